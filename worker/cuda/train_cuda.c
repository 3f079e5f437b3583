/* train_cuda.c - training on GPU ranks: the loader into a CUDA placement
 * (or a host span copied there), model_cuda's passes, and the loop's
 * device hooks; see train_cuda.h. */
#include "worker/cuda/train_cuda.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "worker/cuda/backend_cuda.h"
#include "worker/cuda/mem_cuda.h"
#include "worker/cuda/model_cuda.h"
#include "worker/cuda/placement_cuda.h"

/* Full training: where a run of the host span's floats lies in the device
 * shard (a tensor of a host model, or a host shard's whole span). */
typedef struct {
  size_t host_off; /* floats from the host span's start */
  size_t dev_off;  /* bytes from the shard's base (and the gradients') */
  size_t numel;
} tc_map_t;

struct train_cuda {
  placement_t pl;
  bool pl_ready;
  cuda_backend_t *cb;
  loader_shard_t *shard;
  model_cuda_t *mc;
  size_t n;      /* floats of the trained span: adapters, the host model, or the shard */
  tc_map_t *map; /* full training: [n_map], else NULL */
  int n_map;
  float *m, *v; /* full training: AdamW's moments on the device, laid out as the shard */
  char name[32];
};

/* TY_EINTERNAL with what failed and CUDA's reason, or 0. */
static int cuda_check(cudaError_t e, const char *what, char *err, size_t errlen) {
  return e == cudaSuccess
             ? 0
             : ty_errf(err, errlen, TY_EINTERNAL, "%s: %s", what, cudaGetErrorString(e));
}

static int span_check(const train_cuda_t *t, size_t n, char *err, size_t errlen) {
  return n == t->n ? 0
                   : ty_errf(err, errlen, TY_EINTERNAL,
                             "%s: the trained span holds %zu floats on the device, not %zu",
                             t->name, t->n, n);
}

static int tc_forward(void *ctx, const model_batch_t *batch, double *loss, char *err,
                      size_t errlen) {
  train_cuda_t *tc = ctx;
  return model_cuda_forward_batch(tc->mc, batch, loss, err, errlen);
}

static int tc_backward(void *ctx, float loss_scale, char *err, size_t errlen) {
  return model_cuda_backward(((train_cuda_t *)ctx)->mc, loss_scale, err, errlen);
}

static int tc_row_losses(void *ctx, double *sums, char *err, size_t errlen) {
  return model_cuda_row_losses(((train_cuda_t *)ctx)->mc, sums, err, errlen);
}
static int tc_row_scales(void *ctx, const float *scales, char *err, size_t errlen) {
  return model_cuda_set_row_scales(((train_cuda_t *)ctx)->mc, scales, err, errlen);
}
static void tc_adapters_on(void *ctx, bool on) {
  model_cuda_adapters_on(((train_cuda_t *)ctx)->mc, on);
}

static int tc_zero_grads(void *ctx, char *err, size_t errlen) {
  train_cuda_t *tc = ctx;
  if (tc->map)
    return cuda_check(cudaMemset(model_cuda_base_grads(tc->mc), 0, tc->shard->bytes),
                      "clearing the weights' gradients", err, errlen);
  return cuda_check(cudaMemset(model_cuda_lora_grads(tc->mc), 0, tc->n * sizeof(float)),
                    "clearing the adapters' gradients", err, errlen);
}

/* Full training: the host span to or from the device shard's layout
 * (dev: the weights, or a buffer laid out as them). */
static int map_copy(const train_cuda_t *tc, float *host, char *dev, enum cudaMemcpyKind kind,
                    const char *what, char *err, size_t errlen) {
  for (int i = 0; i < tc->n_map; i++) {
    const tc_map_t *e = &tc->map[i];
    float *h = host + e->host_off;
    char *d = dev + e->dev_off;
    cudaError_t ce = kind == cudaMemcpyHostToDevice
                         ? cudaMemcpy(d, h, e->numel * sizeof(float), kind)
                         : cudaMemcpy(h, d, e->numel * sizeof(float), kind);
    if (ce != cudaSuccess) return cuda_check(ce, what, err, errlen);
  }
  return 0;
}

/* LoRA: the adapters' gradients down and parameters up once a step
 * (full training keeps both on the device: its optimizer runs there).
 * cudaMemcpy on the legacy default stream waits for the queued passes. */
static int tc_grads_to_host(void *ctx, float *grads, size_t n, char *err, size_t errlen) {
  train_cuda_t *tc = ctx;
  int rc = span_check(tc, n, err, errlen);
  return rc ? rc
            : cuda_check(cudaMemcpy(grads, model_cuda_lora_grads(tc->mc), n * sizeof(float),
                                    cudaMemcpyDeviceToHost),
                         "copying the adapters' gradients to the host", err, errlen);
}

