/* test_prefetch.c - the FSDP unit schedule of worker/dist/prefetch.h: with two
 * slots the next unit's gather is queued before the current unit is waited
 * for and never into a slot before that slot's release; a unit still
 * resident is not gathered again; one slot never overlaps. Then the bytes:
 * through real collectives (self, and 2 and 3 forked shm ranks), every
 * tensor of every acquired unit equals the whole tensor of a world-1 load,
 * in float32 and bfloat16, tied and untied; full training's gradients
 * summed over 1 to 4 ranks land, exactly, in each rank's rows of the
 * gradient shard (a tied head's in the embedding's) and nowhere else; and
 * the host backends refuse a bfloat16 shard that is not whole floats,
 * naming the rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "worker/dist/prefetch.h"

#include "ckpt_testutil.h"
#include "tmpdir_testutil.h"

/* C 12, FF 10, NKV 1 x HS 4, V 6, 2 layers: units 0 (embed), 1, 2, 3 (head). */
static llama_config_t tiny(bool tied) {
  return tu_tiny_config(12, 10, 2, 3, 1, 4, 6, tied);
}

static void make_ckpt(const char *dir, bool tied) {
  llama_config_t c = tiny(tied);
  tu_write_ckpt(dir, &c, TY_DTYPE_F32, 1, 7, NULL);
}

static loader_shard_t *load(const char *dir, int rank, int world, ty_dtype_t dt, placement_t *pl,
                            char *err, size_t errlen) {
  loader_opts_t o = {.rank = rank,
                     .world_size = world,
                     .dtype = dt,
                     .memory_efficient = true,
                     .bucket_bytes = 4096,
                     .seed = 1,
                     .pl = pl};
  loader_shard_t *s = NULL;
  return loader_load(dir, &o, &s, NULL, err, errlen) ? NULL : s;
}

/* --- The schedule, recorded by fake ops as tokens: G<slot>u<unit> (one
 * unit's gathers into a slot), W<slot>, R<slot>. */
typedef struct {
  const loader_shard_t *s;
  char trace[1024];
  int unit; /* the unit the open begin() gathers, found from its first send */
} fake_t;

static void put(void *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(void *ctx, const char *fmt, ...) {
  fake_t *f = ctx;
  size_t n = strlen(f->trace);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->trace + n, sizeof f->trace - n, fmt, ap);
  va_end(ap);
}

static int unit_of_send(const loader_shard_t *s, const void *send) {
  for (size_t i = 0; i < s->layout.ntensors; i++)
    if (s->views[i].data == send) {
      const ckpt_tensor_t *t = s->views[i].t;
      if (t->layer >= 0) return PREFETCH_LAYER(t->layer);
      return t->kind == CKPT_EMBED ? PREFETCH_EMBED : s->layout.cfg.num_hidden_layers + 1;
    }
  return -1;
}

static int fk_begin(void *ctx, int slot, char *err, size_t errlen) {
  (void)slot, (void)err, (void)errlen;
  ((fake_t *)ctx)->unit = -1;
  return 0;
}
static int fk_gather(void *ctx, const void *send, void *recv, const size_t *counts, size_t esz,
                     char *err, size_t errlen) {
  (void)recv, (void)counts, (void)esz, (void)err, (void)errlen;
  fake_t *f = ctx;
  if (f->unit < 0) f->unit = unit_of_send(f->s, send);
  return 0;
}
static int fk_end(void *ctx, int slot, char *err, size_t errlen) {
  (void)err, (void)errlen;
  fake_t *f = ctx;
  put(f, "G%du%d ", slot, f->unit);
  return 0;
}
static int fk_wait(void *ctx, int slot, char *err, size_t errlen) {
  (void)err, (void)errlen;
  put(ctx, "W%d ", slot);
  return 0;
}
static int fk_release(void *ctx, int slot, char *err, size_t errlen) {
  (void)err, (void)errlen;
  put(ctx, "R%d ", slot);
  return 0;
}
/* The shards written (after prefetch_forget): F. */
static int fk_written(void *ctx, char *err, size_t errlen) {
  (void)err, (void)errlen;
  put(ctx, "F ");
  return 0;
}
/* The reductions: B(egin), S<floats> (one tensor), E(nd), A<floats>. */
static int fk_reduce_begin(void *ctx, char *err, size_t errlen) {
  (void)err, (void)errlen;
  put(ctx, "B ");
  return 0;
}
static int fk_reduce(void *ctx, float *send, float *recv, const size_t *counts, char *err,
                     size_t errlen) {
  (void)send, (void)recv, (void)err, (void)errlen;
  put(ctx, "S%zu ", counts[0]);
  return 0;
}
static int fk_reduce_end(void *ctx, char *err, size_t errlen) {
  (void)err, (void)errlen;
  put(ctx, "E ");
  return 0;
}
static int fk_add(void *ctx, float *dst, const float *src, size_t n, char *err, size_t errlen) {
  (void)dst, (void)src, (void)err, (void)errlen;
  put(ctx, "A%zu ", n);
  return 0;
}

