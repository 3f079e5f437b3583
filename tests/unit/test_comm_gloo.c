/* test_comm_gloo.c - the Gloo comm across real processes: each forked rank
 * opens a shm and a gloo communicator side by side and runs every
 * collective on both with the same random (not exactly summable) inputs,
 * uneven counts and empty blocks included, at 1-4 ranks; the results must
 * be bitwise equal, which is what lets a job move between ranks on one
 * node (shm) and ranks on many (gloo) with the same losses. Then the
 * failures: a rank killed with -9 mid-collective, a late rank, a rank that
 * never joins, and rendezvous strings that name no usable folder, each
 * failing with its code and the rank named. Exits 77 (skipped) in a build
 * without Gloo. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "tests/unit/ranks_testutil.h"
#include "tests/unit/tmpdir_testutil.h"
#include "worker/dist/comm.h"

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "rank check failed at %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      return 1;                                                            \
    }                                                                      \
  } while (0)

typedef int (*rank_fn)(comm_t *shm, comm_t *gloo, int rank, int world, void *arg);

static char g_gloo[600]; /* "gloo:file:<g_dir>/<n>" */
static char g_shm[128];

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A fresh pair of rendezvous names; the gloo one gets a folder of its own. */
static void new_rendezvous(void) {
  static int n;
  char sub[400];
  snprintf(sub, sizeof sub, "%s/rdv-%d", g_dir, n);
  assert_int_equal(mkdir(sub, 0700), 0);
  snprintf(g_gloo, sizeof g_gloo, "gloo:file:%s", sub);
  snprintf(g_shm, sizeof g_shm, "shm:test-gloo-%d-%d", (int)getpid(), n++);
}

/* Forks `world` ranks; rank r opens shm (unless no_shm) and gloo, runs fn
 * and exits with its result. */
static void fork_ranks(int world, rank_fn fn, void *arg, int no_shm, pid_t *pids) {
  new_rendezvous();
  for (int r = 0; r < world; r++) {
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
      comm_t *s = NULL, *g = NULL;
      char err[512];
      if (!no_shm && comm_open(&s, g_shm, r, world, err, sizeof err)) {
        fprintf(stderr, "rank %d: shm open: %s\n", r, err);
        _exit(2);
      }
      int rc = comm_open(&g, g_gloo, r, world, err, sizeof err);
      if (rc) {
        fprintf(stderr, "rank %d: gloo open: %s\n", r, err);
        _exit(3);
      }
      int res = fn(s, g, r, world, arg);
      comm_close(g);
      comm_close(s);
      _exit(res);
    }
    pids[r] = p;
  }
}

/* Random floats of mixed magnitude, so that the order of a sum shows in
 * its bits: (a + b) + c differs from a + (b + c) for most of them. */
static float rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  uint32_t u = (uint32_t)(*s >> 33);
  float m = (float)(u & 0xffffff) / (float)0x1000000 - 0.5f;
  return m * (float)(1u << ((u >> 24) & 15));
}

static void fill(float *x, size_t n, int rank, int salt) {
  uint64_t s = (uint64_t)rank * 1000003u + (uint64_t)salt * 7919u + 1;
  for (size_t i = 0; i < n; i++) x[i] = rnd(&s);
}

static const size_t k_rows[] = {0, 1, 3, 7, 1001, 40009};
static const size_t k_row_elems[] = {1, 257};

