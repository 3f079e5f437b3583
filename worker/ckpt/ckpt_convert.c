/* ckpt_convert.c - any checkpoint trainyard reads, written again as
 * safetensors, a chunk at a time; see ckpt_convert.h. */
#include "worker/ckpt/ckpt_convert.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/errors.h"
#include "api/llama_config.h"
#include "common/fsutil.h"
#include "common/json_util.h"
#include "common/xalloc.h"
#include "worker/ckpt/checkpoint.h"

/* The first checkpoint file in dir (config.json, *.safetensors, an index),
 * or false. */
static bool holds_checkpoint(const char *dir, char *name, size_t size) {
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
    size_t n = strlen(e->d_name);
    found = !strcmp(e->d_name, "config.json") || !strcmp(e->d_name, ST_INDEX_NAME) ||
            (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors"));
    if (found) snprintf(name, size, "%s", e->d_name);
  }
  closedir(d);
  return found;
}

/* Streams tensors [lo, hi) of the table into one file. */
static int write_file(const char *path, const ckpt_t *ck, const ty_dtype_t *dt, size_t lo,
                      size_t hi, void *src, float *f32, void *dst, convert_stats_t *s, char *err,
                      size_t errlen) {
  const ckpt_layout_t *l = &ck->layout;
  st_desc_t *d = xcalloc(hi - lo + 1, sizeof *d);
  for (size_t i = lo; i < hi; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    d[i - lo] = (st_desc_t){t->name, dt[i], t->ndim, {t->rows, t->cols}};
  }
  static const char *const md[] = {"format", "pt", NULL};
  st_writer_t *w;
  int rc = st_writer_open(path, d, hi - lo, md, &w, err, errlen);
  free(d);
  if (rc) return rc;
  for (size_t i = lo; i < hi && !rc; i++) {
    const st_tensor_t *ft = ck->file_tensor[i];
    const size_t in_es = ty_dtype_size(ft->dtype), out_es = ty_dtype_size(dt[i]);
    const uint64_t per = CONVERT_CHUNK / sizeof(float); /* elements a step, as fp32 */
    for (uint64_t at = 0; at < ft->nelem && !rc; at += per) {
      size_t m = ft->nelem - at < per ? (size_t)(ft->nelem - at) : (size_t)per;
      rc = st_read(ck->st, ft, at * in_es, src, m * in_es, err, errlen);
      if (rc) break;
      s->bytes_read += m * in_es;
      const void *out = src;
      if (ft->dtype != dt[i]) { /* through fp32, exact for widening */
        ty_dtype_to_f32(ft->dtype, src, f32, m);
        ty_dtype_from_f32(dt[i], f32, dst, m);
        out = dst;
      }
      rc = st_writer_write(w, out, m * out_es, err, errlen);
      s->bytes_written += m * out_es;
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
  return r ? ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: cannot write", path) : 0;
}

/* The source's config.json, as it is, with torch_dtype set where asked. */
static int copy_config(const char *src, const char *out, const convert_opts_t *o, char *err,
                       size_t errlen) {
  char from[PATH_MAX + 16], to[PATH_MAX + 16];
  llama_config_path(src, from, sizeof from);
  json_error_t jerr;
  json_t *cfg = json_load_file(from, JSON_REJECT_DUPLICATES, &jerr);
  if (!cfg) return ty_errf(err, errlen, TY_EINVAL, "%s: %s", from, jerr.text);
  if (o->set_dtype) json_object_set_new(cfg, "torch_dtype", json_string(ty_dtype_name(o->dtype)));
  snprintf(to, sizeof to, "%s/config.json", out);
  return write_json(to, cfg, err, errlen);
}

/* Refuses an out folder that is src's or holds a checkpoint already. */
static int check_out(const char *src, const char *out, char *err, size_t errlen) {
  char a[PATH_MAX], b[PATH_MAX], found[256];
  struct stat st;
  if (realpath(src, a) && stat(a, &st) == 0 && S_ISREG(st.st_mode)) *strrchr(a, '/') = '\0';
  if (realpath(out, b) && realpath(src, a) && !strcmp(a, b))
    return ty_errf(err, errlen, TY_EINVAL,
                   "--out %s is the source's folder; give a new folder for the safetensors copy",
                   out);
  if (holds_checkpoint(out, found, sizeof found))
    return ty_errf(err, errlen, TY_EEXISTS,
                   "--out %s already holds a checkpoint (%s); convert never writes over one: "
                   "remove it, or give another --out",
                   out, found);
  return 0;
}

int ckpt_convert(const char *src, const char *out, const convert_opts_t *o, convert_stats_t *stats,
                 char *err, size_t errlen) {
  convert_stats_t s = {0};
  ckpt_t *ck = NULL;
  int rc = check_out(src, out, err, errlen);
  if (!rc) rc = ckpt_open(src, &ck, err, errlen);
  if (rc) return rc;
  const ckpt_layout_t *l = &ck->layout;
  ty_dtype_t *dt = xcalloc(l->ntensors + 1, sizeof *dt);
  size_t *cut = xcalloc(l->ntensors + 2, sizeof *cut); /* file f holds [cut[f], cut[f+1]) */
  uint64_t *bytes = xcalloc(l->ntensors + 1, sizeof *bytes);
  const char **names = xcalloc(l->ntensors + 1, sizeof *names);
  void *src_buf = xmalloc(CONVERT_CHUNK), *dst_buf = xmalloc(CONVERT_CHUNK);
  float *f32 = xmalloc(CONVERT_CHUNK);
  uint64_t total = 0;
  for (size_t i = 0; i < l->ntensors; i++) {
    dt[i] = o->set_dtype ? o->dtype : ck->file_tensor[i]->dtype;
    bytes[i] = ck->file_tensor[i]->nelem * ty_dtype_size(dt[i]);
    names[i] = l->tensors[i].name;
    total += bytes[i];
  }
  const size_t nfiles = st_shard_plan(bytes, l->ntensors, o->shard_bytes, cut);
  char path[PATH_MAX + 64], name[64];
  if ((rc = ty_mkdirs(out, err, errlen)) || (rc = copy_config(src, out, o, err, errlen))) goto done;
  for (size_t f = 0; f < nfiles && !rc; f++) {
    st_shard_name(name, sizeof name, f, nfiles);
    snprintf(path, sizeof path, "%s/%s", out, name);
    rc = write_file(path, ck, dt, cut[f], cut[f + 1], src_buf, f32, dst_buf, &s, err, errlen);
  }
  if (!rc && nfiles > 1) {
    snprintf(path, sizeof path, "%s/%s", out, ST_INDEX_NAME);
    rc = write_json(path, st_shard_index(names, cut, nfiles, total), err, errlen);
  }
  s.tensors = l->ntensors;
  s.files = nfiles;
  if (stats) *stats = s;
done:
  free(f32), free(src_buf), free(dst_buf), free(cut), free(dt), free(bytes), free(names);
  ckpt_close(ck);
  return rc;
}