static prefetch_ops_t fake_ops(fake_t *f, bool reductions) {
  prefetch_ops_t o = {.ctx = f,
                      .begin = fk_begin,
                      .gather = fk_gather,
                      .end = fk_end,
                      .wait = fk_wait,
                      .release = fk_release,
                      .written = fk_written};
  if (reductions) {
    o.reduce_begin = fk_reduce_begin;
    o.reduce = fk_reduce;
    o.reduce_end = fk_reduce_end;
    o.add = fk_add;
  }
  return o;
}

static const int FWD[] = {0, 1, 2, 3}, BWD[] = {3, 2, 1};

/* Runs forward then backward, returning the trace; "|" between passes. */
static void run_passes(prefetch_t *p, fake_t *f) {
  char err[256];
  assert_int_equal(prefetch_pass(p, FWD, 4, err, sizeof err), 0);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(prefetch_acquire(p, err, sizeof err), 0);
    assert_int_equal(prefetch_current(p), FWD[i]);
  }
  put(f, "| ");
  assert_int_equal(prefetch_pass(p, BWD, 3, err, sizeof err), 0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(prefetch_acquire(p, err, sizeof err), 0);
    assert_int_equal(prefetch_current(p), BWD[i]);
  }
  /* Past the pass's end. */
  assert_int_equal(prefetch_acquire(p, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "over"));
}

/* A world-1 float32 shard of a fresh checkpoint in g_dir/name. */
static loader_shard_t *whole_shard(const char *name, bool tied, placement_t *pl) {
  char dir[300], err[512];
  snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
  make_ckpt(dir, tied);
  placement_cpu_init(pl);
  loader_shard_t *s = load(dir, 0, 1, TY_DTYPE_F32, pl, err, sizeof err);
  if (!s) fail_msg("load: %s", err);
  return s;
}

static void schedule(int nslots, const char *want, bool tied) {
  char name[64], err[512];
  snprintf(name, sizeof name, "sched-%d-%d", nslots, tied);
  placement_t pl;
  loader_shard_t *s = whole_shard(name, tied, &pl);
  size_t sb = prefetch_slot_bytes(s);
  void *slots[2] = {malloc(sb), malloc(sb)};
  fake_t f = {.s = s};
  prefetch_ops_t ops = fake_ops(&f, false);
  prefetch_t *p;
  assert_int_equal(prefetch_create(&p, s, nslots, slots, sb, &ops, err, sizeof err), 0);
  assert_int_equal(prefetch_units(p), 4);
  assert_int_equal(prefetch_head(p), 3);
  run_passes(p, &f);
  if (strcmp(f.trace, want)) fail_msg("%d slots:\n got  %s\n want %s", nslots, f.trace, want);
  /* The head and the last layer were not gathered again for the backward. */
  assert_int_equal(prefetch_gathers(p, 3), 1);
  assert_int_equal(prefetch_gathers(p, 2), nslots == 2 ? 1 : 2);
  prefetch_free(p);
  free(slots[0]);
  free(slots[1]);
  loader_shard_free(s);
}

