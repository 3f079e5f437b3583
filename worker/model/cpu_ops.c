/* cpu_ops.c - the CPU kernels of the Llama decoder (see cpu_ops.h). */
#include "worker/model/cpu_ops.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

#include "worker/model/cpu_pool.h"

/* Below this many floats of work per thread, waking threads costs more
 * than it saves. */
#define CPU_PAR_MIN 16384
/* Rows of `width` floats that make up CPU_PAR_MIN. */
#define ROWS_MIN(width) ((size_t)(CPU_PAR_MIN / ((width) > 0 ? (width) : 1)) + 1)

void cpu_matmul_forward(float *out, const float *inp, const float *weight, int N, int IN, int OUT,
                        float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OUT, IN, 1.0f, inp, IN, weight, IN, beta,
              out, OUT);
}

void cpu_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int IN, int OUT, float dinp_beta) {
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IN, OUT, 1.0f, dout, OUT, weight, IN,
                dinp_beta, dinp, IN);
  if (dweight)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, IN, N, 1.0f, dout, OUT, inp, IN, 1.0f,
                dweight, IN);
}

/* The arguments of a row kernel, handed to the pool. */
typedef struct {
  float *out, *rstd, *dinp, *dweight, *x, *dx;
  const float *inp, *weight, *dout, *dresid, *srstd, *cos_t, *sin_t, *a, *b;
  const int *tokens, *pos; /* pos: tokens' positions in their documents, or NULL */
  int N, C, T, NX, HS, V;
  float eps, scale;
} rows_t;

static void bias_fwd_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  for (size_t r = r0; r < r1; r++) {
    float *y = k->out + r * (size_t)k->C;
    for (int c = 0; c < k->C; c++) y[c] += k->weight[c];
  }
}

void cpu_bias_forward(float *out, const float *bias, int N, int OUT) {
  rows_t k = {.out = out, .weight = bias, .N = N, .C = OUT};
  pool_for((size_t)N, ROWS_MIN(OUT), bias_fwd_rows, &k);
}

/* Columns [c0, c1) of dbias, each summed over rows in order. */
static void bias_bwd_cols(void *p, size_t c0, size_t c1) {
  const rows_t *k = p;
  for (int r = 0; r < k->N; r++) {
    const float *dy = k->dout + (size_t)r * k->C;
    for (size_t c = c0; c < c1; c++) k->dweight[c] += dy[c];
  }
}

void cpu_bias_backward(float *dbias, const float *dout, int N, int OUT) {
  rows_t k = {.dweight = dbias, .dout = dout, .N = N, .C = OUT};
  pool_for((size_t)OUT, ROWS_MIN(N), bias_bwd_cols, &k);
}

static void rmsnorm_fwd_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const int C = k->C;
  for (size_t r = r0; r < r1; r++) {
    const float *x = k->inp + r * C;
    float *y = k->out + r * C;
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    float s = (float)(1.0 / sqrt(ss / C + k->eps));
    for (int c = 0; c < C; c++) y[c] = k->weight[c] * (x[c] * s);
    k->rstd[r] = s;
  }
}

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps) {
  rows_t k = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .N = N, .C = C, .eps = eps};
  pool_for((size_t)N, ROWS_MIN(C), rmsnorm_fwd_rows, &k);
}

/* Columns [c0, c1) of dweight, each summed over rows in order. */
static void rmsnorm_dw_cols(void *p, size_t c0, size_t c1) {
  const rows_t *k = p;
  const int C = k->C;
  for (int r = 0; r < k->N; r++) {
    const float *x = k->inp + (size_t)r * C, *dy = k->dout + (size_t)r * C;
    for (size_t c = c0; c < c1; c++) k->dweight[c] += dy[c] * x[c] * k->srstd[r];
  }
}

/* dx = rstd * (w*dy - xhat * mean(w*dy * xhat)), xhat = x * rstd. */
static void rmsnorm_bwd_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const int C = k->C;
  for (size_t r = r0; r < r1; r++) {
    const float *x = k->inp + r * C, *dy = k->dout + r * C;
    const float *dres = k->dresid ? k->dresid + r * C : NULL;
    float *dx = k->dinp + r * C;
    float s = k->srstd[r];
    double dot = 0.0;
    for (int c = 0; c < C; c++) dot += (double)(k->weight[c] * dy[c]) * (x[c] * s);
    float m = (float)(dot / C);
    for (int c = 0; c < C; c++) {
      float g = s * (k->weight[c] * dy[c] - x[c] * s * m);
      dx[c] = dres ? dres[c] + g : g;
    }
  }
}

