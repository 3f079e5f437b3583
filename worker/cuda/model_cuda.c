/* model_cuda.c - the Llama decoder's LoRA training step on a GPU (see
 * model_cuda.h): model_step.c's order of operations on the kernels of
 * backend_cuda.h, base weights read in place from a whole CUDA loader
 * shard, or from the unit slots of worker/cuda/prefetch_cuda.h. */
#include "worker/cuda/model_cuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/errors.h"
#include "api/jobspec.h"
#include "api/model_acts.h"
#include "common/rankenv.h"
#include "common/xalloc.h"
#include "worker/cuda/mem_cuda.h"

#define TC JOBSPEC_TARGET_COUNT

/* The device buffers are api/model_acts.h's MODEL_ACTS_CUDA, the table
 * the memory rules at submit count from (llama_device_activation_bytes). */

struct model_cuda {
  model_dims_t d;
  int B, T, b, t;
  int hc;          /* rows of logits a head chunk holds (head_rows) */
  bool recompute;  /* one layer slot: layers run forward again in the backward pass */
  bool logits_all; /* the last forward's logits are all in m->logits (one chunk) */
  bool head_fused; /* the last forward ran the head's backward too (LoRA, in chunks) */
  ty_dtype_t wdt;  /* the base weights' dtype */
  cuda_backend_t *cb;
  const loader_shard_t *base;
  prefetch_cuda_t *pc; /* sharded base: the units' slots, else NULL */
  prefetch_t *units;
  int *order;            /* the passes' units: forward (L + 2), then backward (L + 1) */
  const lora_t *lo;      /* NULL: full training */
  float *gbase;          /* full training: the base's gradients, laid out as base */
  float *gunit;          /* full training over a shard: one unit's whole gradients, laid out as
                          * the unit lies in a slot, reduce-scattered into gbase */
  int *tokens, *targets; /* device (B*T) */
  int *pos;              /* device (B*T): the batch's positions, when has_pos */
  float *weights;        /* device (B*T): its loss weights, when has_weights */
  bool has_pos, has_weights;
  /* Objectives over whole rows (model_cuda_set_row_scales): the host's
   * copy of the last batch's weights and of its per-token losses (B*T),
   * whether the device's weights are now scaled by their rows, and
   * forwards without the adapters. */
  float *host_w, *host_losses;
  bool row_scaled, lora_off;
  int64_t count; /* the last forward's counted targets */
  uint16_t *xb;  /* bf16 scratch: an activation or gradient on its way to cuBLAS */
  void *attws;   /* a bf16 base: attention's tensor-core workspace, else NULL */
  size_t attws_bytes;
  size_t bytes;
#define TY_X(field, n) float *field;
  MODEL_ACTS_CUDA(TY_X)
#undef TY_X
};

/* A bf16 base runs attention's products on tensor cores (TF32: its
 * linear layers already round their operands to bf16) through a workspace
 * for chunks of scores of at most about 128 MiB (RANKENV_CUDA_ATTN_MIB
 * sets the bound; 0 keeps attention in fp32 on CUDA cores, as for a
 * float32 base). */
static int attn_budget(ty_dtype_t wdt, size_t *out, char *err, size_t errlen) {
  long mib = 128;
  int rc = rankenv_long(RANKENV_CUDA_ATTN_MIB, &mib, err, errlen);
  *out = wdt == TY_DTYPE_BF16 ? (size_t)mib << 20 : 0;
  return rc;
}

static int mc_alloc(model_cuda_t *m, void **p, size_t bytes) {
  if (mem_cuda_alloc(p, bytes)) return TY_EEXHAUSTED;
  m->bytes += bytes;
  return 0;
}

/* The whole base's view of (kind, layer l); a tied head is the embedding. */
static const loader_view_t *base_view(const model_cuda_t *m, ckpt_kind_t kind, int l) {
  const loader_view_t *v = loader_view(m->base, kind, l);
  return v || kind != CKPT_LM_HEAD ? v : loader_view(m->base, CKPT_EMBED, -1);
}

/* Tensor (kind, layer l) of the base: in the whole shard, or in the unit
 * acquired last. */
static const void *wt(const model_cuda_t *m, ckpt_kind_t kind, int l) {
  if (m->units) return prefetch_tensor(m->units, kind, l);
  const loader_view_t *v = base_view(m, kind, l);
  return v ? v->data : NULL;
}

/* Full training: the gradient of (kind, layer l), laid out as the base
 * (a tied head's is the embedding's), or over a shard in the unit gradient
 * buffer where its unit's slot holds the weight; NULL for LoRA. */
static float *gwt(const model_cuda_t *m, ckpt_kind_t kind, int l) {
  if (!m->gbase) return NULL;
  if (m->units) {
    long off = prefetch_offset(m->units, prefetch_unit_of(m->units, kind, l), kind, l);
    return off < 0 ? NULL : m->gunit + (size_t)off / sizeof(float);
  }
  const loader_view_t *v = base_view(m, kind, l);
  return v ? m->gbase + v->offset / sizeof(float) : NULL;
}

