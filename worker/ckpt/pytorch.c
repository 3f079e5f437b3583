/* pytorch.c - one PyTorch checkpoint file as a set of tensor byte ranges:
 * the archive (pt_zip.c), its data.pkl (pt_pickle.c), and each tensor
 * placed inside its storage's entry. The result has the shape of a parsed
 * safetensors header, so the rest of trainyard reads both alike. */
#include "worker/ckpt/pytorch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/xalloc.h"

#define LEGACY_HINT                                                                    \
  "re-save it in PyTorch with torch.save(torch.load(path), path, "                     \
  "_use_new_zipfile_serialization=True) (the default since PyTorch 1.6) in a trusted " \
  "environment, then load it here or make safetensors of it with trainyard convert"

bool pt_is_zip(const unsigned char *head, size_t n) {
  return n >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4;
}

static int fd_read(void *ctx, uint64_t off, void *dst, size_t n) {
  int fd = *(const int *)ctx;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)dst + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

static int cmp_st_name(const void *a, const void *b) {
  return strcmp(((const st_tensor_t *)a)->name, ((const st_tensor_t *)b)->name);
}

/* The folder every entry sits in ("archive/" for torch.save(.., "archive.pt")):
 * the prefix of the one entry named "<prefix>/data.pkl". */
static const pt_zip_entry_t *find_pickle(const pt_zip_t *z, char *prefix, size_t n) {
  const pt_zip_entry_t *found = NULL;
  for (size_t i = 0; i < z->n; i++) {
    const char *name = z->entries[i].name, *slash = strchr(name, '/');
    if (!slash || strcmp(slash, "/data.pkl")) continue;
    if (found) return NULL; /* two archives in one file: which is meant? */
    found = &z->entries[i];
    snprintf(prefix, n, "%.*s", (int)(slash - name), name);
  }
  return found;
}

/* Places the tensors of d inside their storages' entries, into h. */
static int place_tensors(const pt_zip_t *z, const char *prefix, const pt_dict_t *d, int fi,
                         st_header_t *h, char *err, size_t errlen) {
  h->tensors = xcalloc(d->n + 1, sizeof *h->tensors);
  char name[PT_NAME_MAX + 64];
  for (size_t i = 0; i < d->n; i++) {
    const pt_tensor_t *t = &d->tensors[i];
    snprintf(name, sizeof name, "%s/data/%s", prefix, t->storage);
    const pt_zip_entry_t *e = pt_zip_find(z, name);
    if (!e)
      return ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s': its storage '%s' is not in the archive (no entry %s): "
                     "truncated or damaged",
                     t->name, t->storage, name);
    uint64_t es = ty_dtype_size(t->dtype);
    if (t->storage_numel > e->size / es || e->size != t->storage_numel * es)
      return ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s': storage %s holds %llu bytes but data.pkl says %llu %s "
                     "elements: damaged",
                     t->name, name, (unsigned long long)e->size,
                     (unsigned long long)t->storage_numel, ty_dtype_name(t->dtype));
    st_tensor_t *s = &h->tensors[h->ntensors++];
    s->name = xstrdup(t->name);
    s->dtype = t->dtype;
    s->ndim = t->ndim;
    memcpy(s->shape, t->shape, sizeof s->shape);
    s->nelem = t->nelem;
    s->nbytes = t->nelem * es;
    s->begin = e->data_off + t->offset * es; /* the pickle checked offset + nelem <= numel */
    s->file = fi;
  }
  qsort(h->tensors, h->ntensors, sizeof *h->tensors, cmp_st_name);
  for (size_t i = 1; i < h->ntensors; i++)
    if (!strcmp(h->tensors[i - 1].name, h->tensors[i].name))
      return ty_errf(err, errlen, TY_EINVAL, "tensor '%s' appears twice in the state dict",
                     h->tensors[i].name);
  return 0;
}

/* A little-endian archive: torch writes "<prefix>/byteorder" since 1.13;
 * older files have none and are little-endian. */
