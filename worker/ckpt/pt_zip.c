/* pt_zip.c - the zip archive of a PyTorch checkpoint: end of central
 * directory (zip64 too), the central directory, each entry's local header,
 * and the checks that make every entry's byte range trustworthy. Nothing is
 * decompressed: torch stores every entry, and a compressed one is refused. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "worker/ckpt/pytorch.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define EOCD_LEN 22
#define LOC64_LEN 20
#define EOCD64_LEN 56
#define CENTRAL_LEN 46
#define LOCAL_LEN 30

static uint32_t le16(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
static uint32_t le32(const unsigned char *p) {
  return le16(p) | (uint32_t)le16(p + 2) << 16;
}
static uint64_t le64(const unsigned char *p) {
  return le32(p) | (uint64_t)le32(p + 4) << 32;
}

uint32_t pt_crc32(uint32_t crc, const void *p, size_t n) {
  static uint32_t table[256];
  static int ready; /* the table is the same whoever fills it first */
  if (!ready) {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    ready = 1;
  }
  const unsigned char *b = p;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ b[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

void pt_zip_free(pt_zip_t *z) {
  if (!z) return;
  for (size_t i = 0; i < z->n; i++) free(z->entries[i].name);
  free(z->entries);
  z->entries = NULL;
  z->n = 0;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(((const pt_zip_entry_t *)a)->name, ((const pt_zip_entry_t *)b)->name);
}

static int cmp_header(const void *a, const void *b) {
  const pt_zip_entry_t *x = *(const pt_zip_entry_t *const *)a;
  const pt_zip_entry_t *y = *(const pt_zip_entry_t *const *)b;
  return x->header < y->header ? -1 : x->header > y->header;
}

const pt_zip_entry_t *pt_zip_find(const pt_zip_t *z, const char *name) {
  pt_zip_entry_t key = {.name = (char *)name};
  return bsearch(&key, z->entries, z->n, sizeof key, cmp_name);
}

/* The central directory's place: from the end record, or the zip64 one
 * where a field of the end record is saturated. */
typedef struct {
  uint64_t count, cd_off, cd_size, end; /* end: where the directory must stop */
} cdir_t;

static int find_directory(pt_read_fn rd, void *ctx, uint64_t size, cdir_t *d, char *err,
                          size_t errlen) {
  if (size < EOCD_LEN)
    return ty_errf(err, errlen, TY_EINVAL, "%llu bytes, too short for a zip archive (truncated?)",
                   (unsigned long long)size);
  /* The end record is the last 22 bytes plus a comment of up to 65535. */
  size_t tail = size < EOCD_LEN + 65535 ? (size_t)size : EOCD_LEN + 65535;
  unsigned char *buf = xmalloc(tail);
  int rc = 0;
  if (rd(ctx, size - tail, buf, tail)) {
    rc = ty_errf(err, errlen, TY_EDATALOSS, "cannot read the end of the archive");
    goto out;
  }
  size_t at = 0;
  bool found = false;
  for (size_t i = tail - EOCD_LEN + 1; i-- > 0 && !found;)
    if (le32(buf + i) == SIG_EOCD && i + EOCD_LEN + le16(buf + i + 20) == tail)
      at = i, found = true;
  if (!found) {
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "no end-of-central-directory record: the zip archive is truncated or damaged");
    goto out;
  }
  const unsigned char *e = buf + at;
  uint64_t eocd = size - tail + at;
  if (le16(e + 4) || le16(e + 6) || le16(e + 8) != le16(e + 10)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "a zip archive split over several disks is not read");
    goto out;
  }
  d->count = le16(e + 10);
  d->cd_size = le32(e + 12);
  d->cd_off = le32(e + 16);
  d->end = eocd;
  if (d->count == 0xffff || d->cd_size == 0xffffffffu || d->cd_off == 0xffffffffu) {
    unsigned char loc[LOC64_LEN], r64[EOCD64_LEN];
    if (eocd < LOC64_LEN || rd(ctx, eocd - LOC64_LEN, loc, LOC64_LEN) || le32(loc) != SIG_LOC64) {
      rc = ty_errf(err, errlen, TY_EINVAL, "zip64 archive without its zip64 locator: damaged");
      goto out;
    }
    uint64_t off = le64(loc + 8);
    if (off > eocd - LOC64_LEN || eocd - LOC64_LEN - off < EOCD64_LEN ||
        rd(ctx, off, r64, EOCD64_LEN) || le32(r64) != SIG_EOCD64) {
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "the zip64 end record the locator points at (offset %llu) is not there",
                   (unsigned long long)off);
      goto out;
    }
    if (le32(r64 + 16) || le32(r64 + 20) || le64(r64 + 24) != le64(r64 + 32)) {
      rc = ty_errf(err, errlen, TY_EINVAL, "a zip archive split over several disks is not read");
      goto out;
    }
    d->count = le64(r64 + 32);
    d->cd_size = le64(r64 + 40);
    d->cd_off = le64(r64 + 48);
    d->end = off;
  }
  if (d->cd_off > d->end || d->cd_size > d->end - d->cd_off)
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "the central directory (offset %llu, %llu bytes) lies outside the archive's "
                 "%llu bytes: truncated or damaged",
                 (unsigned long long)d->cd_off, (unsigned long long)d->cd_size,
                 (unsigned long long)size);
  else if (d->count > PT_ENTRIES_MAX || d->count > d->cd_size / CENTRAL_LEN)
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "the archive claims %llu entries in a %llu-byte central directory (at most %u "
                 "fit, and %u are read): damaged or hostile",
                 (unsigned long long)d->count, (unsigned long long)d->cd_size,
                 (unsigned)(d->cd_size / CENTRAL_LEN), PT_ENTRIES_MAX);