static int same_collectives(comm_t *s, comm_t *g, int me, int world, void *arg) {
  size_t counts[8];
  int salt = 0;
  for (size_t a = 0; a < sizeof k_rows / sizeof *k_rows; a++)
    for (size_t b = 0; b < sizeof k_row_elems / sizeof *k_row_elems; b++) {
      size_t rows = k_rows[a], re = k_row_elems[b], total = rows * re;
      comm_shard_counts(rows, re, world, counts);
      size_t mine = counts[me];
      float *send = malloc((total + 1) * sizeof(float));
      float *rs = malloc((total + 1) * sizeof(float)), *rg = malloc((total + 1) * sizeof(float));
      float *gs = malloc((total + 1) * sizeof(float)), *gg = malloc((total + 1) * sizeof(float));
      salt++;

      /* all_gather */
      fill(send, mine, me, salt);
      CHECK(comm_all_gather(s, send, rs, counts) == 0, "shm all_gather: %s", comm_error(s));
      CHECK(comm_all_gather(g, send, rg, counts) == 0, "gloo all_gather: %s", comm_error(g));
      CHECK(!memcmp(rs, rg, total * sizeof(float)), "all_gather differs, %zu x %zu", rows, re);

      /* reduce_scatter, and in place (recv = send's own block) */
      fill(send, total, me, salt);
      CHECK(comm_reduce_scatter(s, send, gs, counts) == 0, "shm reduce_scatter: %s", comm_error(s));
      CHECK(comm_reduce_scatter(g, send, gg, counts) == 0, "gloo reduce_scatter: %s",
            comm_error(g));
      CHECK(!memcmp(gs, gg, mine * sizeof(float)), "reduce_scatter differs, %zu x %zu", rows, re);
      memcpy(rg, send, total * sizeof(float));
      float *own = rg + comm_displ(counts, me);
      CHECK(comm_reduce_scatter(g, rg, own, counts) == 0, "gloo reduce_scatter in place: %s",
            comm_error(g));
      CHECK(!memcmp(gs, own, mine * sizeof(float)), "in-place reduce_scatter differs");

      /* all_reduce */
      fill(rs, total, me, salt + 1000);
      memcpy(rg, rs, total * sizeof(float));
      CHECK(comm_all_reduce(s, rs, total) == 0, "shm all_reduce: %s", comm_error(s));
      CHECK(comm_all_reduce(g, rg, total) == 0, "gloo all_reduce: %s", comm_error(g));
      CHECK(!memcmp(rs, rg, total * sizeof(float)), "all_reduce differs, %zu elements", total);

      /* broadcast from the last rank */
      fill(rg, total, me, salt + 2000);
      CHECK(comm_broadcast(g, rg, total, world - 1) == 0, "gloo broadcast: %s", comm_error(g));
      fill(rs, total, world - 1, salt + 2000);
      CHECK(!memcmp(rs, rg, total * sizeof(float)), "broadcast differs, %zu elements", total);

      CHECK(comm_barrier(g) == 0, "gloo barrier: %s", comm_error(g));
      free(send);
      free(rs);
      free(rg);
      free(gs);
      free(gg);
    }
  CHECK(!strcmp(comm_backend(g), "gloo"), "backend '%s'", comm_backend(g));
  (void)arg;
  return 0;
}

static void test_gloo_equals_shm(void **state) {
  (void)state;
  for (int world = 1; world <= 4; world++) {
    pid_t pids[8];
    fork_ranks(world, same_collectives, NULL, 0, pids);
    tu_wait_ranks_ok(world, pids);
  }
}

/* Every rank all_gathers in a loop; the test kills rank 1 with -9; the
 * others must fail, each naming a peer (exit status 10 + that rank): with
 * TY_EABORTED as soon as a receive meets the lost connection, or with
 * TY_EDEADLINE at the timeout when the dead rank had delivered its part and
 * only this rank's send to it was left (Gloo does not fail a pending send
 * when its peer's connection drops). Gloo may also surface the death as the
 * loss of a connection between survivors, so which peer is named is not
 * fixed: the launcher, which sees exit statuses, names the rank that died. */
static int gather_until_killed(comm_t *s, comm_t *g, int me, int world, void *arg) {
  (void)s;
  (void)arg;
  size_t counts[8];
  comm_shard_counts(4096, 1, world, counts);
  float *buf = calloc(4096, sizeof(float));
  if (me == 1) {
    for (;;) comm_all_gather(g, buf + comm_displ(counts, me), buf, counts);
  }
  long long start = 0;
  int rc = 0;
  for (long i = 0;; i++) {
    rc = comm_all_gather(g, buf + comm_displ(counts, me), buf, counts);
    if (rc) break;
    if (i == 50) {
      /* Tell the parent we are running, by a file it waits for. */
      char path[700];
      snprintf(path, sizeof path, "%s/running-%d", g_dir, me);
      FILE *f = fopen(path, "w");
      if (f) fclose(f);
    }
    if (!start && i > 50) start = now_ms();
  }
  free(buf);
  CHECK(rc == TY_EABORTED || rc == TY_EDEADLINE, "rank %d: got %s (%s), want ABORTED or DEADLINE",
        me, ty_err_name(rc), comm_error(g));
  int blamed = comm_failed_rank(g);
  CHECK(blamed >= 0 && blamed != me, "blamed rank %d: %s", blamed, comm_error(g));
  char who[32];
  snprintf(who, sizeof who, "rank %d", blamed);
  CHECK(strstr(comm_error(g), who), "message does not name %s: %s", who, comm_error(g));
  /* The communicator stays broken. */
  CHECK(comm_barrier(g) == rc, "a later call did not fail at once with the same code");
  return 10 + blamed;
}

