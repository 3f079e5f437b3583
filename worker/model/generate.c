/* generate.c - decoding over a key/value cache on the CPU, and the choice
 * of the next token (generate.h). */
#include "worker/model/generate.h"

#include <math.h>
#include <cblas.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"
#include "common/errors.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/cpu_pool.h"
#include "worker/model/rng.h"
#ifdef TRAINYARD_HAVE_CUDA
#include "worker/cuda/generate_cuda.h"
#include "worker/cuda/placement_cuda.h"
#endif

struct gen {
  model_dims_t d;
  const model_weights_t *w; /* borrowed */
  const lora_t *lo;         /* borrowed, or NULL */
  int S, window, len;       /* capacity, sliding window (0: none), tokens cached */
  float *kc, *vc;           /* (L, S, KVD) each: rotated keys, values */
  float *cos_t, *sin_t;     /* (S, HS/2) rotary tables */
  /* Scratch for a chunk of up to GEN_CHUNK rows (generate.h): */
#define TY_X(field, n) float *field;
  GEN_SCRATCH(TY_X)
#undef TY_X
  int pos[GEN_CHUNK];
  float *block; /* the one allocation behind every buffer above */
#ifdef TRAINYARD_HAVE_CUDA
  gen_cuda_t *cu; /* on a GPU: the cache and the scratch are there, block the logits */
#endif
};

#define GEN_NO_CUDA                                                                         \
  "--device cuda: this trainyard was built without the CUDA toolkit; rebuild where one is " \
  "installed, or use --device cpu (or auto)"

int gen_device_pick(const char *name, gen_device_t *dev, char *err, size_t errlen) {
  *dev = GEN_DEVICE_CPU;
  const bool cuda = !strcmp(name, "cuda"), autod = !strcmp(name, "auto");
  if (!cuda && !autod && strcmp(name, "cpu"))
    return ty_errf(err, errlen, TY_EINVAL, "--device %s: use cpu, cuda or auto", name);
  if (!cuda && !autod) return 0;
#ifdef TRAINYARD_HAVE_CUDA
  int n;
  char why[512];
  if (placement_cuda_devices(&n, why, sizeof why)) {
    if (autod) return 0;
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "--%s", why);
  }
  *dev = GEN_DEVICE_CUDA;
  return 0;
#else
  return autod ? 0 : ty_errf(err, errlen, TY_EUNAVAILABLE, "%s", GEN_NO_CUDA);
#endif
}

const char *gen_device_name(gen_device_t dev) {
  return dev == GEN_DEVICE_CUDA ? "cuda" : "cpu";
}

int gen_create_on(gen_t **out, gen_device_t dev, const model_dims_t *d, const model_weights_t *w,
                  const lora_t *lo, int S, int sliding_window, ty_dtype_t wdt, char *err,
                  size_t errlen) {
  if (dev == GEN_DEVICE_CPU) return gen_create(out, d, w, lo, S, sliding_window, err, errlen);
  *out = NULL;
#ifdef TRAINYARD_HAVE_CUDA
  if (S < 1 || sliding_window < 0)
    return ty_errf(err, errlen, TY_EINVAL, "a decoder needs a cache of at least one token");
  gen_t *g = calloc(1, sizeof *g);
  float *logits = g ? malloc(sizeof(float) * d->V) : NULL;
  if (!logits) {
    free(g);
    return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for the decoder's logits");
  }
  g->d = *d;
  g->w = w;
  g->lo = lo;
  g->S = S;
  g->window = sliding_window;
  g->block = g->logits = logits;
  int rc = gen_cuda_create(&g->cu, d, w, lo, S, sliding_window, wdt, -1, err, errlen);
  if (rc) {
    gen_free(g);
    return rc;
  }
  *out = g;
  return 0;
#else
  (void)d, (void)w, (void)lo, (void)S, (void)sliding_window, (void)wdt;
  return ty_errf(err, errlen, TY_EUNAVAILABLE, "%s", GEN_NO_CUDA);
#endif
}

