/* merge.c - a LoRA adapter merged into its base checkpoint, tensor by
 * tensor; see merge.h. */
#include "worker/ckpt/merge.h"
#include "worker/ckpt/ckpt_q4.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>
#include <jansson.h>

#include "api/llama_config.h"
#include "common/beneath.h"
#include "common/errors.h"
#include "common/json_util.h"
#include "common/xalloc.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_convert.h"
#include "worker/ckpt/outputs.h"
#include "worker/ckpt/safetensors.h"

/* The files beside a checkpoint that an inference server reads with it,
 * copied when present: the tokenizer (fast and slow forms) and the
 * generation defaults. */
static const char *const g_side_files[] = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
};
#define SIDE_N (sizeof g_side_files / sizeof g_side_files[0])

/* The adapter's projection on layer kind k, or -1 (not a projection). */
static int target_of(ckpt_kind_t k) {
  switch (k) {
    case CKPT_WQ:
      return JOBSPEC_TARGET_BIT_Q;
    case CKPT_WK:
      return JOBSPEC_TARGET_BIT_K;
    case CKPT_WV:
      return JOBSPEC_TARGET_BIT_V;
    case CKPT_WO:
      return JOBSPEC_TARGET_BIT_O;
    case CKPT_WGATE:
      return JOBSPEC_TARGET_BIT_GATE;
    case CKPT_WUP:
      return JOBSPEC_TARGET_BIT_UP;
    case CKPT_WDOWN:
      return JOBSPEC_TARGET_BIT_DOWN;
    default:
      return -1;
  }
}

/* Removes a folder of plain files (a merged checkpoint, or the part of
 * one); a missing folder is no error. */
static int remove_flat_dir(const char *dir, char *err, size_t errlen) {
  DIR *d = ty_beneath_opendir(dir, NULL, 0);
  if (!d) return errno == ENOENT ? 0 : ty_errf(err, errlen, TY_EPERM, "%s: cannot open", dir);
  char path[PATH_MAX];
  int rc = 0;
  for (struct dirent *e; !rc && (e = readdir(d)) != NULL;) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    rc = ty_beneath_remove(path, false, err, errlen);
  }
  closedir(d);
  return rc ? rc : ty_beneath_remove(dir, true, err, errlen);
}

/* Copies the file from onto to, both through the roots. */
static int copy_file(const char *from, const char *to, char *err, size_t errlen) {
  int in = ty_beneath_open(from, O_RDONLY, 0, err, errlen);
  if (in < 0) return in;
  int out = ty_beneath_open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644, err, errlen);
  if (out < 0) {
    close(in);
    return out;
  }
  char buf[65536];
  int rc = 0;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0 || write(out, buf, (size_t)n) != n) {
      rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "copying %s to %s: %s", from, to, strerror(errno));
      break;
    }
  }
  close(in);
  if (close(out) != 0 && !rc)
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "%s: %s", to, strerror(errno));
  return rc;
}

/* config.json (torch_dtype set where asked) and the side files present
 * in the base's folder into dir. */
static int copy_side(const char *model_path, const char *dir, const merge_opts_t *o,
                     merge_stats_t *s, char *err, size_t errlen) {
  char cfg_path[PATH_MAX], from[PATH_MAX + 64], to[PATH_MAX + 64];
  llama_config_path(model_path, cfg_path, sizeof cfg_path);
  json_t *cfg = ty_json_load_file(cfg_path, JSON_REJECT_DUPLICATES, err, errlen);
  if (!cfg) return TY_EINVAL;
  if (o->set_dtype) json_object_set_new(cfg, "torch_dtype", json_string(ty_dtype_name(o->dtype)));
  /* A 4-bit base merges into floats (as peft's merge_and_unload): the
   * merged model is not quantized. */
  if (json_object_get(cfg, "quantization_config")) {
    json_object_del(cfg, "quantization_config");
    s->dequantized = true;
  }
  snprintf(to, sizeof to, "%s/config.json", dir);
  int rc = ty_json_write_file(cfg, to, JSON_INDENT(2), err, errlen);
  json_decref(cfg);
  if (rc) return rc;
  s->files_copied++;
  char *slash = strrchr(cfg_path, '/');
  if (slash) *slash = '\0';
  for (size_t i = 0; i < SIDE_N && !rc; i++) {
    struct stat st;
    snprintf(from, sizeof from, "%s/%s", slash ? cfg_path : ".", g_side_files[i]);
    if (ty_beneath_stat(from, &st, NULL, 0) != 0 || !S_ISREG(st.st_mode)) continue;
    snprintf(to, sizeof to, "%s/%s", dir, g_side_files[i]);
    if (!(rc = copy_file(from, to, err, errlen))) s->files_copied++;
  }
  return rc;
}