static int tc_params_from_host(void *ctx, const float *params, size_t n, char *err, size_t errlen) {
  train_cuda_t *tc = ctx;
  int rc = span_check(tc, n, err, errlen);
  return rc ? rc
            : cuda_check(cudaMemcpy(model_cuda_lora_params(tc->mc), params, n * sizeof(float),
                                    cudaMemcpyHostToDevice),
                         "copying the adapters to the device", err, errlen);
}

/* --- Full training's optimizer on the device (train_device_t's adamw hooks). */

static int tc_grad_sumsq(void *ctx, double *sumsq, char *err, size_t errlen) {
  train_cuda_t *tc = ctx;
  int rc =
      cuda_sumsq(tc->cb, model_cuda_base_grads(tc->mc), tc->shard->bytes / sizeof(float), sumsq);
  return rc ? ty_errf(err, errlen, TY_EINTERNAL, "%s: the gradients' norm failed", tc->name) : 0;
}

/* One AdamW step per tensor of the shard (its padding untouched), norm
 * gains without weight decay, as the host's optimizer excludes them. */
static int tc_adamw(void *ctx, const optim_t *o, double lr, double grad_scale, char *err,
                    size_t errlen) {
  train_cuda_t *tc = ctx;
  const cuda_adamw_cfg_t c = {lr, o->cfg.beta1, o->cfg.beta2, o->cfg.eps, o->cfg.weight_decay};
  float *p = tc->shard->base, *g = model_cuda_base_grads(tc->mc);
  for (size_t i = 0; i < tc->shard->layout.ntensors; i++) {
    const loader_view_t *v = &tc->shard->views[i];
    size_t off = v->offset / sizeof(float);
    cuda_adamw_step(tc->cb, p + off, g + off, tc->m + off, tc->v + off, v->nbytes / sizeof(float),
                    &c, o->t + 1, grad_scale, v->t->ndim == 2);
  }
  model_cuda_base_changed(tc->mc);
  return cuda_check(cudaGetLastError(), "the AdamW step", err, errlen);
}

/* The span and the moments between the host and the device. */
static int state_copy(train_cuda_t *tc, float *const host[3], enum cudaMemcpyKind kind, size_t n,
                      char *err, size_t errlen) {
  int rc = span_check(tc, n, err, errlen);
  char *dev[3] = {tc->shard->base, (char *)tc->m, (char *)tc->v};
  for (int k = 0; k < 3 && !rc; k++)
    rc = map_copy(tc, host[k], dev[k], kind, "moving the optimizer's state", err, errlen);
  return rc;
}
static int tc_state_to_host(void *ctx, float *params, float *m, float *v, size_t n, char *err,
                            size_t errlen) {
  float *const host[3] = {params, m, v};
  return state_copy(ctx, host, cudaMemcpyDeviceToHost, n, err, errlen);
}
static int tc_state_from_host(void *ctx, const float *params, const float *m, const float *v,
                              size_t n, char *err, size_t errlen) {
  float *const host[3] = {(float *)params, (float *)m, (float *)v};
  model_cuda_base_changed(((train_cuda_t *)ctx)->mc);
  return state_copy(ctx, host, cudaMemcpyHostToDevice, n, err, errlen);
}

/* Full training: the host model's tensors matched by name to the shard's,
 * and the loaded weights brought down into the host model. */
static int map_build(train_cuda_t *t, model_t *host, char *err, size_t errlen) {
  if (!host || !host->params)
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "%s: training every weight needs the host's weights-only model", t->name);
  t->map = xcalloc((size_t)host->n_tensors, sizeof *t->map);
  for (int i = 0; i < host->n_tensors; i++) {
    const model_tensor_t *ht = &host->tensors[i];
    const loader_view_t *v = loader_view_by_name(t->shard, ht->name);
    if (!v || v->nbytes != ht->numel * sizeof(float))
      return ty_errf(err, errlen, TY_EINTERNAL, "%s: tensor %s has no float32 match on the device",
                     t->name, ht->name);
    t->map[t->n_map++] = (tc_map_t){ht->offset, v->offset, ht->numel};
  }
  t->n = host->n_params;
  return map_copy(t, host->params, t->shard->base, cudaMemcpyDeviceToHost,
                  "copying the loaded weights to the host", err, errlen);
}

/* Full training over GPUs: the host span's shard copied onto the device,
 * the same layout, so the span maps onto it as one run. */
static int span_upload(train_cuda_t *t, const fsdp_t *span, char *err, size_t errlen) {
  const loader_shard_t *hs = fsdp_shard(span);
  if (hs->dtype != TY_DTYPE_F32 || fsdp_span(span) * sizeof(float) != hs->bytes)
    return ty_errf(err, errlen, TY_EINTERNAL, "%s: the host span is not a float32 shard", t->name);
  t->n = fsdp_span(span);
  t->map = xcalloc(1, sizeof *t->map);
  t->map[t->n_map++] = (tc_map_t){0, 0, t->n};
  return loader_shard_upload(hs, &t->pl, &t->shard, err, errlen);
}