static void test_schedule(void **state) {
  (void)state;
  /* Two slots: unit i+1's gather is queued before unit i is waited for,
   * into the slot that unit i-1 just released. */
  schedule(2,
           "G0u0 G1u1 W0 R0 G0u2 W1 R1 G1u3 W0 R0 W1 | "
           "R1 W1 R1 G1u1 W0 R0 W1 ",
           false);
  schedule(2,
           "G0u0 G1u1 W0 R0 G0u2 W1 R1 G1u3 W0 R0 W1 | "
           "R1 W1 R1 G1u1 W0 R0 W1 ",
           true);
  /* One slot: gather, wait, compute, release; nothing overlaps. */
  schedule(1,
           "G0u0 W0 R0 G0u1 W0 R0 G0u2 W0 R0 G0u3 W0 | "
           "R0 W0 R0 G0u2 W0 R0 G0u1 W0 ",
           false);
}

/* Acquires every unit of `order` in turn. */
static void pass(prefetch_t *p, const int *order, int n) {
  char err[256];
  assert_int_equal(prefetch_pass(p, order, n, err, sizeof err), 0);
  for (int i = 0; i < n; i++) assert_int_equal(prefetch_acquire(p, err, sizeof err), 0);
}

/* Units still resident after a backward pass serve the next forward pass
 * as they lie, until the shards change (an optimizer step writes them):
 * after prefetch_forget every unit is gathered again, and the first of
 * those gathers is ordered after the computation that wrote the shards
 * (written, once). */
static void test_forget(void **state) {
  (void)state;
  char err[512];
  placement_t pl;
  loader_shard_t *s = whole_shard("forget", false, &pl);
  size_t sb = prefetch_slot_bytes(s);
  void *slots[2] = {malloc(sb), malloc(sb)};
  fake_t f = {.s = s};
  prefetch_ops_t ops = fake_ops(&f, false);
  prefetch_t *p;
  assert_int_equal(prefetch_create(&p, s, 2, slots, sb, &ops, err, sizeof err), 0);
  run_passes(p, &f);
  long before[4];
  for (int u = 0; u < 4; u++) before[u] = prefetch_gathers(p, u);
  pass(p, FWD, 4); /* the shards did not change: unit 1 was still resident */
  assert_int_equal(prefetch_gathers(p, 1), before[1]);
  pass(p, BWD, 3);
  assert_null(strchr(f.trace, 'F'));
  for (int u = 0; u < 4; u++) before[u] = prefetch_gathers(p, u);
  prefetch_forget(p);
  f.trace[0] = 0;
  pass(p, FWD, 4);
  for (int u = 0; u < 4; u++) assert_int_equal(prefetch_gathers(p, u), before[u] + 1);
  /* The held unit's release, then the shards' update, then the gathers. */
  assert_string_equal(f.trace, "R1 F G0u0 G1u1 W0 R0 G0u2 W1 R1 G1u3 W0 R0 W1 ");
  prefetch_free(p);
  free(slots[0]);
  free(slots[1]);
  loader_shard_free(s);
}

