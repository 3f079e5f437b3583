/* thin.c - min/max bucket thinning of a curve; see thin.h. */
#include "server/thin.h"

#include <math.h>

size_t thin_pick(const double *y, size_t n, size_t max_points, size_t *keep) {
  if (max_points < THIN_MIN_POINTS) max_points = THIN_MIN_POINTS;
  if (n <= max_points) {
    for (size_t i = 0; i < n; i++) keep[i] = i;
    return n;
  }
  const size_t buckets = max_points / THIN_MIN_POINTS;
  size_t k = 0;
  for (size_t b = 0; b < buckets; b++) {
    /* [lo, hi): the later buckets take the remainder's extra points. */
    size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    size_t lo_i = lo, hi_i = lo; /* index of the min and of the max */
    int seen = 0;
    for (size_t i = lo; i < hi; i++) {
      if (isnan(y[i])) continue;
      if (!seen || y[i] < y[lo_i]) lo_i = i;
      if (!seen || y[i] > y[hi_i]) hi_i = i;
      seen = 1;
    }
    size_t pick[4] = {lo, lo_i, hi_i, hi - 1};
    /* In index order, each once. */
    if (pick[1] > pick[2]) {
      size_t t = pick[1];
      pick[1] = pick[2], pick[2] = t;
    }
    for (int j = 0; j < 4; j++)
      if (k == 0 || keep[k - 1] < pick[j]) keep[k++] = pick[j];
  }
  return k;
}
