/* thin.h - curves thinned for drawing: of a series of n points, at most
 * max_points, keeping what a chart must show. The points are cut into
 * max_points / 4 buckets of consecutive points (equal counts, the earlier
 * ones one shorter when n does not divide), and of each bucket its first
 * and last point and the points of its smallest and largest value are
 * kept (one point may be several of those), in order. A spike of one step
 * is never thinned away, and the series' ends stay. */
#ifndef TY_SERVER_THIN_H
#define TY_SERVER_THIN_H

#include <stddef.h>

#define THIN_MIN_POINTS 4 /* the fewest max_points allowed: one bucket */

/* Writes the indices kept, ascending, to keep (room for n, or for
 * max_points when smaller) and returns their count. y[i] NaN (a step
 * without a value) is never a bucket's min or max. n <= max_points keeps
 * every point; max_points < THIN_MIN_POINTS is taken as THIN_MIN_POINTS. */
size_t thin_pick(const double *y, size_t n, size_t max_points, size_t *keep);

#endif
