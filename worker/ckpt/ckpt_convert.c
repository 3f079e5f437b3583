/* ckpt_convert.c - any checkpoint trainyard reads, written again as
 * safetensors, a chunk at a time, or with its projections in bitsandbytes'
 * 4-bit layout, or from that layout back to floats; see ckpt_convert.h. */
#include "worker/ckpt/ckpt_convert.h"

#include <dirent.h>
#include <errno.h>
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
#include "worker/ckpt/bnb4.h"
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

/* How table entry i is written. */
typedef enum { WRITE_COPY, WRITE_QUANTIZE, WRITE_DEQUANTIZE } write_mode_t;

/* One tensor of the output files: a table entry's, or one component of a
 * 4-bit weight. */
typedef struct {
  char name[BNB4_NAME_MAX];
  st_desc_t d; /* d.name is name */
  uint64_t bytes;
} out_tensor_t;

/* What is written: per table entry its mode, float dtype (of the tensor,
 * or the quant_state's) and output tensors [first[i], first[i + 1]). */
typedef struct {
  const ckpt_t *ck;
  const bnb4_info_t *info; /* a 4-bit source's, else NULL */
  const convert_opts_t *o;
  write_mode_t *mode;
  ty_dtype_t *dt;
  float *offset; /* quantize with double_quant: the nested_offset */
  size_t *first;
  out_tensor_t *out;
  size_t nout;
} plan_t;

typedef struct {
  void *src, *dst; /* CONVERT_CHUNK bytes each */
  float *f32;      /* CONVERT_CHUNK bytes */
  convert_stats_t *s;
} bufs_t;

/* A 4-bit weight in memory: about its fp32 values and its codes. */
typedef struct {
  uint64_t n, nb, nn;
  float *x;         /* [n] */
  uint8_t *codes;   /* [(n + 1) / 2] */
  float *absmax;    /* [nb] */
  uint8_t *qabsmax; /* [nb], nested */
  float *absmax2;   /* [nn], nested */
  float offset;
} q4w_t;

static void q4w_alloc(q4w_t *q, uint64_t n, bool nested) {
  memset(q, 0, sizeof *q);
  q->n = n, q->nb = q4_blocks((size_t)n), q->nn = nested ? q4_nested_blocks((size_t)q->nb) : 0;
  q->x = xmalloc((size_t)n * sizeof(float) + 1);
  q->codes = xmalloc(q4_code_bytes((size_t)n) + 1);
  q->absmax = xmalloc((size_t)q->nb * sizeof(float) + 1);
  q->qabsmax = xmalloc((size_t)q->nb + 1);
  q->absmax2 = xmalloc((size_t)q->nn * sizeof(float) + 1);
}

static void q4w_free(q4w_t *q) {
  free(q->x), free(q->codes), free(q->absmax), free(q->qabsmax), free(q->absmax2);
}

static int put(st_writer_t *w, const void *p, size_t n, bufs_t *b, char *err, size_t errlen) {
  b->s->bytes_written += n;
  return st_writer_write(w, p, n, err, errlen);
}

/* Tensor ft as dtype dt, a chunk at a time (through fp32 when they differ,
 * exact for widening). */
static int copy_tensor(st_writer_t *w, const st_ckpt_t *st, const st_tensor_t *ft, ty_dtype_t dt,
                       bufs_t *b, char *err, size_t errlen) {
  const size_t in_es = ty_dtype_size(ft->dtype), out_es = ty_dtype_size(dt);
  const uint64_t per = CONVERT_CHUNK / sizeof(float); /* elements a step, as fp32 */
  int rc = 0;
  for (uint64_t at = 0; at < ft->nelem && !rc; at += per) {
    size_t m = ft->nelem - at < per ? (size_t)(ft->nelem - at) : (size_t)per;
    if ((rc = st_read(st, ft, at * in_es, b->src, m * in_es, err, errlen))) break;
    b->s->bytes_read += m * in_es;
    const void *out = b->src;
    if (ft->dtype != dt) {
      ty_dtype_to_f32(ft->dtype, b->src, b->f32, m);
      ty_dtype_from_f32(dt, b->f32, b->dst, m);
      out = b->dst;
    }
    rc = put(w, out, m * out_es, b, err, errlen);
  }
  return rc;
}

