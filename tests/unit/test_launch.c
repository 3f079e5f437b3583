/* test_launch.c - the local launcher with a stand-in worker
 * (tests/comm/launch_testworker.c): success with every line relayed, one
 * rank failing (the others and their subprocesses gone within 5 s, the reason
 * returned), ranks ignoring SIGTERM, SIGINT forwarded, a rank killed with -9
 * mid-collective, a silent rank, the launcher itself killed with -9; no
 * process left behind and nothing left in /dev/shm after any of them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "worker/rank/launch.h"

static char g_bin[1024];
static char g_piddir[256];

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What the line callback saw. */
typedef struct {
  int world;
  int out_lines[8], err_lines[8];
  int done[8], failed[8], sigint_seen[8], training[8];
  char failed_msg[8][512];
  int sent_sigint;
} seen_t;

static void on_line(void *ctx, int rank, launch_stream_t stream, const char *line) {
  seen_t *s = ctx;
  assert_true(rank >= 0 && rank < s->world);
  if (stream == LAUNCH_STDOUT) {
    s->out_lines[rank]++;
    if (strstr(line, "\"phase\":\"done\"")) s->done[rank]++;
    if (strstr(line, "\"phase\":\"training\"")) s->training[rank]++;
    if (strstr(line, "\"phase\":\"failed\"")) {
      s->failed[rank]++;
      snprintf(s->failed_msg[rank], sizeof s->failed_msg[rank], "%s", line);
    }
  } else {
    s->err_lines[rank]++;
    if (strstr(line, "caught SIGINT")) s->sigint_seen[rank]++;
  }
  /* sigint mode: once every rank waits, Ctrl-C the launcher (this thread
   * has SIGINT blocked; the launcher reads it from its signalfd). */
  if (!s->sent_sigint && strstr(line, "waiting for SIGINT")) {
    int all = 1;
    for (int r = 0; r < s->world; r++) all &= s->training[r] > 0;
    if (all) {
      s->sent_sigint = 1;
      kill(getpid(), SIGINT);
    }
  }
}

static void setup_bin(void) {
  const char *b = getenv("TY_TESTWORKER_BIN");
  if (b)
    snprintf(g_bin, sizeof g_bin, "%s", b);
  else
    snprintf(g_bin, sizeof g_bin, "%s/tests/launch_testworker",
             getenv("TRAINYARD_BIN_DIR") ? getenv("TRAINYARD_BIN_DIR") : ".");
}

static void fresh_piddir(void) {
  snprintf(g_piddir, sizeof g_piddir, "/tmp/ty-launch-test-%d-XXXXXX", (int)getpid());
  assert_non_null(mkdtemp(g_piddir));
  setenv("TY_TESTWORKER_PIDDIR", g_piddir, 1);
}

/* Gone: no such process, or a zombie nobody reaped yet. */
static int pid_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *rp = strrchr(buf, ')');
  return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/* Every pid written under the pid directory is gone (waiting up to
 * wait_ms: a subprocess SIGKILLed with its rank's group may still be in its
 * exit); returns how many pids there were. Removes the directory. */
static int check_pids_gone(int wait_ms) {
  DIR *d = opendir(g_piddir);
  assert_non_null(d);
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (!strncmp(e->d_name, "t_", 2)) { /* a timestamp, not a pid */
      char path[600];
      snprintf(path, sizeof path, "%s/%s", g_piddir, e->d_name);
      unlink(path);
      continue;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/%s", g_piddir, e->d_name);
    FILE *f = fopen(path, "r");
    int pid = 0;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    long long until = now_ms() + wait_ms;
    while (!pid_gone(pid) && now_ms() < until) usleep(10 * 1000);
    if (!pid_gone(pid)) fail_msg("%s: pid %d still runs", e->d_name, pid);
    unlink(path);
    count++;
  }
  closedir(d);
  rmdir(g_piddir);
  return count;
}

static int shm_leftovers(const char *job_id) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, job_id)) n++;
  closedir(d);
  return n;
}