int train_cuda_create(train_cuda_t **out, const jobspec_t *spec, const llama_config_t *cfg,
                      comm_t *comm, int device, const train_cuda_trained_t *tr, int B, int T,
                      loader_stats_t *ls, train_device_t *dev, char *err, size_t errlen) {
  *out = NULL;
  const lora_t *lora = tr->lora;
  if (!!tr->lora + !!tr->host + !!tr->span != 1)
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "train_cuda: train adapters, a host model or a span: exactly one");
  train_cuda_t *t = xcalloc(1, sizeof *t);
  snprintf(t->name, sizeof t->name, "cuda:%d", device);
  size_t bucket = (size_t)spec->fsdp.bucket_mb << 20;
  int rc = placement_cuda_init(&t->pl, device, bucket, err, errlen);
  t->pl_ready = rc == 0;
  if (!rc) rc = cuda_backend_create(&t->cb, device, err, errlen);
  if (!rc && tr->span) {
    rc = span_upload(t, tr->span, err, errlen);
  } else if (!rc) {
    loader_opts_t o = {.rank = comm_rank(comm),
                       .world_size = comm_world_size(comm),
                       .dtype = spec->dtype,
                       .memory_efficient = spec->fsdp.memory_efficient_load,
                       .bucket_bytes = bucket,
                       .seed = spec->train.seed,
                       .pl = &t->pl};
    rc = spec->init_from_scratch ? loader_init_scratch(cfg, &o, &t->shard, ls, err, errlen)
                                 : loader_load(spec->model_path, &o, &t->shard, ls, err, errlen);
  }
  /* Several ranks gather their shards unit by unit, two slots: the next
   * unit's gather overlaps the current unit's computation. */
  comm_t *gather = comm_world_size(comm) > 1 ? comm : NULL;
  if (!rc)
    rc = model_cuda_create(&t->mc, t->cb, t->shard, lora, gather, 2, B, T,
                           spec->gradient_checkpointing, err, errlen);
  if (!rc && tr->host) rc = map_build(t, tr->host, err, errlen);
  /* Full training: AdamW's moments beside the shard. */
  if (!rc && !lora &&
      (mem_cuda_alloc((void **)&t->m, t->shard->bytes) ||
       mem_cuda_alloc((void **)&t->v, t->shard->bytes) ||
       cudaMemset(t->m, 0, t->shard->bytes) != cudaSuccess ||
       cudaMemset(t->v, 0, t->shard->bytes) != cudaSuccess)) {
    cudaGetLastError();
    rc = ty_errf(err, errlen, TY_EEXHAUSTED,
                 "%s: no device memory for AdamW's moments (2 x %.1f MiB; use more GPUs)", t->name,
                 (double)t->shard->bytes / 1048576.0);
  }
  if (rc) {
    mem_cuda_explain(rc, err, errlen);
    train_cuda_free(t);
    return rc;
  }
  if (lora) t->n = model_cuda_lora_size(t->mc);
  /* The rank's device peak: the load's, or what training holds (the shard,
   * the activations, the adapters or the gradients and AdamW's moments, any
   * unit slots), whichever is more. A span was loaded on the host: the
   * device saw only its copy. */
  uint64_t held = t->pl.in_use + model_cuda_bytes(t->mc) + (t->m ? 2 * t->shard->bytes : 0);
  if (ls && tr->span) ls->device_peak_bytes = t->pl.peak;
  if (ls && held > ls->device_peak_bytes) ls->device_peak_bytes = held;
  *dev = (train_device_t){.ctx = t,
                          .forward = tc_forward,
                          .backward = tc_backward,
                          .zero_grads = tc_zero_grads,
                          .row_losses = tc_row_losses,
                          .row_scales = tc_row_scales,
                          .adapters_on = lora ? tc_adapters_on : NULL};
  if (lora) {
    dev->grads_to_host = tc_grads_to_host;
    dev->params_from_host = tc_params_from_host;
  } else {
    dev->grad_sumsq = tc_grad_sumsq;
    dev->adamw = tc_adamw;
    dev->state_to_host = tc_state_to_host;
    dev->state_from_host = tc_state_from_host;
  }
  *out = t;
  return 0;
}

void train_cuda_free(train_cuda_t *t) {
  if (!t) return;
  free(t->map);
  mem_cuda_free(t->m);
  mem_cuda_free(t->v);
  model_cuda_free(t->mc);
  loader_shard_free(t->shard);
  if (t->pl_ready) placement_cuda_free(&t->pl);
  cuda_backend_free(t->cb);
  free(t);
}

size_t train_cuda_buffer_bytes(const train_cuda_t *t) {
  return model_cuda_bytes(t->mc);
}