/* Quantizes ft (as dtype dt: each value rounded to dt first, as the weight
 * transformers would quantize) into q, read whole. */
static int quantize_weight(const plan_t *p, const st_tensor_t *ft, ty_dtype_t dt, q4w_t *q,
                           bufs_t *b, char *err, size_t errlen) {
  const size_t es = ty_dtype_size(ft->dtype), per = CONVERT_CHUNK / sizeof(float);
  q4w_alloc(q, ft->nelem, p->o->double_quant);
  int rc = 0;
  for (uint64_t at = 0; at < ft->nelem && !rc; at += per) {
    size_t m = ft->nelem - at < per ? (size_t)(ft->nelem - at) : per;
    if ((rc = st_read(p->ck->st, ft, at * es, b->src, m * es, err, errlen))) break;
    b->s->bytes_read += m * es;
    ty_dtype_to_f32(ft->dtype, b->src, q->x + at, m);
    if (dt != ft->dtype) {
      ty_dtype_from_f32(dt, q->x + at, b->dst, m);
      ty_dtype_to_f32(dt, b->dst, q->x + at, m);
    }
  }
  if (rc) return rc;
  q4_quantize(p->o->q4_type, q->x, (size_t)q->n, q->codes, q->absmax);
  if (p->o->double_quant) {
    q->offset = q4_mean(q->absmax, (size_t)q->nb);
    q4_nest(q->absmax, (size_t)q->nb, q->offset, q->qabsmax, q->absmax2);
  }
  return 0;
}

/* The quant_state of entry i, written with quantize. */
static bnb4_state_t plan_state(const plan_t *p, size_t i) {
  const ckpt_tensor_t *t = &p->ck->layout.tensors[i];
  bnb4_state_t s = {.type = p->o->q4_type, .blocksize = Q4_BLOCK, .dtype = p->dt[i], .ndim = 2};
  s.shape[0] = t->rows, s.shape[1] = t->cols;
  s.nested = p->o->double_quant;
  s.nested_blocksize = Q4_NESTED_BLOCK;
  s.offset = p->offset[i];
  return s;
}

static int write_quantized(st_writer_t *w, const plan_t *p, size_t i, bufs_t *b, char *err,
                           size_t errlen) {
  const st_tensor_t *ft = p->ck->file_tensor[i];
  q4w_t q;
  int rc = quantize_weight(p, ft, p->dt[i], &q, b, err, errlen);
  const bool nest = p->o->double_quant;
  bnb4_state_t s = plan_state(p, i);
  char json[BNB4_STATE_MAX];
  size_t jn = bnb4_state_json(&s, json, sizeof json);
  if (!rc && nest && memcmp(&q.offset, &p->offset[i], sizeof q.offset))
    rc = ty_errf(err, errlen, TY_EINTERNAL,
                 "tensor '%s': the mean of its block maxima changed "
                 "between two reads of the file (is it being written?)",
                 ft->name);
  if (!rc) rc = put(w, q.codes, q4_code_bytes((size_t)q.n), b, err, errlen);
  if (!rc && nest) rc = put(w, q.qabsmax, (size_t)q.nb, b, err, errlen);
  if (!rc && !nest) rc = put(w, q.absmax, (size_t)q.nb * sizeof(float), b, err, errlen);
  if (!rc) rc = put(w, q4_code(p->o->q4_type), 16 * sizeof(float), b, err, errlen);
  if (!rc && nest) rc = put(w, q.absmax2, (size_t)q.nn * sizeof(float), b, err, errlen);
  if (!rc && nest) rc = put(w, q4_dynamic_code(), 256 * sizeof(float), b, err, errlen);
  if (!rc) rc = put(w, json, jn, b, err, errlen);
  q4w_free(&q);
  return rc;
}