void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *dresid,
                          const float *inp, const float *weight, const float *rstd, int N, int C) {
  rows_t k = {.dinp = dinp,
              .dweight = dweight,
              .dout = dout,
              .dresid = dresid,
              .inp = inp,
              .weight = weight,
              .srstd = rstd,
              .N = N,
              .C = C};
  /* dweight first: dinp may alias dresid, never dout or inp. Columns are
   * split between threads, so the result does not depend on their number. */
  if (dweight) pool_for((size_t)C, ROWS_MIN(N), rmsnorm_dw_cols, &k);
  pool_for((size_t)N, ROWS_MIN(C), rmsnorm_bwd_rows, &k);
}

void cpu_rope_tables(float *cos_t, float *sin_t, int T, int HS, double theta,
                     const llama_rope_scaling_t *scaling) {
  int half = HS / 2;
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double inv_freq = llama_rope_inv_freq(theta, HS, i, scaling);
      double a = t * inv_freq;
      cos_t[(size_t)t * half + i] = (float)cos(a);
      sin_t[(size_t)t * half + i] = (float)sin(a);
    }
}

/* k->scale +1: rotation by +angle; -1: the inverse (its transpose). */
static void rope_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const int half = k->HS / 2;
  for (size_t bt = r0; bt < r1; bt++) {
    size_t t = k->pos ? (size_t)k->pos[bt] : bt % (size_t)k->T;
    const float *cs = k->cos_t + t * half, *sn = k->sin_t + t * half;
    for (int h = 0; h < k->NX; h++) {
      float *v = k->x + (bt * k->NX + h) * k->HS;
      for (int i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half], s = k->scale * sn[i];
        v[i] = x1 * cs[i] - x2 * s;
        v[i + half] = x2 * cs[i] + x1 * s;
      }
    }
  }
}

static void rope_apply(float *x, const float *cos_t, const float *sin_t, const int *pos, int B,
                       int T, int NX, int HS, float sign) {
  rows_t k = {.x = x,
              .cos_t = cos_t,
              .sin_t = sin_t,
              .pos = pos,
              .T = T,
              .NX = NX,
              .HS = HS,
              .scale = sign};
  pool_for((size_t)B * T, ROWS_MIN(NX * HS), rope_rows, &k);
}

void cpu_rope_forward(float *x, const float *cos_t, const float *sin_t, const int *pos, int B,
                      int T, int NX, int HS) {
  rope_apply(x, cos_t, sin_t, pos, B, T, NX, HS, 1.0f);
}

void cpu_rope_backward(float *dx, const float *cos_t, const float *sin_t, const int *pos, int B,
                       int T, int NX, int HS) {
  rope_apply(dx, cos_t, sin_t, pos, B, T, NX, HS, -1.0f);
}

/* The first key query row i may see: its document's first token
 * (i - pos[i]), or 0 without positions (one document a row). */
static size_t first_key(const rows_t *k, size_t i) {
  return k->pos ? i - (size_t)k->pos[i] : 0;
}

/* Row i of the scores k->x (T, T): softmax over j in [first_key, i], 0
 * elsewhere; k->out[i] receives the row's log-sum-exp, from which the
 * backward pass rebuilds the probabilities instead of keeping a (T, T)
 * matrix per head. */
static void causal_softmax_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const size_t T = (size_t)k->T;
  for (size_t i = r0; i < r1; i++) {
    float *row = k->x + i * T;
    const size_t j0 = first_key(k, i);
    float mx = row[j0];
    for (size_t j = j0 + 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
    for (size_t j = j0; j <= i; j++) {
      row[j] = expf(row[j] - mx);
      sum += row[j];
    }
    float inv = 1.0f / sum;
    for (size_t j = 0; j < j0; j++) row[j] = 0.0f;
    for (size_t j = j0; j <= i; j++) row[j] *= inv;
    for (size_t j = i + 1; j < T; j++) row[j] = 0.0f;
    k->out[i] = mx + logf(sum);
  }
}

/* Row i of the probabilities rebuilt from the scores k->x and the saved
 * log-sum-exp k->a: exp(s - lse) for j in [first_key, i], 0 elsewhere. */
static void causal_probs_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const size_t T = (size_t)k->T;
  for (size_t i = r0; i < r1; i++) {
    float *row = k->x + i * T;
    const float lse = k->a[i];
    const size_t j0 = first_key(k, i);
    for (size_t j = 0; j < j0; j++) row[j] = 0.0f;
    for (size_t j = j0; j <= i; j++) row[j] = expf(row[j] - lse);
    for (size_t j = i + 1; j < T; j++) row[j] = 0.0f;
  }
}

/* Row i of dS = P * (dP - sum_j P dP), in place over dP (k->x), 0 above
 * the diagonal; k->a holds P. */