out:
  free(buf);
  return rc;
}

/* Applies a zip64 extended-information extra field to the saturated sizes
 * and offset of one central record. */
static int apply_zip64(const unsigned char *x, size_t n, uint64_t *usize, uint64_t *csize,
                       uint64_t *hdr) {
  for (size_t i = 0; i + 4 <= n;) {
    uint32_t id = le16(x + i), len = le16(x + i + 2);
    if (i + 4 + len > n) return -1;
    if (id == 1) {
      const unsigned char *v = x + i + 4;
      size_t k = 0;
      uint64_t *fields[] = {usize, csize, hdr};
      for (int f = 0; f < 3; f++) {
        if (*fields[f] != 0xffffffffu) continue;
        if (k + 8 > len) return -1;
        *fields[f] = le64(v + k);
        k += 8;
      }
      return 0;
    }
    i += 4 + len;
  }
  return *usize == 0xffffffffu || *csize == 0xffffffffu || *hdr == 0xffffffffu ? -1 : 0;
}

/* Reads central record at *pos (advanced past it) into e, checks its
 * local header and places its data. */
static int read_entry(pt_read_fn rd, void *ctx, const unsigned char *cd, uint64_t cd_size,
                      uint64_t *pos, const cdir_t *d, pt_zip_entry_t *e, char *err, size_t errlen) {
  if (cd_size - *pos < CENTRAL_LEN || le32(cd + *pos) != SIG_CENTRAL)
    return ty_errf(err, errlen, TY_EINVAL,
                   "central directory record %llu is damaged (no signature where one must be)",
                   (unsigned long long)*pos);
  const unsigned char *c = cd + *pos;
  uint32_t flags = le16(c + 8), method = le16(c + 10);
  uint64_t csize = le32(c + 20), usize = le32(c + 24), hdr = le32(c + 42);
  uint32_t nlen = le16(c + 28), xlen = le16(c + 30), clen = le16(c + 32);
  if (cd_size - *pos - CENTRAL_LEN < (uint64_t)nlen + xlen + clen)
    return ty_errf(err, errlen, TY_EINVAL, "central directory record %llu runs past its end",
                   (unsigned long long)*pos);
  if (nlen == 0 || nlen >= PT_NAME_MAX || memchr(c + CENTRAL_LEN, 0, nlen))
    return ty_errf(err, errlen, TY_EINVAL, "an entry's name is empty, too long or holds NUL");
  e->name = xmalloc(nlen + 1);
  memcpy(e->name, c + CENTRAL_LEN, nlen);
  e->name[nlen] = 0;
  e->crc = le32(c + 16);
  *pos += CENTRAL_LEN + nlen + xlen + clen;
  if (apply_zip64(c + CENTRAL_LEN + nlen, xlen, &usize, &csize, &hdr))
    return ty_errf(err, errlen, TY_EINVAL, "entry '%s': damaged zip64 extra field", e->name);
  if (flags & 1)
    return ty_errf(err, errlen, TY_EINVAL, "entry '%s' is encrypted; PyTorch never encrypts",
                   e->name);
  if (method != 0)
    return ty_errf(err, errlen, TY_EINVAL,
                   "entry '%s' is compressed (method %u); a PyTorch checkpoint stores every "
                   "entry uncompressed so that tensors can be read by byte range: save it again "
                   "with torch.save instead of repacking the archive",
                   e->name, method);
  if (csize != usize)
    return ty_errf(err, errlen, TY_EINVAL, "entry '%s': stored with %llu bytes but %llu unpacked",
                   e->name, (unsigned long long)csize, (unsigned long long)usize);
  unsigned char lh[LOCAL_LEN];
  if (hdr > d->cd_off || d->cd_off - hdr < LOCAL_LEN || rd(ctx, hdr, lh, LOCAL_LEN) ||
      le32(lh) != SIG_LOCAL)
    return ty_errf(err, errlen, TY_EINVAL,
                   "entry '%s': no local header at offset %llu (before the central directory at "
                   "%llu): damaged or hostile",
                   e->name, (unsigned long long)hdr, (unsigned long long)d->cd_off);
  uint64_t data = hdr + LOCAL_LEN + le16(lh + 26) + le16(lh + 28);
  if (le16(lh + 26) != nlen)
    return ty_errf(err, errlen, TY_EINVAL, "entry '%s': the local header names another entry",
                   e->name);
  if (data > d->cd_off || usize > d->cd_off - data)
    return ty_errf(err, errlen, TY_EINVAL,
                   "entry '%s': its %llu data bytes at offset %llu run past the start of the "
                   "central directory (%llu): truncated or hostile",
                   e->name, (unsigned long long)usize, (unsigned long long)data,
                   (unsigned long long)d->cd_off);
  char lname[PT_NAME_MAX];
  if (rd(ctx, hdr + LOCAL_LEN, lname, nlen) || memcmp(lname, e->name, nlen))
    return ty_errf(err, errlen, TY_EINVAL, "entry '%s': the local header names another entry",
                   e->name);
  e->header = hdr;
  e->data_off = data;
  e->size = usize;
  return 0;
}