/* A 4-bit weight of the source back to floats of dtype dt. */
static int write_dequantized(st_writer_t *w, const plan_t *p, size_t i, bufs_t *b, char *err,
                             size_t errlen) {
  const bnb4_info_t *in = &p->info[i];
  const st_ckpt_t *st = p->ck->st;
  q4w_t q;
  q4w_alloc(&q, in->nelem, in->state.nested);
  int rc = st_read(st, in->comp[BNB4_CODES], 0, q.codes, q4_code_bytes((size_t)q.n), err, errlen);
  if (!rc && in->state.nested) {
    rc = st_read(st, in->comp[BNB4_ABSMAX], 0, q.qabsmax, (size_t)q.nb, err, errlen);
    if (!rc)
      rc = st_read(st, in->comp[BNB4_NESTED_ABSMAX], 0, q.absmax2, (size_t)q.nn * sizeof(float),
                   err, errlen);
    float map[256]; /* the file's own: bitsandbytes decodes with it */
    if (!rc) rc = st_read(st, in->comp[BNB4_NESTED_QUANT_MAP], 0, map, sizeof map, err, errlen);
    if (!rc) q4_unnest_with(map, q.qabsmax, q.absmax2, (size_t)q.nb, in->state.offset, q.absmax);
  } else if (!rc) {
    rc = st_read(st, in->comp[BNB4_ABSMAX], 0, q.absmax, (size_t)q.nb * sizeof(float), err, errlen);
  }
  for (int c = 0; c < BNB4_NCOMP; c++) b->s->bytes_read += in->comp[c] ? in->comp[c]->nbytes : 0;
  if (!rc) q4_dequantize(in->state.type, q.codes, q.absmax, (size_t)q.n, q.x);
  const size_t es = ty_dtype_size(p->dt[i]), per = CONVERT_CHUNK / sizeof(float);
  for (uint64_t at = 0; at < q.n && !rc; at += per) {
    size_t m = q.n - at < per ? (size_t)(q.n - at) : per;
    ty_dtype_from_f32(p->dt[i], q.x + at, b->dst, m);
    rc = put(w, b->dst, m * es, b, err, errlen);
  }
  q4w_free(&q);
  return rc;
}

/* Streams table entries [lo, hi) into one file. */
static int write_file(const char *path, const plan_t *p, size_t lo, size_t hi, bufs_t *b, char *err,
                      size_t errlen) {
  const size_t n = p->first[hi] - p->first[lo];
  st_desc_t *d = xcalloc(n + 1, sizeof *d);
  for (size_t k = 0; k < n; k++) d[k] = p->out[p->first[lo] + k].d;
  static const char *const md[] = {"format", "pt", NULL};
  st_writer_t *w;
  int rc = st_writer_open(path, d, n, md, &w, err, errlen);
  free(d);
  if (rc) return rc;
  for (size_t i = lo; i < hi && !rc; i++) {
    if (p->mode[i] == WRITE_QUANTIZE)
      rc = write_quantized(w, p, i, b, err, errlen);
    else if (p->mode[i] == WRITE_DEQUANTIZE)
      rc = write_dequantized(w, p, i, b, err, errlen);
    else
      rc = copy_tensor(w, p->ck->st, p->ck->file_tensor[i], p->dt[i], b, err, errlen);
  }
  if (rc) {
    char ignored[8];
    st_writer_close(w, ignored, sizeof ignored);
    return rc;
  }
  return st_writer_close(w, err, errlen);
}