/* The scratch of a merge: chunk buffers and the fp32 tensor, one buffer
 * grown to the largest adapted tensor so far (not one allocation each). */
typedef struct {
  void *src, *dst; /* CONVERT_CHUNK bytes each */
  float *f32;      /* CONVERT_CHUNK bytes */
  float *W;        /* wcap floats */
  size_t wcap;
} bufs_t;

/* Streams tensor i of the base into w unchanged but for the dtype. */
static int copy_tensor(st_writer_t *w, const ckpt_t *ck, size_t i, ty_dtype_t dt, bufs_t *b,
                       merge_stats_t *s, char *err, size_t errlen) {
  const st_tensor_t *ft = ck->file_tensor[i];
  const size_t in_es = ty_dtype_size(ft->dtype), out_es = ty_dtype_size(dt);
  const uint64_t per = CONVERT_CHUNK / sizeof(float);
  int rc = 0;
  for (uint64_t at = 0; at < ft->nelem && !rc; at += per) {
    size_t m = ft->nelem - at < per ? (size_t)(ft->nelem - at) : (size_t)per;
    rc = st_read(ck->st, ft, at * in_es, b->src, m * in_es, err, errlen);
    if (rc) break;
    const void *out = b->src;
    if (ft->dtype != dt) {
      ty_dtype_to_f32(ft->dtype, b->src, b->f32, m);
      ty_dtype_from_f32(dt, b->f32, b->dst, m);
      out = b->dst;
    }
    rc = st_writer_write(w, out, m * out_es, err, errlen);
    s->bytes_written += m * out_es;
  }
  return rc;
}

/* Tensor i of the base, W (OUT, IN), written as W + scale * B @ A (p
 * NULL: W alone): read whole into fp32 (a 4-bit weight dequantized,
 * ckpt_read_f32), the product added by one sgemm, written in dt. */
static int merge_tensor(st_writer_t *w, const ckpt_t *ck, size_t i, const lora_pair_t *p,
                        const lora_t *lo, const ckpt_q4_kind_t *fake, ty_dtype_t dt, bufs_t *b,
                        merge_stats_t *s, char *err, size_t errlen) {
  const ckpt_tensor_t *t = &ck->layout.tensors[i];
  const st_tensor_t *ft = ck->file_tensor[i];
  const bnb4_info_t *q4 = ckpt_q4_info(ck, i);
  const size_t n = q4 ? (size_t)q4->nelem : (size_t)ft->nelem, in_es = ty_dtype_size(ft->dtype);
  const size_t out_es = ty_dtype_size(dt);
  if (n > b->wcap) {
    free(b->W);
    b->wcap = 0;
    if (!(b->W = malloc(n * sizeof(float))))
      return ty_errf(err, errlen, TY_EEXHAUSTED, "%s: no memory for its %zu floats", t->name, n);
    b->wcap = n;
  }
  float *W = b->W;
  if (n * sizeof(float) > s->largest_tensor) s->largest_tensor = n * sizeof(float);
  const size_t per = CONVERT_CHUNK / sizeof(float);
  int rc = q4 ? ckpt_read_f32(ck, i, W, err, errlen) : 0;
  for (size_t at = 0; at < n && !rc && !q4; at += per) {
    size_t m = n - at < per ? n - at : per;
    if (ft->dtype == TY_DTYPE_F32) {
      rc = st_read(ck->st, ft, at * in_es, W + at, m * in_es, err, errlen);
    } else if (!(rc = st_read(ck->st, ft, at * in_es, b->src, m * in_es, err, errlen))) {
      ty_dtype_to_f32(ft->dtype, b->src, W + at, m);
    }
  }
  if (!rc && fake && (rc = ckpt_q4_roundtrip(fake, W, n)))
    ty_errf(err, errlen, rc, "%s: no memory to quantize it", t->name);
  if (!rc && p)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t->rows, (int)t->cols, lo->R,
                lo->scale, p->B, lo->R, p->A, (int)t->cols, 1.0f, W, (int)t->cols);
  for (size_t at = 0; at < n && !rc; at += per) {
    size_t m = n - at < per ? n - at : per;
    const void *out = W + at;
    if (dt != TY_DTYPE_F32) {
      ty_dtype_from_f32(dt, W + at, b->dst, m);
      out = b->dst;
    }
    rc = st_writer_write(w, out, m * out_es, err, errlen);
    s->bytes_written += m * out_es;
  }
  return rc;
}

