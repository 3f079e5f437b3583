/* dispatch.c - rank processes: fork + exec in a new process group, the
 * contract's environment, a capped log; see dispatch.h. */
#include "server/dispatch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/errors.h"
#include "common/beneath.h"
#include "common/log.h"
#include "common/xalloc.h"

#define LINE_MAX_BYTES 65536

typedef struct {
  int in_fd;    /* read end of the rank's stdout+stderr pipe; owned */
  int out_fd;   /* the log file; owned */
  int64_t max;  /* bytes to keep */
  void (*on_line)(void *ctx, const char *line);
  void *line_ctx;             /* owned */
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
    if (!p->line_too_long && p->line[0] == '{') p->on_line(p->line_ctx, p->line);
    p->line_len = 0;
    p->line_too_long = false;
  }
}

/* Copies the pipe into the log until EOF; past max bytes it keeps reading
 * (so the rank never blocks on a full pipe) but drops the rest, once noting
 * it in the log. */
static void *pump_main(void *arg) {
  pump_t *p = arg;
  char buf[65536];
  int64_t written = 0;
  bool noted = false;
  for (;;) {
    ssize_t n = read(p->in_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (p->on_line) feed_lines(p, buf, (size_t)n);
    int64_t room = p->max - written;
    size_t take = room <= 0 ? 0 : (size_t)(room < n ? room : n);
    if (take && write(p->out_fd, buf, take) == (ssize_t)take) written += (int64_t)take;
    if (take < (size_t)n && !noted) {
      char note[128];
      int len = snprintf(note, sizeof note,
                         "\n[trainyardd: log capped at %lld bytes; later output dropped]\n",
                         (long long)p->max);
      if (write(p->out_fd, note, (size_t)len) < 0) ty_warn("log note not written");
      noted = true;
    }
  }
  close(p->in_fd);
  close(p->out_fd);
  free(p->line_ctx);
  free(p);
  return NULL;
}

/* "name=value", allocated. */
static char *env_kv(const char *name, const char *value) {
  size_t n = strlen(name) + strlen(value) + 2;
  char *kv = xmalloc(n);
  snprintf(kv, n, "%s=%s", name, value);
  return kv;
}

int dispatch_start(const dispatch_spec_t *sp, dispatch_rank_t *out, char *msg, size_t msgsz) {
  memset(out, 0, sizeof *out);
  if (access(sp->worker, X_OK)) {
    snprintf(msg, msgsz, "cannot run the worker program %s: %s (set --worker)", sp->worker,
             strerror(errno));
    free(sp->line_ctx);
    return TY_EUNAVAILABLE;
  }
  int logfd = open(sp->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (logfd < 0) {
    snprintf(msg, msgsz, "cannot create the rank log %s: %s", sp->log_path, strerror(errno));
    free(sp->line_ctx);
    return TY_EUNAVAILABLE;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) {
    snprintf(msg, msgsz, "pipe: %s", strerror(errno));
    close(logfd);
    free(sp->line_ctx);
    return TY_EUNAVAILABLE;
  }
  /* Everything the child needs is prepared before fork: after it, only
   * async-signal-safe calls. */
  char env_buf[12][1200];
  snprintf(env_buf[0], sizeof env_buf[0], "TRAINYARD_SPEC=%s", sp->spec_path);
  snprintf(env_buf[1], sizeof env_buf[1], "TRAINYARD_JOB_ID=%s", sp->job_id);
  snprintf(env_buf[2], sizeof env_buf[2], "TRAINYARD_ATTEMPT=%d", sp->attempt);
  snprintf(env_buf[3], sizeof env_buf[3], "TRAINYARD_RANK=%d", sp->rank);
  snprintf(env_buf[4], sizeof env_buf[4], "TRAINYARD_WORLD_SIZE=%d", sp->world_size);
  snprintf(env_buf[5], sizeof env_buf[5], "TRAINYARD_RENDEZVOUS=%s", sp->rendezvous);
  snprintf(env_buf[6], sizeof env_buf[6], "TRAINYARD_REPORT_URL=%s", sp->report_url);
  snprintf(env_buf[7], sizeof env_buf[7], "TRAINYARD_TOKEN=%s", sp->token);
  snprintf(env_buf[8], sizeof env_buf[8], "TRAINYARD_MODE=train");
  snprintf(env_buf[9], sizeof env_buf[9], "TRAINYARD_HEARTBEAT_MS=%d", sp->heartbeat_ms);
  /* One GPU per rank: the rank sees only its own, as device 0. */
  snprintf(env_buf[10], sizeof env_buf[10], "CUDA_VISIBLE_DEVICES=%d", sp->gpu);
  /* ...and may allocate this much of it (worker/mem_cuda.h). */
  snprintf(env_buf[11], sizeof env_buf[11], "TRAINYARD_CUDA_MEM_LIMIT_MIB=%lld",
           (long long)sp->gpu_mem_limit_mib);
  int n_own = sp->gpu < 0 ? 10 : sp->gpu_mem_limit_mib > 0 ? 12 : 11;
  extern char **environ;
  size_t nenv = 0;
  while (environ[nenv]) nenv++;
  char **envp = xcalloc(nenv + 16, sizeof *envp);
  size_t k = 0;
  for (size_t i = 0; i < nenv; i++)
    if (strncmp(environ[i], "TRAINYARD_", 10) &&
        (sp->gpu < 0 || strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21)))
      envp[k++] = environ[i];
  for (int i = 0; i < n_own; i++) envp[k++] = env_buf[i];
  /* The roots, as long as they are (up to 32 of PATH_MAX each). */
  char *roots[3] = {NULL, NULL, NULL};
  if (ty_beneath_confined()) { /* this server's roots (svc_open) are the rank's, even none */
    roots[0] = env_kv("TRAINYARD_READ_ROOTS", ty_beneath_roots(false));
    roots[1] = env_kv("TRAINYARD_WRITE_ROOTS", ty_beneath_roots(true));
  }
  if (ty_beneath_walks()) roots[2] = xstrdup("TRAINYARD_BENEATH_WALK=1");
  for (int i = 0; i < 3; i++)
    if (roots[i]) envp[k++] = roots[i];
  envp[k] = NULL;
  char *argv[] = {(char *)sp->worker, NULL};

  pid_t pid = fork();
  if (pid < 0) {
    snprintf(msg, msgsz, "fork: %s", strerror(errno));
    free(envp);
    for (int i = 0; i < 3; i++) free(roots[i]);
    close(fds[0]);
    close(fds[1]);
    close(logfd);
    free(sp->line_ctx);
    return TY_EUNAVAILABLE;
  }
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execve(sp->worker, argv, envp);
    static const char err[] = "trainyardd: exec of the worker failed\n";
    if (write(2, err, sizeof err - 1) < 0) _exit(127);
    _exit(127);
  }
  /* Both sides set the group, so no signal can race the child's setpgid. */
  setpgid(pid, pid);
  free(envp);
  for (int i = 0; i < 3; i++) free(roots[i]);
  close(fds[1]);
  out->pid = pid;
  out->start_ticks = dispatch_start_ticks(pid);
  pump_t *p = xcalloc(1, sizeof *p);
  p->in_fd = fds[0];
  p->out_fd = logfd;
  p->max = sp->log_max;
  p->on_line = sp->on_line;
  p->line_ctx = sp->line_ctx;
  if (pthread_create(&out->pump, NULL, pump_main, p) == 0) {
    out->pump_started = true;
  } else {
    ty_warn("no log thread for rank %d of job %s; its output is dropped", sp->rank, sp->job_id);
    close(fds[0]);
    close(logfd);
    free(p->line_ctx);
    free(p);
  }
  return 0;
}

