/* generate_cuda.c - generate.h's decoder on a GPU (generate_cuda.h):
 * generate.c's feed_chunk on the kernels of backend_cuda.h. */
#include "worker/cuda/generate_cuda.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "api/jobspec.h"
#include "common/errors.h"
#include "worker/cuda/mem_cuda.h"
#include "worker/model/generate.h"

#define TC JOBSPEC_TARGET_COUNT

struct gen_cuda {
  model_dims_t d;
  cuda_backend_t *cb;
  int S, window, R;
  size_t n_adapter;      /* the adapter's parameters (0: none) */
  float scale;           /* the adapter's alpha / R */
  unsigned targets;      /* the adapter's JOBSPEC_TARGET_* (0: none) */
  ty_dtype_t wdt;        /* the matrices' type (F32 or BF16); vectors are F32 */
  model_weights_t w;     /* device pointers into wbuf (layers: a host array); the
                            matrices' of wdt, whatever the pointers' type */
  lora_pair_t *ab;       /* [L * TC] device pointers into lbuf (host array) */
  void *wbuf;            /* the weights */
  float *lbuf;           /* the adapter's A and B */
  uint16_t *xb;          /* (CH, max(C, QD, FF)): a product's input in bf16 */
  float *kc, *vc;        /* (L, S, KVD) each */
  float *cos_t, *sin_t;  /* (S, HS/2) */
#define TY_X(field, n) float *field; /* generate.h's GEN_SCRATCH, in one allocation at x */
  GEN_SCRATCH(TY_X)
#undef TY_X
  int *tokens, *pos;     /* (CH) each */
};

/* Each tensor starts on a GEN_ALIGN-byte boundary of the arena (bf16
 * matrices and fp32 vectors mix; cuBLAS wants aligned operands). */
#define GEN_ALIGN 256

/* Bytes of a model's weights on the device, matrices (cols != 0) of wdt
 * and vectors (norms, biases) float32, as model.h lays them out per layer
 * (the tied head is the embedding's), each tensor aligned. */
static size_t weight_bytes(const model_dims_t *d, ty_dtype_t wdt) {
  const size_t ws = ty_dtype_size(wdt);
  size_t per = 0;
#define TY_X(field, name, rows, cols) \
  per += GEN_ALIGN +                  \
         ((cols) != 0 ? (size_t)(rows) * (size_t)(cols)*ws : (size_t)(rows) * sizeof(float));
  MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  return ((size_t)d->V * d->C * ws + GEN_ALIGN) * (d->tied ? 1 : 2) + (size_t)d->L * per +
         (size_t)d->C * sizeof(float) + GEN_ALIGN;
}

/* Takes n elements of dt from the device arena *p (bytes), host's floats
 * copied there (narrowed to dt through tmp, room for n bf16 values). */
static float *put(char **p, const float *host, size_t n, ty_dtype_t dt, uint16_t *tmp, int *bad) {
  const size_t off = (size_t)(uintptr_t)*p % GEN_ALIGN;
  if (off) *p += GEN_ALIGN - off;
  void *at = *p;
  *p += n * ty_dtype_size(dt);
  const void *src = host;
  if (dt != TY_DTYPE_F32) {
    ty_dtype_from_f32(dt, host, tmp, n);
    src = tmp;
  }
  if (n && cudaMemcpy(at, src, n * ty_dtype_size(dt), cudaMemcpyHostToDevice) != cudaSuccess)
    *bad = 1;
  return at;
}

static int alloc(void **p, size_t bytes, const char *what, char *err, size_t errlen) {
  if (!mem_cuda_alloc(p, bytes ? bytes : 4)) return 0;
  int rc = ty_errf(err, errlen, TY_EEXHAUSTED,
                   "device cuda: no device memory for the decoder's %s (%.1f MiB); use a "
                   "smaller --max_new_tokens or prompt, --dtype bfloat16, or --device cpu",
                   what, (double)bytes / (1 << 20));
  mem_cuda_explain(rc, err, errlen);
  return rc;
}

