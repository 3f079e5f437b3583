/* model_io.c - a whole model from a checkpoint or from the seeded
 * initialisation; see model_io.h. */
#include "worker/ckpt/model_io.h"
#include "worker/ckpt/ckpt_q4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/json_util.h"
#include "common/clock.h"
#include "worker/ckpt/checkpoint.h"
#include "common/memstat.h"
#include "worker/model/weightinit.h"

int model_io_read_config(const char *dir, llama_config_t *cfg, char *err, size_t errlen) {
  return ckpt_read_config(dir, cfg, err, errlen);
}

typedef struct {
  const ckpt_t *ck;
  void *stage;          /* staging for F16/BF16 tensors, sized to the largest */
  uint64_t done, total; /* file bytes read, and to read */
  loader_progress_fn progress;
  void *progress_ctx;
} load_ctx_t;

/* After tensor ft is in place: counts its bytes and says so. */
static void loaded(load_ctx_t *ctx, const st_tensor_t *ft) {
  ctx->done += ft->nbytes;
  if (ctx->progress) ctx->progress(ctx->progress_ctx, ctx->done, ctx->total);
}

static int fill_from_ckpt(void *vctx, const model_tensor_t *t, float *dst, char *err,
                          size_t errlen) {
  load_ctx_t *ctx = vctx;
  const ckpt_layout_t *l = &ctx->ck->layout;
  for (size_t i = 0; i < l->ntensors; i++) {
    if (strcmp(l->tensors[i].name, t->name) != 0) continue;
    const st_tensor_t *ft = ctx->ck->file_tensor[i];
    const bnb4_info_t *q4 = ckpt_q4_info(ctx->ck, i);
    if ((q4 ? q4->nelem : ft->nelem) != t->numel) break;
    int rc;
    if (q4) { /* a bitsandbytes 4-bit weight: the floats it stands for */
      rc = ckpt_read_f32(ctx->ck, i, dst, err, errlen);
    } else if (ft->dtype == TY_DTYPE_F32) {
      rc = st_read(ctx->ck->st, ft, 0, dst, ft->nbytes, err, errlen);
    } else {
      rc = st_read(ctx->ck->st, ft, 0, ctx->stage, ft->nbytes, err, errlen);
      if (!rc) ty_dtype_to_f32(ft->dtype, ctx->stage, dst, ft->nelem);
    }
    if (!rc) loaded(ctx, ft);
    return rc;
  }
  snprintf(err, errlen,
           "tensor %s of the model has no counterpart of %zu elements in the "
           "checkpoint",
           t->name, t->numel);
  return TY_EINVAL;
}

int model_io_load(model_t *m, const char *dir, loader_progress_fn progress, void *progress_ctx,
                  loader_stats_t *stats, char *err, size_t errlen) {
  double t0 = ty_mono_s();
  ckpt_t *ck;
  int rc = ckpt_open(dir, &ck, err, errlen);
  if (rc) return rc;
  if ((size_t)m->n_tensors != ck->layout.ntensors) {
    snprintf(err, errlen,
             "checkpoint %s has %zu tensors, the model %d: its config.json "
             "differs from the model's",
             dir, ck->layout.ntensors, m->n_tensors);
    ckpt_close(ck);
    return TY_EINVAL;
  }
  size_t stage = 0;
  uint64_t total = 0;
  for (size_t i = 0; i < ck->layout.ntensors; i++) {
    const st_tensor_t *ft = ck->file_tensor[i];
    if (ft->dtype != TY_DTYPE_F32 && ft->nbytes > stage) stage = ft->nbytes;
    total += ft->nbytes;
  }
  load_ctx_t ctx = {ck, stage ? malloc(stage) : NULL, 0, total, progress, progress_ctx};
  if (stage && !ctx.stage) {
    snprintf(err, errlen, "cannot allocate a %zu-byte staging buffer", stage);
    rc = TY_EEXHAUSTED;
  } else {
    rc = model_fill(m, fill_from_ckpt, &ctx, err, errlen);
  }
  free(ctx.stage);
  ckpt_close(ck);
  if (!rc && stats) {
    memstat_t ms;
    memstat_read(&ms);
    *stats = (loader_stats_t){.bytes_read = ctx.done,
                              .bytes_total = total,
                              .shard_bytes = (uint64_t)m->n_params * sizeof(float),
                              .host_peak_bytes = ms.hwm_bytes,
                              .device_peak_bytes = (uint64_t)m->n_params * sizeof(float),
                              .load_seconds = ty_mono_s() - t0};
  }
  return rc;
}

static int fill_scratch(void *vctx, const model_tensor_t *t, float *dst, char *err, size_t errlen) {
  uint64_t seed = *(const uint64_t *)vctx;
  winit_fill(winit_stream(seed, t->name), winit_is_norm(t->name), 0, dst, t->numel);
  return 0;
}

void model_io_init_scratch(model_t *m, uint64_t seed) {
  char err[64];
  /* fill_scratch cannot fail. */
  (void)model_fill(m, fill_scratch, &seed, err, sizeof err);
}

bool model_io_quantized(const char *dir) {
  char path[4096];
  llama_config_path(dir, path, sizeof path);
  json_t *cfg = ty_json_load_file(path, 0, NULL, 0);
  const json_t *qc = json_object_get(cfg, "quantization_config");
  const bool q = qc && !json_is_null(qc);
  json_decref(cfg);
  return q;
}
