/* dispatch.c - the local dispatcher (server/dispatcher.h): each rank a
 * trainyard-worker process on this host, started in its own process group
 * (common/rankproc.h) with the contract's environment (common/rankenv.h),
 * its stdout and stderr copied to a log file capped at a size by a thread
 * of its own, which also hands on the report lines it prints. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/beneath.h"
#include "common/log.h"
#include "common/logpump.h"
#include "common/rankenv.h"
#include "common/rankproc.h"
#include "common/xalloc.h"
#include "server/dispatcher.h"

#define LINE_MAX_BYTES 65536

/* One started rank. */
typedef struct {
  pid_t pid;           /* also the process group id */
  int64_t start_ticks; /* /proc/<pid>/stat start time, clock ticks */
  pthread_t pump;
  bool pump_started;
  bool exited;
  int status; /* wait status once exited */
} lrank_t;

struct dispatch_run {
  int world, started;
  lrank_t *ranks;
  void (*on_line)(void *ctx, int rank, const char *line);
  void *line_ctx; /* owned; shared by the pumps */
};

typedef struct {
  int in_fd;    /* read end of the rank's stdout+stderr pipe; owned */
  int out_fd;   /* the log file; owned */
  int64_t max;  /* bytes to keep */
  int rank;
  const dispatch_run_t *run;  /* its on_line and line_ctx outlive the pump */
  char line[LINE_MAX_BYTES];  /* the current, incomplete line */
  size_t line_len;
  bool line_too_long;
} pump_t;

/* Splits output into lines for on_line; JSON report lines only. */
static void feed_lines(pump_t *p, const char *buf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (buf[i] != '\n') {
      if (p->line_len + 1 < sizeof p->line)
        p->line[p->line_len++] = buf[i];
      else
        p->line_too_long = true;
      continue;
    }
    p->line[p->line_len] = '\0';
    if (!p->line_too_long && p->line[0] == '{') p->run->on_line(p->run->line_ctx, p->rank, p->line);
    p->line_len = 0;
    p->line_too_long = false;
  }
}

static void pump_lines(void *ctx, const char *buf, size_t n) {
  pump_t *p = ctx;
  if (p->run->on_line) feed_lines(p, buf, n);
}

/* Copies the pipe into the log until EOF, capped (common/logpump.h). */
static void *pump_main(void *arg) {
  pump_t *p = arg;
  ty_logpump(p->in_fd, p->out_fd, p->max, "trainyardd", pump_lines, p);
  close(p->in_fd);
  close(p->out_fd);
  free(p);
  return NULL;
}

/* Starts rank i of the attempt into run->ranks[i]: 0, or a TY_E* code
 * with msg saying why (the program is missing, the log cannot be
 * created, ...). */
static int start_rank(const dispatch_attempt_t *a, dispatch_run_t *run, int i, char *msg,
                      size_t msgsz) {
  lrank_t *out = &run->ranks[i];
  int gpu = a->gpus ? a->gpus[i] : -1;
  if (access(a->worker, X_OK)) {
    snprintf(msg, msgsz, "cannot run the worker program %s: %s (set --worker)", a->worker,
             strerror(errno));
    return TY_EUNAVAILABLE;
  }
  const char *log_path = a->log_paths[i];
  int logfd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (logfd < 0) {
    snprintf(msg, msgsz, "cannot create the rank log %s: %s", log_path, strerror(errno));
    return TY_EUNAVAILABLE;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) {
    snprintf(msg, msgsz, "pipe: %s", strerror(errno));
    close(logfd);
    return TY_EUNAVAILABLE;
  }
  rankenv_t re = {0};
  rankenv_set(&re, RANKENV_SPEC, a->spec_path);
  rankenv_set(&re, RANKENV_JOB_ID, a->job_id);
  rankenv_set_long(&re, RANKENV_ATTEMPT, a->attempt);
  rankenv_set_long(&re, RANKENV_RANK, i);
  rankenv_set_long(&re, RANKENV_WORLD_SIZE, a->world_size);
  rankenv_set(&re, RANKENV_RENDEZVOUS, a->rendezvous);
  rankenv_set(&re, RANKENV_REPORT_URL, a->report_url);
  rankenv_set(&re, RANKENV_TOKEN, a->token);
  rankenv_set(&re, RANKENV_MODE, "train");
  rankenv_set_long(&re, RANKENV_HEARTBEAT_MS, a->heartbeat_ms);
  /* One GPU per rank: the rank sees only its own, as device 0, and may
   * allocate this much of it (worker/cuda/mem_cuda.h). */
  char gpu_kv[64];
  snprintf(gpu_kv, sizeof gpu_kv, "CUDA_VISIBLE_DEVICES=%d", gpu);
  const char *gpu_drop[] = {"CUDA_VISIBLE_DEVICES=", NULL}, *gpu_env[] = {gpu_kv, NULL};
  if (gpu >= 0 && a->gpu_mem_limit_mib > 0)
    rankenv_set_long(&re, RANKENV_CUDA_MEM_LIMIT_MIB, a->gpu_mem_limit_mib);
  if (ty_beneath_confined()) { /* this server's roots (svc_open) are the rank's, even none */
    rankenv_set(&re, RANKENV_READ_ROOTS, ty_beneath_roots(false));
    rankenv_set(&re, RANKENV_WRITE_ROOTS, ty_beneath_roots(true));
  }
  if (ty_beneath_walks()) rankenv_set(&re, RANKENV_BENEATH_WALK, "1");
  extern char **environ;
  char **envp = rankenv_envp(&re, environ, RANKENV_INHERIT_NONE, gpu >= 0 ? gpu_drop : NULL,
                             gpu >= 0 ? gpu_env : NULL);
  rankenv_clear(&re);
  char *argv[] = {(char *)a->worker, NULL};
  rankproc_spec_t sp = {.program = a->worker,
                        .argv = argv,
                        .envp = envp,
                        .out_fd = fds[1],
                        .err_fd = fds[1],
                        .die_with_parent = false,
                        .exec_fail = "trainyardd: exec of the worker failed\n"};
  int e = rankproc_spawn(&sp, &out->pid, &out->start_ticks);
  rankenv_envp_free(envp);
  close(fds[1]);
  if (e) {
    snprintf(msg, msgsz, "fork: %s", strerror(e));
    close(fds[0]);
    close(logfd);
    return TY_EUNAVAILABLE;
  }
  pump_t *p = xcalloc(1, sizeof *p);
  p->in_fd = fds[0];
  p->out_fd = logfd;
  p->max = a->log_max;
  p->rank = i;
  p->run = run;
  if (pthread_create(&out->pump, NULL, pump_main, p) == 0) {
    out->pump_started = true;
  } else {
    ty_warn("no log thread for rank %d of job %s; its output is dropped", i, a->job_id);
    close(fds[0]);
    close(logfd);
    free(p);
  }
  return 0;
}

