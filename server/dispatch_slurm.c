/* dispatch_slurm.c - the Slurm dispatcher (server/dispatcher.h): each
 * attempt is one batch job, a script written into the attempt's folder
 * (server/slurm_script.h) and submitted with sbatch, whose one line runs
 * `srun --kill-on-bad-exit=1 trainyard-worker` on every allocated task.
 * A rank learns its number from srun (SLURM_PROCID, common/rankenv.h) and
 * the rest of the worker contract from the environment sbatch passes on.
 * Its state comes from squeue, then `scontrol show job` once the job has
 * left the queue, then sacct where accounting keeps it; cancel is scancel.
 * Every Slurm command is run with an argv (fork and exec), never through a
 * shell. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/beneath.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rankenv.h"
#include "common/rankproc.h"
#include "common/xalloc.h"
#include "server/dispatcher.h"
#include "server/slurm_script.h"

struct dispatch_run {
  int world;
  long jobid;
  const srv_config_t *cfg;
  char state[32]; /* Slurm's last word on the job ("PENDING", ...); "" before the first */
  bool ended;
  int status;    /* every rank's wait status once ended */
  char why[512]; /* what Slurm said of an end that was not COMPLETED */
  bool term_sent, kill_sent;
  double next_poll; /* ty_mono_s() before which Slurm is not asked again */
  void *line_ctx;   /* owned; no rank prints reports to us (they POST) */
};

/* Runs argv (envp: NULL for this process's environment) with its stdout
 * and stderr into out (NUL-terminated, cut to outsz), killing it after
 * timeout_s. Returns its wait status, or -1 when it could not be run
 * (out says why). */