int gen_cuda_create(gen_cuda_t **out, const model_dims_t *d, const model_weights_t *w,
                    const lora_t *lo, int S, int sliding_window, ty_dtype_t wdt, int device,
                    char *err, size_t errlen) {
  *out = NULL;
  if (wdt != TY_DTYPE_F32 && wdt != TY_DTYPE_BF16)
    return ty_errf(err, errlen, TY_EINVAL,
                   "device cuda: the decoder keeps weights in float32 or bfloat16, not %s",
                   ty_dtype_name(wdt));
  gen_cuda_t *g = calloc(1, sizeof *g);
  if (!g) return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for the GPU decoder");
  g->d = *d;
  g->wdt = wdt;
  g->S = S;
  g->window = sliding_window;
  g->R = lo ? lo->R : 0;
  g->scale = lo ? lo->scale : 0.0f;
  g->targets = lo ? lo->targets : 0;
  g->w.layers = calloc((size_t)d->L, sizeof *g->w.layers);
  g->ab = lo ? calloc((size_t)d->L * TC, sizeof *g->ab) : NULL;
  if (!g->w.layers || (lo && !g->ab)) {
    gen_cuda_free(g);
    return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for the GPU decoder");
  }
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0; /* the thread's */
  int rc = mem_cuda_init(err, errlen);
  if (!rc) rc = cuda_backend_create(&g->cb, device, err, errlen);
  /* GEN_SCRATCH's letters */
  const size_t CH = GEN_CHUNK, KVD = (size_t)d->NKV * d->HS, QD = (size_t)d->NH * d->HS;
  const size_t C = (size_t)d->C, FF = (size_t)d->FF, V = (size_t)d->V, R = (size_t)g->R;
  size_t act = 0; /* the scratch's floats */
#define TY_X(field, n) act += (n);
  GEN_SCRATCH(TY_X)
#undef TY_X
  float *a = NULL;
  size_t widest = (size_t)d->C > QD ? (size_t)d->C : QD;
  if ((size_t)d->FF > widest) widest = (size_t)d->FF;
  if (!rc) rc = alloc(&g->wbuf, weight_bytes(d, wdt), "weights", err, errlen);
  if (!rc && wdt == TY_DTYPE_BF16)
    rc = alloc((void **)&g->xb, sizeof(uint16_t) * CH * widest, "bf16 inputs", err, errlen);
  if (!rc && lo)
    rc = alloc((void **)&g->lbuf, sizeof(float) * lo->n_params, "adapter", err, errlen);
  if (!rc)
    rc = alloc((void **)&g->kc, sizeof(float) * 2 * d->L * S * KVD, "key/value cache", err, errlen);
  if (!rc) rc = alloc((void **)&g->cos_t, sizeof(float) * S * d->HS, "rotary tables", err, errlen);
  if (!rc) rc = alloc((void **)&g->x, sizeof(float) * act, "activations", err, errlen);
  if (!rc) rc = alloc((void **)&g->tokens, sizeof(int) * 2 * CH, "token ids", err, errlen);
  if (rc) {
    gen_cuda_free(g);
    return rc;
  }
  /* The weights, in the host model's tensor order. */
  int bad = 0;
  char *p = g->wbuf;
  size_t big = (size_t)d->C * (d->V > d->FF ? d->V : d->FF); /* the largest tensor */
  if (QD * d->C > big) big = QD * d->C;
  uint16_t *tmp = wdt == TY_DTYPE_F32 ? NULL : malloc(sizeof(uint16_t) * big);
  if (wdt != TY_DTYPE_F32 && !tmp) {
    gen_cuda_free(g);
    return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory to convert the weights to %s",
                   ty_dtype_name(wdt));
  }
  g->w.embed_tokens = put(&p, w->embed_tokens, (size_t)d->V * d->C, wdt, tmp, &bad);
  for (int l = 0; l < d->L; l++) {
    model_layer_t *dl = &g->w.layers[l];
    const model_layer_t *hl = &w->layers[l];
#define TY_X(field, name, rows, cols)                                                       \
  dl->field = (rows) != 0                                                                   \
                  ? put(&p, hl->field, (size_t)(rows) * ((cols) != 0 ? (size_t)(cols) : 1), \
                        (cols) != 0 ? wdt : TY_DTYPE_F32, tmp, &bad)                        \
                  : NULL;
    MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  }
  g->w.norm = put(&p, w->norm, (size_t)d->C, TY_DTYPE_F32, tmp, &bad);
  g->w.lm_head =
      d->tied ? g->w.embed_tokens : put(&p, w->lm_head, (size_t)d->V * d->C, wdt, tmp, &bad);
  free(tmp);
  if (lo) { /* one copy of the adapter's buffer; its pairs at the same offsets */
    g->n_adapter = lo->n_params;
    if (cudaMemcpy(g->lbuf, lo->params, sizeof(float) * lo->n_params, cudaMemcpyHostToDevice) !=
        cudaSuccess)
      bad = 1;
    for (size_t i = 0; i < (size_t)d->L * TC; i++) {
      if (lo->w[i].A) g->ab[i].A = g->lbuf + (lo->w[i].A - lo->params);
      if (lo->w[i].B) g->ab[i].B = g->lbuf + (lo->w[i].B - lo->params);
    }
  }
  g->vc = g->kc + (size_t)d->L * S * KVD;
  g->sin_t = g->cos_t + (size_t)S * d->HS / 2;
  a = g->x; /* the scratch's allocation, carved as GEN_SCRATCH says */
