/* test_loader_async.c - the loader against a placement whose copies are
 * queued (placement.h: stage / stage_in, finish), as the CUDA placement's
 * are, on the host. The "queued" placement below lends two staging
 * buffers and runs a copy only when something waits for it (the buffer lent
 * again, finish, release): a loader that skips the completion point leaves
 * bytes missing, one that writes a buffer after handing it back changes
 * what a later copy sends (each copy checks a digest taken at stage_in).
 * Every path (memory-efficient, standard, from scratch, upload) must give
 * the CPU placement's shard byte for byte with nothing left queued when it
 * returns, over buckets and buffers small enough for many turns; and a
 * copy failing in flight, a refused stage, or a file cut short mid-load
 * must fail cleanly: the error names it, nothing stays placed or queued. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "worker/ckpt/loader.h"

#include "ckpt_testutil.h"
#include "cut_testutil.h"
#include "tmpdir_testutil.h"

#define QBUFS 2
#define QMAX 4096 /* queued copies at most (the standard path's copy_within, one a tensor) */

/* One queued copy: from staging buffer buf (digest sum of its n bytes when
 * it was handed back), or placement memory src when buf is -1. */
typedef struct {
  char *dst;
  const char *src;
  size_t n;
  int buf;
  uint64_t sum;
} qcopy_t;

typedef struct {
  size_t cap; /* bytes of each staging buffer */
  char *buf[QBUFS];
  int next;        /* the buffer lent next */
  qcopy_t q[QMAX]; /* [head, tail) queued, in order */
  size_t head, tail;
  int stage_fail_at; /* the Nth stage (from 1) fails; 0 never */
  int finish_fail;   /* finish reports a copy failed in flight */
  int stages, stage_ins, violations;
  char why[256]; /* the first violation */
} queued_t;

