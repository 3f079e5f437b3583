/* launch.c - the local launcher: forks a job's ranks, relays their lines,
 * stops them all when one fails or the launcher is interrupted, reaps them
 * and removes the job's shm segment; see launch.h. One poll loop over a
 * signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP) and every rank's two pipes. */
#include "worker/rank/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errors.h"
#include "api/report_wire.h"
#include "common/clock.h"
#include "common/rankenv.h"
#include "common/rankproc.h"
#include "common/shm_name.h"
#include "common/xalloc.h"
#include "worker/dist/comm.h"

extern char **environ;

#define LAUNCH_GRACE_MS_DEFAULT 2000

typedef struct {
  pid_t pid;    /* also its process group; 0 once reaped */
  pid_t pgid;   /* kept after reaping, to kill what it left behind */
  int fd[2];    /* read ends of stdout, stderr; -1 when closed */
  char *buf[2]; /* partial lines, LAUNCH_LINE_MAX + 1 bytes each */
  size_t len[2];
  long long last_progress_ms; /* start, or the last report that moved */
  report_wire_t last;         /* that report, once has_last */
  bool has_last;
  char failed_msg[400];       /* message of its last "failed" report */
  char last_err[200];         /* its last stderr line */
} rank_t;

typedef struct {
  const launch_opts_t *o;
  launch_result_t *res;
  rank_t *ranks;
  int world, live, grace_ms;
  int stopping;      /* SIGTERM (or the forwarded signal) has been sent */
  int killed;        /* SIGKILL has been sent */
  long long kill_at; /* when SIGKILL follows */
} launch_t;

static void set_reason(launch_result_t *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_reason(launch_result_t *res, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->reason, sizeof res->reason, fmt, ap);
  va_end(ap);
}

/* The environment of rank `rank`: the caller's, less the contract's own
 * variables, plus the contract and opts->env. Returns a NULL-terminated
 * array for rankenv_envp_free. */
static char **build_env(const launch_opts_t *o, const launch_result_t *res, int attempt,
                        const char *rdv, int rank) {
  rankenv_t e = {0};
  rankenv_set(&e, RANKENV_SPEC, o->spec_path);
  rankenv_set(&e, RANKENV_MODE, o->mode);
  rankenv_set(&e, RANKENV_JOB_ID, res->job_id);
  rankenv_set_long(&e, RANKENV_ATTEMPT, attempt);
  rankenv_set_long(&e, RANKENV_RANK, rank);
  rankenv_set_long(&e, RANKENV_WORLD_SIZE, o->world_size);
  rankenv_set(&e, RANKENV_RENDEZVOUS, rdv);
  rankenv_set(&e, RANKENV_REPORT_URL, o->report_url);
  rankenv_set(&e, RANKENV_TOKEN, o->token);
  rankenv_set(&e, RANKENV_READ_ROOTS, o->read_roots);
  rankenv_set(&e, RANKENV_WRITE_ROOTS, o->write_roots);
  char **env = rankenv_envp(&e, environ, RANKENV_INHERIT_TUNING, NULL, o->env);
  rankenv_clear(&e);
  return env;
}

static void signal_all(launch_t *L, int sig) {
  for (int r = 0; r < L->world; r++)
    if (L->ranks[r].pid > 0) rankproc_signal(L->ranks[r].pgid, 0, sig);
}

/* Starts stopping every rank: `sig` now, SIGKILL after the grace period. */
static void stop_all(launch_t *L, int sig) {
  if (L->stopping) return;
  L->stopping = 1;
  L->kill_at = ty_mono_ms() + L->grace_ms;
  signal_all(L, sig);
}

/* A report on stdout (api/report_wire.h): remembers a failed report's
 * message (the rank's reason if it then fails), and counts as progress when
 * it moved past the rank's previous report (a heartbeat repeating it does
 * not). */
static void take_report(rank_t *k, const char *line) {
  report_wire_t w;
  if (!report_wire_parse_line(line, &w)) return;
  if (w.phase == REPORT_PHASE_FAILED && w.message[0])
    snprintf(k->failed_msg, sizeof k->failed_msg, "%.*s", (int)sizeof k->failed_msg - 1, w.message);
  if (!k->has_last || report_wire_progressed(&k->last, &w)) {
    k->last = w;
    k->has_last = true;
    k->last_progress_ms = ty_mono_ms();
  }
}

