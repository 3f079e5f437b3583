/* prefetch.c - the unit table of a sharded base and the slot schedule that
 * overlaps the next unit's gather with the current unit's computation; see
 * prefetch.h. */
#include "worker/dist/prefetch.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"

/* One tensor of a unit. */
typedef struct {
  const loader_view_t *v; /* this rank's rows */
  ckpt_kind_t role;       /* what the model asks for (CKPT_LM_HEAD for a tied head) */
  int layer;
  size_t off;     /* bytes from the start of the slot */
  size_t *counts; /* [world] elements of each rank's rows */
} pf_tensor_t;

typedef struct {
  int first, n; /* its tensors: ts[first .. first + n) */
  size_t bytes; /* extent in a slot */
} pf_unit_t;

struct prefetch {
  const loader_shard_t *s;
  int world, nslots, nunits;
  size_t esz; /* bytes per element */
  prefetch_ops_t ops;
  void *slots[PREFETCH_MAX_SLOTS];
  int slot_unit[PREFETCH_MAX_SLOTS];  /* the unit a slot holds (or is gathering), or -1 */
  long slot_used[PREFETCH_MAX_SLOTS]; /* when it was last acquired, for reuse order */
  long tick;
  bool written; /* prefetch_forget since the last gather */
  pf_tensor_t *ts;
  int nts;
  pf_unit_t *units;
  long *gathers; /* [nunits] */
  int *order;    /* the pass */
  int n, next;
  int cur, cur_slot; /* the held unit and its slot, or -1 */
};

/* The unit of tensor (kind, layer) in a model of L layers. */
static int unit_of(ckpt_kind_t kind, int layer, int L) {
  if (kind == CKPT_EMBED) return PREFETCH_EMBED;
  if (kind == CKPT_FINAL_NORM || kind == CKPT_LM_HEAD) return L + 1;
  return PREFETCH_LAYER(layer);
}

/* Appends view v as role to the table (the caller walks units in order). */
static void add_tensor(prefetch_t *p, const loader_view_t *v, ckpt_kind_t role, int unit) {
  const ckpt_tensor_t *t = v->t;
  pf_unit_t *u = &p->units[unit];
  pf_tensor_t *pt = &p->ts[p->nts];
  if (!u->n) u->first = p->nts;
  pt->v = v;
  pt->role = role;
  pt->layer = t->layer;
  pt->off = (u->bytes + 63) & ~(size_t)63;
  pt->counts = xcalloc((size_t)p->world, sizeof *pt->counts);
  comm_shard_counts((size_t)t->rows, (size_t)t->cols, p->world, pt->counts);
  u->bytes = pt->off + (size_t)t->rows * (size_t)t->cols * p->esz;
  u->n++;
  p->nts++;
}

/* The unit table: tensors grouped by unit, units in order, each group in
 * table order; a tied head holds the final norm and the embedding. */
static void build_units(prefetch_t *p) {
  const loader_shard_t *s = p->s;
  const int L = s->layout.cfg.num_hidden_layers;
  p->nunits = L + 2;
  p->units = xcalloc((size_t)p->nunits, sizeof *p->units);
  p->ts = xcalloc(s->layout.ntensors + 1, sizeof *p->ts);
  const loader_view_t *embed = loader_view(s, CKPT_EMBED, -1);
  for (int u = 0; u < p->nunits; u++) {
    for (size_t i = 0; i < s->layout.ntensors; i++)
      if (unit_of(s->views[i].t->kind, s->views[i].t->layer, L) == u)
        add_tensor(p, &s->views[i], s->views[i].t->kind, u);
    if (u == L + 1 && !loader_view(s, CKPT_LM_HEAD, -1) && embed)
      add_tensor(p, embed, CKPT_LM_HEAD, u);
  }
}

static void free_units(prefetch_t *p) {
  for (int i = 0; i < p->nts; i++) free(p->ts[i].counts);
  free(p->ts);
  free(p->units);
}

size_t prefetch_slot_bytes(const loader_shard_t *shard) {
  prefetch_t p = {.s = shard, .world = shard->world_size, .esz = ty_dtype_size(shard->dtype)};
  build_units(&p);
  size_t most = 0;
  for (int u = 0; u < p.nunits; u++)
    if (p.units[u].bytes > most) most = p.units[u].bytes;
  free_units(&p);
  return most;
}