static launch_opts_t opts_for(int world, const char *mode, seen_t *seen, const char *job) {
  launch_opts_t o;
  memset(&o, 0, sizeof o);
  o.worker = g_bin;
  o.world_size = world;
  o.spec_path = "spec.json";
  o.mode = "train";
  o.job_id = job;
  o.on_line = on_line;
  o.ctx = seen;
  setenv("TY_TESTWORKER", mode, 1);
  memset(seen, 0, sizeof *seen);
  seen->world = world;
  return o;
}

static void test_success(void **state) {
  (void)state;
  for (int world = 1; world <= 3; world += 2) {
    seen_t seen;
    char job[64];
    snprintf(job, sizeof job, "ok-%d-%d", (int)getpid(), world);
    launch_opts_t o = opts_for(world, "ok", &seen, job);
    launch_result_t res;
    fresh_piddir();
    assert_int_equal(launch_run(&o, &res), 0);
    assert_int_equal(res.failed_rank, -1);
    assert_string_equal(res.reason, "");
    assert_string_equal(res.job_id, job);
    for (int r = 0; r < world; r++) {
      assert_int_equal(seen.done[r], 1);
      assert_int_equal(seen.out_lines[r], 2);
      assert_true(seen.err_lines[r] >= 1);
    }
    assert_int_equal(check_pids_gone(5000), world);
    assert_int_equal(shm_leftovers(job), 0);
  }
}

static void run_failing(const char *mode, int grace_ms) {
  seen_t seen;
  char job[64];
  snprintf(job, sizeof job, "%s-%d", mode, (int)getpid());
  launch_opts_t o = opts_for(3, mode, &seen, job);
  o.grace_ms = grace_ms;
  setenv("TY_TESTWORKER_RANK", "1", 1);
  launch_result_t res;
  fresh_piddir();
  long long t0 = now_ms();
  int rc = launch_run(&o, &res);
  long long took = now_ms() - t0;
  assert_int_equal(rc, TY_EABORTED);
  assert_int_equal(res.failed_rank, 1);
  assert_int_equal(res.exit_code, 3);
  assert_string_equal(res.reason, "injected failure");
  /* Rank 1 fails at 0.5 s; the sleepers (60 s) and their subprocesses must be
   * gone well within 5 s of that. */
  assert_true(took < 500 + 5000);
  /* Sleepers that ignore SIGTERM last the grace period, then SIGKILL. */
  if (grace_ms) assert_true(took >= 500 + grace_ms - 50);
  assert_int_equal(seen.training[0] + seen.training[2], 2);
  /* ranks 0-2 and the subprocesses of ranks 0 and 2 */
  assert_int_equal(check_pids_gone(5000), 5);
  assert_int_equal(shm_leftovers(job), 0);
}

static void test_rank_fails(void **state) {
  (void)state;
  run_failing("fail", 0);
}

static void test_rank_fails_others_ignore_sigterm(void **state) {
  (void)state;
  run_failing("stubborn", 400);
}

/* A caller that ignores SIGCHLD (as servers often do) still gets the exit
 * statuses, and its disposition back. */
static void test_sigchld_ignored(void **state) {
  (void)state;
  struct sigaction ign, prev, now;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGCHLD, &ign, &prev);
  seen_t seen;
  launch_opts_t o = opts_for(2, "fail", &seen, NULL);
  setenv("TY_TESTWORKER_RANK", "1", 1);
  launch_result_t res;
  fresh_piddir();
  assert_int_equal(launch_run(&o, &res), TY_EABORTED);
  assert_int_equal(res.failed_rank, 1);
  assert_int_equal(res.exit_code, 3);
  sigaction(SIGCHLD, &prev, &now);
  assert_true(now.sa_handler == SIG_IGN);
  assert_int_equal(check_pids_gone(5000), 3);
}