int pt_zip_parse(pt_read_fn rd, void *ctx, uint64_t size, pt_zip_t *z, char *err, size_t errlen) {
  z->entries = NULL;
  z->n = 0;
  cdir_t d;
  int rc = find_directory(rd, ctx, size, &d, err, errlen);
  if (rc) return rc;
  unsigned char *cd = xmalloc(d.cd_size ? d.cd_size : 1);
  if (rd(ctx, d.cd_off, cd, d.cd_size)) {
    free(cd);
    return ty_errf(err, errlen, TY_EDATALOSS, "cannot read the central directory");
  }
  z->entries = xcalloc(d.count + 1, sizeof *z->entries);
  uint64_t pos = 0;
  for (uint64_t i = 0; i < d.count && !rc; i++, z->n++)
    rc = read_entry(rd, ctx, cd, d.cd_size, &pos, &d, &z->entries[i], err, errlen);
  free(cd);
  if (!rc) {
    /* No two entries share a byte: each ends before the next one starts. */
    pt_zip_entry_t **by = xmalloc((z->n + 1) * sizeof *by);
    for (size_t i = 0; i < z->n; i++) by[i] = &z->entries[i];
    qsort(by, z->n, sizeof *by, cmp_header);
    for (size_t i = 1; i < z->n && !rc; i++)
      if (by[i - 1]->data_off + by[i - 1]->size > by[i]->header)
        rc = ty_errf(err, errlen, TY_EINVAL, "entries '%s' and '%s' overlap: damaged or hostile",
                     by[i - 1]->name, by[i]->name);
    free(by);
  }
  if (!rc) {
    qsort(z->entries, z->n, sizeof *z->entries, cmp_name);
    for (size_t i = 1; i < z->n && !rc; i++)
      if (!strcmp(z->entries[i - 1].name, z->entries[i].name))
        rc = ty_errf(err, errlen, TY_EINVAL, "entry '%s' appears twice", z->entries[i].name);
  }
  if (rc) pt_zip_free(z);
  return rc;
}