/* The adapter must be one for this model: its layers, and each targeted
 * projection's (OUT, IN) the checkpoint's. */
static int check_adapter(const lora_t *lo, const ckpt_layout_t *l, char *err, size_t errlen) {
  if (lo->L != (int)l->cfg.num_hidden_layers)
    return ty_errf(err, errlen, TY_EINVAL,
                   "the adapter has %d layers but the model's config.json has %lld; it was "
                   "trained for another model",
                   lo->L, (long long)l->cfg.num_hidden_layers);
  for (size_t i = 0; i < l->ntensors; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    int tg = t->layer >= 0 ? target_of(t->kind) : -1;
    if (tg < 0 || !lora_has_target(lo, tg)) continue;
    if (lo->out[tg] != t->rows || lo->in[tg] != t->cols)
      return ty_errf(err, errlen, TY_EINVAL,
                     "the adapter's %s is for a [%d, %d] projection but %s is [%lld, %lld]; it "
                     "was trained for another model",
                     jobspec_target_name(tg), lo->out[tg], lo->in[tg], t->name, (long long)t->rows,
                     (long long)t->cols);
  }
  return 0;
}

/* The merged model's weights into dir: model.safetensors, or files of at
 * most o->shard_bytes each with their index. */
static int write_weights(const ckpt_t *ck, const lora_t *lo, const char *dir, const merge_opts_t *o,
                         merge_stats_t *s, char *err, size_t errlen) {
  const ckpt_layout_t *l = &ck->layout;
  st_desc_t *d = xcalloc(l->ntensors + 1, sizeof *d);
  uint64_t *bytes = xcalloc(l->ntensors + 1, sizeof *bytes), total = 0;
  const char **names = xcalloc(l->ntensors + 1, sizeof *names);
  size_t *cut = xcalloc(l->ntensors + 2, sizeof *cut); /* file f holds [cut[f], cut[f+1]) */
  for (size_t i = 0; i < l->ntensors; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    const bnb4_info_t *q4 = ckpt_q4_info(ck, i); /* written as the dtype it was quantized from */
    const ty_dtype_t file_dt = q4 ? q4->state.dtype : ck->file_tensor[i]->dtype;
    d[i] = (st_desc_t){t->name, o->set_dtype ? o->dtype : file_dt, t->ndim, {t->rows, t->cols}};
    bytes[i] = (uint64_t)(t->rows * t->cols) * ty_dtype_size(d[i].dtype);
    names[i] = t->name;
    total += bytes[i];
  }
  const size_t nfiles = st_shard_plan(bytes, l->ntensors, o->shard_bytes, cut);
  static const char *const md[] = {"format", "pt", NULL};
  bufs_t b = {xmalloc(CONVERT_CHUNK), xmalloc(CONVERT_CHUNK), xmalloc(CONVERT_CHUNK), NULL, 0};
  char path[PATH_MAX + 64], name[64];
  int rc = 0;
  for (size_t f = 0; f < nfiles && !rc; f++) {
    st_shard_name(name, sizeof name, f, nfiles);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    st_writer_t *w = NULL;
    rc = st_writer_open(path, d + cut[f], cut[f + 1] - cut[f], md, &w, err, errlen);
    for (size_t i = cut[f]; i < cut[f + 1] && !rc; i++) {
      const ckpt_tensor_t *t = &l->tensors[i];
      int tg = t->layer >= 0 ? target_of(t->kind) : -1;
      /* A QLoRA job's float base: its projections as 4 bits kept them. */
      const ckpt_q4_kind_t *fake = o->q4 && !ck->q4 && ckpt_q4_projection(t->name) ? o->q4 : NULL;
      if (tg >= 0 && lora_has_target(lo, tg)) {
        rc = merge_tensor(w, ck, i, &lo->w[t->layer * JOBSPEC_TARGET_COUNT + tg], lo, fake,
                          d[i].dtype, &b, s, err, errlen);
        s->merged++;
      } else if (ckpt_q4_info(ck, i) || fake) {
        rc = merge_tensor(w, ck, i, NULL, lo, fake, d[i].dtype, &b, s, err, errlen);
      } else {
        rc = copy_tensor(w, ck, i, d[i].dtype, &b, s, err, errlen);
      }
      s->tensors++;
    }
    if (w && rc) {
      char ignored[8];
      st_writer_close(w, ignored, sizeof ignored);
    } else if (w) {
      rc = st_writer_close(w, err, errlen);
    }
  }
  if (!rc && nfiles > 1) {
    snprintf(path, sizeof path, "%s/%s", dir, ST_INDEX_NAME);
    json_t *idx = st_shard_index(names, cut, nfiles, total);
    rc = ty_json_write_file(idx, path, JSON_INDENT(2), err, errlen);
    json_decref(idx);
  }
  s->files = nfiles;
  free(b.src), free(b.dst), free(b.f32), free(b.W), free(d), free(bytes), free(names), free(cut);
  return rc;
}