void dispatch_release(dispatch_rank_t *r) {
  if (r->pump_started) pthread_join(r->pump, NULL);
  r->pump_started = false;
}

int64_t dispatch_start_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* Field 2 (comm) may hold spaces and parentheses: parse after the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  char state = 0;
  long long start = -1;
  /* After ')': state(3) then fields 4..21, start time is field 22. */
  if (sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %lld",
             &state, &start) != 2)
    return -1;
  return start;
}

static char proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : 0;
}

bool dispatch_alive(pid_t pid, int64_t start_ticks) {
  if (pid <= 0) return false;
  int64_t t = dispatch_start_ticks(pid);
  if (t < 0 || (start_ticks > 0 && t != start_ticks)) return false;
  char st = proc_state(pid);
  return st && st != 'Z' && st != 'X';
}

int dispatch_signal(pid_t pid, int64_t start_ticks, int sig) {
  if (pid <= 0) return TY_ENOTFOUND;
  /* The group leader may be gone while its children live on; only a
   * leader that is still there and is someone else stops us. */
  int64_t t = dispatch_start_ticks(pid);
  if (t >= 0 && start_ticks > 0 && t != start_ticks) return TY_ENOTFOUND;
  if (killpg(pid, sig) && errno == ESRCH) return TY_ENOTFOUND;
  return 0;
}

bool dispatch_group_alive(pid_t pgid) {
  return pgid > 0 && (killpg(pgid, 0) == 0 || errno == EPERM);
}