static uint64_t digest(const char *p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

static void violation(queued_t *q, const char *what) {
  if (!q->violations++) snprintf(q->why, sizeof q->why, "%s", what);
}

/* Runs queued copies in order until `upto` of them are done. */
static void run_to(queued_t *q, size_t upto) {
  for (; q->head < upto; q->head++) {
    qcopy_t *c = &q->q[q->head];
    const char *src = c->buf >= 0 ? q->buf[c->buf] : c->src;
    if (c->buf >= 0 && digest(src, c->n) != c->sum)
      violation(q, "a staging buffer was written after stage_in, before its copy ran");
    memcpy(c->dst, src, c->n);
  }
}

static void push(queued_t *q, qcopy_t c) {
  if (q->tail == QMAX) fail_msg("more than %d copies queued", QMAX);
  q->q[q->tail++] = c;
}

static int q_alloc(placement_t *p, size_t n, void **out) {
  (void)p;
  *out = malloc(n ? n : 1);
  return *out ? 0 : TY_EEXHAUSTED;
}

static void q_release(placement_t *p, void *ptr, size_t n) {
  queued_t *q = p->ctx;
  (void)n;
  if (q->head != q->tail) violation(q, "memory released with copies still queued");
  free(ptr);
}

static int q_stage(placement_t *p, void **buf, size_t *cap) {
  queued_t *q = p->ctx;
  if (++q->stages == q->stage_fail_at) return TY_EINTERNAL;
  /* Wait for the last copy out of this buffer: run up to it. */
  size_t upto = q->head;
  for (size_t i = q->head; i < q->tail; i++)
    if (q->q[i].buf == q->next) upto = i + 1;
  run_to(q, upto);
  *buf = q->buf[q->next];
  *cap = q->cap;
  return 0;
}

static int q_stage_in(placement_t *p, void *dst, size_t off, size_t n) {
  queued_t *q = p->ctx;
  q->stage_ins++;
  if (n > q->cap) violation(q, "stage_in of more than the buffer");
  if (!n) return 0;
  push(q, (qcopy_t){(char *)dst + off, NULL, n, q->next, digest(q->buf[q->next], n)});
  q->next = (q->next + 1) % QBUFS;
  return 0;
}

static int q_copy_in(placement_t *p, void *dst, size_t off, const void *src, size_t n) {
  for (size_t done = 0; done < n;) {
    void *buf;
    size_t cap;
    int rc = q_stage(p, &buf, &cap);
    if (rc) return rc;
    size_t k = n - done < cap ? n - done : cap;
    memcpy(buf, (const char *)src + done, k);
    q_stage_in(p, dst, off + done, k);
    done += k;
  }
  return 0;
}

static int q_copy_within(placement_t *p, void *dst, size_t dst_off, const void *src, size_t src_off,
                         size_t n) {
  queued_t *q = p->ctx;
  if (n) push(q, (qcopy_t){(char *)dst + dst_off, (const char *)src + src_off, n, -1, 0});
  return 0;
}

static int q_finish(placement_t *p) {
  queued_t *q = p->ctx;
  run_to(q, q->tail);
  return q->finish_fail ? TY_EINTERNAL : 0;
}

static const placement_ops_t g_queued = {.name = "queued",
                                         .alloc = q_alloc,
                                         .release = q_release,
                                         .copy_in = q_copy_in,
                                         .copy_within = q_copy_within,
                                         .finish = q_finish,
                                         .stage = q_stage,
                                         .stage_in = q_stage_in};

static void queued_init(placement_t *p, queued_t *q, size_t cap) {
  memset(q, 0, sizeof *q);
  q->cap = cap;
  for (int i = 0; i < QBUFS; i++) q->buf[i] = malloc(cap);
  *p = (placement_t){.ops = &g_queued, .ctx = q};
}

static void queued_free(queued_t *q) {
  for (int i = 0; i < QBUFS; i++) free(q->buf[i]);
}

/* Nothing queued, nothing placed, no violation. */
static void assert_quiet(const placement_t *p, const queued_t *q) {
  if (q->violations) fail_msg("%d violations, first: %s", q->violations, q->why);
  assert_int_equal(q->head, q->tail);
  assert_int_equal(p->in_use, 0);
}

/* a (queued) and b (CPU) hold the same bytes in every view. */
static void assert_same(const loader_shard_t *a, const loader_shard_t *b) {
  assert_int_equal(a->bytes, b->bytes);
  for (size_t i = 0; i < a->layout.ntensors; i++) {
    assert_int_equal(a->views[i].nbytes, b->views[i].nbytes);
    assert_memory_equal(a->views[i].data, b->views[i].data, a->views[i].nbytes);
  }
}

static llama_config_t tiny(void) {
  return tu_tiny_config(24, 40, 2, 3, 1, 8, 37, false);
}

/* Every path and dtype pair, buckets and buffers small enough that each
 * tensor crosses in several turns (the bucket or the buffer the smaller). */
static void test_paths_match_cpu(void **state) {
  (void)state;
  char dir[2][300], err[1024];
  llama_config_t c = tiny();
  const ty_dtype_t file_dt[2] = {TY_DTYPE_BF16, TY_DTYPE_F32};
  for (int f = 0; f < 2; f++) {
    snprintf(dir[f], sizeof dir[f], "%s/m%d", g_dir, f);
    tu_write_ckpt(dir[f], &c, file_dt[f], 2, 5, NULL);
  }
  const ty_dtype_t shard_dt[3] = {TY_DTYPE_F32, TY_DTYPE_BF16, TY_DTYPE_F16};
  const size_t buckets[] = {64, 200, 1 << 20}, caps[] = {64, 96, 1 << 20};
  int turns = 0;
  for (int f = 0; f < 2; f++)
    for (int d = 0; d < 3; d++)
      for (int k = 0; k < 3; k++)
        for (int path = 0; path < 3; path++) { /* memory-efficient, standard, scratch */
          placement_t cpu, pl;
          queued_t q;
          placement_cpu_init(&cpu);
          queued_init(&pl, &q, caps[(k + d) % 3]);
          loader_opts_t o = {.rank = 1,
                             .world_size = 2,
                             .dtype = shard_dt[d],
                             .memory_efficient = path == 0,
                             .bucket_bytes = buckets[k],
                             .seed = 11,
                             .pl = &cpu};
          loader_shard_t *want, *got;
          int rc = path == 2 ? loader_init_scratch(&c, &o, &want, NULL, err, sizeof err)
                             : loader_load(dir[f], &o, &want, NULL, err, sizeof err);
          assert_int_equal(rc, 0);
          o.pl = &pl;
          rc = path == 2 ? loader_init_scratch(&c, &o, &got, NULL, err, sizeof err)
                         : loader_load(dir[f], &o, &got, NULL, err, sizeof err);
          if (rc) fail_msg("%s", err);
          assert_int_equal(q.head, q.tail); /* the completion point was reached */
          assert_same(got, want);
          turns += q.stage_ins;
          loader_shard_free(got);
          loader_shard_free(want);
          assert_quiet(&pl, &q);
          queued_free(&q);
        }
  assert_true(turns > 2000); /* many buffer turns, not a copy a tensor */
}

/* A host shard through copy_in, in 64-byte turns. */
static void test_upload(void **state) {
  (void)state;
  char err[1024];
  llama_config_t c = tiny();
  placement_t cpu, pl;
  queued_t q;
  placement_cpu_init(&cpu);
  queued_init(&pl, &q, 64);
  loader_opts_t o = {.rank = 0, .world_size = 1, .dtype = TY_DTYPE_F32, .seed = 4, .pl = &cpu};
  loader_shard_t *hs, *ds;
  assert_int_equal(loader_init_scratch(&c, &o, &hs, NULL, err, sizeof err), 0);
  assert_int_equal(loader_shard_upload(hs, &pl, &ds, err, sizeof err), 0);
  assert_int_equal(q.head, q.tail);
  assert_int_equal(q.stage_ins, (int)((hs->bytes + 63) / 64));
  assert_same(ds, hs);
  loader_shard_free(ds);
  assert_quiet(&pl, &q);
  /* A copy that failed in flight: found at the completion point. */
  q.finish_fail = 1;
  ds = (loader_shard_t *)1;
  assert_int_equal(loader_shard_upload(hs, &pl, &ds, err, sizeof err), TY_EINTERNAL);
  assert_null(ds);
  assert_non_null(strstr(err, "copying its shard onto queued failed"));
  assert_quiet(&pl, &q);
  loader_shard_free(hs);
  queued_free(&q);
}

/* Failures with copies queued: each is reported, nothing stays placed or
 * queued, and no copy runs into released memory (q_release checks). */
static void test_failures(void **state) {
  (void)state;
  char dir[300], err[1024];
  llama_config_t c = tiny();
  const struct {
    int path; /* 0 memory-efficient, 1 standard, 2 scratch */
    int stage_fail_at, finish_fail, cut_after;
    int rc;
    const char *want;
  } cases[] = {
      {0, 7, 0, 0, TY_EINTERNAL, "to queued failed"},
      {1, 7, 0, 0, TY_EINTERNAL, "to queued failed"},
      {2, 7, 0, 0, TY_EINTERNAL, "to queued failed"},
      {0, 0, 1, 0, TY_EINTERNAL, "copying the shard to queued failed"},
      {1, 0, 1, 0, TY_EINTERNAL, "copying the model to queued failed"},
      {2, 0, 1, 0, TY_EINTERNAL, "copying initial weights to queued failed"},
      {0, 0, 0, 1, TY_EDATALOSS, "truncated"},
      {0, 0, 0, 3, TY_EDATALOSS, "truncated"},
      {0, 0, 0, 9, TY_EDATALOSS, "truncated"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(dir, sizeof dir, "%s/f%zu", g_dir, i);
    tu_write_ckpt(dir, &c, TY_DTYPE_BF16, 2, 5, NULL);
    placement_t pl;
    queued_t q;
    queued_init(&pl, &q, 96);
    q.stage_fail_at = cases[i].stage_fail_at;
    q.finish_fail = cases[i].finish_fail;
    tu_cut_t cut = {dir, cases[i].cut_after, 0, 0};
    loader_opts_t o = {.rank = 0,
                       .world_size = 2,
                       .dtype = TY_DTYPE_F32,
                       .memory_efficient = cases[i].path == 0,
                       .bucket_bytes = 64,
                       .pl = &pl,
                       .progress = cases[i].cut_after ? tu_cut_files : NULL,
                       .progress_ctx = &cut};
    loader_shard_t *s = (loader_shard_t *)1;
    err[0] = 0;
    int rc = cases[i].path == 2 ? loader_init_scratch(&c, &o, &s, NULL, err, sizeof err)
                                : loader_load(dir, &o, &s, NULL, err, sizeof err);
    if (rc != cases[i].rc || !strstr(err, cases[i].want))
      fail_msg("case %zu: rc %d, '%s'", i, rc, err);
    assert_null(s);
    if (cases[i].cut_after) assert_int_equal(cut.seen, cases[i].cut_after);
    assert_int_equal(cut.failed, 0);
    assert_true(q.stage_ins > 0); /* copies were queued before it failed */
    assert_quiet(&pl, &q);
    queued_free(&q);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paths_match_cpu),
      cmocka_unit_test(test_upload),
      cmocka_unit_test(test_failures),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