static void test_bad_arguments(void **state) {
  (void)state;
  char err[512];
  placement_t pl;
  loader_shard_t *s = whole_shard("bad", false, &pl);
  size_t sb = prefetch_slot_bytes(s);
  void *slots[1] = {malloc(sb)};
  fake_t f = {.s = s};
  prefetch_ops_t ops = fake_ops(&f, false);
  prefetch_t *p;
  assert_int_equal(prefetch_create(&p, s, 1, slots, sb - 1, &ops, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "a slot holds"));
  assert_int_equal(prefetch_create(&p, s, 0, slots, sb, &ops, err, sizeof err), TY_EINVAL);
  assert_int_equal(prefetch_create(&p, s, 1, slots, sb, &ops, err, sizeof err), 0);
  int bad[] = {0, 4};
  assert_int_equal(prefetch_pass(p, bad, 2, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "unit 4"));
  assert_null(prefetch_tensor(p, CKPT_WQ, 0)); /* nothing acquired */
  /* Summing gradients needs the reduction ops, and a unit in range. */
  float *g = calloc(sb / sizeof(float), sizeof(float)), *gs = calloc(s->bytes, 1);
  assert_int_equal(prefetch_scatter_add(p, 1, g, gs, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "reduction ops"));
  prefetch_free(p);
  ops = fake_ops(&f, true);
  assert_int_equal(prefetch_create(&p, s, 1, slots, sb, &ops, err, sizeof err), 0);
  assert_int_equal(prefetch_scatter_add(p, 4, g, gs, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "unit 4"));
  /* Every reduction is queued after the gradients, every add after them
   * all: layer 0's nine tensors (C 12, QD 12, KVD 4, FF 10). */
  f.trace[0] = '\0';
  assert_int_equal(prefetch_scatter_add(p, PREFETCH_LAYER(0), g, gs, err, sizeof err), 0);
  const char *want =
      "B S12 S144 S48 S48 S144 S12 S120 S120 S120 E "
      "A12 A144 A48 A48 A144 A12 A120 A120 A120 ";
  if (strcmp(f.trace, want)) fail_msg("reductions:\n got  %s\n want %s", f.trace, want);
  assert_int_equal(prefetch_unit_of(p, CKPT_WK, 1), PREFETCH_LAYER(1));
  assert_int_equal(prefetch_unit_of(p, CKPT_EMBED, -1), PREFETCH_EMBED);
  assert_int_equal(prefetch_unit_of(p, CKPT_FINAL_NORM, -1), 3);
  assert_int_equal(prefetch_offset(p, 1, CKPT_WO, 1), -1); /* layer 1 is unit 2 */
  assert_int_equal(prefetch_offset(p, 1, CKPT_ATTN_NORM, 0), 0);
  assert_int_equal(prefetch_unit_bytes(p, 9), 0);
  free(g);
  free(gs);
  prefetch_free(p);
  free(slots[0]);
  loader_shard_free(s);
}

/* --- The bytes, through real collectives. */
typedef struct {
  const char *dir;
  ty_dtype_t dt;
} bytes_arg_t;

/* Every tensor of the acquired unit against the world-1 load `whole`. */
static int check_unit(const prefetch_t *p, const loader_shard_t *whole, int u, int L) {
  for (size_t i = 0; i < whole->layout.ntensors; i++) {
    const loader_view_t *v = &whole->views[i];
    int vu = v->t->layer >= 0 ? PREFETCH_LAYER(v->t->layer) : v->t->kind == CKPT_EMBED ? 0 : L + 1;
    ckpt_kind_t kind = v->t->kind;
    if (vu != u) {
      if (!(u == L + 1 && kind == CKPT_EMBED && !loader_view(whole, CKPT_LM_HEAD, -1))) continue;
      kind = CKPT_LM_HEAD; /* a tied head is the embedding */
    }
    const void *got = prefetch_tensor(p, kind, v->t->layer);
    if (!got || memcmp(got, v->data, v->nbytes)) {
      fprintf(stderr, "unit %d: %s %s\n", u, v->t->name, got ? "differs" : "missing");
      return 1;
    }
  }
  return 0;
}

/* arg: a bytes_arg_t. */
static int bytes_rank(const void *arg, const char *rdv, int rank, int world) {
  const bytes_arg_t *a = arg;
  char err[512];
  comm_t *c;
  if (comm_open(&c, rdv, rank, world, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
  }
  placement_t pl, plw;
  placement_cpu_init(&pl);
  placement_cpu_init(&plw);
  loader_shard_t *s = load(a->dir, rank, world, a->dt, &pl, err, sizeof err);
  loader_shard_t *whole = load(a->dir, 0, 1, a->dt, &plw, err, sizeof err);
  if (!s || !whole) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
  }
  const int L = s->layout.cfg.num_hidden_layers;
  size_t sb = prefetch_slot_bytes(s);
  void *slots[2] = {malloc(sb), malloc(sb)};
  prefetch_ops_t ops = prefetch_host_ops(c);
  prefetch_t *p;
  int bad = prefetch_create(&p, s, 2, slots, sb, &ops, err, sizeof err);
  int fwd[8], bwd[8];
  for (int u = 0; u < L + 2; u++) fwd[u] = u;
  for (int u = 0; u < L + 1; u++) bwd[u] = L + 1 - u;
  for (int pass = 0; pass < 4 && !bad; pass++) { /* two steps */
    const int *order = pass % 2 ? bwd : fwd, n = pass % 2 ? L + 1 : L + 2;
    bad = prefetch_pass(p, order, n, err, sizeof err);
    for (int i = 0; i < n && !bad; i++) {
      bad = prefetch_acquire(p, err, sizeof err);
      if (!bad) bad = check_unit(p, whole, order[i], L);
    }
  }
  if (bad && *err) fprintf(stderr, "rank %d: %s\n", rank, err);
  prefetch_free(p);
  free(slots[0]);
  free(slots[1]);
  loader_shard_free(s);
  loader_shard_free(whole);
  comm_close(c);
  return bad ? 1 : 0;
}