/* Adds output tensor (name + suffix, dtype, shape) to p. */
static void add_out(plan_t *p, const char *name, ty_dtype_t dt, int ndim, int64_t d0, int64_t d1) {
  out_tensor_t *t = &p->out[p->nout++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->d = (st_desc_t){t->name, dt, ndim, {d0, d1}};
  t->bytes = (uint64_t)d0 * (uint64_t)(ndim == 2 ? d1 : 1) * ty_dtype_size(dt);
}

/* Every entry's mode, dtype and output tensors. With double_quant, reads
 * and quantizes each projection once ahead: the quant_state holds the mean
 * of its block maxima, and its length is in the header, before the data. */
static int plan_make(plan_t *p, bufs_t *b, char *err, size_t errlen) {
  const ckpt_layout_t *l = &p->ck->layout;
  const convert_opts_t *o = p->o;
  p->out = xcalloc(l->ntensors * BNB4_NCOMP + 1, sizeof *p->out);
  int rc = 0;
  for (size_t i = 0; i < l->ntensors && !rc; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    const st_tensor_t *ft = p->ck->file_tensor[i];
    p->first[i] = p->nout;
    p->mode[i] = p->info && p->info[i].q4                      ? WRITE_DEQUANTIZE
                 : o->quantize && bnb4_quantized_kind(t->kind) ? WRITE_QUANTIZE
                                                               : WRITE_COPY;
    p->dt[i] = o->set_dtype                     ? o->dtype
               : p->mode[i] == WRITE_DEQUANTIZE ? p->info[i].state.dtype
                                                : ft->dtype;
    if (p->mode[i] != WRITE_QUANTIZE) {
      add_out(p, t->name, p->dt[i], t->ndim, t->rows, t->cols);
      continue;
    }
    q4w_t q = {0};
    if (o->double_quant && !(rc = quantize_weight(p, ft, p->dt[i], &q, b, err, errlen)))
      p->offset[i] = q.offset;
    q4w_free(&q);
    const uint64_t n = (uint64_t)t->rows * (uint64_t)t->cols, nb = q4_blocks((size_t)n);
    bnb4_state_t s = plan_state(p, i);
    char name[BNB4_NAME_MAX], json[BNB4_STATE_MAX];
    const size_t jn = bnb4_state_json(&s, json, sizeof json);
    add_out(p, t->name, TY_DTYPE_U8, 2, (int64_t)q4_code_bytes((size_t)n), 1);
    for (int c = BNB4_ABSMAX; c < BNB4_NCOMP; c++) {
      const int64_t size[BNB4_NCOMP] = {0,   (int64_t)nb, 16, (int64_t)q4_nested_blocks((size_t)nb),
                                        256, (int64_t)jn};
      if (!o->double_quant && (c == BNB4_NESTED_ABSMAX || c == BNB4_NESTED_QUANT_MAP)) continue;
      bnb4_name(name, sizeof name, t->name, (bnb4_comp_t)c, o->q4_type);
      const bool bytes = c == BNB4_QUANT_STATE || (c == BNB4_ABSMAX && o->double_quant);
      add_out(p, name, bytes ? TY_DTYPE_U8 : TY_DTYPE_F32, 1, size[c], 0);
    }
  }
  p->first[l->ntensors] = p->nout;
  return rc;
}

static int write_json(const char *path, json_t *j, char *err, size_t errlen) {
  int r = ty_json_dump_file(j, path, JSON_INDENT(2));
  json_decref(j);
  return r ? ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: cannot write", path) : 0;
}

/* The source's config.json, as it is, with torch_dtype set where asked,
 * quantization_config added (quantize) or removed (dequantize). */
static int copy_config(const char *src, const char *out, const convert_opts_t *o,
                       const llama_config_t *cfg, char *err, size_t errlen) {
  char from[PATH_MAX + 16], to[PATH_MAX + 16];
  llama_config_path(src, from, sizeof from);
  json_error_t jerr;
  json_t *j = json_load_file(from, JSON_REJECT_DUPLICATES, &jerr);
  if (!j) return ty_errf(err, errlen, TY_EINVAL, "%s: %s", from, jerr.text);
  if (o->set_dtype) json_object_set_new(j, "torch_dtype", json_string(ty_dtype_name(o->dtype)));
  if (o->dequantize) json_object_del(j, "quantization_config");
  if (o->quantize) {
    const bnb4_config_t q = {o->q4_type, o->double_quant,
                             o->set_dtype ? o->dtype : cfg->torch_dtype};
    json_object_set_new(j, "quantization_config", bnb4_config_json(&q));
  }
  snprintf(to, sizeof to, "%s/config.json", out);
  return write_json(to, j, err, errlen);
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

/* A 4-bit source: config.json without its quantization_config (which must
 * agree with every weight's quant_state), then bnb4_match. */
static int open_q4(const char *src, json_t *cfgj, st_ckpt_t *st, ckpt_t **out, bnb4_info_t **info,
                   char *err, size_t errlen) {
  bnb4_config_t bc;
  const json_t *qc = json_object_get(cfgj, "quantization_config");
  int rc = qc ? bnb4_config_parse(qc, &bc, err, errlen) : 0;
  if (rc) return rc;
  json_object_del(cfgj, "quantization_config");
  llama_config_t cfg;
  llama_config_init(&cfg);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  if (llama_config_from_json(cfgj, &cfg, "", false, &errs) ||
      llama_config_validate(&cfg, "", &errs))
    rc = ty_errf(err, errlen, TY_EINVAL, "%s: config.json: %s: %s", src,
                 errs.len ? errs.items[0].field : "", errs.len ? errs.items[0].message : "invalid");
  ty_errlist_clear(&errs);
  if (rc) return rc;
  ckpt_t *ck = xcalloc(1, sizeof *ck);
  ck->st = st;
  if ((rc = ckpt_layout_init(&ck->layout, &cfg))) {
    ck->st = NULL, ckpt_close(ck);
    return ty_errf(err, errlen, rc, "%s/config.json: sizes too large for this build", src);
  }
  const size_t n = ck->layout.ntensors;
  ck->file_tensor = xcalloc(n + 1, sizeof *ck->file_tensor);
  *info = xcalloc(n + 1, sizeof **info);
  size_t nq4 = 0;
  char msg[768];
  if ((rc = bnb4_match(&ck->layout, st, ck->file_tensor, *info, &nq4, msg, sizeof msg)))
    ty_errf(err, errlen, rc, "%s: %s", src, msg);
  else if (!nq4)
    rc = ty_errf(err, errlen, TY_EINVAL, "%s: no weight is stored 4-bit: nothing to dequantize",
                 src);
  for (size_t i = 0; i < n && !rc && qc; i++) {
    const bnb4_state_t *s = &(*info)[i].state;
    if ((*info)[i].q4 && (s->type != bc.type || s->nested != bc.double_quant))
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "%s: tensor '%s' is %s%s but config.json's quantization_config says %s%s", src,
                   (*info)[i].comp[BNB4_QUANT_STATE]->name, q4_type_name(s->type),
                   s->nested ? " with double quant" : "", q4_type_name(bc.type),
                   bc.double_quant ? " with double quant" : "");
  }
  ck->st = rc ? NULL : ck->st; /* on failure the caller closes st */
  if (rc) ckpt_close(ck), free(*info), *info = NULL;
  *out = rc ? NULL : ck;
  return rc;
}

/* Opens src: a float checkpoint with ckpt_open, a 4-bit one (config.json
 * with a quantization_config, or a bitsandbytes quant_state tensor) only
 * for dequantize. info is the 4-bit source's, else NULL. */
static int open_source(const char *src, const convert_opts_t *o, ckpt_t **out, bnb4_info_t **info,
                       char *err, size_t errlen) {
  *out = NULL, *info = NULL;
  char path[PATH_MAX + 16], why[1024];
  llama_config_path(src, path, sizeof path);
  json_t *cfgj = ty_json_load_file(path, JSON_REJECT_DUPLICATES, why, sizeof why);
  st_ckpt_t *st = NULL;
  if (!cfgj || !json_is_object(cfgj) || st_open_flags(src, ST_OPEN_U8, &st, NULL, 0)) {
    json_decref(cfgj);
    return ckpt_open(src, out, err, errlen); /* it says what is wrong, as it always has */
  }
  const json_t *qc = json_object_get(cfgj, "quantization_config");
  const char *qs = NULL;
  for (size_t i = 0; i < st->ntensors && !qs; i++)
    if (strstr(st->tensors[i].name, ".quant_state.bitsandbytes__")) qs = st->tensors[i].name;
  char what[BNB4_NAME_MAX + 64];
  if (qc && !json_is_null(qc))
    snprintf(what, sizeof what, "config.json has a quantization_config");
  else
    snprintf(what, sizeof what, "tensor '%s' is a bitsandbytes quant_state", qs ? qs : "");
  const bool q4 = (qc && !json_is_null(qc)) || qs;
  int rc = 0;
  if (q4 && o->quantize)
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "%s is already quantized (%s); --quantize wants a float "
                 "checkpoint: write this one as floats with --dequantize first",
                 src, what);
  else if (q4 && !o->dequantize)
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "%s is a bitsandbytes 4-bit checkpoint (%s): add "
                 "--dequantize to write its weights as floats",
                 src, what);
  else if (!q4 && o->dequantize)
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "%s is not a bitsandbytes 4-bit checkpoint (no "
                 "quantization_config in config.json, no quant_state tensor): nothing to "
                 "dequantize",
                 src);
  else if (q4 && !(rc = open_q4(src, cfgj, st, out, info, err, errlen)))
    st = NULL; /* *out owns it */
  if (!q4 && !rc) rc = ckpt_open(src, out, err, errlen);
  st_close(st);
  json_decref(cfgj);
  return rc;
}