static void emit(launch_t *L, int r, int s, const char *line) {
  rank_t *k = &L->ranks[r];
  if (s == 0 && line[0] == '{')
    take_report(k, line);
  else if (s == 1 && line[0])
    snprintf(k->last_err, sizeof k->last_err, "%s", line);
  launch_stream_t st = s == 0 ? LAUNCH_STDOUT : LAUNCH_STDERR;
  if (L->o->on_line) {
    L->o->on_line(L->o->ctx, r, st, line);
  } else {
    FILE *f = s == 0 ? stdout : stderr;
    fprintf(f, "[rank %d] %s\n", r, line);
    fflush(f);
  }
}

/* Reads what is there from rank r's stream s; closes it at EOF or error.
 * Returns the bytes read (0 at EOF, -1 when nothing is there yet). */
static ssize_t read_stream(launch_t *L, int r, int s) {
  rank_t *k = &L->ranks[r];
  char *b = k->buf[s];
  ssize_t got = read(k->fd[s], b + k->len[s], LAUNCH_LINE_MAX - k->len[s]);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return -1;
  if (got > 0) k->len[s] += (size_t)got;
  size_t start = 0;
  for (size_t i = 0; i < k->len[s]; i++) {
    if (b[i] != '\n') continue;
    b[i] = '\0';
    emit(L, r, s, b + start);
    start = i + 1;
  }
  memmove(b, b + start, k->len[s] - start);
  k->len[s] -= start;
  if (k->len[s] == LAUNCH_LINE_MAX || (got <= 0 && k->len[s])) { /* a piece, or the tail */
    b[k->len[s]] = '\0';
    emit(L, r, s, b);
    k->len[s] = 0;
  }
  if (got <= 0) {
    close(k->fd[s]);
    k->fd[s] = -1;
  }
  return got < 0 ? 0 : got;
}

/* Reads everything rank r has written so far, so that a report written
 * just before it exited counts before its exit does. */
static void drain_rank(launch_t *L, int r) {
  for (int s = 0; s < 2; s++)
    while (L->ranks[r].fd[s] >= 0 && read_stream(L, r, s) > 0) {
    }
}

/* Records rank r's end as the job's failure, if it is the first. */
static void fail_rank(launch_t *L, int r, int status, const char *why) {
  launch_result_t *res = L->res;
  if (res->failed_rank >= 0 || res->interrupted) return;
  rank_t *k = &L->ranks[r];
  res->failed_rank = r;
  res->exit_code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  res->term_signal = status >= 0 && WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  const char *tail = k->last_err[0] ? "; last log line: " : "";
  if (why)
    set_reason(res, "%s", why);
  else if (k->failed_msg[0])
    set_reason(res, "%s", k->failed_msg);
  else if (res->term_signal)
    set_reason(res, "killed by signal %d (%s)%s%s", res->term_signal, strsignal(res->term_signal),
               tail, k->last_err);
  else
    set_reason(res, "exited with status %d%s%s", res->exit_code, tail, k->last_err);
  stop_all(L, SIGTERM);
}

/* Reaps whichever ranks have ended. Of several that failed at once, a rank
 * killed by a signal is blamed before ranks that exited reporting it. */
static void reap(launch_t *L) {
  int blame = -1, blame_status = 0;
  for (int r = 0; r < L->world; r++) {
    rank_t *k = &L->ranks[r];
    if (k->pid <= 0) continue;
    int st;
    if (!rankproc_reap(k->pid, &st)) continue;
    k->pid = 0;
    L->live--;
    rankproc_clear_group(k->pgid); /* whatever it started in its group */
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    drain_rank(L, r);
    if (blame < 0 || (WIFSIGNALED(st) && !WIFSIGNALED(blame_status))) {
      blame = r;
      blame_status = st;
    }
  }
  if (blame >= 0 && !L->stopping) fail_rank(L, blame, blame_status, NULL);
}

static void on_signal(launch_t *L, int sig) {
  if (sig == SIGCHLD) return; /* reap() runs every iteration */
  if (L->stopping) {          /* a second request: no more grace */
    signal_all(L, SIGKILL);
    L->killed = 1;
    return;
  }
  if (L->res->failed_rank < 0) {
    L->res->interrupted = sig;
    set_reason(L->res, "stopped by %s", strsignal(sig));
  }
  stop_all(L, sig == SIGHUP ? SIGTERM : sig);
}