/* --- Full training's gradients, through real collectives: every rank
 * writes known whole-unit gradients (small integers, so sums are exact);
 * each rank's gradient shard must then hold its start value plus the sum
 * over ranks of its rows, and nothing else may change. */

/* Rank r's gradient of element e of tensor i (i + 100 for a tied head's
 * part, which adds into the embedding's shard). */
static float grad_of(int r, size_t i, size_t e) {
  return (float)((r + 1) * (1 + (int)(e % 5)) + (int)i);
}

/* Writes rank r's gradients of unit u into g, laid out as in a slot. */
static void fill_unit(const prefetch_t *p, const loader_shard_t *s, int u, int r, float *g) {
  for (size_t i = 0; i < s->layout.ntensors; i++) {
    const ckpt_tensor_t *t = s->views[i].t;
    size_t numel = (size_t)t->rows * (size_t)t->cols;
    long off = prefetch_offset(p, u, t->kind, t->layer);
    for (size_t e = 0; off >= 0 && e < numel; e++) g[off / 4 + e] = grad_of(r, i, e);
    off = t->kind == CKPT_EMBED ? prefetch_offset(p, u, CKPT_LM_HEAD, -1) : -1;
    for (size_t e = 0; off >= 0 && e < numel; e++) g[off / 4 + e] = grad_of(r, i + 100, e);
  }
}

/* arg: the checkpoint's directory. */
static int scatter_rank(const void *arg, const char *rdv, int rank, int world) {
  const char *dir = arg;
  char err[512];
  comm_t *c;
  placement_t pl;
  placement_cpu_init(&pl);
  loader_shard_t *s = NULL;
  if (comm_open(&c, rdv, rank, world, err, sizeof err) ||
      !(s = load(dir, rank, world, TY_DTYPE_F32, &pl, err, sizeof err))) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
  }
  size_t sb = prefetch_slot_bytes(s), n = s->bytes / sizeof(float);
  void *slots[1] = {malloc(sb)};
  float *g = malloc(sb), *gs = malloc(s->bytes);
  for (size_t k = 0; k < n; k++) gs[k] = 0.25f; /* added to, never overwritten */
  prefetch_ops_t ops = prefetch_host_ops(c);
  prefetch_t *p;
  int bad = prefetch_create(&p, s, 1, slots, sb, &ops, err, sizeof err);
  /* The backward pass's order: head, layers in reverse, embedding. */
  for (int u = prefetch_units(p) - 1; u >= 0 && !bad; u--) {
    memset(g, 0, sb);
    fill_unit(p, s, u, rank, g);
    bad = prefetch_scatter_add(p, u, g, gs, err, sizeof err);
  }
  if (bad) fprintf(stderr, "rank %d: %s\n", rank, err);
  bool tied = !loader_view(s, CKPT_LM_HEAD, -1);
  char *seen = calloc(n, 1);
  for (size_t i = 0; i < s->layout.ntensors && !bad; i++) {
    const loader_view_t *v = &s->views[i];
    size_t cols = (size_t)v->t->cols, k0 = v->offset / sizeof(float);
    for (size_t k = 0; k < (size_t)v->rows * cols && !bad; k++) {
      size_t e = (size_t)v->row0 * cols + k; /* the element in the whole tensor */
      double want = 0.25;
      for (int r = 0; r < world; r++) {
        want += grad_of(r, i, e);
        if (tied && v->t->kind == CKPT_EMBED) want += grad_of(r, i + 100, e);
      }
      seen[k0 + k] = 1;
      if (gs[k0 + k] != (float)want) {
        fprintf(stderr, "rank %d: %s[%zu]: %g, want %g\n", rank, v->t->name, e, gs[k0 + k], want);
        bad = 1;
      }
    }
  }
  for (size_t k = 0; k < n && !bad; k++)
    if (!seen[k] && gs[k] != 0.25f) {
      fprintf(stderr, "rank %d: padding float %zu changed to %g\n", rank, k, gs[k]);
      bad = 1;
    }
  free(seen);
  prefetch_free(p);
  free(slots[0]);
  free(g);
  free(gs);
  loader_shard_free(s);
  comm_close(c);
  return bad ? 1 : 0;
}