static void softmax_bwd_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const size_t T = (size_t)k->T;
  for (size_t i = r0; i < r1; i++) {
    const float *pr = k->a + i * T;
    float *d = k->x + i * T;
    float dot = 0.0f;
    for (size_t j = 0; j <= i; j++) dot += pr[j] * d[j];
    for (size_t j = 0; j <= i; j++) d[j] = pr[j] * (d[j] - dot);
    for (size_t j = i + 1; j < T; j++) d[j] = 0.0f;
  }
}

/* Query rows per block of the causal products: block [i0, i1) reads only
 * keys [0, i1), so the products skip the masked upper triangle but for the
 * block's own diagonal square. 64 keeps each product large enough for
 * sgemm's packing to pay (at T = 256, 62% of the full square's work). */
#define ATT_ROWS 64

void cpu_attention_forward(float *out, float *lse, float *scratch, const float *q, const float *k,
                           const float *v, const int *pos, int B, int T, int NH, int NKV, int HS) {
  const int QD = NH * HS, KVD = NKV * HS, group = NH / NKV;
  const float scale = 1.0f / sqrtf((float)HS);
  float *P = scratch; /* (T, T); row i is written for columns < its block's end */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *qh = q + (size_t)b * T * QD + (size_t)h * HS;
      const float *kh = k + (size_t)b * T * KVD + (size_t)(h / group) * HS;
      const float *vh = v + (size_t)b * T * KVD + (size_t)(h / group) * HS;
      /* scores[i0:i1, 0:i1] = scale * q_h[i0:i1] @ k_h[0:i1]^T */
      for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
        int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, HS, scale,
                    qh + (size_t)i0 * QD, QD, kh, KVD, 0.0f, P + (size_t)i0 * T, T);
      }
      rows_t sk = {.x = P,
                   .out = lse + ((size_t)b * NH + h) * T,
                   .pos = pos ? pos + (size_t)b * T : NULL,
                   .T = T};
      pool_for((size_t)T, ROWS_MIN(T), causal_softmax_rows, &sk);
      /* out_h[i0:i1] (HS wide) = P[i0:i1, 0:i1] @ v_h[0:i1] */
      float *oh = out + (size_t)b * T * QD + (size_t)h * HS;
      for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
        int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, HS, i1, 1.0f,
                    P + (size_t)i0 * T, T, vh, KVD, 0.0f, oh + (size_t)i0 * QD, QD);
      }
    }
}

void cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                            const float *lse, const float *q, const float *k, const float *v,
                            const int *pos, int B, int T, int NH, int NKV, int HS) {
  const int QD = NH * HS, KVD = NKV * HS, group = NH / NKV;
  const float scale = 1.0f / sqrtf((float)HS);
  float *P = scratch, *dS = scratch + (size_t)T * T; /* (T, T) each */
  /* Heads of one group add into the same dk, dv. */
  memset(dk, 0, sizeof(float) * (size_t)B * T * KVD);
  memset(dv, 0, sizeof(float) * (size_t)B * T * KVD);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      size_t qoff = (size_t)b * T * QD + (size_t)h * HS;
      size_t kvoff = (size_t)b * T * KVD + (size_t)(h / group) * HS;
      /* Row block [i0, i1) against keys [0, i1): P rebuilt as scale * q_h @
       * k_h^T (then exp(s - lse) below), dP = dout_h @ v_h^T. */
      for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
        int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
        size_t qr = qoff + (size_t)i0 * QD;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, HS, scale, q + qr, QD,
                    k + kvoff, KVD, 0.0f, P + (size_t)i0 * T, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, HS, 1.0f, dout + qr, QD,
                    v + kvoff, KVD, 0.0f, dS + (size_t)i0 * T, T);
      }
      rows_t pk = {.x = P,
                   .a = lse + ((size_t)b * NH + h) * T,
                   .pos = pos ? pos + (size_t)b * T : NULL,
                   .T = T};
      pool_for((size_t)T, ROWS_MIN(T), causal_probs_rows, &pk);
      rows_t sk = {.x = dS, .a = P, .T = T};
      pool_for((size_t)T, ROWS_MIN(T), softmax_bwd_rows, &sk);
      for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
        int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
        size_t qr = qoff + (size_t)i0 * QD;
        const float *Pb = P + (size_t)i0 * T, *dSb = dS + (size_t)i0 * T;
        /* dv_h[0:i1] += P[i0:i1, 0:i1]^T @ dout_h[i0:i1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, HS, i1 - i0, 1.0f, Pb, T,
                    dout + qr, QD, 1.0f, dv + kvoff, KVD);
        /* dq_h[i0:i1] = scale * dS[i0:i1, 0:i1] @ k_h[0:i1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, HS, i1, scale, dSb, T,
                    k + kvoff, KVD, 0.0f, dq + qr, QD);
        /* dk_h[0:i1] += scale * dS[i0:i1, 0:i1]^T @ q_h[i0:i1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, HS, i1 - i0, scale, dSb, T, q + qr,
                    QD, 1.0f, dk + kvoff, KVD);
      }
    }
}

/* k->a gate, k->b up, k->out h. */
static void swiglu_fwd_range(void *p, size_t i0, size_t i1) {
  const rows_t *k = p;
  for (size_t i = i0; i < i1; i++) {
    float g = k->a[i];
    k->out[i] = g / (1.0f + expf(-g)) * k->b[i];
  }
}

