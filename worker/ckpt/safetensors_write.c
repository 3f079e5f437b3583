/* safetensors_write.c - the streaming safetensors writer: header from the
 * tensor descriptions, then the data in order, in pieces of any size. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/fsfault.h"
#include "common/beneath.h"
#include "common/partial.h"
#include "common/xalloc.h"
#include "worker/ckpt/safetensors.h"

/* The file is written as <path>.partial and renamed onto path once whole,
 * so that path holds the previous file, or the new one complete, never a
 * part: a reader (eval, a later job, PEFT) and a crash both see one or the
 * other. */
struct st_writer {
  FILE *f;
  char *path;
  char *partial;    /* path + ".partial", where the bytes go */
  int slot;         /* partial's ty_partial_track slot (a signal removes it) */
  uint64_t total;   /* data bytes declared by the header */
  uint64_t written; /* data bytes written so far */
  char *buf;        /* stdio buffer */
};

static void writer_free(st_writer_t *w, bool remove_partial) {
  if (!w) return;
  if (w->f) fclose(w->f);
  if (remove_partial) ty_beneath_remove(w->partial, false, NULL, 0);
  ty_partial_untrack(w->slot);
  free(w->path);
  free(w->partial);
  free(w->buf);
  free(w);
}

int st_writer_open(const char *path, const st_desc_t *descs, size_t n, const char *const *metadata,
                   st_writer_t **out, char *err, size_t errlen) {
  *out = NULL;
  json_t *root = json_object();
  if (metadata && metadata[0]) {
    json_t *md = json_object();
    for (size_t i = 0; metadata[i] && metadata[i + 1]; i += 2)
      json_object_set_new(md, metadata[i], json_string(metadata[i + 1]));
    json_object_set_new(root, "__metadata__", md);
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const st_desc_t *d = &descs[i];
    const bool known = (unsigned)d->dtype < TY_DTYPE_COUNT || d->dtype == TY_DTYPE_U8;
    if (!known || d->ndim < 0 || d->ndim > ST_MAX_DIMS) {
      json_decref(root);
      return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': bad dtype or rank", d->name);
    }
    json_t *shape = json_array();
    uint64_t nelem = 1;
    for (int k = 0; k < d->ndim; k++) {
      json_array_append_new(shape, json_integer(d->shape[k]));
      nelem *= (uint64_t)d->shape[k];
    }
    uint64_t nb = nelem * ty_dtype_size(d->dtype);
    json_t *e = json_object();
    json_object_set_new(e, "dtype", json_string(ty_dtype_st_name(d->dtype)));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets",
                        json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
    if (json_object_get(root, d->name)) {
      json_decref(e);
      json_decref(root);
      return ty_errf(err, errlen, TY_EINVAL, "tensor '%s' declared twice", d->name);
    }
    json_object_set_new(root, d->name, e);
    off += nb;
  }
  char *hdr = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  size_t hlen = strlen(hdr);
  size_t padded = (hlen + 7) & ~(size_t)7; /* spaces keep the data section 8-byte aligned */

  st_writer_t *w = xcalloc(1, sizeof *w);
  w->path = xstrdup(path);
  size_t pl = strlen(path);
  w->partial = xmalloc(pl + sizeof ".partial");
  memcpy(w->partial, path, pl);
  memcpy(w->partial + pl, ".partial", sizeof ".partial");
  w->total = off;
  w->slot = ty_partial_track(w->partial);
  char why[1024];
  w->f = ty_beneath_fopen(w->partial, "wb", why, sizeof why);
  if (!w->f) {
    int e = errno;
    free(hdr);
    writer_free(w, false);
    return ty_errf(err, errlen, e == ENOENT ? TY_ENOTFOUND : TY_EPERM, "cannot create: %s", why);
  }
  w->buf = xmalloc(1u << 20);
  setvbuf(w->f, w->buf, _IOFBF, 1u << 20);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  bool ok = !ty_fsfault("write", w->partial) && fwrite(len8, 1, 8, w->f) == 8 &&
            fwrite(hdr, 1, hlen, w->f) == hlen;
  for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', w->f) != EOF;
  free(hdr);
  if (!ok) {
    int e = errno;
    writer_free(w, true);
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: writing the header: %s", path, strerror(e));
  }
  *out = w;
  return 0;
}

int st_writer_write(st_writer_t *w, const void *data, size_t n, char *err, size_t errlen) {
  if (n > w->total - w->written)
    return ty_errf(err, errlen, TY_EINVAL, "%s: %zu bytes more than the header declares", w->path,
                   (size_t)(n - (w->total - w->written)));
  if (ty_fsfault("write", w->partial) || fwrite(data, 1, n, w->f) != n)
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: write failed: %s (disk full?)", w->path,
                   strerror(errno));
  w->written += n;
  return 0;
}

int st_writer_close(st_writer_t *w, char *err, size_t errlen) {
  if (!w) return 0;
  int rc = 0;
  if (w->written != w->total)
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "%s: %llu of %llu data bytes written; not written (what was there stays)", w->path,
                 (unsigned long long)w->written, (unsigned long long)w->total);
  FILE *f = w->f;
  w->f = NULL;
  if (fclose(f) && !rc)
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: closing: %s (disk full?)", w->path,
                 strerror(errno));
  char why[1024];
  if (!rc && ty_beneath_rename(w->partial, w->path, why, sizeof why))
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: cannot replace it: %s", w->path, why);
  writer_free(w, rc != 0);
  return rc;
}