static void test_sigint_forwarded(void **state) {
  (void)state;
  seen_t seen;
  char job[64];
  snprintf(job, sizeof job, "sigint-%d", (int)getpid());
  launch_opts_t o = opts_for(2, "sigint", &seen, job);
  o.grace_ms = 8000; /* a loaded host may be slow to run a rank's handler */
  launch_result_t res;
  fresh_piddir();
  long long t0 = now_ms();
  int rc = launch_run(&o, &res);
  assert_true(seen.sent_sigint);
  assert_int_equal(rc, TY_ECANCELLED);
  assert_int_equal(res.interrupted, SIGINT);
  assert_int_equal(res.failed_rank, -1);
  for (int r = 0; r < 2; r++)
    if (seen.sigint_seen[r] != 1)
      fail_msg("rank %d did not log its SIGINT (%lld ms)", r, now_ms() - t0);
  assert_int_equal(check_pids_gone(5000), 2);
  /* The launcher's signal mask is restored. */
  sigset_t cur;
  sigprocmask(SIG_BLOCK, NULL, &cur);
  assert_false(sigismember(&cur, SIGINT));
}

static void test_rank_killed_mid_collective(void **state) {
  (void)state;
  seen_t seen;
  char job[64];
  snprintf(job, sizeof job, "kill9-%d", (int)getpid());
  launch_opts_t o = opts_for(3, "kill9", &seen, job);
  setenv("TY_TESTWORKER_RANK", "2", 1);
  setenv("TRAINYARD_COMM_TIMEOUT_MS", "20000", 1);
  launch_result_t res;
  fresh_piddir();
  assert_int_equal(launch_run(&o, &res), TY_EABORTED);
  /* Everything is over within 5 s of rank 2's death. */
  char path[400];
  snprintf(path, sizeof path, "%s/t_dying_ms2.pid", g_piddir);
  FILE *f = fopen(path, "r");
  long long died = 0;
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%lld", &died), 1);
  fclose(f);
  assert_true(now_ms() - died < 5000);
  assert_int_equal(res.failed_rank, 2);
  assert_int_equal(res.term_signal, SIGKILL);
  assert_non_null(strstr(res.reason, "signal 9"));
  /* Survivors that reported before they were stopped name a dead peer:
   * rank 2, or on a slow host a rank the launcher stopped first (the
   * naming of the killed rank itself is test_comm's). */
  for (int r = 0; r < 2; r++)
    if (seen.failed[r]) assert_non_null(strstr(seen.failed_msg[r], "died during all_reduce"));
  assert_int_equal(check_pids_gone(5000), 3);
  assert_int_equal(shm_leftovers(job), 0);
  unsetenv("TRAINYARD_COMM_TIMEOUT_MS");
}

static void test_silent_rank(void **state) {
  (void)state;
  seen_t seen;
  char job[64];
  snprintf(job, sizeof job, "hang-%d", (int)getpid());
  launch_opts_t o = opts_for(2, "hang", &seen, job);
  o.progress_timeout_ms = 1500; /* past a sanitizer build's start-up */
  o.grace_ms = 300;
  launch_result_t res;
  fresh_piddir();
  long long t0 = now_ms();
  assert_int_equal(launch_run(&o, &res), TY_EABORTED);
  assert_true(now_ms() - t0 < 8000);
  assert_true(res.failed_rank == 0 || res.failed_rank == 1);
  assert_non_null(strstr(res.reason, "no progress for 1500 ms"));
  assert_true(check_pids_gone(5000) >= 2); /* rank (and joined) files */
  assert_int_equal(shm_leftovers(job), 0);
}

/* Heartbeats that repeat the same step are not progress; advancing steps
 * are, however long the whole run takes. */
static void test_stalled_vs_advancing(void **state) {
  (void)state;
  seen_t seen;
  launch_result_t res;
  launch_opts_t o = opts_for(2, "stall", &seen, NULL);
  o.progress_timeout_ms = 400;
  o.grace_ms = 300;
  long long t0 = now_ms();
  assert_int_equal(launch_run(&o, &res), TY_EABORTED);
  assert_true(now_ms() - t0 < 6000);
  assert_non_null(strstr(res.reason, "no progress"));
  assert_true(seen.training[0] > 3); /* it kept reporting */
  /* 20 steps, 100 ms apart: 2 s in all, against a 1 s limit (wide enough
   * for a sanitizer build's start-up on a busy host). */
  o = opts_for(2, "steps", &seen, NULL);
  o.progress_timeout_ms = 1000;
  assert_int_equal(launch_run(&o, &res), 0);
  assert_int_equal(seen.done[0] + seen.done[1], 2);
  /* A made-up job id. */
  assert_non_null(strstr(res.job_id, "local-"));
}

