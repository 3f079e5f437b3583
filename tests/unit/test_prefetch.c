/* test_prefetch.c - the FSDP unit schedule of worker/prefetch.h: with two
 * slots the next unit's gather is queued before the current unit is waited
 * for and never into a slot before that slot's release; a unit still
 * resident is not gathered again; one slot never overlaps. Then the bytes:
 * through real collectives (self, and 2 and 3 forked shm ranks), every
 * tensor of every acquired unit equals the whole tensor of a world-1 load,
 * in float32 and bfloat16, tied and untied; and the host backends refuse a
 * bfloat16 shard that is not whole floats, naming the rank. */
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

#include "api/errors.h"
#include "worker/prefetch.h"

#include "tmpdir_testutil.h"

/* C 12, FF 10, NKV 1 x HS 4, V 6, 2 layers: units 0 (embed), 1, 2, 3 (head). */
static llama_config_t tiny(bool tied) {
  llama_config_t c;
  llama_config_init(&c);
  c.hidden_size = 12;
  c.intermediate_size = 10;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 6;
  c.tie_word_embeddings = tied;
  return c;
}

static void make_ckpt(const char *dir, bool tied) {
  llama_config_t c = tiny(tied);
  char err[512];
  if (ckpt_write_random(dir, &c, TY_DTYPE_F32, 1, 7, NULL, err, sizeof err))
    fail_msg("checkpoint: %s", err);
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
  prefetch_ops_t ops = {&f, fk_begin, fk_gather, fk_end, fk_wait, fk_release};
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

static void test_bad_arguments(void **state) {
  (void)state;
  char err[512];
  placement_t pl;
  loader_shard_t *s = whole_shard("bad", false, &pl);
  size_t sb = prefetch_slot_bytes(s);
  void *slots[1] = {malloc(sb)};
  fake_t f = {.s = s};
  prefetch_ops_t ops = {&f, fk_begin, fk_gather, fk_end, fk_wait, fk_release};
  prefetch_t *p;
  assert_int_equal(prefetch_create(&p, s, 1, slots, sb - 1, &ops, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "a slot holds"));
  assert_int_equal(prefetch_create(&p, s, 0, slots, sb, &ops, err, sizeof err), TY_EINVAL);
  assert_int_equal(prefetch_create(&p, s, 1, slots, sb, &ops, err, sizeof err), 0);
  int bad[] = {0, 4};
  assert_int_equal(prefetch_pass(p, bad, 2, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "unit 4"));
  assert_null(prefetch_tensor(p, CKPT_WQ, 0)); /* nothing acquired */
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

static int bytes_rank(const bytes_arg_t *a, const char *rdv, int rank, int world) {
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

static void run_world(const bytes_arg_t *a, int world) {
  static int serial;
  char rdv[96];
  if (world == 1) {
    assert_int_equal(bytes_rank(a, "self", 0, 1), 0);
    return;
  }
  snprintf(rdv, sizeof rdv, "shm:test-prefetch-%d-%d", (int)getpid(), serial++);
  pid_t pids[4];
  for (int r = 0; r < world; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) _exit(bytes_rank(a, rdv, r, world));
  }
  for (int r = 0; r < world; r++) {
    int st;
    assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fail_msg("rank %d of %d failed", r, world);
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
      for (int world = 1; world <= 3; world++) run_world(&a, world);
    }
  }
}

/* bfloat16 over 4 shm ranks: a norm of 12 splits into 3 elements a rank,
 * 6 bytes, not whole floats. */
static int odd_rank(const char *rdv, int rank, int world) {
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
  char rdv[96];
  snprintf(rdv, sizeof rdv, "shm:test-prefetch-odd-%d", (int)getpid());
  pid_t pids[4];
  for (int r = 0; r < 4; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) _exit(odd_rank(rdv, r, 4));
  }
  for (int r = 0; r < 4; r++) {
    int st;
    assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fail_msg("rank %d failed", r);
  }
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
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_bytes),
      cmocka_unit_test(test_not_whole_floats),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