/* Runs fn as `world` ranks: in process for one ("self"), else forked shm
 * ranks; fails the test naming a rank that failed. */
static void ranks(int world, const char *tag,
                  int (*fn)(const void *arg, const char *rdv, int rank, int world),
                  const void *arg) {
  static int serial;
  char rdv[96];
  if (world == 1) {
    assert_int_equal(fn(arg, "self", 0, 1), 0);
    return;
  }
  snprintf(rdv, sizeof rdv, "shm:test-prefetch-%s-%d-%d", tag, (int)getpid(), serial++);
  pid_t pids[4];
  for (int r = 0; r < world; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) _exit(fn(arg, rdv, r, world));
  }
  for (int r = 0; r < world; r++) {
    int st;
    assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fail_msg("%s: rank %d of %d failed", tag, r, world);
  }
}

static void test_scatter_add(void **state) {
  (void)state;
  for (int tied = 0; tied < 2; tied++) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/scatter-%d", g_dir, tied);
    make_ckpt(dir, tied);
    for (int world = 1; world <= 4; world++) ranks(world, "scatter", scatter_rank, dir);
  }
}

static void test_bytes(void **state) {
  (void)state;
  for (int tied = 0; tied < 2; tied++) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/bytes-%d", g_dir, tied);
    make_ckpt(dir, tied);
    const ty_dtype_t dts[] = {TY_DTYPE_F32, TY_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
      bytes_arg_t a = {dir, dts[d]};
      for (int world = 1; world <= 3; world++) ranks(world, "bytes", bytes_rank, &a);
    }
  }
}

/* bfloat16 over 4 shm ranks: a norm of 12 splits into 3 elements a rank,
 * 6 bytes, not whole floats. */
static int odd_rank(const void *arg, const char *rdv, int rank, int world) {
  (void)arg;
  char err[512];
  comm_t *c;
  if (comm_open(&c, rdv, rank, world, err, sizeof err)) return 1;
  uint16_t mine[3] = {1, 2, 3}, all[12];
  size_t counts[4] = {3, 3, 3, 3};
  int rc = comm_all_gather_queue(c, mine, all, counts, 2);
  int ok = rc == TY_EINVAL && strstr(comm_error(c), "rank 0's 3 elements of 2 bytes");
  if (!ok) fprintf(stderr, "rank %d: rc %d: %s\n", rank, rc, comm_error(c));
  comm_close(c);
  return ok ? 0 : 1;
}

static void test_not_whole_floats(void **state) {
  (void)state;
  ranks(4, "odd", odd_rank, NULL);
  /* self moves any size; an element size other than 2 or 4 is refused. */
  comm_t *c;
  char err[256];
  assert_int_equal(comm_open(&c, "self", 0, 1, err, sizeof err), 0);
  uint16_t one[3] = {4, 5, 6}, out[3] = {0};
  size_t n = 3;
  assert_int_equal(comm_all_gather_queue(c, one, out, &n, 2), 0);
  assert_memory_equal(one, out, sizeof one);
  assert_null(comm_stream(c));
  assert_int_equal(comm_drain(c), 0);
  assert_int_equal(comm_all_gather_queue(c, one, out, &n, 8), TY_EINVAL);
  assert_non_null(strstr(comm_error(c), "2 or 4"));
  comm_close(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule),
      cmocka_unit_test(test_forget),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_bytes),
      cmocka_unit_test(test_scatter_add),
      cmocka_unit_test(test_not_whole_floats),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
