/* comm_shm_coll.c - the shared-memory collectives, chunked through each
 * rank's halves of the segment with every rank copying in parallel (layout
 * and the round discipline in comm_shm.h):
 *   all_gather      each rank writes its piece to its half; barrier; each
 *                   rank copies every piece out            (1 barrier/round)
 *   reduce_scatter  each rank writes its piece of every destination's block
 *                   to its half; barrier; each rank sums its own block's
 *                   pieces over the ranks, in rank order    (1 barrier/round)
 *   all_reduce      each rank writes its piece; barrier; rank r sums the
 *                   r-th sub-range over ranks and writes it back into its
 *                   own half; barrier; each rank copies the sums out
 *                                                            (2 barriers/round)
 *   broadcast       root writes; barrier; the others copy   (1 barrier/round)
 * Every element of a reduction is summed by exactly one rank in rank order,
 * so all ranks get bitwise the same values. */
#include <string.h>

#include "common/errors.h"
#include "worker/dist/comm_shm.h"

/* Elements of a block of n elements that fall in [off, off + piece). */
static size_t piece_of(size_t n, size_t off, size_t piece) {
  if (n <= off) return 0;
  return n - off < piece ? n - off : piece;
}

static void set_displ(shm_t *s, const size_t *counts, int world) {
  size_t d = 0;
  for (int r = 0; r < world; r++) {
    s->displ[r] = d;
    d += counts[r];
  }
}

static size_t rounds_for(size_t longest, size_t piece) {
  size_t k = (longest + piece - 1) / piece;
  return k ? k : 1; /* one round even for nothing: it checks the metadata */
}

static size_t max_count(const size_t *counts, int world) {
  size_t m = 0;
  for (int r = 0; r < world; r++)
    if (counts[r] > m) m = counts[r];
  return m;
}

static void add2(float *restrict out, const float *restrict a, const float *restrict b,
                 size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void add_to(float *restrict out, const float *restrict a, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] += a[i];
}

/* out[0..n) = sum over r of rank r's half at sub_off, added in rank order:
 * ((h0 + h1) + h2) + ... ; one pass per rank after the first two. */
static void sum_ranks(shm_t *s, int world, size_t sub_off, float *out, size_t n) {
  if (!n) return;
  if (world == 1) {
    memcpy(out, shm_slot(s, 0) + sub_off, n * sizeof(float));
    return;
  }
  add2(out, shm_slot(s, 0) + sub_off, shm_slot(s, 1) + sub_off, n);
  for (int r = 2; r < world; r++) add_to(out, shm_slot(s, r) + sub_off, n);
}

static int shm_all_gather(comm_t *c, const float *send, float *recv, const size_t *counts,
                          size_t total) {
  shm_t *s = c->impl;
  int me = c->rank, world = c->world;
  size_t piece = s->half_floats;
  set_displ(s, counts, world);
  size_t rounds = rounds_for(max_count(counts, world), piece);
  shm_begin(c, SHM_OP_ALL_GATHER, 0, total, "all_gather");
  for (size_t k = 0; k < rounds; k++) {
    size_t off = k * piece, n = piece_of(counts[me], off, piece);
    if (n) memcpy(shm_slot(s, me), send + off, n * sizeof(float));
    int rc = shm_sync(c, k == 0);
    if (rc) return rc;
    for (int r = 0; r < world; r++) {
      size_t nr = piece_of(counts[r], off, piece);
      if (!nr) continue;
      float *dst = recv + s->displ[r] + off;
      if (r != me)
        memcpy(dst, shm_slot(s, r), nr * sizeof(float));
      else if (dst != send + off)
        memmove(dst, send + off, nr * sizeof(float));
    }
    s->round++;
  }
  return 0;
}

static int shm_reduce_scatter(comm_t *c, const float *send, float *recv, const size_t *counts,
                              size_t total) {
  shm_t *s = c->impl;
  int me = c->rank, world = c->world;
  size_t piece = s->half_floats / (size_t)world; /* one sub-slot per destination */
  set_displ(s, counts, world);
  size_t rounds = rounds_for(max_count(counts, world), piece);
  shm_begin(c, SHM_OP_REDUCE_SCATTER, 0, total, "reduce_scatter");
  for (size_t k = 0; k < rounds; k++) {
    size_t off = k * piece;
    float *mine = shm_slot(s, me);
    for (int r = 0; r < world; r++) {
      size_t nr = piece_of(counts[r], off, piece);
      if (nr) memcpy(mine + (size_t)r * piece, send + s->displ[r] + off, nr * sizeof(float));
    }
    int rc = shm_sync(c, k == 0);
    if (rc) return rc;
    /* recv may be send's own block: that piece is already staged. */
    sum_ranks(s, world, (size_t)me * piece, recv + off, piece_of(counts[me], off, piece));
    s->round++;
  }
  return 0;
}

static int shm_all_reduce(comm_t *c, float *buf, size_t count) {
  shm_t *s = c->impl;
  int me = c->rank, world = c->world;
  size_t piece = s->half_floats;
  size_t rounds = rounds_for(count, piece);
  shm_begin(c, SHM_OP_ALL_REDUCE, 0, count, "all_reduce");
  for (size_t k = 0; k < rounds; k++) {
    size_t off = k * piece, n = piece_of(count, off, piece);
    float *mine = shm_slot(s, me);
    if (n) memcpy(mine, buf + off, n * sizeof(float));
    int rc = shm_sync(c, k == 0);
    if (rc) return rc;
    size_t first, m;
    comm_shard_rows(n, world, me, &first, &m);
    /* Sum into buf (private), then publish in this rank's own half: only
     * this rank reads sub-range `me` of any half in this phase. */
    sum_ranks(s, world, first, buf + off + first, m);
    if (m) memcpy(mine + first, buf + off + first, m * sizeof(float));
    rc = shm_sync(c, 0);
    if (rc) return rc;
    for (int r = 0; r < world; r++) {
      if (r == me) continue;
      comm_shard_rows(n, world, r, &first, &m);
      if (m) memcpy(buf + off + first, shm_slot(s, r) + first, m * sizeof(float));
    }
    s->round++;
  }
  return 0;
}

static int shm_broadcast(comm_t *c, float *buf, size_t count, int root) {
  shm_t *s = c->impl;
  size_t piece = s->half_floats;
  size_t rounds = rounds_for(count, piece);
  shm_begin(c, SHM_OP_BROADCAST, (uint32_t)root, count, "broadcast");
  for (size_t k = 0; k < rounds; k++) {
    size_t off = k * piece, n = piece_of(count, off, piece);
    if (c->rank == root && n) memcpy(shm_slot(s, root), buf + off, n * sizeof(float));
    int rc = shm_sync(c, k == 0);
    if (rc) return rc;
    if (c->rank != root && n) memcpy(buf + off, shm_slot(s, root), n * sizeof(float));
    s->round++;
  }
  return 0;
}

static int shm_barrier(comm_t *c) {
  shm_t *s = c->impl;
  shm_begin(c, SHM_OP_BARRIER, 0, 0, "barrier");
  int rc = shm_sync(c, 1);
  s->round++;
  return rc;
}

const comm_ops_t comm_shm_ops = {
    .name = "shm",
    .all_gather = shm_all_gather,
    .reduce_scatter = shm_reduce_scatter,
    .all_reduce = shm_all_reduce,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .close = shm_close,
};