static void test_gloo_kill9(void **state) {
  (void)state;
  /* A send that the death does not end fails at 3 s, not 300. */
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "3000", 1);
  pid_t pids[3];
  fork_ranks(3, gather_until_killed, NULL, 1, pids);
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
  char path[700];
  for (int r = 0; r < 3; r += 2) {
    snprintf(path, sizeof path, "%s/running-%d", g_dir, r);
    long long t0 = now_ms();
    while (access(path, F_OK) != 0) {
      assert_true(now_ms() - t0 < 60000);
      usleep(10000);
    }
  }
  long long t0 = now_ms();
  kill(pids[1], SIGKILL);
  int st;
  waitpid(pids[1], &st, 0);
  for (int r = 0; r < 3; r += 2) {
    assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
    if (!WIFEXITED(st)) fail_msg("rank %d died of signal %d", r, WTERMSIG(st));
    int blamed = WEXITSTATUS(st) - 10;
    if (blamed < 0 || blamed > 2 || blamed == r) fail_msg("rank %d exited %d", r, WEXITSTATUS(st));
  }
  /* Seen within a few seconds, not at the 300 s timeout. */
  assert_true(now_ms() - t0 < 20000);
}

/* Rank 2 sleeps past the timeout before its barrier. */
static int late_barrier(comm_t *s, comm_t *g, int me, int world, void *arg) {
  (void)s;
  (void)arg;
  (void)world;
  if (me == 2) {
    usleep(2500 * 1000);
    return 0;
  }
  long long t0 = now_ms();
  int rc = comm_barrier(g);
  CHECK(rc == TY_EDEADLINE, "rank %d: got %s (%s), want DEADLINE_EXCEEDED", me, ty_err_name(rc),
        comm_error(g));
  CHECK(comm_failed_rank(g) == 2, "blamed rank %d: %s", comm_failed_rank(g), comm_error(g));
  CHECK(now_ms() - t0 >= 900, "timed out after %lld ms, before the 1000 ms timeout", now_ms() - t0);
  return 0;
}

static void test_gloo_timeout(void **state) {
  (void)state;
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "1000", 1);
  pid_t pids[3];
  fork_ranks(3, late_barrier, NULL, 1, pids);
  tu_wait_ranks_ok(3, pids);
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
}

/* World size 2 but only rank 0 starts: its open fails at the timeout,
 * saying that not every rank joined. */
static void test_gloo_missing_rank(void **state) {
  (void)state;
  new_rendezvous();
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "1000", 1);
  comm_t *c = NULL;
  char err[1024];
  long long t0 = now_ms();
  int rc = comm_open(&c, g_gloo, 0, 2, err, sizeof err);
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
  assert_null(c);
  assert_int_equal(rc, TY_EDEADLINE);
  assert_non_null(strstr(err, "rank 0 of 2"));
  assert_true(now_ms() - t0 < 30000);
}

static void test_gloo_bad_rendezvous(void **state) {
  (void)state;
  comm_t *c = NULL;
  char err[1024];
  assert_int_equal(comm_open(&c, "gloo:tcp:host:1", 0, 2, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "gloo:file:<dir>"));
  assert_int_equal(comm_open(&c, "gloo:file:", 0, 2, err, sizeof err), TY_EINVAL);
  char missing[700];
  snprintf(missing, sizeof missing, "gloo:file:%s/no-such-folder", g_dir);
  assert_int_equal(comm_open(&c, missing, 0, 2, err, sizeof err), TY_ENOTFOUND);
  assert_non_null(strstr(err, "no-such-folder"));
  assert_non_null(strstr(err, "does not exist"));
  assert_null(c);
}

int main(void) {
#ifndef TRAINYARD_HAVE_GLOO
  printf("SKIP: this build has no Gloo comm (install libgloo-dev and rebuild)\n");
  return 77;
#else
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gloo_equals_shm),     cmocka_unit_test(test_gloo_kill9),
      cmocka_unit_test(test_gloo_timeout),        cmocka_unit_test(test_gloo_missing_rank),
      cmocka_unit_test(test_gloo_bad_rendezvous),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
#endif
}