int gen_create(gen_t **out, const model_dims_t *d, const model_weights_t *w, const lora_t *lo,
               int S, int sliding_window, char *err, size_t errlen) {
  *out = NULL;
  if (S < 1 || sliding_window < 0)
    return ty_errf(err, errlen, TY_EINVAL, "a decoder needs a cache of at least one token");
  /* GEN_SCRATCH's letters */
  const size_t CH = GEN_CHUNK, KVD = (size_t)d->NKV * d->HS, QD = (size_t)d->NH * d->HS;
  const size_t C = (size_t)d->C, FF = (size_t)d->FF, V = (size_t)d->V;
  const size_t R = lo ? (size_t)lo->R : 0;
  /* kc and vc, cos_t and sin_t, the scratch */
  size_t total = 2 * (size_t)d->L * S * KVD + (size_t)S * d->HS;
#define TY_X(field, n) total += (n);
  GEN_SCRATCH(TY_X)
#undef TY_X
  gen_t *g = calloc(1, sizeof *g);
  float *p = g ? malloc(sizeof(float) * total) : NULL;
  if (!p) {
    free(g);
    return ty_errf(err, errlen, TY_EEXHAUSTED,
                   "no memory for a decoder of %d tokens (%.1f MiB of key/value cache and "
                   "scratch)",
                   S, (double)total * sizeof(float) / (1 << 20));
  }
  g->d = *d;
  g->w = w;
  g->lo = lo;
  g->S = S;
  g->window = sliding_window;
  g->block = p;
  g->kc = p, p += (size_t)d->L * S * KVD;
  g->vc = p, p += (size_t)d->L * S * KVD;
  g->cos_t = p, p += (size_t)S * d->HS / 2;
  g->sin_t = p, p += (size_t)S * d->HS / 2;
#define TY_X(field, n) g->field = p, p += (n);
  GEN_SCRATCH(TY_X)
#undef TY_X
  cpu_rope_tables(g->cos_t, g->sin_t, S, d->HS, d->rope_theta, &d->rope_scaling);
  *out = g;
  return 0;
}

void gen_free(gen_t *g) {
  if (!g) return;
#ifdef TRAINYARD_HAVE_CUDA
  gen_cuda_free(g->cu);
#endif
  free(g->block);
  free(g);
}

int gen_refresh_adapter(gen_t *g, char *err, size_t errlen) {
#ifdef TRAINYARD_HAVE_CUDA
  if (g->cu && g->lo) return gen_cuda_set_adapter(g->cu, g->lo, err, errlen);
#endif
  (void)g, (void)err, (void)errlen;
  return 0;
}

void gen_reset(gen_t *g) {
  g->len = 0;
}

int gen_len(const gen_t *g) {
  return g->len;
}

const float *gen_logits(const gen_t *g) {
  return g->logits;
}

/* out (n, OUT) = beta * out + x (n, IN) @ W^T. One row (each generated
 * token) is a matrix-vector product: sgemm would pack all of W first. */
static void matmul(float *out, const float *x, const float *W, int n, int IN, int OUT, float beta) {
  if (n == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, OUT, IN, 1.0f, W, IN, x, 1, beta, out, 1);
  else
    cpu_matmul_forward(out, x, W, n, IN, OUT, beta);
}

/* out (n, OUT) = beta * out + x (n, IN) @ W^T, plus the adapter's
 * scale * (x A^T) B^T when target is adapted in layer l. */
static void proj(gen_t *g, int l, int target, float *out, const float *x, const float *W, int n,
                 int IN, int OUT, float beta) {
  matmul(out, x, W, n, IN, OUT, beta);
  const lora_t *lo = g->lo;
  if (!lo || !lora_has_target(lo, target)) return;
  const lora_pair_t *ab = &lo->w[(size_t)l * JOBSPEC_TARGET_COUNT + target];
  matmul(g->xa, x, ab->A, n, IN, lo->R, 0.0f);
  for (size_t i = 0; i < (size_t)n * lo->R; i++) g->xa[i] *= lo->scale;
  matmul(out, g->xa, ab->B, n, lo->R, OUT, 1.0f);
}