/* The launcher itself is killed with -9: its ranks die with it. */
static void test_launcher_killed(void **state) {
  (void)state;
  seen_t seen;
  char job[64];
  snprintf(job, sizeof job, "orphan-%d", (int)getpid());
  launch_opts_t o = opts_for(2, "hang", &seen, job);
  fresh_piddir();
  pid_t launcher = fork();
  assert_true(launcher >= 0);
  if (launcher == 0) {
    launch_result_t res;
    launch_run(&o, &res);
    _exit(0);
  }
  /* Wait until both ranks have joined the communicator. */
  char p0[400], p1[400];
  snprintf(p0, sizeof p0, "%s/joined0.pid", g_piddir);
  snprintf(p1, sizeof p1, "%s/joined1.pid", g_piddir);
  long long until = now_ms() + 10000;
  while ((access(p0, F_OK) || access(p1, F_OK)) && now_ms() < until) usleep(10 * 1000);
  usleep(20 * 1000); /* the files' contents */
  assert_int_equal(kill(launcher, SIGKILL), 0);
  int st;
  assert_int_equal(waitpid(launcher, &st, 0), launcher);
  assert_int_equal(check_pids_gone(3000), 4); /* rank and joined files of 2 ranks */
  /* Both joined, so the last joiner removed the name: nothing is left. */
  until = now_ms() + 3000;
  while (shm_leftovers(job) && now_ms() < until) usleep(10 * 1000);
  assert_int_equal(shm_leftovers(job), 0);
}

static void test_bad_options(void **state) {
  (void)state;
  launch_opts_t o;
  launch_result_t res;
  memset(&o, 0, sizeof o);
  o.worker = "/nonexistent/trainyard-worker";
  o.world_size = 2;
  assert_int_equal(launch_run(&o, &res), TY_EINVAL);
  assert_non_null(strstr(res.reason, "/nonexistent/trainyard-worker"));
  o.worker = g_bin;
  o.world_size = 0;
  assert_int_equal(launch_run(&o, &res), TY_EINVAL);
  assert_non_null(strstr(res.reason, "world_size"));
}

/* The roots reach the ranks only as the caller gives them: one in the
 * launcher's own environment is not passed on. */
static void test_roots(void **state) {
  (void)state;
  char file[300], text[256] = {0};
  snprintf(file, sizeof file, "/tmp/ty-launch-roots-%d", (int)getpid());
  setenv("TY_TESTWORKER_ROOTS_FILE", file, 1);
  setenv("TRAINYARD_READ_ROOTS", "/inherited", 1);
  for (int given = 0; given < 2; given++) {
    seen_t seen;
    char job[64];
    snprintf(job, sizeof job, "roots-%d-%d", (int)getpid(), given);
    launch_opts_t o = opts_for(1, "roots", &seen, job);
    if (given) o.read_roots = "/srv/models:/srv/data", o.write_roots = "/srv/runs";
    launch_result_t res;
    fresh_piddir();
    assert_int_equal(launch_run(&o, &res), 0);
    check_pids_gone(5000);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_string_equal(
        text, given ? "read=/srv/models:/srv/data write=/srv/runs" : "read=(unset) write=(unset)");
  }
  unlink(file);
  unsetenv("TRAINYARD_READ_ROOTS");
  unsetenv("TY_TESTWORKER_ROOTS_FILE");
}

int main(void) {
  setup_bin();
  /* The tests kill(getpid(), SIGINT) only while launch_run has it blocked. */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_success),
      cmocka_unit_test(test_roots),
      cmocka_unit_test(test_rank_fails),
      cmocka_unit_test(test_rank_fails_others_ignore_sigterm),
      cmocka_unit_test(test_sigchld_ignored),
      cmocka_unit_test(test_sigint_forwarded),
      cmocka_unit_test(test_rank_killed_mid_collective),
      cmocka_unit_test(test_silent_rank),
      cmocka_unit_test(test_stalled_vs_advancing),
      cmocka_unit_test(test_launcher_killed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