#define TY_X(field, n) g->field = a, a += (n);
  GEN_SCRATCH(TY_X)
#undef TY_X
  g->pos = g->tokens + CH;
  if (bad) cudaGetLastError();
  rc =
      bad ? ty_errf(err, errlen, TY_EINTERNAL, "device cuda: copying the weights to the GPU failed")
          : cuda_rope_tables(g->cb, g->cos_t, g->sin_t, S, d->HS, d->rope_theta, &d->rope_scaling);
  if (!rc) rc = cuda_backend_sync(g->cb, err, errlen);
  if (rc) {
    gen_cuda_free(g);
    return rc;
  }
  *out = g;
  return 0;
}

void gen_cuda_free(gen_cuda_t *g) {
  if (!g) return;
  mem_cuda_free(g->wbuf);
  mem_cuda_free(g->xb);
  mem_cuda_free(g->lbuf);
  mem_cuda_free(g->kc);
  mem_cuda_free(g->cos_t);
  mem_cuda_free(g->x);
  mem_cuda_free(g->tokens);
  cuda_backend_free(g->cb);
  free(g->w.layers);
  free(g->ab);
  free(g);
}

/* out (n, OUT) = beta * out + x (n, IN) @ W^T (W of g->wdt), plus the
 * adapter's scale * (x A^T) B^T when target (-1: none, the head) is
 * adapted in layer l. */
static int proj(gen_cuda_t *g, int l, int target, float *out, const float *x, const float *W, int n,
                int IN, int OUT, float beta) {
  const void *in = x;
  if (g->wdt == TY_DTYPE_BF16) { /* the input rounded to bf16, as model_cuda.c's products */
    cuda_f32_to_bf16(g->cb, g->xb, x, (size_t)n * IN);
    in = g->xb;
  }
  int rc = cuda_matmul_forward(g->cb, out, in, W, g->wdt, n, IN, OUT, beta);
  if (rc || target < 0 || !(g->targets & (1u << target))) return rc;
  const lora_pair_t *ab = &g->ab[(size_t)l * TC + target];
  return cuda_lora_forward(g->cb, out, g->xa, x, ab->A, ab->B, n, IN, OUT, g->R, g->scale);
}