/* One layer's attention over the cache, for rows [0, n) at positions
 * p0 .. p0+n-1, one (row, head) pair per work item. */
typedef struct {
  const gen_t *g;
  const float *kc, *vc; /* the layer's cache, (S, KVD) */
  int n, p0;
} att_ctx_t;

/* Softmax-weighted sum of the visible values, in one pass over the keys
 * (the running maximum rescales what was summed so far), so no row of
 * scores is kept: the output row is the accumulator. */
static void attention_items(void *vctx, size_t i0, size_t i1) {
  const att_ctx_t *c = vctx;
  const model_dims_t *d = &c->g->d;
  const int HS = d->HS, NH = d->NH, KVD = d->NKV * d->HS, QD = d->NH * d->HS;
  const int group = d->NH / d->NKV;
  const float inv = 1.0f / sqrtf((float)HS);
  for (size_t it = i0; it < i1; it++) {
    const int i = (int)(it / NH), h = (int)(it % NH), p = c->p0 + i;
    const float *q = c->g->q + (size_t)i * QD + (size_t)h * HS;
    float *o = c->g->att + (size_t)i * QD + (size_t)h * HS;
    const size_t koff = (size_t)(h / group) * HS;
    const int j0 = c->g->window > 0 && p - c->g->window + 1 > 0 ? p - c->g->window + 1 : 0;
    float mx = -INFINITY, sum = 0.0f;
    memset(o, 0, sizeof(float) * HS);
    for (int j = j0; j <= p; j++) {
      const float *k = c->kc + (size_t)j * KVD + koff, *v = c->vc + (size_t)j * KVD + koff;
      float s = 0.0f;
      for (int e = 0; e < HS; e++) s += q[e] * k[e];
      s *= inv;
      if (s > mx) {
        const float r = expf(mx - s); /* 0 on the first key */
        sum *= r;
        for (int e = 0; e < HS; e++) o[e] *= r;
        mx = s;
      }
      const float wgt = expf(s - mx);
      sum += wgt;
      for (int e = 0; e < HS; e++) o[e] += wgt * v[e];
    }
    for (int e = 0; e < HS; e++) o[e] /= sum;
  }
}

/* Tokens [0, n) of a chunk (n <= GEN_CHUNK) at positions g->len ...;
 * leaves the last token's logits. */
static void feed_chunk(gen_t *g, const int *tokens, int n) {
  const model_dims_t *d = &g->d;
  const model_weights_t *w = g->w;
  const int C = d->C, QD = d->NH * d->HS, KVD = d->NKV * d->HS, FF = d->FF, p0 = g->len;
  for (int i = 0; i < n; i++) g->pos[i] = p0 + i;
  cpu_embedding_forward(g->x, tokens, w->embed_tokens, n, C);
  for (int l = 0; l < d->L; l++) {
    const model_layer_t *lw = &w->layers[l];
    float *kc = g->kc + (size_t)l * g->S * KVD, *vc = g->vc + (size_t)l * g->S * KVD;
    float *k = kc + (size_t)p0 * KVD, *v = vc + (size_t)p0 * KVD; /* the new rows, in place */
    cpu_rmsnorm_forward(g->ln, g->rstd, g->x, lw->input_layernorm, n, C, d->eps);
    proj(g, l, JOBSPEC_TARGET_BIT_Q, g->q, g->ln, lw->q_proj, n, C, QD, 0.0f);
    proj(g, l, JOBSPEC_TARGET_BIT_K, k, g->ln, lw->k_proj, n, C, KVD, 0.0f);
    proj(g, l, JOBSPEC_TARGET_BIT_V, v, g->ln, lw->v_proj, n, C, KVD, 0.0f);
    if (d->qkv_bias) { /* Qwen2: before the rotation, as in training */
      cpu_bias_forward(g->q, lw->q_bias, n, QD);
      cpu_bias_forward(k, lw->k_bias, n, KVD);
      cpu_bias_forward(v, lw->v_bias, n, KVD);
    }
    cpu_rope_forward(g->q, g->cos_t, g->sin_t, g->pos, 1, n, d->NH, d->HS);
    cpu_rope_forward(k, g->cos_t, g->sin_t, g->pos, 1, n, d->NKV, d->HS);
    att_ctx_t ac = {g, kc, vc, n, p0};
    pool_for((size_t)n * d->NH, 1, attention_items, &ac);
    proj(g, l, JOBSPEC_TARGET_BIT_O, g->x, g->att, lw->o_proj, n, QD, C, 1.0f);
    cpu_rmsnorm_forward(g->ln, g->rstd, g->x, lw->post_attention_layernorm, n, C, d->eps);
    proj(g, l, JOBSPEC_TARGET_BIT_GATE, g->gate, g->ln, lw->gate_proj, n, C, FF, 0.0f);
    proj(g, l, JOBSPEC_TARGET_BIT_UP, g->up, g->ln, lw->up_proj, n, C, FF, 0.0f);
    cpu_swiglu_forward(g->gate, g->gate, g->up, (size_t)n * FF);
    proj(g, l, JOBSPEC_TARGET_BIT_DOWN, g->x, g->gate, lw->down_proj, n, FF, C, 1.0f);
  }
  const float *last = g->x + (size_t)(n - 1) * C;
  cpu_rmsnorm_forward(g->ln, g->rstd, last, w->norm, 1, C, d->eps);
  matmul(g->logits, g->ln, w->lm_head, 1, C, d->V, 0.0f);
  g->len += n;
}

