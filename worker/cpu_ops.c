/* cpu_ops.c - the CPU kernels of the Llama decoder (see cpu_ops.h). */
#include "worker/cpu_ops.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

/* Below this many floats of work a parallel region costs more than it saves. */
#define CPU_PAR_MIN 16384

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

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps) {
#pragma omp parallel for if ((size_t)N * C > CPU_PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *x = inp + (size_t)r * C;
    float *y = out + (size_t)r * C;
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    float s = (float)(1.0 / sqrt(ss / C + eps));
    for (int c = 0; c < C; c++) y[c] = weight[c] * (x[c] * s);
    rstd[r] = s;
  }
}

void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *dresid,
                          const float *inp, const float *weight, const float *rstd, int N, int C) {
  /* dweight first: dinp may alias dresid, never dout or inp. Columns are
   * split between threads, so each sum runs over rows in order. */
  if (dweight) {
#pragma omp parallel for if ((size_t)N * C > CPU_PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += 64) {
      int c1 = c0 + 64 < C ? c0 + 64 : C;
      for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
        for (int c = c0; c < c1; c++) dweight[c] += dy[c] * x[c] * rstd[r];
      }
    }
  }
  /* dx = rstd * (w*dy - xhat * mean(w*dy * xhat)), xhat = x * rstd. */
#pragma omp parallel for if ((size_t)N * C > CPU_PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
    const float *dres = dresid ? dresid + (size_t)r * C : NULL;
    float *dx = dinp + (size_t)r * C;
    float s = rstd[r];
    double dot = 0.0;
    for (int c = 0; c < C; c++) dot += (double)(weight[c] * dy[c]) * (x[c] * s);
    float m = (float)(dot / C);
    for (int c = 0; c < C; c++) {
      float g = s * (weight[c] * dy[c] - x[c] * s * m);
      dx[c] = dres ? dres[c] + g : g;
    }
  }
}

void cpu_rope_tables(float *cos_t, float *sin_t, int T, int HS, double theta) {
  int half = HS / 2;
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double inv_freq = 1.0 / pow(theta, (2.0 * i) / HS);
      double a = t * inv_freq;
      cos_t[(size_t)t * half + i] = (float)cos(a);
      sin_t[(size_t)t * half + i] = (float)sin(a);
    }
}

/* sign +1: forward rotation by +angle; -1: the inverse (its transpose). */
static void rope_apply(float *x, const float *cos_t, const float *sin_t, int B, int T, int NX,
                       int HS, float sign) {
  int half = HS / 2;
#pragma omp parallel for if ((size_t)B * T * NX * HS > CPU_PAR_MIN)
  for (int bt = 0; bt < B * T; bt++) {
    int t = bt % T;
    const float *cs = cos_t + (size_t)t * half, *sn = sin_t + (size_t)t * half;
    for (int h = 0; h < NX; h++) {
      float *v = x + ((size_t)bt * NX + h) * HS;
      for (int i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half], s = sign * sn[i];
        v[i] = x1 * cs[i] - x2 * s;
        v[i + half] = x2 * cs[i] + x1 * s;
      }
    }
  }
}

void cpu_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int NX,
                      int HS) {
  rope_apply(x, cos_t, sin_t, B, T, NX, HS, 1.0f);
}

void cpu_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int NX,
                       int HS) {
  rope_apply(dx, cos_t, sin_t, B, T, NX, HS, -1.0f);
}

void cpu_attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                           int B, int T, int NH, int NKV, int HS) {
  const int QD = NH * HS, KVD = NKV * HS, group = NH / NKV;
  const float scale = 1.0f / sqrtf((float)HS);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *qh = q + (size_t)b * T * QD + (size_t)h * HS;
      const float *kh = k + (size_t)b * T * KVD + (size_t)(h / group) * HS;
      const float *vh = v + (size_t)b * T * KVD + (size_t)(h / group) * HS;
      float *P = att + ((size_t)b * NH + h) * T * T;
      /* scores (T, T) = scale * q_h (T, HS) @ k_h (T, HS)^T */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, qh, QD, kh, KVD, 0.0f,
                  P, T);
#pragma omp parallel for if ((size_t)T * T > CPU_PAR_MIN)
      for (int i = 0; i < T; i++) {
        float *row = P + (size_t)i * T;
        float mx = row[0];
        for (int j = 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j <= i; j++) {
          row[j] = expf(row[j] - mx);
          sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= i; j++) row[j] *= inv;
        for (int j = i + 1; j < T; j++) row[j] = 0.0f;
      }
      /* out_h (T, HS) = P (T, T) @ v_h (T, HS) */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, P, T, vh, KVD, 0.0f,
                  out + (size_t)b * T * QD + (size_t)h * HS, QD);
    }
}

void cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                            const float *att, const float *q, const float *k, const float *v, int B,
                            int T, int NH, int NKV, int HS) {
  const int QD = NH * HS, KVD = NKV * HS, group = NH / NKV;
  const float scale = 1.0f / sqrtf((float)HS);
  /* Heads of one group add into the same dk, dv. */
  memset(dk, 0, sizeof(float) * (size_t)B * T * KVD);
  memset(dv, 0, sizeof(float) * (size_t)B * T * KVD);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      size_t qoff = (size_t)b * T * QD + (size_t)h * HS;
      size_t kvoff = (size_t)b * T * KVD + (size_t)(h / group) * HS;
      const float *P = att + ((size_t)b * NH + h) * T * T;
      float *dS = scratch;
      /* dv_h (T, HS) += P^T @ dout_h; dP (T, T) = dout_h @ v_h^T */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, P, T, dout + qoff, QD,
                  1.0f, dv + kvoff, KVD);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, dout + qoff, QD,
                  v + kvoff, KVD, 0.0f, dS, T);
      /* softmax backward: dS = P * (dP - sum_j P dP), zero above the diagonal */
#pragma omp parallel for if ((size_t)T * T > CPU_PAR_MIN)
      for (int i = 0; i < T; i++) {
        const float *p = P + (size_t)i * T;
        float *d = dS + (size_t)i * T;
        float dot = 0.0f;
        for (int j = 0; j <= i; j++) dot += p[j] * d[j];
        for (int j = 0; j <= i; j++) d[j] = p[j] * (d[j] - dot);
        for (int j = i + 1; j < T; j++) d[j] = 0.0f;
      }
      /* dq_h = scale * dS @ k_h; dk_h += scale * dS^T @ q_h */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, scale, dS, T, k + kvoff, KVD,
                  0.0f, dq + qoff, QD);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, scale, dS, T, q + qoff, QD,
                  1.0f, dk + kvoff, KVD);
    }
}

void cpu_swiglu_forward(float *h, const float *gate, const float *up, size_t n) {
#pragma omp parallel for if (n > CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    float g = gate[i];
    h[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                         const float *up, size_t n) {
  /* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g) */
#pragma omp parallel for if (n > CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    float g = gate[i], s = 1.0f / (1.0f + expf(-g)), d = dh[i];
    dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
  }
}

void cpu_embedding_forward(float *out, const int *tokens, const float *embed, int N, int C) {
#pragma omp parallel for if ((size_t)N * C > CPU_PAR_MIN)
  for (int r = 0; r < N; r++)
    memcpy(out + (size_t)r * C, embed + (size_t)tokens[r] * C, sizeof(float) * C);
}

void cpu_embedding_backward(float *dembed, const float *dout, const int *tokens, int N, int C) {
  /* Two rows may share a token: split columns, not rows, between threads. */
#pragma omp parallel for if ((size_t)N * C > CPU_PAR_MIN)
  for (int c0 = 0; c0 < C; c0 += 64) {
    int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int r = 0; r < N; r++) {
      float *dst = dembed + (size_t)tokens[r] * C;
      const float *src = dout + (size_t)r * C;
      for (int c = c0; c < c1; c++) dst[c] += src[c];
    }
  }
}

double cpu_crossentropy_forward(float *losses, const float *logits, const int *targets, int N,
                                int V) {
#pragma omp parallel for if ((size_t)N * V > CPU_PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *l = logits + (size_t)r * V;
    float mx = l[0];
    for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
    double sum = 0.0;
    for (int j = 0; j < V; j++) sum += expf(l[j] - mx);
    losses[r] = (float)(log(sum) + mx - l[targets[r]]);
  }
  double total = 0.0;
  for (int r = 0; r < N; r++) total += losses[r];
  return total;
}

void cpu_crossentropy_backward(float *logits, const int *targets, int N, int V, float dloss) {
#pragma omp parallel for if ((size_t)N * V > CPU_PAR_MIN)
  for (int r = 0; r < N; r++) {
    float *l = logits + (size_t)r * V;
    float mx = l[0];
    for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
      l[j] = expf(l[j] - mx);
      sum += l[j];
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < V; j++) l[j] *= inv * dloss;
    l[targets[r]] -= dloss;
  }
}
