/* launch_testworker.c - a stand-in for trainyard-worker in the launcher's
 * tests: it checks the worker contract's environment, speaks the report
 * protocol on stdout and logs on stderr, and then does what
 * TY_TESTWORKER says:
 *   ok        join the job's communicator, all-reduce the ranks, report done
 *   fail      rank TY_TESTWORKER_RANK reports failed and exits 3 after
 *             0.5 s; the others start a subprocess and sleep
 *   stubborn  as fail, but the sleepers ignore SIGTERM
 *   sigint    report, wait for SIGINT, log that it came, exit 130
 *   hang      join the communicator, write joined<R>.pid, then sleep
 *             without a word
 *   stall     report step 3 every 50 ms, forever (a heartbeat, no progress)
 *   steps     report steps 1..20 every 100 ms, then done
 *   kill9     all-reduce in a loop; rank TY_TESTWORKER_RANK kills itself
 *             with SIGKILL midway; the others report the comm error
 * Every rank writes its pid to TY_TESTWORKER_PIDDIR/rank<R>.pid, and a
 * subprocess's to child<R>.pid, when that directory is set; kill9's victim
 * writes the monotonic milliseconds of its death to t_dying_ms<R>.pid. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rankenv.h"
#include "worker/dist/comm.h"

static int g_rank, g_world;
static volatile sig_atomic_t g_sigint;

static void report_step(const char *phase, int step, const char *message) {
  printf(
      "{\"job_id\":\"%s\",\"attempt\":%s,\"rank\":%d,\"world_size\":%d,\"phase\":\"%s\","
      "\"step\":%d,\"message\":\"%s\"}\n",
      rankenv_str(RANKENV_JOB_ID), rankenv_str(RANKENV_ATTEMPT), g_rank, g_world, phase, step,
      message);
  fflush(stdout);
}

static void report(const char *phase, const char *message) {
  report_step(phase, 0, message);
}

static void write_pid(const char *what, pid_t pid) {
  const char *dir = getenv("TY_TESTWORKER_PIDDIR");
  if (!dir) return;
  char path[512];
  snprintf(path, sizeof path, "%s/%s%d.pid", dir, what, g_rank);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "%d\n", (int)pid);
  fclose(f);
}

static comm_t *join_or_die(void) {
  comm_t *c;
  char err[512];
  if (comm_open_env(&c, err, sizeof err)) {
    report("failed", err);
    exit(1);
  }
  return c;
}

static void on_sigint(int sig) {
  (void)sig;
  g_sigint = 1;
}

static int run_ok(void) {
  comm_t *c = join_or_die();
  float v[3] = {(float)g_rank, 1.0f, 2.0f};
  if (comm_all_reduce(c, v, 3)) {
    report("failed", comm_error(c));
    return 1;
  }
  float want = (float)(g_world * (g_world - 1) / 2);
  if (v[0] != want || v[1] != (float)g_world) {
    report("failed", "all_reduce gave a wrong sum");
    return 1;
  }
  comm_close(c);
  report("done", "sum ok");
  return 0;
}

static int run_fail(int stubborn) {
  int bad = atoi(getenv("TY_TESTWORKER_RANK") ? getenv("TY_TESTWORKER_RANK") : "1");
  if (g_rank == bad) {
    usleep(500 * 1000);
    report("failed", "injected failure");
    fprintf(stderr, "[rank %d/%d] giving up\n", g_rank, g_world);
    return 3;
  }
  pid_t sub = fork();
  if (sub == 0) {
    for (;;) pause();
  }
  write_pid("child", sub);
  if (stubborn) signal(SIGTERM, SIG_IGN);
  report("training", "sleeping");
  sleep(60);
  return 0;
}

static int run_sigint(void) {
  signal(SIGINT, on_sigint);
  report("training", "waiting for SIGINT");
  while (!g_sigint) usleep(10 * 1000); /* polled: no lost-wakeup window */
  fprintf(stderr, "[rank %d/%d] caught SIGINT, stopping\n", g_rank, g_world);
  return 130;
}