int gen_feed(gen_t *g, const int *tokens, int n, char *err, size_t errlen) {
  if (n < 1) return ty_errf(err, errlen, TY_EINVAL, "nothing to decode: no tokens");
  if (n > g->S - g->len)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%d more tokens would pass the decoder's %d-token cache (%d held)", n, g->S,
                   g->len);
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= g->d.V)
      return ty_errf(err, errlen, TY_EINVAL,
                     "token %d at position %d is outside the model's vocabulary [0, %d)", tokens[i],
                     g->len + i, g->d.V);
#ifdef TRAINYARD_HAVE_CUDA
  if (g->cu) {
    for (int i = 0; i < n; i += GEN_CHUNK) {
      const int k = n - i < GEN_CHUNK ? n - i : GEN_CHUNK;
      int rc =
          gen_cuda_feed(g->cu, tokens + i, k, g->len, i + k == n ? g->logits : NULL, err, errlen);
      if (rc) return rc;
      g->len += k;
    }
    return 0;
  }
#endif
  for (int i = 0; i < n; i += GEN_CHUNK)
    feed_chunk(g, tokens + i, n - i < GEN_CHUNK ? n - i : GEN_CHUNK);
  return 0;
}

/* Descending probability, then ascending id (a total order: the same
 * nucleus on every host). */
static int by_prob(const void *a, const void *b, void *ctx) {
  const float *p = ctx;
  const int i = *(const int *)a, j = *(const int *)b;
  if (p[i] != p[j]) return p[i] > p[j] ? -1 : 1;
  return (i > j) - (i < j);
}

int gen_sample(const float *logits, int V, float temperature, float top_p, uint64_t *rng,
               float *scratch, int *idx) {
  int best = 0;
  for (int i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  if (temperature <= 0.0f) return best;
  const float mx = logits[best];
  double total = 0.0;
  for (int i = 0; i < V; i++) {
    scratch[i] = expf((logits[i] - mx) / temperature);
    total += scratch[i];
    idx[i] = i;
  }
  for (int i = 0; i < V; i++) scratch[i] = (float)(scratch[i] / total);
  qsort_r(idx, (size_t)V, sizeof *idx, by_prob, scratch);
  int k = 0;
  double mass = 0.0; /* of the nucleus idx[0 .. k) */
  while (k < V && (k == 0 || mass < top_p)) mass += scratch[idx[k++]];
  rng_t r = {*rng};
  double u = rng_uniform(&r) * mass;
  *rng = r.s;
  for (int i = 0; i < k; i++) {
    u -= scratch[idx[i]];
    if (u < 0.0) return idx[i];
  }
  return idx[k - 1]; /* rounding left u at or just above 0 */
}