static void check_progress(launch_t *L, long long now) {
  int limit = L->o->progress_timeout_ms;
  if (limit <= 0 || L->stopping) return;
  for (int r = 0; r < L->world; r++) {
    rank_t *k = &L->ranks[r];
    if (k->pid > 0 && now - k->last_progress_ms >= limit) {
      char why[160];
      snprintf(why, sizeof why,
               "no progress for %d ms (no report moved its phase, step or bytes loaded): the "
               "rank is stuck",
               limit);
      fail_rank(L, r, -1, why);
      rankproc_signal(k->pgid, 0, SIGKILL);
      return;
    }
  }
}

/* Milliseconds poll may sleep before a timer is due (-1: none). */
static int next_timeout(launch_t *L, long long now, long long drain_until) {
  long long t = 1000; /* reap() also runs at least this often */
  if (L->stopping && !L->killed && L->kill_at - now < t) t = L->kill_at - now;
  if (L->o->progress_timeout_ms > 0 && !L->stopping)
    for (int r = 0; r < L->world; r++)
      if (L->ranks[r].pid > 0) {
        long long due = L->ranks[r].last_progress_ms + L->o->progress_timeout_ms - now;
        if (due < t) t = due;
      }
  if (L->live == 0 && drain_until - now < t) t = drain_until - now;
  return t < 0 ? 0 : (int)t;
}

static void run_loop(launch_t *L, int sfd) {
  struct pollfd *pfd = xcalloc((size_t)(1 + 2 * L->world), sizeof *pfd);
  int *who = xcalloc((size_t)(2 * L->world), sizeof *who);
  long long drain_until = 0;
  for (;;) {
    int open_fds = 0;
    pfd[0].fd = sfd;
    pfd[0].events = POLLIN;
    for (int r = 0; r < L->world; r++)
      for (int s = 0; s < 2; s++)
        if (L->ranks[r].fd[s] >= 0) {
          pfd[1 + open_fds].fd = L->ranks[r].fd[s];
          pfd[1 + open_fds].events = POLLIN;
          who[open_fds++] = r * 2 + s;
        }
    if (L->live == 0 && open_fds == 0) break;
    long long now = ty_mono_ms();
    if (L->live == 0 && !drain_until) drain_until = now + L->grace_ms;
    int n = poll(pfd, (nfds_t)(1 + open_fds), next_timeout(L, now, drain_until));
    if (n > 0 && (pfd[0].revents & POLLIN)) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) on_signal(L, (int)si.ssi_signo);
    }
    for (int i = 0; n > 0 && i < open_fds; i++)
      if (pfd[1 + i].revents) read_stream(L, who[i] / 2, who[i] % 2);
    reap(L);
    now = ty_mono_ms();
    check_progress(L, now);
    if (L->stopping && !L->killed && now >= L->kill_at) {
      signal_all(L, SIGKILL);
      L->killed = 1;
    }
    if (L->live == 0 && drain_until && now >= drain_until) /* a pipe held by an escapee */
      for (int r = 0; r < L->world; r++)
        for (int s = 0; s < 2; s++)
          if (L->ranks[r].fd[s] >= 0) {
            close(L->ranks[r].fd[s]);
            L->ranks[r].fd[s] = -1;
          }
  }
  free(pfd);
  free(who);
}

/* Forks rank r; returns 0 or an errno. */
static int start_rank(launch_t *L, int r, char **argv, char **env, const char *fail_msg) {
  rank_t *k = &L->ranks[r];
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC)) return errno;
  if (pipe2(err, O_CLOEXEC)) {
    int e = errno;
    close(out[0]);
    close(out[1]);
    return e;
  }
  rankproc_spec_t sp = {.program = L->o->worker,
                        .argv = argv,
                        .envp = env,
                        .out_fd = out[1],
                        .err_fd = err[1],
                        .die_with_parent = true,
                        .exec_fail = fail_msg};
  pid_t pid;
  int64_t ticks;
  int e = rankproc_spawn(&sp, &pid, &ticks);
  close(out[1]);
  close(err[1]);
  if (e) {
    close(out[0]);
    close(err[0]);
    return e;
  }
  k->pid = k->pgid = pid;
  k->fd[0] = out[0];
  k->fd[1] = err[0];
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  k->last_progress_ms = ty_mono_ms();
  L->live++;
  return 0;
}

static int check_opts(const launch_opts_t *o, launch_result_t *res) {
  if (!o->worker || !*o->worker) {
    set_reason(res, "no worker binary given");
    return TY_EINVAL;
  }
  if (o->world_size < 1 || o->world_size > 4096) {
    set_reason(res, "world_size %d: need 1..4096 ranks", o->world_size);
    return TY_EINVAL;
  }
  if (access(o->worker, X_OK)) {
    set_reason(res, "worker binary '%s' cannot be run: %s", o->worker, strerror(errno));
    return TY_EINVAL;
  }
  if (o->grace_ms < 0 || o->progress_timeout_ms < 0 || o->attempt < 0) {
    set_reason(res, "grace_ms, progress_timeout_ms and attempt must not be negative");
    return TY_EINVAL;
  }
  return 0;
}

