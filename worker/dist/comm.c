/* comm.c - the collective-communication dispatcher: parses the rendezvous,
 * checks arguments once for every backend, keeps the sticky error state, and
 * the dim-0 shard arithmetic; see comm.h. */
#include "worker/dist/comm.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/numbers.h"
#include "common/rankenv.h"
#include "common/xalloc.h"
#include "worker/dist/comm_impl.h"

int comm_fail(comm_t *c, int code, int rank, const char *fmt, ...) {
  c->broken = code;
  c->failed_rank = rank;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return code;
}

size_t comm_displ(const size_t *counts, int r) {
  size_t d = 0;
  for (int i = 0; i < r; i++) d += counts[i];
  return d;
}

static int timeout_from_env(int *out, char *err, size_t errlen) {
  long v = COMM_TIMEOUT_MS_DEFAULT;
  int rc = rankenv_long(RANKENV_COMM_TIMEOUT_MS, &v, err, errlen);
  if (rc) return rc;
  *out = (int)v;
  return 0;
}

int comm_open(comm_t **out, const char *rendezvous, int rank, int world_size, char *err,
              size_t errlen) {
  *out = NULL;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return ty_errf(err, errlen, TY_EINVAL, "rank %d of world size %d: need 0 <= rank < world_size",
                   rank, world_size);
  }
  if (!rendezvous) rendezvous = "self";
  comm_t *c = xcalloc(1, sizeof *c);
  c->rank = rank;
  c->world = world_size;
  c->failed_rank = -1;
  int rc = timeout_from_env(&c->timeout_ms, err, errlen);
  if (rc == 0) {
    if (!strcmp(rendezvous, "self")) {
      if (world_size != 1) {
        ty_errf(err, errlen, 0,
                "rendezvous 'self' serves one rank, not %d (use shm:<name> for CPU ranks)",
                world_size);
        rc = TY_EINVAL;
      } else {
        rc = comm_self_open(c, err, errlen);
      }
    } else if (!strncmp(rendezvous, "shm:", 4)) {
      rc = comm_shm_open(c, rendezvous + 4, err, errlen);
    } else if (!strncmp(rendezvous, "gloo:", 5)) {
#ifdef TRAINYARD_HAVE_GLOO
      rc = comm_gloo_open(c, rendezvous + 5, err, errlen);
#else
      ty_errf(err, errlen, 0,
              "rendezvous '%s' needs Gloo, and this trainyard-worker was built without it "
              "(install libgloo-dev and rebuild)",
              rendezvous);
      rc = TY_EUNIMPLEMENTED;
#endif
    } else if (!strncmp(rendezvous, "nccl:", 5)) {
#ifdef TRAINYARD_HAVE_NCCL
      rc = comm_nccl_open(c, rendezvous + 5, err, errlen);
#else
      ty_errf(err, errlen, 0,
              "rendezvous '%s' needs NCCL, and this trainyard-worker was built without CUDA/NCCL",
              rendezvous);
      rc = TY_EUNIMPLEMENTED;
#endif
    } else {
      ty_errf(err, errlen, 0,
              "unknown rendezvous '%s' (use self, shm:<name>, gloo:file:<dir> or "
              "nccl:file:<path>)",
              rendezvous);
      rc = TY_EINVAL;
    }
  }
  if (rc != 0) {
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int comm_open_env(comm_t **out, char *err, size_t errlen) {
  long rank = 0, world = 1;
  *out = NULL;
  int rc = rankenv_long(RANKENV_WORLD_SIZE, &world, err, errlen);
  if (!rc) rc = rankenv_long_in(RANKENV_RANK, 0, world - 1, &rank, err, errlen);
  if (rc) return rc;
  const char *rdv = rankenv_str(RANKENV_RENDEZVOUS);
  if (!rdv) {
    if (world != 1) {
      ty_errf(err, errlen, 0, "%s is unset but %s is %ld (set it to shm:<name> for CPU ranks)",
              rankenv_name(RANKENV_RENDEZVOUS), rankenv_name(RANKENV_WORLD_SIZE), world);
      *out = NULL;
      return TY_EINVAL;
    }
    rdv = "self";
  }
  return comm_open(out, rdv, (int)rank, (int)world, err, errlen);
}

void comm_close(comm_t *c) {
  if (!c) return;
  c->ops->close(c);
  free(c);
}

int comm_rank(const comm_t *c) {
  return c->rank;
}
int comm_world_size(const comm_t *c) {
  return c->world;
}
const char *comm_backend(const comm_t *c) {
  return c->ops->name;
}
const char *comm_error(const comm_t *c) {
  return c->err;
}
int comm_failed_rank(const comm_t *c) {
  return c->failed_rank;
}

/* Entry checks shared by every collective; returns 0 to go on. */
static int enter(comm_t *c) {
  if (c->broken) return c->broken;
  c->err[0] = '\0';
  return 0;
}

static int check_counts(comm_t *c, const char *op, const void *mine, const void *all,
                        const size_t *counts, size_t *total) {
  if (!counts) return comm_fail(c, TY_EINVAL, -1, "%s: counts is NULL", op);
  size_t t = 0;
  for (int r = 0; r < c->world; r++) {
    if (counts[r] > ((size_t)-1 / sizeof(float)) - t)
      return comm_fail(c, TY_EINVAL, -1, "%s: counts overflow at rank %d", op, r);
    t += counts[r];
  }
  if ((counts[c->rank] && !mine) || (t && !all))
    return comm_fail(c, TY_EINVAL, -1, "%s: NULL buffer for a non-empty count", op);
  *total = t;
  return 0;
}

int comm_all_gather(comm_t *c, const float *send, float *recv, const size_t *counts) {
  int rc = enter(c);
  size_t total;
  if (rc || (rc = check_counts(c, "all_gather", send, recv, counts, &total))) return rc;
  return c->ops->all_gather(c, send, recv, counts, total);
}

int comm_reduce_scatter(comm_t *c, const float *send, float *recv, const size_t *counts) {
  int rc = enter(c);
  size_t total;
  if (rc || (rc = check_counts(c, "reduce_scatter", recv, send, counts, &total))) return rc;
  return c->ops->reduce_scatter(c, send, recv, counts, total);
}

int comm_all_reduce(comm_t *c, float *buf, size_t count) {
  int rc = enter(c);
  if (rc) return rc;
  if (count && !buf) return comm_fail(c, TY_EINVAL, -1, "all_reduce: NULL buffer");
  return c->ops->all_reduce(c, buf, count);
}

int comm_broadcast(comm_t *c, float *buf, size_t count, int root) {
  int rc = enter(c);
  if (rc) return rc;
  if (count && !buf) return comm_fail(c, TY_EINVAL, -1, "broadcast: NULL buffer");
  if (root < 0 || root >= c->world)
    return comm_fail(c, TY_EINVAL, -1, "broadcast: root %d is not a rank in 0..%d", root,
                     c->world - 1);
  return c->ops->broadcast(c, buf, count, root);
}

int comm_barrier(comm_t *c) {
  int rc = enter(c);
  if (rc) return rc;
  return c->ops->barrier(c);
}

int comm_all_gather_queue(comm_t *c, const void *send, void *recv, const size_t *counts,
                          size_t elem_size) {
  int rc = enter(c);
  if (rc) return rc;
  if (elem_size != 2 && elem_size != 4)
    return comm_fail(c, TY_EINVAL, -1, "all_gather: elements of %zu bytes (2 or 4 are moved)",
                     elem_size);
  size_t total;
  if ((rc = check_counts(c, "all_gather", send, recv, counts, &total))) return rc;
  if (c->ops->all_gather_queue) return c->ops->all_gather_queue(c, send, recv, counts, elem_size);
  if (c->world == 1) { /* self: a copy of any size */
    if (counts[0] && send != recv) memmove(recv, send, counts[0] * elem_size);
    return 0;
  }
  /* Host backends move floats: whole floats per rank, the same bytes. */
  for (int r = 0; r < c->world; r++)
    if (counts[r] * elem_size % sizeof(float))
      return comm_fail(c, TY_EINVAL, -1,
                       "all_gather: rank %d's %zu elements of %zu bytes are not whole floats, "
                       "which the %s backend moves",
                       r, counts[r], elem_size, c->ops->name);
  size_t *floats = xcalloc((size_t)c->world, sizeof *floats);
  for (int r = 0; r < c->world; r++) floats[r] = counts[r] * elem_size / sizeof(float);
  rc = c->ops->all_gather(c, send, recv, floats, total * elem_size / sizeof(float));
  free(floats);
  return rc;
}

int comm_reduce_scatter_queue(comm_t *c, float *send, float *recv, const size_t *counts) {
  int rc = enter(c);
  size_t total;
  if (rc || (rc = check_counts(c, "reduce_scatter", recv, send, counts, &total))) return rc;
  if (c->ops->reduce_scatter_queue)
    return c->ops->reduce_scatter_queue(c, send, recv, counts, total);
  return c->ops->reduce_scatter(c, send, recv, counts, total);
}

void *comm_stream(comm_t *c) {
  return c->ops->stream ? c->ops->stream(c) : NULL;
}

int comm_wait_event(comm_t *c, void *event, const char *what) {
  int rc = enter(c);
  if (rc || !c->ops->wait_event) return rc;
  return c->ops->wait_event(c, event, what);
}

int comm_drain(comm_t *c) {
  int rc = enter(c);
  if (rc || !c->ops->drain) return rc;
  return c->ops->drain(c);
}

void comm_shard_rows(size_t rows, int world_size, int rank, size_t *first_row, size_t *nrows) {
  size_t n = (size_t)world_size, r = (size_t)rank;
  size_t base = rows / n, extra = rows % n;
  *nrows = base + (r < extra ? 1 : 0);
  *first_row = r * base + (r < extra ? r : extra);
}

void comm_shard_counts(size_t rows, size_t row_elems, int world_size, size_t *counts) {
  for (int r = 0; r < world_size; r++) {
    size_t first, n;
    comm_shard_rows(rows, world_size, r, &first, &n);
    counts[r] = n * row_elems;
  }
}
