/* test_comm.c - the comm layer across real processes: every collective with
 * uneven counts on 1-4 forked shm ranks (small chunks, so large buffers take
 * many rounds), checked exactly; the self backend; a rank killed with -9
 * mid-collective, a late rank, a missing rank and mismatched calls, each
 * failing with the rank named; /dev/shm left clean every time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "tests/unit/ranks_testutil.h"
#include "worker/dist/comm.h"

/* In a forked rank: report and exit 1 instead of a cmocka assertion. */
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "rank check failed at %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      return 1;                                                            \
    }                                                                      \
  } while (0)

typedef int (*rank_fn)(comm_t *c, int rank, int world, void *arg);

static char g_rdv[128];

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int shm_exists(const char *rdv) {
  char path[300], err[256];
  if (comm_shm_path(rdv, path, sizeof path, err, sizeof err)) return -1;
  char full[400];
  snprintf(full, sizeof full, "/dev/shm%s", path);
  struct stat st;
  return stat(full, &st) == 0;
}

static void new_rendezvous(void) {
  static int n;
  snprintf(g_rdv, sizeof g_rdv, "shm:test-comm-%d-%d", (int)getpid(), n++);
}

/* Forks `world` ranks on a fresh rendezvous; rank r opens, runs fn, closes
 * and exits with fn's result. skip_open: fn gets NULL and opens itself.
 * pids[] (optional) receives the children. Returns nothing; the caller
 * waits with wait_ranks. */
static void fork_ranks(int world, rank_fn fn, void *arg, pid_t *pids) {
  new_rendezvous();
  for (int r = 0; r < world; r++) {
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
      comm_t *c = NULL;
      char err[512];
      int rc = comm_open(&c, g_rdv, r, world, err, sizeof err);
      if (rc) {
        fprintf(stderr, "rank %d: comm_open: %s\n", r, err);
        _exit(2);
      }
      int res = fn(c, r, world, arg);
      comm_close(c);
      _exit(res);
    }
    pids[r] = p;
  }
}

/* Waits for every rank; asserts each exited 0; asserts /dev/shm is clean. */
static void wait_ranks_ok(int world, const pid_t *pids) {
  tu_wait_ranks_ok(world, pids);
  assert_int_equal(shm_exists(g_rdv), 0);
}

static void run_ranks(int world, rank_fn fn, void *arg) {
  pid_t pids[8];
  fork_ranks(world, fn, arg, pids);
  wait_ranks_ok(world, pids);
}

/* Exact in fp32: small integers whose sums over 4 ranks stay below 2^24. */
static float val(int rank, size_t i) {
  return (float)((rank * 7919 + (long)i * 31) % 4099);
}

static const size_t k_rows[] = {0, 1, 2, 3, 7, 1001, 40009};
static const size_t k_row_elems[] = {1, 3, 257};

static int coll_all_gather(comm_t *c, int me, int world) {
  size_t counts[8];
  for (size_t a = 0; a < sizeof k_rows / sizeof *k_rows; a++)
    for (size_t b = 0; b < sizeof k_row_elems / sizeof *k_row_elems; b++) {
      size_t rows = k_rows[a], re = k_row_elems[b];
      if (rows * re > 3000000) continue;
      comm_shard_counts(rows, re, world, counts);
      size_t first, n, total = rows * re;
      comm_shard_rows(rows, world, me, &first, &n);
      float *send = malloc((n * re + 1) * sizeof(float));
      float *recv = malloc((total + 1) * sizeof(float));
      for (size_t i = 0; i < n * re; i++) send[i] = val(0, first * re + i);
      for (int inplace = 0; inplace < 2; inplace++) {
        memset(recv, 0xff, (total + 1) * sizeof(float));
        const float *src = send;
        if (inplace) {
          memcpy(recv + first * re, send, n * re * sizeof(float));
          src = recv + first * re;
        }
        int rc = comm_all_gather(c, src, recv, counts);
        CHECK(rc == 0, "all_gather rows %zu: %s", rows, comm_error(c));
        for (size_t i = 0; i < total; i++)
          CHECK(recv[i] == val(0, i), "all_gather rows %zu x %zu [%zu] = %g, want %g", rows, re, i,
                recv[i], val(0, i));
      }
      free(send);
      free(recv);
    }
  return 0;
}

