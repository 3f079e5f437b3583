/* test_weightinit.c - the counter-based initial weights: statistics (mean 0,
 * std 0.02, bounded), independence from chunking, distinct streams. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/model/weightinit.h"

static void test_statistics(void **state) {
  (void)state;
  const size_t n = 1u << 20;
  float *v = malloc(n * sizeof *v);
  winit_fill(winit_stream(1234, "model.layers.0.mlp.up_proj.weight"), false, 0, v, n);
  double sum = 0, sq = 0;
  float lo = 1, hi = -1;
  for (size_t i = 0; i < n; i++) {
    sum += v[i];
    sq += (double)v[i] * v[i];
    lo = v[i] < lo ? v[i] : lo;
    hi = v[i] > hi ? v[i] : hi;
  }
  double mean = sum / n, sd = sqrt(sq / n - mean * mean);
  assert_true(fabs(mean) < 1e-4);                                   /* 5 standard errors of 2e-5 */
  assert_true(fabs(sd - WINIT_STD) < 2e-4);                         /* 1% of 0.02 */
  assert_true(lo >= -3.47f * WINIT_STD && hi <= 3.47f * WINIT_STD); /* Irwin-Hall bound */
  assert_true(lo < -3 * WINIT_STD && hi > 3 * WINIT_STD);           /* but with real tails */
  free(v);
}

static void test_chunking_and_streams(void **state) {
  (void)state;
  float whole[1000], part[1000], other[1000];
  uint64_t s = winit_stream(7, "lm_head.weight");
  winit_fill(s, false, 0, whole, 1000);
  /* Any split of the index range gives the same values. */
  size_t cuts[] = {0, 1, 333, 334, 999, 1000};
  for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
    winit_fill(s, false, cuts[c], part + cuts[c], cuts[c + 1] - cuts[c]);
  assert_memory_equal(whole, part, sizeof whole);
  /* Another tensor, another seed: other values. */
  winit_fill(winit_stream(7, "model.embed_tokens.weight"), false, 0, other, 1000);
  assert_true(memcmp(whole, other, sizeof whole) != 0);
  winit_fill(winit_stream(8, "lm_head.weight"), false, 0, other, 1000);
  assert_true(memcmp(whole, other, sizeof whole) != 0);
  winit_fill(s, true, 5, other, 10);
  for (int i = 0; i < 10; i++) assert_true(other[i] == 1.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_statistics),
                                     cmocka_unit_test(test_chunking_and_streams)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