int ckpt_merge(const char *model_path, const lora_t *lo, const char *out, const merge_opts_t *o,
               merge_stats_t *stats, char *err, size_t errlen) {
  merge_stats_t s = {0};
  char part[PATH_MAX];
  struct stat st;
  if (snprintf(part, sizeof part, "%s.partial", out) >= (int)sizeof part)
    return ty_errf(err, errlen, TY_EINVAL, "%s: path too long", out);
  if (!o->replace && ty_beneath_stat(out, &st, NULL, 0) == 0)
    return ty_errf(err, errlen, TY_EEXISTS,
                   "%s already exists; merge never writes over it: remove it, or give another "
                   "output folder",
                   out);
  ckpt_t *ck = NULL;
  int rc = ckpt_open(model_path, &ck, err, errlen);
  if (!rc) rc = check_adapter(lo, &ck->layout, err, errlen);
  /* A part left by a merge that was killed is stale: start again. */
  if (!rc) rc = remove_flat_dir(part, err, errlen);
  if (!rc) rc = ty_beneath_mkdirs(part, err, errlen);
  if (!rc) rc = copy_side(model_path, part, o, &s, err, errlen);
  if (!rc) rc = write_weights(ck, lo, part, o, &s, err, errlen);
  ckpt_close(ck);
  if (!rc && o->replace) rc = remove_flat_dir(out, err, errlen);
  if (!rc) rc = ty_beneath_rename(part, out, err, errlen);
  if (rc) {
    char ignored[8];
    remove_flat_dir(part, ignored, sizeof ignored);
    return rc;
  }
  if (stats) *stats = s;
  return 0;
}

int ckpt_merge_dir(const char *model_path, const char *adapter_dir, const char *out,
                   const merge_opts_t *o, merge_stats_t *stats, char *err, size_t errlen) {
  llama_config_t cfg;
  int rc = ckpt_read_config(model_path, &cfg, err, errlen);
  if (rc) return rc;
  model_t *m = NULL;
  lora_t *lo = NULL;
  char why[1024];
  rc = model_create_table(&m, &cfg, 1, 1, MODEL_EVAL, err, errlen);
  if (!rc && (rc = outputs_read_adapter(adapter_dir, m, &lo, why, sizeof why)))
    ty_errf(err, errlen, rc, "%s (is it an adapter for the model at %s?)", why, model_path);
  if (!rc) rc = ckpt_merge(model_path, lo, out, o, stats, err, errlen);
  lora_free(lo);
  model_free(m);
  return rc;
}

int merge_write_outputs(const char *output_dir, const lora_t *lo, const char *model_path,
                        const ckpt_q4_kind_t *q4, char *err, size_t errlen) {
  char out[PATH_MAX];
  if (snprintf(out, sizeof out, "%s/%s", output_dir, MERGE_OUTPUT_DIR) >= (int)sizeof out)
    return ty_errf(err, errlen, TY_EINVAL, "%s: path too long", output_dir);
  const merge_opts_t o = {.replace = true, .shard_bytes = MERGE_SHARD_BYTES, .q4 = q4};
  char why[2048];
  int rc = ckpt_merge(model_path, lo, out, &o, NULL, why, sizeof why);
  return rc ? ty_errf(err, errlen, rc, "merge_adapter: %s", why) : 0;
}