static int run_cmd(char *const argv[], char *const envp[], double timeout_s, char *out,
                   size_t outsz) {
  extern char **environ;
  int fds[2];
  out[0] = '\0';
  if (pipe2(fds, O_CLOEXEC)) {
    snprintf(out, outsz, "pipe: %s", strerror(errno));
    return -1;
  }
  sigset_t none;
  sigemptyset(&none);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(out, outsz, "fork: %s", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) { /* only async-signal-safe calls until exec */
    sigprocmask(SIG_SETMASK, &none, NULL);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execvpe(argv[0], argv, envp ? envp : environ);
    static const char fail[] = "exec failed: not found in PATH\n";
    if (write(1, fail, sizeof fail - 1) < 0) _exit(127);
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  const double until = ty_mono_s() + timeout_s;
  bool killed = false;
  for (;;) {
    int left = (int)((until - ty_mono_s()) * 1000);
    if (left <= 0 && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    struct pollfd p = {fds[0], POLLIN, 0};
    int n = poll(&p, 1, left > 0 ? left : 100);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    ssize_t got = read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    size_t take = len + 1 < outsz ? outsz - len - 1 : 0;
    if (take > (size_t)got) take = (size_t)got;
    memcpy(out + len, buf, take);
    len += take;
    out[len] = '\0';
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (len && (out[len - 1] == '\n' || out[len - 1] == ' ')) out[--len] = '\0';
  if (killed) snprintf(out, outsz, "%s did not answer within %.0f s", argv[0], timeout_s);
  return killed ? -1 : status;
}

/* ---- Slurm's states ---- */

/* States in which the job's ranks may still run (or are about to). */
static bool state_live(const char *st) {
  static const char *const live[] = {"PENDING",   "CONFIGURING",  "RUNNING",     "COMPLETING",
                                     "SUSPENDED", "REQUEUED",     "RESIZING",    "SIGNALING",
                                     "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", NULL};
  for (int i = 0; live[i]; i++)
    if (!strcmp(st, live[i])) return true;
  return false;
}

/* The end of the batch job as a wait status of its ranks and a reason. */
static void finish(dispatch_run_t *r, const char *state, int code, int sig) {
  r->ended = true;
  snprintf(r->state, sizeof r->state, "%s", state);
  const long id = r->jobid;
  if (!strcmp(state, "COMPLETED")) {
    r->status = 0;
    return;
  }
  /* Killed by a signal where Slurm names one, else the exit code (1 where
   * Slurm gives none: the ranks did not finish). */
  r->status = sig > 0 && sig < 127 ? sig : (code > 0 && code < 256 ? code : 1) << 8;
  if (!strcmp(state, "CANCELLED") && (r->term_sent || r->kill_sent)) {
    r->status = r->kill_sent ? SIGKILL : SIGTERM;
    return; /* trainyard stopped it: the scheduler knows why */
  }
  if (!strcmp(state, "TIMEOUT"))
    snprintf(r->why, sizeof r->why,
             "Slurm job %ld reached its time limit (TIMEOUT); raise --slurm_time, or "
             "checkpoint more often (train.checkpoint_every) and let a restart resume",
             id);
  else if (!strcmp(state, "NODE_FAIL"))
    snprintf(r->why, sizeof r->why, "a node of Slurm job %ld failed (NODE_FAIL)", id);
  else if (!strcmp(state, "OUT_OF_MEMORY"))
    snprintf(r->why, sizeof r->why,
             "Slurm job %ld ran out of memory (OUT_OF_MEMORY): a rank went over its --mem; use "
             "fsdp.memory_efficient_load, more nodes, or nodes with more memory",
             id);
  else if (!strcmp(state, "PREEMPTED"))
    snprintf(r->why, sizeof r->why, "Slurm job %ld was preempted (PREEMPTED)", id);
  else if (!strcmp(state, "CANCELLED"))
    snprintf(r->why, sizeof r->why,
             "Slurm job %ld was cancelled outside trainyard (CANCELLED: scancel, or an "
             "administrator)",
             id);
  else if (!strcmp(state, "BOOT_FAIL") || !strcmp(state, "DEADLINE"))
    snprintf(r->why, sizeof r->why, "Slurm job %ld ended %s", id, state);
  else if (!strcmp(state, "FAILED"))
    snprintf(r->why, sizeof r->why, "Slurm job %ld FAILED (exit code %d%s%s)", id, code,
             sig ? ", signal " : "", sig ? strsignal(sig) : "");
  else
    snprintf(r->why, sizeof r->why, "Slurm job %ld ended %s", id, state);
}

/* "KEY=value" of `scontrol show job -o` output into val; false when absent. */
static bool field(const char *text, const char *key, char *val, size_t size) {
  size_t n = strlen(key);
  for (const char *p = text; (p = strstr(p, key)); p += n)
    if ((p == text || p[-1] == ' ' || p[-1] == '\n') && p[n] == '=') {
      const char *v = p + n + 1;
      size_t len = strcspn(v, " \n");
      snprintf(val, size, "%.*s", (int)(len < size ? len : size - 1), v);
      return true;
    }
  return false;
}

/* Asks Slurm about the job (at most every --slurm_poll seconds). */
static void poll_job(dispatch_run_t *r) {
  if (r->ended || ty_mono_s() < r->next_poll) return;
  r->next_poll = ty_mono_s() + r->cfg->slurm_poll;
  char id[32], out[4096];
  snprintf(id, sizeof id, "%ld", r->jobid);
  char *sq[] = {"squeue", "-h", "-j", id, "-o", "%T", NULL};
  int st = run_cmd(sq, NULL, 20, out, sizeof out);
  if (st == 0 && out[0] && !strchr(out, ' ')) {
    snprintf(r->state, sizeof r->state, "%.31s", out);
    if (state_live(out)) return;
  }
  /* Left the queue (or squeue shows its end): scontrol knows how it ended
   * until MinJobAge has passed. */
  char *sc[] = {"scontrol", "-o", "show", "job", id, NULL};
  st = run_cmd(sc, NULL, 20, out, sizeof out);
  char state[32], exitc[32];
  if (st == 0 && field(out, "JobState", state, sizeof state)) {
    if (state_live(state)) {
      snprintf(r->state, sizeof r->state, "%s", state);
      return;
    }
    int code = 0, sig = 0;
    if (field(out, "ExitCode", exitc, sizeof exitc)) sscanf(exitc, "%d:%d", &code, &sig);
    finish(r, state, code, sig);
    return;
  }
  /* Gone from the controller: accounting, where it is configured. */
  char *sa[] = {"sacct", "-n", "-X", "-P", "-j", id, "-o", "State,ExitCode", NULL};
  st = run_cmd(sa, NULL, 20, out, sizeof out);
  int code = 0, sig = 0;
  if (st == 0 && out[0] && sscanf(out, "%31[A-Z_]%*[^|]|%d:%d", state, &code, &sig) >= 1) {
    if (!state_live(state)) finish(r, state, code, sig);
    return;
  }
  finish(r, "UNKNOWN", 1, 0);
  snprintf(r->why, sizeof r->why,
           "Slurm no longer knows job %ld (not in squeue or scontrol, and no accounting): its "
           "end went unseen",
           r->jobid);
}

/* scancel: with sig SIGTERM, the signal to the job's running tasks; else
 * the whole job ended. */
static void cancel_job(long jobid, int sig) {
  char id[32], out[1024];
  snprintf(id, sizeof id, "%ld", jobid);
  char *term[] = {"scancel", "--signal=TERM", id, NULL}, *all[] = {"scancel", id, NULL};
  int st = run_cmd(sig == SIGTERM ? term : all, NULL, 20, out, sizeof out);
  if (st != 0) ty_warn("scancel of Slurm job %ld: %s", jobid, out[0] ? out : "failed");
}

/* ---- the engine ---- */

/* Bytes of host memory asked per node: each rank's lower bound with room
 * for what the memory rules do not count (activations, buffers, the
 * process). */
static int64_t node_mem_mib(const dispatch_attempt_t *a) {
  if (a->mem_mib_per_rank <= 0) return 0;
  return (int64_t)a->ranks_per_node * (a->mem_mib_per_rank + 512);
}

static int slurm_start(dispatcher_t *d, const dispatch_attempt_t *a, dispatch_run_t **out,
                       int *started, char *msg, size_t msgsz) {
  const srv_config_t *cfg = d->impl;
  *out = NULL;
  *started = 0;
  char dir[PATH_MAX];
  if (!realpath(a->dir, dir)) {
    snprintf(msg, msgsz, "the attempt's folder %s: %s", a->dir, strerror(errno));
    free(a->line_ctx);
    return TY_EUNAVAILABLE;
  }
  slurm_script_t in = {.job_id = a->job_id,
                       .job_name = a->job_name,
                       .attempt = a->attempt,
                       .nodes = a->nodes,
                       .ranks_per_node = a->ranks_per_node,
                       .cpus_per_rank = (int)cfg->slurm_cpus_per_rank,
                       .mem_mib = node_mem_mib(a),
                       .cuda = a->cuda,
                       .grace_s = a->grace_s,
                       .partition = cfg->slurm_partition,
                       .account = cfg->slurm_account,
                       .qos = cfg->slurm_qos,
                       .time_limit = cfg->slurm_time,
                       .extra = cfg->slurm_extra,
                       .worker = a->worker,
                       .log_dir = dir};
  char *text = NULL;
  int rc = slurm_script(&in, &text, msg, msgsz);
  char script[PATH_MAX + 16];
  snprintf(script, sizeof script, "%s/sbatch.sh", dir);
  if (!rc) {
    int fd = open(script, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    size_t len = strlen(text);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len) {
      snprintf(msg, msgsz, "cannot write the batch script %s: %s", script, strerror(errno));
      rc = TY_EUNAVAILABLE;
    }
    if (fd >= 0) close(fd);
  }
  free(text);
  char *outp = rc ? NULL : slurm_output_pattern(dir, "/slurm-%j.out");
  if (rc) {
    free(a->line_ctx);
    return rc;
  }
  /* The ranks' contract but their numbers, which srun gives each task. */
  rankenv_t re = {0};
  rankenv_set(&re, RANKENV_SPEC, a->spec_path);
  rankenv_set(&re, RANKENV_JOB_ID, a->job_id);
  rankenv_set_long(&re, RANKENV_ATTEMPT, a->attempt);
  rankenv_set(&re, RANKENV_RENDEZVOUS, a->rendezvous);
  rankenv_set(&re, RANKENV_REPORT_URL, a->report_url);
  rankenv_set(&re, RANKENV_TOKEN, a->token);
  rankenv_set(&re, RANKENV_MODE, "train");
  rankenv_set_long(&re, RANKENV_HEARTBEAT_MS, a->heartbeat_ms);
  /* Each rank appends its output to rank-<rank>.log itself, capped as the
   * local dispatcher's logs are (srun's --output file would grow
   * without bound). */
  rankenv_set(&re, RANKENV_LOG_DIR, dir);
  rankenv_set_long(&re, RANKENV_LOG_MAX, a->log_max);
  if (a->cuda && a->gpu_mem_limit_mib > 0)
    rankenv_set_long(&re, RANKENV_CUDA_MEM_LIMIT_MIB, a->gpu_mem_limit_mib);
  if (ty_beneath_confined()) {
    rankenv_set(&re, RANKENV_READ_ROOTS, ty_beneath_roots(false));
    rankenv_set(&re, RANKENV_WRITE_ROOTS, ty_beneath_roots(true));
  }
  if (ty_beneath_walks()) rankenv_set(&re, RANKENV_BENEATH_WALK, "1");
  extern char **environ;
  char **envp = rankenv_envp(&re, environ, RANKENV_INHERIT_NONE, NULL, NULL);
  rankenv_clear(&re);
  char output_opt[PATH_MAX + 32];
  snprintf(output_opt, sizeof output_opt, "--output=%s", outp);
  free(outp);
  char *argv[] = {"sbatch", "--parsable", output_opt, script, NULL};
  char answer[2048];
  int st = run_cmd(argv, envp, 60, answer, sizeof answer);
  rankenv_envp_free(envp);
  char *end = NULL;
  long jobid = st == 0 ? strtol(answer, &end, 10) : 0;
  if (st != 0 || jobid <= 0 || (end && *end && *end != ';')) {
    snprintf(msg, msgsz, "sbatch %s failed (%s%d): %s", script,
             st < 0          ? ""
             : WIFEXITED(st) ? "exit status "
                             : "signal ",
             st < 0          ? -1
             : WIFEXITED(st) ? WEXITSTATUS(st)
                             : WTERMSIG(st),
             answer[0] ? answer : "no output");
    free(a->line_ctx);
    return TY_EUNAVAILABLE;
  }
  dispatch_run_t *r = xcalloc(1, sizeof *r);
  r->world = a->world_size;
  r->jobid = jobid;
  r->cfg = cfg;
  r->line_ctx = a->line_ctx;
  ty_info("job %s attempt %d: Slurm job %ld (%d nodes x %d ranks)", a->job_id, a->attempt, jobid,
          a->nodes, a->ranks_per_node);
  *out = r;
  *started = r->world;
  return 0;
}

static dispatch_run_t *slurm_adopt(dispatcher_t *d, int pid, int64_t start_ticks, int world) {
  if (start_ticks != DISPATCH_SLURM_TICKS || pid <= 0) return NULL;
  dispatch_run_t *r = xcalloc(1, sizeof *r);
  r->world = world;
  r->jobid = pid;
  r->cfg = d->impl;
  return r;
}

static void slurm_where(const dispatch_run_t *run, int rank, int *pid, int64_t *start_ticks) {
  (void)rank;
  *pid = (int)run->jobid;
  *start_ticks = DISPATCH_SLURM_TICKS;
}

/* Once per run and kind: SIGTERM asks the ranks to stop (a job still
 * queued is simply removed), SIGKILL ends the job. */
static void slurm_signal(dispatch_run_t *run, int rank, int sig) {
  (void)rank;
  if (run->ended) return;
  bool queued = !run->state[0] || !strcmp(run->state, "PENDING");
  if (sig == SIGTERM && !run->term_sent) {
    run->term_sent = true;
    cancel_job(run->jobid, queued ? SIGKILL : SIGTERM);
  } else if (sig != SIGTERM && !run->kill_sent) {
    run->kill_sent = true;
    cancel_job(run->jobid, SIGKILL);
  }
  run->next_poll = 0;
}

static bool slurm_ended(dispatch_run_t *run, int rank, int *status) {
  (void)rank;
  poll_job(run);
  *status = run->status;
  return run->ended;
}

static bool slurm_waiting(dispatch_run_t *run) {
  poll_job(run);
  return !run->ended &&
         (!run->state[0] || !strcmp(run->state, "PENDING") || !strcmp(run->state, "CONFIGURING"));
}

static bool slurm_why(dispatch_run_t *run, int rank, char *buf, size_t size) {
  (void)rank;
  if (!run->ended || !run->why[0]) return false;
  snprintf(buf, size, "%s", run->why);
  return true;
}

static void slurm_clear(dispatch_run_t *run) {
  if (!run->ended) cancel_job(run->jobid, SIGKILL);
}

static void slurm_release(dispatch_run_t *run) {
  if (!run) return;
  free(run->line_ctx);
  free(run);
}

/* Rows that a local dispatcher recorded (before a switch to Slurm) are
 * processes of this host. */
static bool slurm_recorded_alive(dispatcher_t *d, int pid, int64_t start_ticks) {
  (void)d;
  if (start_ticks != DISPATCH_SLURM_TICKS) return rankproc_alive(pid, start_ticks);
  char id[32], out[256];
  snprintf(id, sizeof id, "%d", pid);
  char *sq[] = {"squeue", "-h", "-j", id, "-o", "%T", NULL};
  return run_cmd(sq, NULL, 20, out, sizeof out) == 0 && state_live(out);
}

static void slurm_recorded_signal(dispatcher_t *d, int pid, int64_t start_ticks, int sig) {
  (void)d;
  if (start_ticks != DISPATCH_SLURM_TICKS) {
    rankproc_signal(pid, start_ticks, sig);
    return;
  }
  cancel_job(pid, sig);
}

static const dispatcher_ops_t g_slurm_ops = {
    .name = "slurm",
    .start = slurm_start,
    .where = slurm_where,
    .signal = slurm_signal,
    .ended = slurm_ended,
    .clear = slurm_clear,
    .release = slurm_release,
    .queues = true,
    .waiting = slurm_waiting,
    .why = slurm_why,
    .adopt = slurm_adopt,
    .recorded_alive = slurm_recorded_alive,
    .recorded_signal = slurm_recorded_signal,
};

void dispatch_slurm_init(dispatcher_t *d, const srv_config_t *cfg) {
  d->ops = &g_slurm_ops;
  d->impl = (void *)cfg;
}