static int local_start(dispatcher_t *d, const dispatch_attempt_t *a, dispatch_run_t **out,
                       int *started, char *msg, size_t msgsz) {
  (void)d;
  dispatch_run_t *run = xcalloc(1, sizeof *run);
  run->world = a->world_size;
  run->ranks = xcalloc((size_t)run->world, sizeof *run->ranks);
  run->on_line = a->on_line;
  run->line_ctx = a->line_ctx;
  int rc = 0;
  while (run->started < run->world && !rc) {
    rc = start_rank(a, run, run->started, msg, msgsz);
    if (!rc) run->started++;
  }
  *started = run->started;
  if (run->started == 0) {
    free(run->line_ctx);
    free(run->ranks);
    free(run);
    run = NULL;
  }
  *out = run;
  return rc;
}

static void local_where(const dispatch_run_t *run, int rank, int *pid, int64_t *start_ticks) {
  *pid = run->ranks[rank].pid;
  *start_ticks = run->ranks[rank].start_ticks;
}

static void local_signal(dispatch_run_t *run, int rank, int sig) {
  lrank_t *k = &run->ranks[rank];
  if (rank < run->started) rankproc_signal(k->pid, k->start_ticks, sig);
}

static bool local_ended(dispatch_run_t *run, int rank, int *status) {
  lrank_t *k = &run->ranks[rank];
  if (rank >= run->started) return false;
  if (!k->exited && rankproc_reap(k->pid, &k->status)) k->exited = true;
  *status = k->status;
  return k->exited;
}

/* Stragglers a rank left in its group get the same end. */
static void local_clear(dispatch_run_t *run) {
  for (int i = 0; i < run->started; i++)
    if (rankproc_group_alive(run->ranks[i].pid)) killpg(run->ranks[i].pid, SIGKILL);
}

static void local_release(dispatch_run_t *run) {
  if (!run) return;
  for (int i = 0; i < run->started; i++)
    if (run->ranks[i].pump_started) pthread_join(run->ranks[i].pump, NULL);
  free(run->line_ctx);
  free(run->ranks);
  free(run);
}

static bool local_recorded_alive(dispatcher_t *d, int pid, int64_t start_ticks) {
  (void)d;
  return rankproc_alive(pid, start_ticks);
}

static void local_recorded_signal(dispatcher_t *d, int pid, int64_t start_ticks, int sig) {
  (void)d;
  rankproc_signal(pid, start_ticks, sig);
}

static const dispatcher_ops_t g_local_ops = {
    .name = "local",
    .start = local_start,
    .where = local_where,
    .signal = local_signal,
    .ended = local_ended,
    .clear = local_clear,
    .release = local_release,
    .recorded_alive = local_recorded_alive,
    .recorded_signal = local_recorded_signal,
};

dispatcher_t dispatch_local = {.ops = &g_local_ops, .impl = NULL};
