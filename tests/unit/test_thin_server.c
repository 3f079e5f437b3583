/* test_thin_server.c - curve thinning (server/thin.c): short series kept
 * whole; long ones cut to at most max_points, ascending, with the ends, each
 * bucket's first, last, min and max; a one-step spike and dip survive;
 * NaN never taken for an extreme. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/thin.h"

static void test_short_series_whole(void **state) {
  (void)state;
  double y[5] = {1, 2, 3, 4, 5};
  size_t keep[5];
  assert_int_equal(thin_pick(y, 5, 5, keep), 5);
  for (size_t i = 0; i < 5; i++) assert_int_equal(keep[i], i);
  assert_int_equal(thin_pick(y, 0, 8, keep), 0);
}

static void test_bounds_and_extremes(void **state) {
  (void)state;
  enum { N = 100000 };
  double *y = malloc(N * sizeof *y);
  size_t *keep = malloc(N * sizeof *keep);
  for (size_t i = 0; i < N; i++) y[i] = 5.0 - (double)i / N + 0.01 * sin((double)i);
  y[31337] = 100.0; /* a spike */
  y[77777] = -50.0; /* a dip */
  for (size_t mp = 4; mp <= 4096; mp = mp * 3 + 1) {
    size_t k = thin_pick(y, N, mp, keep);
    assert_true(k <= mp);
    assert_true(k >= mp / 4 * 2); /* each bucket gives its first and last */
    assert_int_equal(keep[0], 0);
    assert_int_equal(keep[k - 1], N - 1);
    int spike = 0, dip = 0;
    for (size_t j = 0; j < k; j++) {
      if (j) assert_true(keep[j] > keep[j - 1]);
      spike |= keep[j] == 31337;
      dip |= keep[j] == 77777;
    }
    assert_true(spike && dip);
  }
  free(y);
  free(keep);
}

static void test_bucket_contents(void **state) {
  (void)state;
  double y[8] = {3, 9, 1, 4, 5, 5, 5, 5};
  size_t keep[8];
  /* max_points 7: one bucket; first 0, max 9 at 1, min 1 at 2, last 7. */
  size_t k = thin_pick(y, 8, 2 * THIN_MIN_POINTS - 1, keep);
  assert_int_equal(k, 4);
  const size_t one[4] = {0, 1, 2, 7};
  for (size_t j = 0; j < 4; j++) assert_int_equal(keep[j], one[j]);
  /* 10 points, max_points 8: buckets [0, 5) and [5, 10); a flat bucket
   * gives its first and last only. */
  double z[10] = {3, 9, 1, 4, 5, 5, 5, 5, 5, 5};
  size_t kz[10];
  k = thin_pick(z, 10, 8, kz);
  const size_t two[6] = {0, 1, 2, 4, 5, 9};
  assert_int_equal(k, 6);
  for (size_t j = 0; j < 6; j++) assert_int_equal(kz[j], two[j]);
}

static void test_nan_is_no_extreme(void **state) {
  (void)state;
  double y[12] = {NAN, 2, NAN, 7, 1, NAN, 3, 3, 3, 3, 3, NAN};
  size_t keep[12];
  size_t k = thin_pick(y, 12, 4, keep);
  /* One bucket: first 0, min 4 (1), max 3 (7), last 11. */
  assert_int_equal(k, 4);
  assert_int_equal(keep[0], 0);
  assert_int_equal(keep[1], 3);
  assert_int_equal(keep[2], 4);
  assert_int_equal(keep[3], 11);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_short_series_whole),
      cmocka_unit_test(test_bounds_and_extremes),
      cmocka_unit_test(test_bucket_contents),
      cmocka_unit_test(test_nan_is_no_extreme),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