static int check_byteorder(pt_read_fn rd, void *ctx, const pt_zip_t *z, const char *prefix,
                           char *err, size_t errlen) {
  char name[PT_NAME_MAX + 16], v[16] = "";
  snprintf(name, sizeof name, "%s/byteorder", prefix);
  const pt_zip_entry_t *e = pt_zip_find(z, name);
  if (!e) return 0;
  if (e->size >= sizeof v || rd(ctx, e->data_off, v, (size_t)e->size))
    return ty_errf(err, errlen, TY_EINVAL, "%s is unreadable", name);
  if (strcmp(v, "little"))
    return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                   "the checkpoint was saved on a big-endian machine; trainyard reads "
                   "little-endian tensors only (re-save it on a little-endian one)");
  return 0;
}

int pt_read_archive(pt_read_fn rd, void *ctx, uint64_t size, int fi, st_header_t *h, char *err,
                    size_t errlen) {
  h->tensors = NULL;
  h->ntensors = 0;
  pt_zip_t z = {0};
  pt_dict_t d = {0};
  uint8_t *pkl = NULL;
  int rc = pt_zip_parse(rd, ctx, size, &z, err, errlen);
  if (rc) return rc;
  char prefix[PT_NAME_MAX];
  const pt_zip_entry_t *e = find_pickle(&z, prefix, sizeof prefix);
  if (!e) {
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "a zip archive without one <name>/data.pkl: not a checkpoint torch.save wrote");
    goto out;
  }
  if ((rc = check_byteorder(rd, ctx, &z, prefix, err, errlen))) goto out;
  if (e->size > PT_PICKLE_MAX) {
    rc = ty_errf(err, errlen, TY_EINVAL, "%s has %llu bytes, more than the %u a state dict needs",
                 e->name, (unsigned long long)e->size, PT_PICKLE_MAX);
    goto out;
  }
  pkl = xmalloc(e->size ? (size_t)e->size : 1);
  if (rd(ctx, e->data_off, pkl, (size_t)e->size)) {
    rc = ty_errf(err, errlen, TY_EDATALOSS, "cannot read %s", e->name);
    goto out;
  }
  if (pt_crc32(0, pkl, (size_t)e->size) != e->crc) {
    rc = ty_errf(err, errlen, TY_EDATALOSS, "%s fails its CRC-32: the file is damaged", e->name);
    goto out;
  }
  if ((rc = pt_pickle_load(pkl, (size_t)e->size, &d, err, errlen))) goto out;
  rc = place_tensors(&z, prefix, &d, fi, h, err, errlen);
out:
  free(pkl);
  pt_dict_free(&d);
  pt_zip_free(&z);
  if (rc) st_header_free(h);
  return rc;
}

int pt_open_file(int fd, const char *path, uint64_t size, int fi, st_header_t *h, char *err,
                 size_t errlen) {
  h->tensors = NULL;
  h->ntensors = 0;
  unsigned char head[512] = {0};
  size_t n = size < sizeof head ? (size_t)size : sizeof head;
  if (fd_read(&fd, 0, head, n))
    return ty_errf(err, errlen, TY_EDATALOSS, "%s: cannot read: %s", path, strerror(errno));
  if (!pt_is_zip(head, n)) {
    /* Before 1.6 torch.save wrote pickles one after another (starting with
     * the pickled magic number, protocol 2), and before that a tar file. */
    if (n >= 2 && head[0] == 0x80 && head[1] <= 5)
      return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                     "%s is a legacy PyTorch file (the pre-1.6 pickle format), which cannot be "
                     "read without running its pickles: " LEGACY_HINT,
                     path);
    if (n >= 262 && !memcmp(head + 257, "ustar", 5))
      return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                     "%s is a legacy PyTorch file (the tar format of PyTorch 0.x): " LEGACY_HINT,
                     path);
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s is neither safetensors nor a PyTorch zip checkpoint (torch.save since 1.6)",
                   path);
  }
  char msg[900];
  int rc = pt_read_archive(fd_read, &fd, size, fi, h, msg, sizeof msg);
  if (rc) ty_errf(err, errlen, rc, "%s: %s", path, msg);
  return rc;
}