int launch_run(const launch_opts_t *o, launch_result_t *res) {
  memset(res, 0, sizeof *res);
  res->failed_rank = -1;
  res->exit_code = -1;
  int rc = check_opts(o, res);
  if (rc) return rc;
  int attempt = o->attempt ? o->attempt : 1;
  if (o->job_id)
    snprintf(res->job_id, sizeof res->job_id, "%s", o->job_id);
  else
    snprintf(res->job_id, sizeof res->job_id, "local-%d-%lld", (int)getpid(), ty_mono_ms());
  char rdv[256];
  if (o->rendezvous) {
    snprintf(rdv, sizeof rdv, "%s", o->rendezvous);
  } else if (o->world_size == 1) {
    snprintf(rdv, sizeof rdv, "self");
  } else { /* shm names allow [A-Za-z0-9._-] */
    char name[160];
    snprintf(name, sizeof name, "%s", res->job_id);
    for (char *p = name; *p; p++)
      if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", *p))
        *p = '_';
    snprintf(rdv, sizeof rdv, "shm:%s-%d", name, attempt);
  }
  int is_shm = !strncmp(rdv, "shm:", 4);
  if (is_shm) comm_shm_remove(rdv); /* a dead attempt's, should one be left */
  if (is_shm) ty_shm_sweep_local(); /* and those of launchers killed during a rendezvous */

  launch_t L = {.o = o, .res = res, .world = o->world_size};
  L.grace_ms = o->grace_ms ? o->grace_ms : LAUNCH_GRACE_MS_DEFAULT;
  L.ranks = xcalloc((size_t)L.world, sizeof *L.ranks);
  size_t nargs = 0;
  while (o->args && o->args[nargs]) nargs++;
  char **argv = xcalloc(nargs + 2, sizeof(char *));
  argv[0] = (char *)o->worker;
  for (size_t i = 0; i < nargs; i++) argv[i + 1] = (char *)o->args[i];
  char fail_msg[600];
  snprintf(fail_msg, sizeof fail_msg, "launcher: cannot run %s\n", o->worker);

  sigset_t mask, old;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, &old);
  /* With SIGCHLD ignored (or SA_NOCLDWAIT) the kernel reaps the ranks
   * itself and their exit statuses are lost: default it while we run. */
  struct sigaction chld_old, chld_dfl;
  memset(&chld_dfl, 0, sizeof chld_dfl);
  chld_dfl.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, NULL, &chld_old);
  int chld_changed = chld_old.sa_handler == SIG_IGN || (chld_old.sa_flags & SA_NOCLDWAIT);
  if (chld_changed) sigaction(SIGCHLD, &chld_dfl, NULL);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) {
    set_reason(res, "launcher: signalfd: %s", strerror(errno));
    rc = TY_EUNAVAILABLE;
  }
  for (int r = 0; r < L.world; r++) {
    L.ranks[r].fd[0] = L.ranks[r].fd[1] = -1;
    L.ranks[r].buf[0] = xmalloc(LAUNCH_LINE_MAX + 1);
    L.ranks[r].buf[1] = xmalloc(LAUNCH_LINE_MAX + 1);
  }
  for (int r = 0; r < L.world && rc == 0; r++) {
    char **env = build_env(o, res, attempt, rdv, r);
    int e = start_rank(&L, r, argv, env, fail_msg);
    rankenv_envp_free(env);
    if (e) {
      set_reason(res, "cannot start rank %d of %d: %s", r, L.world, strerror(e));
      rc = TY_EUNAVAILABLE;
      L.stopping = L.killed = 1;
      signal_all(&L, SIGKILL);
    }
  }
  if (L.live > 0) run_loop(&L, sfd);

  if (is_shm) comm_shm_remove(rdv);
  if (sfd >= 0) close(sfd);
  if (chld_changed) sigaction(SIGCHLD, &chld_old, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  for (int r = 0; r < L.world; r++) {
    free(L.ranks[r].buf[0]);
    free(L.ranks[r].buf[1]);
  }
  free(L.ranks);
  free(argv);
  if (rc) return rc;
  if (res->failed_rank >= 0) return TY_EABORTED;
  if (res->interrupted) return TY_ECANCELLED;
  return 0;
}
