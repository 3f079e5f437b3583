/* checkpoint_write.c - writes a randomly initialised Llama checkpoint
 * (config.json + one or more safetensors files + index), streamed. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/fsutil.h"
#include "common/json_util.h"
#include "common/xalloc.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/model/weightinit.h"

#define CW_CHUNK (1u << 20) /* elements generated per step: 4 MiB of fp32 */

/* Streams tensors [lo, hi) of the table into one file. */
static int write_file(const char *path, const ckpt_layout_t *l, size_t lo, size_t hi,
                      ty_dtype_t dtype, uint64_t seed, float *f32, void *out, char *err,
                      size_t errlen) {
  st_desc_t *d = xcalloc(hi - lo + 1, sizeof *d);
  for (size_t i = lo; i < hi; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    d[i - lo] = (st_desc_t){t->name, dtype, t->ndim, {t->rows, t->cols}};
  }
  static const char *const md[] = {"format", "pt", NULL};
  st_writer_t *w;
  int rc = st_writer_open(path, d, hi - lo, md, &w, err, errlen);
  free(d);
  if (rc) return rc;
  const size_t esz = ty_dtype_size(dtype);
  for (size_t i = lo; i < hi && !rc; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    uint64_t stream = winit_stream(seed, t->name);
    uint64_t n = (uint64_t)t->rows * (uint64_t)t->cols;
    for (uint64_t done = 0; done < n && !rc; done += CW_CHUNK) {
      size_t m = n - done < CW_CHUNK ? (size_t)(n - done) : CW_CHUNK;
      winit_fill(stream, t->is_norm, done, f32, m);
      ty_dtype_from_f32(dtype, f32, out, m);
      rc = st_writer_write(w, out, m * esz, err, errlen);
    }
  }
  if (rc) {
    char ignored[8];
    st_writer_close(w, ignored, sizeof ignored);
    return rc;
  }
  return st_writer_close(w, err, errlen);
}

static int write_json(const char *path, json_t *j, char *err, size_t errlen) {
  int r = ty_json_dump_file(j, path, JSON_INDENT(2));
  json_decref(j);
  if (r) return ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: cannot write", path);
  return 0;
}

int ckpt_write_random(const char *dir, const llama_config_t *cfg, ty_dtype_t dtype, int shards,
                      uint64_t seed, uint64_t *bytes_out, char *err, size_t errlen) {
  ckpt_layout_t l;
  if (ckpt_layout_init(&l, cfg)) return ty_errf(err, errlen, TY_EINVAL, "model sizes out of range");
  int rc = 0;
  char path[4096];
  float *f32 = NULL;
  void *out = NULL;
  size_t *cut = NULL;        /* file f holds tensors [cut[f], cut[f+1]) */
  const char **names = NULL; /* the tensors' */
  if (shards < 1 || (size_t)shards > l.ntensors) {
    rc = ty_errf(err, errlen, TY_EINVAL, "shards must be between 1 and %zu (the tensor count)",
                 l.ntensors);
    goto out;
  }
  if ((rc = ty_mkdirs(dir, err, errlen))) goto out;
  llama_config_t c = *cfg;
  c.torch_dtype = dtype;
  snprintf(path, sizeof path, "%s/config.json", dir);
  if ((rc = write_json(path, llama_config_to_json(&c), err, errlen))) goto out;

  const size_t esz = ty_dtype_size(dtype);
  uint64_t total = l.nparams * esz;
  f32 = xmalloc(CW_CHUNK * sizeof *f32);
  out = xmalloc(CW_CHUNK * esz);
  /* Consecutive tensors per file, cut where the running byte count passes
   * the next 1/shards of the total, each file holding at least one. */
  cut = xcalloc((size_t)shards + 1, sizeof *cut);
  names = xcalloc(l.ntensors + 1, sizeof *names);
  for (size_t i = 0; i < l.ntensors; i++) names[i] = l.tensors[i].name;
  size_t lo = 0;
  uint64_t acc = 0;
  for (int f = 0; f < shards && !rc; f++) {
    size_t hi = lo;
    uint64_t goal = total / (uint64_t)shards * (uint64_t)(f + 1);
    size_t must_leave = (size_t)(shards - f - 1);
    while (hi < l.ntensors - must_leave && (hi == lo || acc < goal || f == shards - 1)) {
      acc += (uint64_t)l.tensors[hi].rows * (uint64_t)l.tensors[hi].cols * esz;
      hi++;
    }
    char name[64];
    st_shard_name(name, sizeof name, (size_t)f, (size_t)shards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    rc = write_file(path, &l, lo, hi, dtype, seed, f32, out, err, errlen);
    cut[f] = lo, cut[f + 1] = hi;
    lo = hi;
  }
  if (!rc && shards > 1) {
    snprintf(path, sizeof path, "%s/%s", dir, ST_INDEX_NAME);
    rc = write_json(path, st_shard_index(names, cut, (size_t)shards, total), err, errlen);
  }
  if (!rc && bytes_out) *bytes_out = total;
out:
  free(cut);
  free(names);
  free(f32);
  free(out);
  ckpt_layout_free(&l);
  return rc;
}