static ckpt_kind_t norm_kind(int i, int L) {
  return i == 2 * L ? CKPT_FINAL_NORM : (i % 2 ? CKPT_MLP_NORM : CKPT_ATTN_NORM);
}

/* Norm gain i (as copy_norm numbers them) and its gradient: for full
 * training the float32 base itself, which the optimizer updates; else the
 * fp32 copy (no gradient). */
static const float *norm_w(const model_cuda_t *m, int i) {
  if (m->gbase) return wt(m, norm_kind(i, m->d.L), i / 2);
  return m->normw + (size_t)i * m->d.C;
}
static float *norm_dw(const model_cuda_t *m, int i) {
  return gwt(m, norm_kind(i, m->d.L), i / 2);
}

/* The fp32 norm gain i: layer l's input norm at 2l, post-attention at
 * 2l+1, the final norm at 2L. From a sharded base, its unit must be the one
 * acquired last. */
static int copy_norm(model_cuda_t *m, int i) {
  const int C = m->d.C;
  const void *src = wt(m, norm_kind(i, m->d.L), i / 2);
  float *dst = m->normw + (size_t)i * C;
  if (!src) return TY_EINTERNAL; /* cannot happen: every unit holds its norms */
  if (m->wdt == TY_DTYPE_BF16)
    cuda_bf16_to_f32(m->cb, dst, src, (size_t)C);
  else if (cudaMemcpyAsync(dst, src, (size_t)C * sizeof(float), cudaMemcpyDeviceToDevice, 0) !=
           cudaSuccess)
    return TY_EINTERNAL;
  return 0;
}