static int coll_reduce_scatter(comm_t *c, int me, int world) {
  size_t counts[8];
  for (size_t a = 0; a < sizeof k_rows / sizeof *k_rows; a++)
    for (size_t b = 0; b < sizeof k_row_elems / sizeof *k_row_elems; b++) {
      size_t rows = k_rows[a], re = k_row_elems[b];
      if (rows * re > 3000000) continue;
      comm_shard_counts(rows, re, world, counts);
      size_t first, n, total = rows * re;
      comm_shard_rows(rows, world, me, &first, &n);
      float *send = malloc((total + 1) * sizeof(float));
      float *recv = calloc(n * re + 1, sizeof(float));
      for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < total; i++) send[i] = val(me, i);
        float *dst = inplace ? send + first * re : recv;
        int rc = comm_reduce_scatter(c, send, dst, counts);
        CHECK(rc == 0, "reduce_scatter rows %zu: %s", rows, comm_error(c));
        for (size_t i = 0; i < n * re; i++) {
          float want = 0;
          for (int r = 0; r < world; r++) want += val(r, first * re + i);
          CHECK(dst[i] == want, "reduce_scatter rows %zu x %zu [%zu] = %g, want %g", rows, re, i,
                dst[i], want);
        }
      }
      free(send);
      free(recv);
    }
  return 0;
}

static int coll_all_reduce_broadcast(comm_t *c, int me, int world) {
  static const size_t sizes[] = {0, 1, 5, 4096, 3 * 4096 + 17, 300007};
  for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
    size_t n = sizes[a];
    float *buf = malloc((n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) buf[i] = val(me, i);
    int rc = comm_all_reduce(c, buf, n);
    CHECK(rc == 0, "all_reduce %zu: %s", n, comm_error(c));
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int r = 0; r < world; r++) want += val(r, i);
      CHECK(buf[i] == want, "all_reduce %zu [%zu] = %g, want %g", n, i, buf[i], want);
    }
    for (int root = 0; root < world; root++) {
      for (size_t i = 0; i < n; i++) buf[i] = me == root ? val(root + 1, i) : -1.0f;
      rc = comm_broadcast(c, buf, n, root);
      CHECK(rc == 0, "broadcast %zu from %d: %s", n, root, comm_error(c));
      for (size_t i = 0; i < n; i++)
        CHECK(buf[i] == val(root + 1, i), "broadcast %zu from %d [%zu] = %g", n, root, i, buf[i]);
    }
    CHECK(comm_barrier(c) == 0, "barrier: %s", comm_error(c));
    free(buf);
  }
  return 0;
}

static int all_collectives(comm_t *c, int me, int world, void *arg) {
  (void)arg;
  if (comm_rank(c) != me || comm_world_size(c) != world) return 1;
  if (coll_all_gather(c, me, world)) return 1;
  if (coll_reduce_scatter(c, me, world)) return 1;
  if (coll_all_reduce_broadcast(c, me, world)) return 1;
  return 0;
}

static void test_shm_collectives(void **state) {
  (void)state;
  /* 16 KiB halves: 4096 floats, so the larger cases take many rounds. */
  setenv("TRAINYARD_COMM_SHM_CHUNK_KB", "16", 1);
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "20000", 1);
  for (int world = 1; world <= 4; world++) run_ranks(world, all_collectives, NULL);
  /* The default chunk size too (one round for most cases). */
  unsetenv("TRAINYARD_COMM_SHM_CHUNK_KB");
  run_ranks(3, all_collectives, NULL);
}