int prefetch_create(prefetch_t **out, const loader_shard_t *shard, int nslots, void *const *slots,
                    size_t slot_bytes, const prefetch_ops_t *ops, char *err, size_t errlen) {
  *out = NULL;
  if (nslots < 1 || nslots > PREFETCH_MAX_SLOTS)
    return ty_errf(err, errlen, TY_EINVAL, "prefetch: %d slots (1..%d)", nslots,
                   PREFETCH_MAX_SLOTS);
  prefetch_t *p = xcalloc(1, sizeof *p);
  p->s = shard;
  p->world = shard->world_size;
  p->esz = ty_dtype_size(shard->dtype);
  p->nslots = nslots;
  p->ops = *ops;
  p->cur = p->cur_slot = -1;
  build_units(p);
  p->gathers = xcalloc((size_t)p->nunits, sizeof *p->gathers);
  int rc = 0;
  for (int i = 0; i < p->nts && !rc; i++) {
    const pf_tensor_t *t = &p->ts[i];
    size_t cols = (size_t)t->v->t->cols;
    if (t->counts[shard->rank] != (size_t)t->v->rows * cols)
      rc =
          ty_errf(err, errlen, TY_EINVAL,
                  "prefetch: %s: rank %d holds %lld rows, the collectives' split %zu",
                  t->v->t->name, shard->rank, (long long)t->v->rows, t->counts[shard->rank] / cols);
  }
  for (int u = 0; u < p->nunits && !rc; u++)
    if (p->units[u].bytes > slot_bytes)
      rc = ty_errf(err, errlen, TY_EINVAL, "prefetch: unit %d needs %zu bytes, a slot holds %zu", u,
                   p->units[u].bytes, slot_bytes);
  for (int k = 0; k < nslots; k++) {
    p->slots[k] = slots[k];
    p->slot_unit[k] = -1;
  }
  if (rc) {
    prefetch_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void prefetch_free(prefetch_t *p) {
  if (!p) return;
  free_units(p);
  free(p->gathers);
  free(p->order);
  free(p);
}

int prefetch_units(const prefetch_t *p) {
  return p->nunits;
}
int prefetch_head(const prefetch_t *p) {
  return p->nunits - 1;
}
int prefetch_current(const prefetch_t *p) {
  return p->cur;
}
long prefetch_gathers(const prefetch_t *p, int u) {
  return u >= 0 && u < p->nunits ? p->gathers[u] : 0;
}

int prefetch_pass(prefetch_t *p, const int *order, int n, char *err, size_t errlen) {
  for (int i = 0; i < n; i++)
    if (order[i] < 0 || order[i] >= p->nunits)
      return ty_errf(err, errlen, TY_EINVAL, "prefetch: unit %d of a pass is not in 0..%d",
                     order[i], p->nunits - 1);
  free(p->order);
  p->order = xmalloc((size_t)(n ? n : 1) * sizeof *p->order);
  memcpy(p->order, order, (size_t)n * sizeof *order);
  p->n = n;
  p->next = 0;
  return 0;
}

static int slot_of(const prefetch_t *p, int u) {
  for (int k = 0; k < p->nslots; k++)
    if (p->slot_unit[k] == u) return k;
  return -1;
}

/* Queues unit u's gather into slot k (after k's last release). */
static int gather_unit(prefetch_t *p, int u, int k, char *err, size_t errlen) {
  const pf_unit_t *un = &p->units[u];
  int rc = 0;
  if (p->written && p->ops.written) rc = p->ops.written(p->ops.ctx, err, errlen);
  if (rc) return rc;
  p->written = false;
  p->slot_unit[k] = u;
  rc = p->ops.begin(p->ops.ctx, k, err, errlen);
  for (int i = un->first; i < un->first + un->n && !rc; i++) {
    const pf_tensor_t *t = &p->ts[i];
    rc = p->ops.gather(p->ops.ctx, t->v->data, (char *)p->slots[k] + t->off, t->counts, p->esz, err,
                       errlen);
  }
  if (!rc) rc = p->ops.end(p->ops.ctx, k, err, errlen);
  if (rc) {
    p->slot_unit[k] = -1; /* its contents are unknown */
    return rc;
  }
  p->gathers[u]++;
  return 0;
}

/* The slot to gather into: not `keep`'s, the least recently acquired. */
static int victim(const prefetch_t *p, int keep) {
  int best = -1;
  for (int k = 0; k < p->nslots; k++)
    if (k != keep && (best < 0 || p->slot_used[k] < p->slot_used[best])) best = k;
  return best;
}

int prefetch_acquire(prefetch_t *p, char *err, size_t errlen) {
  if (p->next >= p->n)
    return ty_errf(err, errlen, TY_EINVAL, "prefetch: the pass of %d units is over", p->n);
  const int u = p->order[p->next++];
  int rc = 0;
  /* Everything queued so far was the held unit's last use. */
  if (p->cur_slot >= 0) rc = p->ops.release(p->ops.ctx, p->cur_slot, err, errlen);
  p->cur = p->cur_slot = -1;
  if (rc) return rc;
  int k = slot_of(p, u);
  if (k < 0) {
    k = victim(p, -1);
    if ((rc = gather_unit(p, u, k, err, errlen))) return rc;
  }
  p->slot_used[k] = ++p->tick;
  /* The next unit's gather goes in before anything waits. */
  if (p->next < p->n && p->nslots > 1) {
    const int v = p->order[p->next];
    if (v != u && slot_of(p, v) < 0 && (rc = gather_unit(p, v, victim(p, k), err, errlen)))
      return rc;
  }
  if ((rc = p->ops.wait(p->ops.ctx, k, err, errlen))) return rc;
  p->cur = u;
  p->cur_slot = k;
  return 0;
}

void prefetch_forget(prefetch_t *p) {
  for (int k = 0; k < p->nslots; k++) p->slot_unit[k] = -1;
  p->written = true;
}

/* The tensor of unit u in role (kind, layer), or NULL. */
static const pf_tensor_t *find(const prefetch_t *p, int u, ckpt_kind_t kind, int layer) {
  if (u < 0 || u >= p->nunits) return NULL;
  const pf_unit_t *un = &p->units[u];
  for (int i = un->first; i < un->first + un->n; i++) {
    const pf_tensor_t *t = &p->ts[i];
    if (t->role == kind && (t->layer < 0 || t->layer == layer)) return t;
  }
  return NULL;
}

void *prefetch_tensor(const prefetch_t *p, ckpt_kind_t kind, int layer) {
  const pf_tensor_t *t = p->cur < 0 ? NULL : find(p, p->cur, kind, layer);
  return t ? (char *)p->slots[p->cur_slot] + t->off : NULL;
}

int prefetch_unit_of(const prefetch_t *p, ckpt_kind_t kind, int layer) {
  return unit_of(kind, layer, p->nunits - 2);
}

size_t prefetch_unit_bytes(const prefetch_t *p, int u) {
  return u >= 0 && u < p->nunits ? p->units[u].bytes : 0;
}

long prefetch_offset(const prefetch_t *p, int u, ckpt_kind_t kind, int layer) {
  const pf_tensor_t *t = find(p, u, kind, layer);
  return t ? (long)t->off : -1;
}

int prefetch_scatter_add(prefetch_t *p, int u, float *grad, float *gshard, char *err,
                         size_t errlen) {
  if (p->esz != sizeof(float) || !p->ops.reduce || !p->ops.add)
    return ty_errf(err, errlen, TY_EINVAL,
                   "prefetch: gradients are summed over a float32 shard with reduction ops");
  if (u < 0 || u >= p->nunits)
    return ty_errf(err, errlen, TY_EINVAL, "prefetch: unit %d is not in 0..%d", u, p->nunits - 1);
  const pf_unit_t *un = &p->units[u];
  const int rank = p->s->rank;
  int rc = p->ops.reduce_begin(p->ops.ctx, err, errlen);
  /* Each tensor's whole gradient lies in grad as in a slot; this rank's
   * rows of it receive the sum (in place). */
  for (int i = un->first; i < un->first + un->n && !rc; i++) {
    float *whole = grad + p->ts[i].off / sizeof(float);
    rc = p->ops.reduce(p->ops.ctx, whole, whole + comm_displ(p->ts[i].counts, rank),
                       p->ts[i].counts, err, errlen);
  }
  if (!rc) rc = p->ops.reduce_end(p->ops.ctx, err, errlen);
  for (int i = un->first; i < un->first + un->n && !rc; i++) {
    const pf_tensor_t *t = &p->ts[i];
    const float *mine = grad + t->off / sizeof(float) + comm_displ(t->counts, rank);
    rc = p->ops.add(p->ops.ctx, gshard + t->v->offset / sizeof(float), mine, t->counts[rank], err,
                    errlen);
  }
  return rc;
}

/* --- Blocking host collectives. */

static int host_nop(void *ctx, int slot, char *err, size_t errlen) {
  (void)ctx, (void)slot, (void)err, (void)errlen;
  return 0;
}

static int host_gather(void *ctx, const void *send, void *recv, const size_t *counts,
                       size_t elem_size, char *err, size_t errlen) {
  comm_t *c = ctx;
  int rc = comm_all_gather_queue(c, send, recv, counts, elem_size);
  return rc ? ty_errf(err, errlen, rc, "prefetch: %s", comm_error(c)) : 0;
}

static int host_fence(void *ctx, char *err, size_t errlen) {
  (void)ctx, (void)err, (void)errlen;
  return 0;
}

static int host_reduce(void *ctx, float *send, float *recv, const size_t *counts, char *err,
                       size_t errlen) {
  comm_t *c = ctx;
  int rc = comm_reduce_scatter_queue(c, send, recv, counts);
  return rc ? ty_errf(err, errlen, rc, "prefetch: %s", comm_error(c)) : 0;
}

static int host_add(void *ctx, float *dst, const float *src, size_t n, char *err, size_t errlen) {
  (void)ctx, (void)err, (void)errlen;
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
  return 0;
}

prefetch_ops_t prefetch_host_ops(comm_t *comm) {
  return (prefetch_ops_t){.ctx = comm,
                          .begin = host_nop,
                          .gather = host_gather,
                          .end = host_nop,
                          .wait = host_nop,
                          .release = host_nop,
                          .reduce_begin = host_fence,
                          .reduce = host_reduce,
                          .reduce_end = host_fence,
                          .add = host_add};
}