int gen_cuda_feed(gen_cuda_t *g, const int *tokens, int n, int p0, float *logits, char *err,
                  size_t errlen) {
  const model_dims_t *d = &g->d;
  const model_weights_t *w = &g->w;
  const int C = d->C, QD = d->NH * d->HS, KVD = d->NKV * d->HS, FF = d->FF;
  int pos[GEN_CHUNK];
  for (int i = 0; i < n; i++) pos[i] = p0 + i;
  if (cudaMemcpy(g->tokens, tokens, sizeof(int) * n, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(g->pos, pos, sizeof(int) * n, cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaGetLastError();
    return ty_errf(err, errlen, TY_EINTERNAL, "device cuda: copying token ids to the GPU failed");
  }
  int rc = 0;
  cuda_embedding_forward(g->cb, g->x, g->tokens, w->embed_tokens, g->wdt, n, C);
  for (int l = 0; l < d->L && !rc; l++) {
    const model_layer_t *lw = &w->layers[l];
    float *kc = g->kc + (size_t)l * g->S * KVD, *vc = g->vc + (size_t)l * g->S * KVD;
    float *k = kc + (size_t)p0 * KVD, *v = vc + (size_t)p0 * KVD; /* the new rows, in place */
    cuda_rmsnorm_forward(g->cb, g->ln, g->rstd, g->x, lw->input_layernorm, n, C, d->eps);
    rc = proj(g, l, JOBSPEC_TARGET_BIT_Q, g->q, g->ln, lw->q_proj, n, C, QD, 0.0f);
    if (!rc) rc = proj(g, l, JOBSPEC_TARGET_BIT_K, k, g->ln, lw->k_proj, n, C, KVD, 0.0f);
    if (!rc) rc = proj(g, l, JOBSPEC_TARGET_BIT_V, v, g->ln, lw->v_proj, n, C, KVD, 0.0f);
    if (rc) break;
    if (d->qkv_bias) { /* Qwen2: before the rotation, as in training */
      cuda_bias_forward(g->cb, g->q, lw->q_bias, TY_DTYPE_F32, n, QD);
      cuda_bias_forward(g->cb, k, lw->k_bias, TY_DTYPE_F32, n, KVD);
      cuda_bias_forward(g->cb, v, lw->v_bias, TY_DTYPE_F32, n, KVD);
    }
    cuda_rope_forward(g->cb, g->q, g->cos_t, g->sin_t, g->pos, 1, n, d->NH, d->HS);
    cuda_rope_forward(g->cb, k, g->cos_t, g->sin_t, g->pos, 1, n, d->NKV, d->HS);
    gen_cuda_attention(g->cb, g->att, g->q, kc, vc, n, p0, g->window, d->NH, d->NKV, d->HS);
    rc = proj(g, l, JOBSPEC_TARGET_BIT_O, g->x, g->att, lw->o_proj, n, QD, C, 1.0f);
    if (rc) break;
    cuda_rmsnorm_forward(g->cb, g->ln, g->rstd, g->x, lw->post_attention_layernorm, n, C, d->eps);
    rc = proj(g, l, JOBSPEC_TARGET_BIT_GATE, g->gate, g->ln, lw->gate_proj, n, C, FF, 0.0f);
    if (!rc) rc = proj(g, l, JOBSPEC_TARGET_BIT_UP, g->up, g->ln, lw->up_proj, n, C, FF, 0.0f);
    if (rc) break;
    cuda_swiglu_forward(g->cb, g->gate, g->gate, g->up, (size_t)n * FF);
    rc = proj(g, l, JOBSPEC_TARGET_BIT_DOWN, g->x, g->gate, lw->down_proj, n, FF, C, 1.0f);
  }
  if (!rc && logits) {
    cuda_rmsnorm_forward(g->cb, g->ln, g->rstd, g->x + (size_t)(n - 1) * C, w->norm, 1, C, d->eps);
    rc = proj(g, -1, -1, g->logits, g->ln, w->lm_head, 1, C, d->V, 0.0f);
  }
  if (rc)
    return ty_errf(err, errlen, TY_EINTERNAL, "device cuda: a matrix product failed (cuBLAS)");
  rc = cuda_backend_sync(g->cb, err, errlen);
  if (!rc && logits &&
      cudaMemcpy(logits, g->logits, sizeof(float) * d->V, cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    rc = ty_errf(err, errlen, TY_EINTERNAL, "device cuda: copying the logits to the host failed");
  }
  return rc;
}

int gen_cuda_set_adapter(gen_cuda_t *g, const lora_t *lo, char *err, size_t errlen) {
  if (!lo || !g->n_adapter || lo->n_params != g->n_adapter || lo->R != g->R)
    return ty_errf(err, errlen, TY_EINVAL,
                   "gen_cuda: the adapter is not shaped as the one the decoder was made with");
  if (cudaMemcpy(g->lbuf, lo->params, sizeof(float) * lo->n_params, cudaMemcpyHostToDevice) !=
      cudaSuccess)
    return ty_errf(err, errlen, TY_EINTERNAL, "gen_cuda: copying the adapter to the GPU: %s",
                   cudaGetErrorString(cudaGetLastError()));
  return 0;
}