static void test_self(void **state) {
  (void)state;
  comm_t *c;
  char err[256];
  assert_int_equal(comm_open(&c, "self", 0, 1, err, sizeof err), 0);
  assert_string_equal(comm_backend(c), "self");
  assert_int_equal(all_collectives(c, 0, 1, NULL), 0);
  comm_close(c);
  assert_int_equal(comm_open(&c, "self", 0, 2, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "shm:"));
  assert_int_equal(comm_open(&c, "tcp:x", 0, 1, err, sizeof err), TY_EINVAL);
  assert_int_equal(comm_open(&c, "shm:bad/name", 0, 2, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "'/'"));
  assert_int_equal(comm_open(&c, "shm:x", 2, 2, err, sizeof err), TY_EINVAL);
  /* From the environment: unset means one rank, self. */
  unsetenv("TRAINYARD_RENDEZVOUS");
  unsetenv("TRAINYARD_RANK");
  unsetenv("TRAINYARD_WORLD_SIZE");
  assert_int_equal(comm_open_env(&c, err, sizeof err), 0);
  assert_string_equal(comm_backend(c), "self");
  comm_close(c);
  setenv("TRAINYARD_WORLD_SIZE", "2", 1);
  assert_int_equal(comm_open_env(&c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "TRAINYARD_RENDEZVOUS"));
  unsetenv("TRAINYARD_WORLD_SIZE");
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "soon", 1);
  assert_int_equal(comm_open(&c, "self", 0, 1, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "TRAINYARD_COMM_TIMEOUT_MS"));
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
}

static void test_shard_rows(void **state) {
  (void)state;
  for (int world = 1; world <= 5; world++)
    for (size_t rows = 0; rows < 23; rows++) {
      size_t next = 0;
      for (int r = 0; r < world; r++) {
        size_t first, n;
        comm_shard_rows(rows, world, r, &first, &n);
        assert_int_equal(first, next);
        assert_int_equal(n, rows / world + ((size_t)r < rows % world ? 1 : 0));
        next += n;
      }
      assert_int_equal(next, rows);
    }
}

/* Rank 2 of 3 is killed (by the test) while every rank is inside a long,
 * many-round all_gather; the others must fail within ~1 s naming rank 2. */
static int gather_until_killed(comm_t *c, int me, int world, void *arg) {
  (void)arg;
  size_t per = 4u << 20; /* 16 MiB per rank in 16 KiB rounds: ~1000 rounds */
  size_t counts[3] = {per, per, per};
  float *send = calloc(per, sizeof(float)), *recv = calloc(3 * per, sizeof(float));
  CHECK(send && recv, "out of memory");
  int rc = 0;
  long long t0 = 0;
  for (int it = 0; it < 1000 && rc == 0; it++) {
    t0 = now_ms();
    rc = comm_all_gather(c, send, recv, counts);
  }
  long long waited = now_ms() - t0;
  free(send);
  free(recv);
  CHECK(rc == TY_EABORTED, "rank %d: all_gather returned %d (%s), want ABORTED", me, rc,
        comm_error(c));
  CHECK(comm_failed_rank(c) == 2, "rank %d blamed %d: %s", me, comm_failed_rank(c), comm_error(c));
  CHECK(strstr(comm_error(c), "rank 2") != NULL, "message: %s", comm_error(c));
  CHECK(waited < 2500, "rank %d took %lld ms to notice", me, waited);
  /* Broken for good: the next call fails at once with the same code. */
  CHECK(comm_barrier(c) == TY_EABORTED, "barrier after failure");
  return 0;
}

static void test_shm_kill9_mid_collective(void **state) {
  (void)state;
  setenv("TRAINYARD_COMM_SHM_CHUNK_KB", "16", 1);
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "30000", 1);
  pid_t pids[3];
  fork_ranks(3, gather_until_killed, NULL, pids);
  usleep(400 * 1000);
  assert_int_equal(kill(pids[2], SIGKILL), 0);
  /* Rank 2 stays a zombie until the survivors are done: liveness must not
   * depend on the parent reaping it. */
  for (int r = 0; r < 2; r++) {
    int st;
    assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
  }
  int st;
  assert_int_equal(waitpid(pids[2], &st, 0), pids[2]);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(shm_exists(g_rdv), 0);
  unsetenv("TRAINYARD_COMM_SHM_CHUNK_KB");
}