int ckpt_convert(const char *src, const char *out, const convert_opts_t *o, convert_stats_t *stats,
                 char *err, size_t errlen) {
  convert_stats_t s = {0};
  ckpt_t *ck = NULL;
  bnb4_info_t *info = NULL;
  int rc = check_out(src, out, err, errlen);
  if (!rc) rc = open_source(src, o, &ck, &info, err, errlen);
  if (rc) return rc;
  const ckpt_layout_t *l = &ck->layout;
  const size_t n = l->ntensors;
  plan_t p = {.ck = ck, .info = info, .o = o};
  p.mode = xcalloc(n + 1, sizeof *p.mode);
  p.dt = xcalloc(n + 1, sizeof *p.dt);
  p.offset = xcalloc(n + 1, sizeof *p.offset);
  p.first = xcalloc(n + 2, sizeof *p.first);
  size_t *cut = xcalloc(n + 2, sizeof *cut); /* file f holds entries [cut[f], cut[f+1]) */
  size_t *ocut = xcalloc(n + 2, sizeof *ocut);
  uint64_t *bytes = xcalloc(n + 1, sizeof *bytes);
  bufs_t b = {xmalloc(CONVERT_CHUNK), xmalloc(CONVERT_CHUNK), xmalloc(CONVERT_CHUNK), &s};
  const char **names = NULL;
  uint64_t total = 0;
  if ((rc = plan_make(&p, &b, err, errlen))) goto done;
  names = xcalloc(p.nout + 1, sizeof *names);
  for (size_t i = 0; i < n; i++) {
    for (size_t k = p.first[i]; k < p.first[i + 1]; k++) {
      bytes[i] += p.out[k].bytes;
      names[k] = p.out[k].name;
    }
    total += bytes[i];
    if (p.mode[i] == WRITE_COPY) continue;
    s.q4_weights++;
    s.q4_float_bytes +=
        (uint64_t)l->tensors[i].rows * (uint64_t)l->tensors[i].cols * ty_dtype_size(p.dt[i]);
    s.q4_bytes += p.mode[i] == WRITE_QUANTIZE ? bytes[i] : 0;
    for (int c = 0; c < BNB4_NCOMP && p.mode[i] == WRITE_DEQUANTIZE; c++)
      s.q4_bytes += info[i].comp[c] ? info[i].comp[c]->nbytes : 0;
  }
  const size_t nfiles = st_shard_plan(bytes, n, o->shard_bytes, cut);
  for (size_t f = 0; f <= nfiles; f++) ocut[f] = p.first[cut[f]];
  char path[PATH_MAX + 64], name[64];
  if ((rc = ty_mkdirs(out, err, errlen)) || (rc = copy_config(src, out, o, &l->cfg, err, errlen)))
    goto done;
  for (size_t f = 0; f < nfiles && !rc; f++) {
    st_shard_name(name, sizeof name, f, nfiles);
    snprintf(path, sizeof path, "%s/%s", out, name);
    rc = write_file(path, &p, cut[f], cut[f + 1], &b, err, errlen);
  }
  if (!rc && nfiles > 1) {
    snprintf(path, sizeof path, "%s/%s", out, ST_INDEX_NAME);
    rc = write_json(path, st_shard_index(names, ocut, nfiles, total), err, errlen);
  }
  s.tensors = p.nout;
  s.files = nfiles;
  if (stats) *stats = s;
done:
  free(b.src), free(b.dst), free(b.f32), free(cut), free(ocut), free(bytes), free(names);
  free(p.mode), free(p.dt), free(p.offset), free(p.first), free(p.out), free(info);
  ckpt_close(ck);
  return rc;
}