void cpu_swiglu_forward(float *h, const float *gate, const float *up, size_t n) {
  rows_t k = {.out = h, .a = gate, .b = up};
  pool_for(n, CPU_PAR_MIN, swiglu_fwd_range, &k);
}

/* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g); k->dout dh, k->out dgate,
 * k->dx dup. */
static void swiglu_bwd_range(void *p, size_t i0, size_t i1) {
  const rows_t *k = p;
  for (size_t i = i0; i < i1; i++) {
    float g = k->a[i], s = 1.0f / (1.0f + expf(-g)), d = k->dout[i];
    k->out[i] = d * k->b[i] * s * (1.0f + g * (1.0f - s));
    k->dx[i] = d * g * s;
  }
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                         const float *up, size_t n) {
  rows_t k = {.out = dgate, .dx = dup, .dout = dh, .a = gate, .b = up};
  pool_for(n, CPU_PAR_MIN, swiglu_bwd_range, &k);
}

static void embedding_fwd_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  for (size_t r = r0; r < r1; r++)
    memcpy(k->out + r * k->C, k->weight + (size_t)k->tokens[r] * k->C, sizeof(float) * k->C);
}

void cpu_embedding_forward(float *out, const int *tokens, const float *embed, int N, int C) {
  rows_t k = {.out = out, .tokens = tokens, .weight = embed, .C = C};
  pool_for((size_t)N, ROWS_MIN(C), embedding_fwd_rows, &k);
}

/* Two rows may share a token: threads split columns, not rows. */
static void embedding_bwd_cols(void *p, size_t c0, size_t c1) {
  const rows_t *k = p;
  for (int r = 0; r < k->N; r++) {
    float *dst = k->dweight + (size_t)k->tokens[r] * k->C;
    const float *src = k->dout + (size_t)r * k->C;
    for (size_t c = c0; c < c1; c++) dst[c] += src[c];
  }
}

void cpu_embedding_backward(float *dembed, const float *dout, const int *tokens, int N, int C) {
  rows_t k = {.dweight = dembed, .dout = dout, .tokens = tokens, .N = N, .C = C};
  pool_for((size_t)C, ROWS_MIN(N), embedding_bwd_cols, &k);
}

/* k->a logits, k->tokens targets, k->out losses. */
static void ce_fwd_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const int V = k->V;
  for (size_t r = r0; r < r1; r++) {
    const float *l = k->a + r * V;
    float mx = l[0];
    for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
    double sum = 0.0; /* at least 1: the max's own term */
    for (int j = 0; j < V; j++) sum += expf(l[j] - mx);
    /* cppcheck-suppress invalidFunctionArg ; V >= 1, so sum >= 1 */
    k->out[r] = (float)(log(sum) + mx - l[k->tokens[r]]);
  }
}

double cpu_crossentropy_forward(float *losses, const float *logits, const int *targets, int N,
                                int V) {
  rows_t k = {.out = losses, .a = logits, .tokens = targets, .V = V};
  pool_for((size_t)N, ROWS_MIN(V), ce_fwd_rows, &k);
  double total = 0.0;
  for (int r = 0; r < N; r++) total += losses[r];
  return total;
}

/* k->x logits -> dlogits in place, k->tokens targets, k->scale dloss,
 * k->a each row's loss weight (NULL: 1). */
static void ce_bwd_rows(void *p, size_t r0, size_t r1) {
  const rows_t *k = p;
  const int V = k->V;
  for (size_t r = r0; r < r1; r++) {
    float *l = k->x + r * V;
    float mx = l[0];
    for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
      l[j] = expf(l[j] - mx);
      sum += l[j];
    }
    const float dl = k->a ? k->scale * k->a[r] : k->scale;
    float inv = (float)(1.0 / sum) * dl;
    for (int j = 0; j < V; j++) l[j] *= inv;
    l[k->tokens[r]] -= dl;
  }
}

void cpu_crossentropy_backward(float *logits, const int *targets, const float *weights, int N,
                               int V, float dloss) {
  rows_t k = {.x = logits, .a = weights, .tokens = targets, .V = V, .scale = dloss};
  pool_for((size_t)N, ROWS_MIN(V), ce_bwd_rows, &k);
}