/* Rank 1 arrives 1.5 s late at a barrier with a 300 ms timeout: rank 0
 * fails DEADLINE blaming rank 1; rank 1 finds the failure when it arrives. */
static int late_barrier(comm_t *c, int me, int world, void *arg) {
  (void)arg;
  if (me == 1) usleep(1500 * 1000);
  long long t0 = now_ms();
  int rc = comm_barrier(c);
  long long waited = now_ms() - t0;
  CHECK(rc == TY_EDEADLINE, "rank %d: barrier returned %d (%s)", me, rc, comm_error(c));
  CHECK(comm_failed_rank(c) == 1, "rank %d blamed %d", me, comm_failed_rank(c));
  CHECK(strstr(comm_error(c), "rank 1 did not reach barrier"), "message: %s", comm_error(c));
  if (me == 0) CHECK(waited >= 250 && waited < 1400, "rank 0 waited %lld ms", waited);
  return 0;
}

static void test_shm_timeout(void **state) {
  (void)state;
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "300", 1);
  run_ranks(2, late_barrier, NULL);
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
}

/* Different element totals on two ranks: both fail INVALID_ARGUMENT. */
static int mismatched(comm_t *c, int me, int world, void *arg) {
  (void)arg;
  float buf[11] = {0};
  int rc = comm_all_reduce(c, buf, me == 0 ? 10 : 11);
  CHECK(rc == TY_EINVAL, "rank %d: all_reduce returned %d (%s)", me, rc, comm_error(c));
  CHECK(strstr(comm_error(c), "same calls"), "message: %s", comm_error(c));
  return 0;
}

static void test_shm_mismatch(void **state) {
  (void)state;
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "5000", 1);
  run_ranks(2, mismatched, NULL);
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
}

/* Only one of two ranks starts: it gives up after the timeout naming the
 * missing rank, and removes the segment. */
static void test_shm_missing_rank(void **state) {
  (void)state;
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "300", 1);
  char err[512];
  comm_t *c;
  for (int present = 0; present < 2; present++) {
    new_rendezvous();
    long long t0 = now_ms();
    assert_int_equal(comm_open(&c, g_rdv, present, 2, err, sizeof err), TY_EDEADLINE);
    assert_true(now_ms() - t0 < 1500);
    assert_non_null(strstr(err, present == 0 ? "rank 1" : "rank 0"));
    assert_int_equal(shm_exists(g_rdv), 0);
  }
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
}

/* A segment left by a dead job blocks rank 0 with a message saying what to
 * remove; comm_shm_remove clears it. */
static void test_shm_stale_segment(void **state) {
  (void)state;
  new_rendezvous();
  char path[300], err[512];
  assert_int_equal(comm_shm_path(g_rdv, path, sizeof path, err, sizeof err), 0);
  int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
  assert_true(fd >= 0);
  close(fd);
  comm_t *c;
  assert_int_equal(comm_open(&c, g_rdv, 0, 2, err, sizeof err), TY_EUNAVAILABLE);
  assert_non_null(strstr(err, "already exists"));
  assert_int_equal(comm_shm_remove(g_rdv), 0);
  assert_int_equal(comm_shm_remove(g_rdv), 1);
  assert_int_equal(comm_shm_remove("self"), TY_EINVAL);
  assert_int_equal(shm_exists(g_rdv), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shard_rows),       cmocka_unit_test(test_self),
      cmocka_unit_test(test_shm_collectives),  cmocka_unit_test(test_shm_kill9_mid_collective),
      cmocka_unit_test(test_shm_timeout),      cmocka_unit_test(test_shm_mismatch),
      cmocka_unit_test(test_shm_missing_rank), cmocka_unit_test(test_shm_stale_segment),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