static int run_kill9(void) {
  int bad = atoi(getenv("TY_TESTWORKER_RANK") ? getenv("TY_TESTWORKER_RANK") : "1");
  comm_t *c = join_or_die();
  size_t n = 1u << 20;
  float *buf = calloc(n, sizeof(float));
  for (int it = 0; it < 100000; it++) {
    if (g_rank == bad && it == 20) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      const char *dir = getenv("TY_TESTWORKER_PIDDIR");
      char path[512];
      snprintf(path, sizeof path, "%s/t_dying_ms%d.pid", dir ? dir : "/nonexistent", g_rank);
      FILE *f = fopen(path, "w");
      if (f) {
        fprintf(f, "%lld\n", (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
        fclose(f);
      }
      raise(SIGKILL);
    }
    if (comm_all_reduce(c, buf, n)) {
      report("failed", comm_error(c));
      return 1;
    }
  }
  free(buf);
  comm_close(c);
  report("done", "no failure seen");
  return 0;
}

int main(void) {
  const char *rank = rankenv_str(RANKENV_RANK), *world = rankenv_str(RANKENV_WORLD_SIZE);
  const rankenv_id_t need[] = {RANKENV_JOB_ID, RANKENV_ATTEMPT, RANKENV_RENDEZVOUS, RANKENV_MODE,
                               RANKENV_SPEC};
  if (!rank || !world) {
    fprintf(stderr, "launch_testworker: %s or %s unset\n", rankenv_name(RANKENV_RANK),
            rankenv_name(RANKENV_WORLD_SIZE));
    return 2;
  }
  g_rank = atoi(rank);
  g_world = atoi(world);
  for (size_t i = 0; i < sizeof need / sizeof *need; i++)
    if (!rankenv_str(need[i])) {
      report("failed", rankenv_name(need[i]));
      return 2;
    }
  write_pid("rank", getpid());
  fprintf(stderr, "[rank %d/%d] starting (pgid %d)\n", g_rank, g_world, (int)getpgid(0));
  report("starting", "env ok");
  const char *what = getenv("TY_TESTWORKER") ? getenv("TY_TESTWORKER") : "ok";
  if (!strcmp(what, "ok")) return run_ok();
  if (!strcmp(what, "roots")) { /* the roots it was given, into TY_TESTWORKER_ROOTS_FILE */
    FILE *f = fopen(getenv("TY_TESTWORKER_ROOTS_FILE"), "w");
    if (!f) return 2;
    const char *r = rankenv_str(RANKENV_READ_ROOTS), *w = rankenv_str(RANKENV_WRITE_ROOTS);
    fprintf(f, "read=%s write=%s", r ? r : "(unset)", w ? w : "(unset)");
    fclose(f);
    report("done", "roots written");
    return 0;
  }
  if (!strcmp(what, "fail")) return run_fail(0);
  if (!strcmp(what, "stubborn")) return run_fail(1);
  if (!strcmp(what, "sigint")) return run_sigint();
  if (!strcmp(what, "kill9")) return run_kill9();
  if (!strcmp(what, "stall"))
    for (;;) {
      report_step("training", 3, "heartbeat");
      usleep(50 * 1000);
    }
  if (!strcmp(what, "steps")) {
    for (int step = 1; step <= 20; step++) {
      report_step("training", step, "step");
      usleep(100 * 1000);
    }
    report("done", "20 steps");
    return 0;
  }
  if (!strcmp(what, "hang")) {
    comm_t *c = join_or_die();
    write_pid("joined", getpid());
    sleep(60);
    comm_close(c);
    return 0;
  }
  fprintf(stderr, "launch_testworker: unknown TY_TESTWORKER '%s'\n", what);
  return 2;
}
