/* test_cpu_ops.c - causal grouped-query attention, forward and backward,
 * against a direct double-precision evaluation of the definition, at
 * sequence lengths that span several of the kernels' query-row blocks (and
 * end in a partial one), with query heads sharing kv heads. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "worker/model/cpu_ops.h"

static void fill(float *x, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((seed >> 8) / 16777216.0 - 0.5) * 2.0f;
  }
}

/* |got - want| within 1e-4 of want's magnitude (plus 1e-5 for values near 0). */
static void expect_close(const float *got, const double *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= 1e-4 * fabs(want[i]) + 1e-5))
      fail_msg("element %zu: %.8g, want %.8g", i, (double)got[i], want[i]);
}

/* The definition, in double: softmax over keys j <= i of scale * q_i . k_j,
 * and its gradients for upstream gradient dout. */
static void reference(double *out, double *dq, double *dk, double *dv, const float *q,
                      const float *k, const float *v, const float *dout, int B, int T, int NH,
                      int NKV, int HS) {
  const int QD = NH * HS, KVD = NKV * HS, group = NH / NKV;
  const double scale = 1.0 / sqrt((double)HS);
  double *p = calloc((size_t)T, sizeof *p), *dp = calloc((size_t)T, sizeof *dp);
  for (size_t i = 0; i < (size_t)B * T * KVD; i++) dk[i] = dv[i] = 0.0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const float *qi = q + ((size_t)b * T + i) * QD + (size_t)h * HS;
        const float *gi = dout + ((size_t)b * T + i) * QD + (size_t)h * HS;
        double mx = -INFINITY, sum = 0.0, dot = 0.0;
        for (int j = 0; j <= i; j++) {
          const float *kj = k + ((size_t)b * T + j) * KVD + (size_t)(h / group) * HS;
          double s = 0.0;
          for (int d = 0; d < HS; d++) s += (double)qi[d] * kj[d];
          p[j] = s * scale;
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
        for (int j = 0; j <= i; j++) {
          const float *vj = v + ((size_t)b * T + j) * KVD + (size_t)(h / group) * HS;
          p[j] /= sum;
          dp[j] = 0.0;
          for (int d = 0; d < HS; d++) dp[j] += (double)gi[d] * vj[d];
          dot += p[j] * dp[j];
        }
        double *oi = out + ((size_t)b * T + i) * QD + (size_t)h * HS;
        double *dqi = dq + ((size_t)b * T + i) * QD + (size_t)h * HS;
        for (int d = 0; d < HS; d++) oi[d] = dqi[d] = 0.0;
        for (int j = 0; j <= i; j++) {
          size_t kv = ((size_t)b * T + j) * KVD + (size_t)(h / group) * HS;
          double ds = p[j] * (dp[j] - dot) * scale;
          for (int d = 0; d < HS; d++) {
            oi[d] += p[j] * v[kv + d];
            dv[kv + d] += p[j] * gi[d];
            dqi[d] += ds * k[kv + d];
            dk[kv + d] += ds * qi[d];
          }
        }
      }
  free(p);
  free(dp);
}

static void check_attention(int B, int T, int NH, int NKV, int HS) {
  const size_t qn = (size_t)B * T * NH * HS, kn = (size_t)B * T * NKV * HS;
  float *q = malloc(qn * sizeof *q), *dout = malloc(qn * sizeof *dout);
  float *k = malloc(kn * sizeof *k), *v = malloc(kn * sizeof *v);
  float *out = malloc(qn * sizeof *out), *dq = malloc(qn * sizeof *dq);
  float *dk = malloc(kn * sizeof *dk), *dv = malloc(kn * sizeof *dv);
  float *lse = malloc((size_t)B * NH * T * sizeof *lse);
  float *scratch = malloc((size_t)2 * T * T * sizeof *scratch);
  double *rout = malloc(qn * sizeof *rout), *rdq = malloc(qn * sizeof *rdq);
  double *rdk = malloc(kn * sizeof *rdk), *rdv = malloc(kn * sizeof *rdv);
  fill(q, qn, 1);
  fill(k, kn, 2);
  fill(v, kn, 3);
  fill(dout, qn, 4);
  cpu_attention_forward(out, lse, scratch, q, k, v, NULL, B, T, NH, NKV, HS);
  cpu_attention_backward(dq, dk, dv, scratch, dout, lse, q, k, v, NULL, B, T, NH, NKV, HS);
  reference(rout, rdq, rdk, rdv, q, k, v, dout, B, T, NH, NKV, HS);
  expect_close(out, rout, qn);
  expect_close(dq, rdq, qn);
  expect_close(dk, rdk, kn);
  expect_close(dv, rdv, kn);
  free(q), free(dout), free(k), free(v), free(out), free(dq), free(dk), free(dv);
  free(lse), free(scratch), free(rout), free(rdq), free(rdk), free(rdv);
}

static void test_attention_one_block(void **state) {
  (void)state;
  check_attention(2, 7, 4, 2, 8);
}

static void test_attention_row_blocks(void **state) {
  (void)state;
  check_attention(2, 150, 4, 2, 16); /* blocks of 64, 64 and 22 rows */
  check_attention(1, 128, 3, 1, 8);  /* two full blocks, three heads on one kv head */
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_attention_one_block),
                                     cmocka_unit_test(test_attention_row_blocks)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