int model_cuda_create(model_cuda_t **out, cuda_backend_t *cb, const loader_shard_t *base,
                      const lora_t *lora, comm_t *comm, int slots, int B, int T, bool recompute,
                      char *err, size_t errlen) {
  *out = NULL;
  if (!comm && base->world_size != 1)
    return ty_errf(err, errlen, TY_EINVAL,
                   "model_cuda: a shard of %d ranks needs the ranks' comm to gather it",
                   base->world_size);
  if (comm && (base->world_size != comm_world_size(comm) || base->rank != comm_rank(comm)))
    return ty_errf(err, errlen, TY_EINVAL,
                   "model_cuda: the shard of rank %d of %d does not fit rank %d of %d", base->rank,
                   base->world_size, comm_rank(comm), comm_world_size(comm));
  if (base->dtype != TY_DTYPE_F32 && base->dtype != TY_DTYPE_BF16)
    return ty_errf(err, errlen, TY_EINVAL, "model_cuda: base weights must be float32 or bfloat16");
  if (!lora && base->dtype != TY_DTYPE_F32)
    return ty_errf(err, errlen, TY_EINVAL,
                   "model_cuda: training every weight needs float32 weights (set dtype float32)");
  model_cuda_t *m = calloc(1, sizeof *m);
  if (!m) return TY_EEXHAUSTED;
  int rc = model_dims_from_config(&m->d, &base->layout.cfg, err, errlen);
  if (rc) {
    free(m);
    return rc;
  }
  if (B < 1 || T < 1 || (lora && (lora->L != m->d.L || (size_t)lora->N < (size_t)B * T))) {
    free(m);
    return ty_errf(err, errlen, TY_EINVAL,
                   "model_cuda: micro-batch %d x %d, or adapters for %d layers and %d rows, do "
                   "not fit the model",
                   B, T, lora ? lora->L : 0, lora ? lora->N : 0);
  }
  m->B = B, m->T = T, m->wdt = base->dtype, m->cb = cb, m->base = base, m->lo = lora;
  const model_dims_t *d = &m->d;
  const lora_t *lo = lora;
  /* MODEL_ACTS_CUDA's letters */
  const size_t R = lo ? (size_t)lo->R : 0, NP = lo ? lo->n_params : 0;
  const size_t L = (size_t)d->L, C = (size_t)d->C, NH = (size_t)d->NH, HS = (size_t)d->HS;
  const size_t QD = NH * HS, KVD = (size_t)d->NKV * HS, FF = (size_t)d->FF, V = (size_t)d->V;
  const size_t N = (size_t)B * T; /* and TC */
  size_t budget;
  rc = model_head_rows(N, d->V, &m->hc, err, errlen);
  if (!rc) rc = attn_budget(m->wdt, &budget, err, errlen);
  if (rc) {
    free(m);
    return rc;
  }
  m->recompute = recompute;
  const size_t LS = recompute ? 1 : L, HC = (size_t)m->hc;
  /* bf16 scratch: the widest activation, or a chunk's logits */
  const size_t xbn = llama_device_scratch_elems(&base->layout.cfg, (int64_t)N, (int64_t)HC);
  if (comm) {
    rc = prefetch_cuda_create(&m->pc, cb, base, comm, slots, err, errlen);
    if (rc) {
      model_cuda_free(m);
      return rc;
    }
    m->units = prefetch_cuda_units(m->pc);
    m->bytes += prefetch_cuda_bytes(m->pc);
    const int nl = d->L;
    m->order = xcalloc((size_t)(2 * nl + 3), sizeof *m->order);
    for (int u = 0; u < nl + 2; u++) m->order[u] = u;
    for (int i = 0; i < nl + 1; i++) m->order[nl + 2 + i] = nl + 1 - i;
  }
  rc = mc_alloc(m, (void **)&m->tokens, N * sizeof(int));
  if (!rc && !lo) rc = mc_alloc(m, (void **)&m->gbase, base->bytes);
  if (!rc && !lo && m->units) rc = mc_alloc(m, (void **)&m->gunit, prefetch_slot_bytes(base));
  if (!rc) rc = mc_alloc(m, (void **)&m->targets, N * sizeof(int));
  if (!rc) rc = mc_alloc(m, (void **)&m->pos, N * sizeof(int));
  if (!rc) rc = mc_alloc(m, (void **)&m->weights, N * sizeof(float));
  if (!rc) rc = mc_alloc(m, (void **)&m->xb, xbn * sizeof(uint16_t));
#define TY_X(field, n) \
  if (!rc) rc = mc_alloc(m, (void **)&m->field, (n) * sizeof(float));
  MODEL_ACTS_CUDA(TY_X)
#undef TY_X
  if (rc) {
    size_t want = m->bytes;
    model_cuda_free(m);
    return ty_errf(err, errlen, TY_EEXHAUSTED,
                   "model_cuda: out of device memory after %.1f MiB of training buffers "
                   "(activations%s) beside the %.1f MiB base shard (lower the micro-batch or "
                   "seq_len, or use more ranks)",
                   (double)want / 1048576.0,
                   lo         ? ""
                   : m->units ? ", gradients, unit slots"
                              : ", gradients",
                   (double)base->bytes / 1048576.0);
  }
  /* Last, and optional: where the device has no room left for it,
   * attention takes the fp32 path, which needs none. */
  if (budget) {
    const size_t ab = cuda_attention_tf32_bytes(B, T, d->NH, budget);
    if (!mc_alloc(m, &m->attws, ab)) m->attws_bytes = ab;
  }
  if ((lo &&
       cudaMemcpy(m->lp, lo->params, NP * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) ||
      cudaMemset(m->lg, 0, NP * sizeof(float)) != cudaSuccess ||
      (m->gbase && cudaMemset(m->gbase, 0, base->bytes) != cudaSuccess))
    rc = TY_EINTERNAL;
  if (!rc)
    rc = cuda_rope_tables(cb, m->rope_cos, m->rope_sin, T, d->HS, d->rope_theta, &d->rope_scaling);
  /* A sharded base's norms are copied as their units come by; full
   * training reads them from the base. */
  for (int i = 0; i <= 2 * d->L && !rc && !m->units && lo; i++) rc = copy_norm(m, i);
  if (!rc) rc = cuda_backend_sync(cb, err, errlen);
  if (rc) {
    model_cuda_free(m);
    return ty_errf(err, errlen, rc, "model_cuda: setting up the device buffers failed");
  }
  *out = m;
  return 0;
}

void model_cuda_free(model_cuda_t *m) {
  if (!m) return;
  if (m->pc) cudaDeviceSynchronize(); /* no gather may still write a slot */
  prefetch_cuda_free(m->pc);
  free(m->order);
  mem_cuda_free(m->tokens);
  mem_cuda_free(m->targets);
  mem_cuda_free(m->pos);
  mem_cuda_free(m->weights);
  free(m->host_w);
  free(m->host_losses);
  mem_cuda_free(m->gbase);
  mem_cuda_free(m->gunit);
  mem_cuda_free(m->xb);
  mem_cuda_free(m->attws);
#define TY_X(field, n) mem_cuda_free(m->field);
  MODEL_ACTS_CUDA(TY_X)
#undef TY_X
  free(m);
}

size_t model_cuda_bytes(const model_cuda_t *m) {
  return m->bytes;
}
size_t model_cuda_attention_bytes(const model_cuda_t *m) {
  return m->attws_bytes;
}
float *model_cuda_lora_params(model_cuda_t *m) {
  return m->lp;
}
float *model_cuda_lora_grads(model_cuda_t *m) {
  return m->lg;
}
size_t model_cuda_lora_size(const model_cuda_t *m) {
  return m->lo ? m->lo->n_params : 0;
}
float *model_cuda_base_grads(model_cuda_t *m) {
  return m->gbase;
}

void model_cuda_base_changed(model_cuda_t *m) {
  if (m->units) prefetch_forget(m->units);
}

/* The adapter of (l, target), if any: device A, B, dA, dB and its xa slot. */
typedef struct {
  const float *A, *B;
  float *dA, *dB, *xa;
} mc_adapter_t;

static bool adapter(const model_cuda_t *m, int l, int target, mc_adapter_t *a) {
  const lora_t *lo = m->lo;
  if (!lo || !lora_has_target(lo, target)) return false;
  const lora_pair_t *p = &lo->w[l * TC + target];
  size_t oa = (size_t)(p->A - lo->params), ob = (size_t)(p->B - lo->params);
  a->A = m->lp + oa, a->B = m->lp + ob, a->dA = m->lg + oa, a->dB = m->lg + ob;
  a->xa = m->xa + (size_t)(l * TC + target) * m->B * m->T * lo->R;
  return true;
}

/* out (n, OUT) = beta * out + x (n, IN) @ W^T, plus the adapter on target
 * (target < 0: none). */
static int proj_forward_rows(model_cuda_t *m, int n, int l, int target, float *out, const float *x,
                             const void *W, int IN, int OUT, float beta) {
  int rc;
  if (m->wdt == TY_DTYPE_BF16) {
    cuda_f32_to_bf16(m->cb, m->xb, x, (size_t)n * IN);
    rc = cuda_matmul_forward(m->cb, out, m->xb, W, TY_DTYPE_BF16, n, IN, OUT, beta);
  } else {
    rc = cuda_matmul_forward(m->cb, out, x, W, TY_DTYPE_F32, n, IN, OUT, beta);
  }
  mc_adapter_t a;
  if (!rc && target >= 0 && !m->lora_off && adapter(m, l, target, &a))
    rc = cuda_lora_forward(m->cb, out, a.xa, x, a.A, a.B, n, IN, OUT, m->lo->R, m->lo->scale);
  return rc;
}
static int proj_forward(model_cuda_t *m, int l, int target, float *out, const float *x,
                        const void *W, int IN, int OUT, float beta) {
  return proj_forward_rows(m, m->b * m->t, l, target, out, x, W, IN, OUT, beta);
}

/* dx (n, IN) = dx_beta * dx + dout @ W (+ the adapter's part and its
 * gradients); dW (OUT, IN) += dout^T @ x for full training (an fp32 base),
 * NULL when the base is frozen. */
static int proj_backward_rows(model_cuda_t *m, int n, int l, int target, float *dx, float *dW,
                              const float *dout, const float *x, const void *W, int IN, int OUT,
                              float dx_beta) {
  int rc;
  if (m->wdt == TY_DTYPE_BF16) {
    cuda_f32_to_bf16(m->cb, m->xb, dout, (size_t)n * OUT);
    rc = cuda_matmul_backward(m->cb, dx, NULL, m->xb, NULL, W, TY_DTYPE_BF16, n, IN, OUT, dx_beta);
  } else {
    rc = cuda_matmul_backward(m->cb, dx, dW, dout, dW ? x : NULL, W, TY_DTYPE_F32, n, IN, OUT,
                              dx_beta);
  }
  mc_adapter_t a;
  if (!rc && target >= 0 && adapter(m, l, target, &a))
    rc = cuda_lora_backward(m->cb, dx, a.dA, a.dB, m->dxa, dout, x, a.xa, a.A, a.B, n, IN, OUT,
                            m->lo->R, m->lo->scale);
  return rc;
}
static int proj_backward(model_cuda_t *m, int l, int target, float *dx, float *dW,
                         const float *dout, const float *x, const void *W, int IN, int OUT,
                         float dx_beta) {
  return proj_backward_rows(m, m->b * m->t, l, target, dx, dW, dout, x, W, IN, OUT, dx_beta);
}

/* Logits of the output head for rows [r0, r0 + rows) into m->logits. */
static int head_logits(model_cuda_t *m, int r0, int rows) {
  const model_dims_t *d = &m->d;
  return proj_forward_rows(m, rows, 0, -1, m->logits, m->lnf + (size_t)r0 * d->C,
                           wt(m, CKPT_LM_HEAD, -1), d->C, d->V, 0.0f);
}

/* Layer l's slice of a per-layer buffer of the given row width. */
#define LAYER(buf, width) (m->buf + (size_t)(m->recompute ? 0 : l) * NA * (width))
#define RES(r) (m->res + (size_t)(r)*NA * d->C)
#define W(kind) wt(m, CKPT_##kind, l)
#define GW(kind) gwt(m, CKPT_##kind, l)
#define TGT(x) JOBSPEC_TARGET_BIT_##x

static int layer_forward(model_cuda_t *m, int l) {
  const model_dims_t *d = &m->d;
  cuda_backend_t *cb = m->cb;
  const int n = m->b * m->t, C = d->C, QD = d->NH * d->HS, KVD = d->NKV * d->HS, FF = d->FF;
  const size_t NA = (size_t)m->B * m->T;
  float *ln1 = LAYER(ln1, C), *q = LAYER(q, QD), *k = LAYER(k, KVD), *v = LAYER(v, KVD);
  float *atty = LAYER(atty, QD), *mid = LAYER(mid, C), *ln2 = LAYER(ln2, C);
  float *gate = LAYER(gate, FF), *up = LAYER(up, FF), *h = LAYER(h, FF);
  float *lse = LAYER(lse, d->NH);
  cuda_rmsnorm_forward(cb, ln1, LAYER(rstd1, 1), RES(l), norm_w(m, 2 * l), n, C, d->eps);
  int rc = proj_forward(m, l, TGT(Q), q, ln1, W(WQ), C, QD, 0.0f);
  if (!rc) rc = proj_forward(m, l, TGT(K), k, ln1, W(WK), C, KVD, 0.0f);
  if (!rc) rc = proj_forward(m, l, TGT(V), v, ln1, W(WV), C, KVD, 0.0f);
  if (d->qkv_bias) { /* Qwen2: before the rotation, as nn.Linear's bias */
    cuda_bias_forward(cb, q, W(BQ), m->wdt, n, QD);
    cuda_bias_forward(cb, k, W(BK), m->wdt, n, KVD);
    cuda_bias_forward(cb, v, W(BV), m->wdt, n, KVD);
  }
  const int *pos = m->has_pos ? m->pos : NULL;
  cuda_rope_forward(cb, q, m->rope_cos, m->rope_sin, pos, m->b, m->t, d->NH, d->HS);
  cuda_rope_forward(cb, k, m->rope_cos, m->rope_sin, pos, m->b, m->t, d->NKV, d->HS);
  if (!rc)
    rc = cuda_attention_forward(cb, m->attws, m->attws_bytes, atty, lse, q, k, v, pos, m->b, m->t,
                                d->NH, d->NKV, d->HS);
  cudaMemcpyAsync(mid, RES(l), sizeof(float) * n * C, cudaMemcpyDeviceToDevice, 0);
  if (!rc) rc = proj_forward(m, l, TGT(O), mid, atty, W(WO), QD, C, 1.0f);
  cuda_rmsnorm_forward(cb, ln2, LAYER(rstd2, 1), mid, norm_w(m, 2 * l + 1), n, C, d->eps);
  if (!rc) rc = proj_forward(m, l, TGT(GATE), gate, ln2, W(WGATE), C, FF, 0.0f);
  if (!rc) rc = proj_forward(m, l, TGT(UP), up, ln2, W(WUP), C, FF, 0.0f);
  cuda_swiglu_forward(cb, h, gate, up, (size_t)n * FF);
  cudaMemcpyAsync(RES(l + 1), mid, sizeof(float) * n * C, cudaMemcpyDeviceToDevice, 0);
  if (!rc) rc = proj_forward(m, l, TGT(DOWN), RES(l + 1), h, W(WDOWN), FF, C, 1.0f);
  return rc;
}

static int layer_backward(model_cuda_t *m, int l) {
  const model_dims_t *d = &m->d;
  cuda_backend_t *cb = m->cb;
  const int n = m->b * m->t, C = d->C, QD = d->NH * d->HS, KVD = d->NKV * d->HS, FF = d->FF;
  const size_t NA = (size_t)m->B * m->T;
  const float *ln1 = LAYER(ln1, C), *q = LAYER(q, QD), *k = LAYER(k, KVD), *v = LAYER(v, KVD);
  const float *atty = LAYER(atty, QD), *mid = LAYER(mid, C), *ln2 = LAYER(ln2, C);
  const float *gate = LAYER(gate, FF), *up = LAYER(up, FF), *h = LAYER(h, FF);
  const float *lse = LAYER(lse, d->NH);
  /* m->dres holds d(loss)/d(res_{l+1}) on entry and d/d(res_l) on return. */
  int rc = proj_backward(m, l, TGT(DOWN), m->dh, GW(WDOWN), m->dres, h, W(WDOWN), FF, C, 0.0f);
  cuda_swiglu_backward(cb, m->dgate, m->dup, m->dh, gate, up, (size_t)n * FF);
  if (!rc)
    rc = proj_backward(m, l, TGT(GATE), m->dln, GW(WGATE), m->dgate, ln2, W(WGATE), C, FF, 0.0f);
  if (!rc) rc = proj_backward(m, l, TGT(UP), m->dln, GW(WUP), m->dup, ln2, W(WUP), C, FF, 1.0f);
  cuda_rmsnorm_backward(cb, m->dmid, norm_dw(m, 2 * l + 1), m->dln, m->dres, mid,
                        norm_w(m, 2 * l + 1), LAYER(rstd2, 1), n, C);
  if (!rc) rc = proj_backward(m, l, TGT(O), m->datty, GW(WO), m->dmid, atty, W(WO), QD, C, 0.0f);
  const int *pos = m->has_pos ? m->pos : NULL;
  if (!rc)
    rc = cuda_attention_backward(cb, m->attws, m->attws_bytes, m->dq, m->dk, m->dv, m->attscr,
                                 m->datty, atty, lse, q, k, v, pos, m->b, m->t, d->NH, d->NKV,
                                 d->HS);
  cuda_rope_backward(cb, m->dq, m->rope_cos, m->rope_sin, pos, m->b, m->t, d->NH, d->HS);
  cuda_rope_backward(cb, m->dk, m->rope_cos, m->rope_sin, pos, m->b, m->t, d->NKV, d->HS);
  /* dq, dk, dv are now the projections' output gradients: the biases'
   * (full training; under LoRA they are frozen, GW NULL). */
  if (d->qkv_bias && GW(BQ)) {
    cuda_bias_backward(cb, GW(BQ), m->dq, n, QD);
    cuda_bias_backward(cb, GW(BK), m->dk, n, KVD);
    cuda_bias_backward(cb, GW(BV), m->dv, n, KVD);
  }
  if (!rc) rc = proj_backward(m, l, TGT(Q), m->dln, GW(WQ), m->dq, ln1, W(WQ), C, QD, 0.0f);
  if (!rc) rc = proj_backward(m, l, TGT(K), m->dln, GW(WK), m->dk, ln1, W(WK), C, KVD, 1.0f);
  if (!rc) rc = proj_backward(m, l, TGT(V), m->dln, GW(WV), m->dv, ln1, W(WV), C, KVD, 1.0f);
  cuda_rmsnorm_backward(cb, m->dres, norm_dw(m, 2 * l), m->dln, m->dmid, RES(l), norm_w(m, 2 * l),
                        LAYER(rstd1, 1), n, C);
  return rc;
}

/* Declares a pass over the units (forward: embedding, layers, head;
 * backward: head, layers in reverse); nothing to do for a whole base. */
static int units_pass(model_cuda_t *m, bool forward, char *err, size_t errlen) {
  if (!m->units) return 0;
  const int L = m->d.L;
  return forward ? prefetch_pass(m->units, m->order, L + 2, err, errlen)
                 : prefetch_pass(m->units, m->order + L + 2, L + 1, err, errlen);
}

/* The pass's next unit (its tensors are then wt's), with the norm gains it
 * holds copied into normw on LoRA's forward pass. */
static int units_next(model_cuda_t *m, bool forward, char *err, size_t errlen) {
  if (!m->units) return 0;
  int rc = prefetch_acquire(m->units, err, errlen);
  const int u = prefetch_current(m->units), L = m->d.L;
  /* Full training reads its float32 norms from the slot (norm_w). */
  if (rc || !forward || u == PREFETCH_EMBED || !m->lo) return rc;
  if (u == L + 1) return copy_norm(m, 2 * L);
  rc = copy_norm(m, 2 * (u - 1));
  return rc ? rc : copy_norm(m, 2 * (u - 1) + 1);
}

/* Ends a pass: waits for the queued gathers (where a failed peer shows),
 * then for the compute stream. msg: err holds the reason already. */
static int pass_end(model_cuda_t *m, int rc, bool msg, const char *pass, char *err, size_t errlen) {
  if (rc && !msg)
    ty_errf(err, errlen, rc, "model_cuda: a matrix product failed in the %s pass", pass);
  if (m->pc) {
    int drc = prefetch_cuda_drain(m->pc, rc ? NULL : err, rc ? 0 : errlen);
    if (!rc) rc = drc;
  }
  if (rc) return rc;
  return cuda_backend_sync(m->cb, err, errlen);
}

int model_cuda_forward_batch(model_cuda_t *m, const model_batch_t *bt, double *loss, char *err,
                             size_t errlen) {
  const model_dims_t *d = &m->d;
  if (!bt->targets)
    return ty_errf(err, errlen, TY_EINVAL, "model_cuda: a forward pass needs targets");
  int rc = model_batch_check(bt, m->B, m->T, d->V, err, errlen);
  if (rc) return rc;
  const int b = bt->b, t = bt->t, n = b * t;
  m->b = b, m->t = t;
  m->has_pos = bt->pos != NULL;
  m->has_weights = bt->weights != NULL;
  m->row_scaled = false;
  if (bt->weights) {
    if (!m->host_w) m->host_w = xmalloc(sizeof(float) * (size_t)m->B * m->T);
    memcpy(m->host_w, bt->weights, sizeof(float) * n);
  }
  m->count = model_batch_count(bt);
  if (cudaMemcpy(m->tokens, bt->tokens, sizeof(int) * n, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(m->targets, bt->targets, sizeof(int) * n, cudaMemcpyHostToDevice) != cudaSuccess ||
      (bt->pos &&
       cudaMemcpy(m->pos, bt->pos, sizeof(int) * n, cudaMemcpyHostToDevice) != cudaSuccess) ||
      (bt->weights && cudaMemcpy(m->weights, bt->weights, sizeof(float) * n,
                                 cudaMemcpyHostToDevice) != cudaSuccess))
    return ty_errf(err, errlen, TY_EINTERNAL, "model_cuda: copying the batch to the device failed");
  const size_t NA = (size_t)m->B * m->T;
  bool msg = true; /* a failure of units_* has its reason in err */
  rc = units_pass(m, true, err, errlen);
  if (!rc) rc = units_next(m, true, err, errlen);
  if (!rc) cuda_embedding_forward(m->cb, RES(0), m->tokens, wt(m, CKPT_EMBED, -1), m->wdt, n, d->C);
  for (int l = 0; l < d->L && !rc; l++)
    if (!(rc = units_next(m, true, err, errlen))) msg = !(rc = layer_forward(m, l));
  if (!rc) rc = units_next(m, true, err, errlen);
  /* The head and each token's loss, a chunk of rows at a time. */
  if (!rc)
    cuda_rmsnorm_forward(m->cb, m->lnf, m->rstdf, RES(d->L), norm_w(m, 2 * d->L), n, d->C, d->eps);
  m->logits_all = n <= m->hc;
  /* LoRA in chunks: the frozen head's backward runs here, while each
   * chunk's logits are at hand, leaving its input's gradient for a loss
   * scale of 1 (dlnf; model_cuda_backward scales it): no chunk's logits
   * are computed twice. */
  m->head_fused = m->lo && !m->logits_all;
  for (int r0 = 0; r0 < n && !rc; r0 += m->hc) {
    int rows = n - r0 < m->hc ? n - r0 : m->hc;
    const float *w = m->has_weights ? m->weights + r0 : NULL;
    msg = !(rc = head_logits(m, r0, rows));
    if (!rc)
      msg = !(rc = cuda_crossentropy_forward(m->cb, m->losses + r0, m->logits, m->targets + r0, w,
                                             rows, d->V, NULL));
    if (rc || !m->head_fused) continue;
    cuda_crossentropy_backward(m->cb, m->logits, m->targets + r0, w, rows, d->V, 1.0f);
    msg = !(rc = proj_backward_rows(m, rows, 0, -1, m->dlnf + (size_t)r0 * d->C, NULL, m->logits,
                                    m->lnf + (size_t)r0 * d->C, wt(m, CKPT_LM_HEAD, -1), d->C, d->V,
                                    0.0f));
  }
  double sum = 0.0;
  if (!rc) msg = !(rc = cuda_sum(m->cb, m->losses, (size_t)n, &sum));
  rc = pass_end(m, rc, msg, "forward", err, errlen);
  /* The mean over the counted targets (the weighted rows' losses are 0). */
  if (loss) *loss = !m->has_weights ? sum / n : m->count > 0 ? sum / (double)m->count : 0.0;
  return rc;
}

int model_cuda_forward(model_cuda_t *m, const int *tokens, const int *targets, int b, int t,
                       double *loss, char *err, size_t errlen) {
  const model_batch_t bt = {.tokens = tokens, .targets = targets, .b = b, .t = t};
  return model_cuda_forward_batch(m, &bt, loss, err, errlen);
}

/* Full training over a shard: unit u's gradients start at zero in the
 * unit buffer (the previous unit's were added into the shard already: the
 * same stream), then are summed over the ranks and this rank's rows added
 * into gbase. Nothing to do otherwise. */
static int unit_grads_clear(model_cuda_t *m, int u, char *err, size_t errlen) {
  if (!m->gunit) return 0;
  cudaError_t e = cudaMemsetAsync(m->gunit, 0, prefetch_unit_bytes(m->units, u), 0);
  if (e == cudaSuccess) return 0;
  return ty_errf(err, errlen, TY_EINTERNAL, "model_cuda: clearing unit %d's gradients: %s", u,
                 cudaGetErrorString(e));
}
static int unit_grads_reduce(model_cuda_t *m, int u, char *err, size_t errlen) {
  return m->gunit ? prefetch_scatter_add(m->units, u, m->gunit, m->gbase, err, errlen) : 0;
}

int model_cuda_backward(model_cuda_t *m, float loss_scale, char *err, size_t errlen) {
  const model_dims_t *d = &m->d;
  const int n = m->b * m->t;
  const size_t NA = (size_t)m->B * m->T;
  bool msg = true;
  const int head = d->L + 1;
  int rc = units_pass(m, false, err, errlen);
  if (!rc) rc = units_next(m, false, err, errlen);
  if (!rc) rc = unit_grads_clear(m, head, err, errlen);
  /* The head's input gradient: the fused forward's, scaled; or chunk by
   * chunk (its logits computed again unless the forward's are all still
   * there): logits become dlogits, then the head's input gradient (and for
   * full training its weight's, summed over the chunks); then the final
   * norm. */
  const float dloss =
      m->row_scaled  ? 1.0f /* the device's weights carry each row's scale */
      : m->has_weights ? (m->count > 0 ? loss_scale / (float)m->count : 0.0f)
                       : loss_scale / n;
  /* With row scales, the fused forward's input gradient (for weights of 1
   * a row) does not serve: the chunks' logits are computed again. */
  const bool fused = m->head_fused && !m->row_scaled;
  if (fused) cuda_scale(m->cb, m->dln, m->dlnf, dloss, (size_t)n * d->C);
  for (int r0 = 0; r0 < n && !rc && !fused; r0 += m->hc) {
    int rows = n - r0 < m->hc ? n - r0 : m->hc;
    if (!m->logits_all) msg = !(rc = head_logits(m, r0, rows));
    if (rc) break;
    cuda_crossentropy_backward(m->cb, m->logits, m->targets + r0,
                               m->has_weights ? m->weights + r0 : NULL, rows, d->V, dloss);
    msg = !(rc = proj_backward_rows(m, rows, 0, -1, m->dln + (size_t)r0 * d->C,
                                    gwt(m, CKPT_LM_HEAD, -1), m->logits, m->lnf + (size_t)r0 * d->C,
                                    wt(m, CKPT_LM_HEAD, -1), d->C, d->V, 0.0f));
  }
  if (!rc) {
    cuda_rmsnorm_backward(m->cb, m->dres, norm_dw(m, 2 * d->L), m->dln, NULL, RES(d->L),
                          norm_w(m, 2 * d->L), m->rstdf, n, d->C);
    rc = unit_grads_reduce(m, head, err, errlen);
  }
  for (int l = d->L - 1; l >= 0 && !rc; l--) {
    if ((rc = units_next(m, false, err, errlen)) ||
        (rc = unit_grads_clear(m, PREFETCH_LAYER(l), err, errlen)))
      break;
    /* One layer slot: it holds layer L-1's activations from the forward
     * pass; every other layer's are computed again from its input. */
    if (m->recompute && l < d->L - 1) msg = !(rc = layer_forward(m, l));
    if (!rc) msg = !(rc = layer_backward(m, l));
    if (!rc) rc = unit_grads_reduce(m, PREFETCH_LAYER(l), err, errlen);
  }
  /* Full training: the embedding's rows take d(loss)/d(res_0). */
  if (!rc && m->gbase && !(rc = unit_grads_clear(m, PREFETCH_EMBED, err, errlen))) {
    cuda_embedding_backward(m->cb, gwt(m, CKPT_EMBED, -1), m->dres, m->tokens, n, d->C);
    rc = unit_grads_reduce(m, PREFETCH_EMBED, err, errlen);
  }
  return pass_end(m, rc, msg, "backward", err, errlen);
}

int model_cuda_row_losses(model_cuda_t *m, double *sums, char *err, size_t errlen) {
  const int n = m->b * m->t;
  if (!m->host_losses) m->host_losses = xmalloc(sizeof(float) * (size_t)m->B * m->T);
  if (cudaMemcpy(m->host_losses, m->losses, sizeof(float) * n, cudaMemcpyDeviceToHost) !=
      cudaSuccess)
    return ty_errf(err, errlen, TY_EINTERNAL, "model_cuda: copying the losses to the host failed");
  /* A target of weight 0 has a loss of 0 (cuda_crossentropy_forward). */
  for (int i = 0; i < m->b; i++) {
    double sum = 0.0;
    for (int j = 0; j < m->t; j++) sum += m->host_losses[i * m->t + j];
    sums[i] = sum;
  }
  return 0;
}

int model_cuda_set_row_scales(model_cuda_t *m, const float *scales, char *err, size_t errlen) {
  const int n = m->b * m->t;
  float *w = xmalloc(sizeof(float) * n);
  for (int r = 0; r < n; r++) w[r] = (m->has_weights ? m->host_w[r] : 1.0f) * scales[r / m->t];
  const bool ok = cudaMemcpy(m->weights, w, sizeof(float) * n, cudaMemcpyHostToDevice) ==
                  cudaSuccess;
  free(w);
  if (!ok)
    return ty_errf(err, errlen, TY_EINTERNAL, "model_cuda: copying the row scales failed");
  m->has_weights = m->row_scaled = true;
  return 0;
}

void model_cuda_adapters_on(model_cuda_t *m, bool on) {
  m->lora_off = !on;
}
