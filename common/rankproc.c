/* rankproc.c - starting, signalling and reaping a rank's process group;
 * see rankproc.h. */
#include "common/rankproc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errors.h"

/* In the child between fork and exec: async-signal-safe calls only. */
static _Noreturn void exec_rank(const rankproc_spec_t *s, pid_t parent) {
  setpgid(0, 0);
  if (s->die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127); /* the starter died before prctl */
  }
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull > 0) {
    dup2(devnull, 0);
    if (devnull > 2) close(devnull);
  }
  dup2(s->out_fd, 1);
  dup2(s->err_fd, 2);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(s->program, s->argv, s->envp);
  if (s->exec_fail) {
    ssize_t w = write(2, s->exec_fail, strlen(s->exec_fail));
    (void)w;
  }
  _exit(127);
}

int rankproc_spawn(const rankproc_spec_t *s, pid_t *pid, int64_t *start_ticks) {
  pid_t parent = getpid();
  pid_t p = fork();
  if (p < 0) return errno;
  if (p == 0) exec_rank(s, parent);
  /* Both sides set the group, so no signal can race the child's setpgid. */
  setpgid(p, p);
  *pid = p;
  *start_ticks = rankproc_start_ticks(p);
  return 0;
}

int64_t rankproc_start_ticks(pid_t pid) {
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
  if (sscanf(p + 2,
             "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %lld",
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

bool rankproc_alive(pid_t pid, int64_t start_ticks) {
  if (pid <= 0) return false;
  int64_t t = rankproc_start_ticks(pid);
  if (t < 0 || (start_ticks > 0 && t != start_ticks)) return false;
  char st = proc_state(pid);
  return st && st != 'Z' && st != 'X';
}

int rankproc_signal(pid_t pid, int64_t start_ticks, int sig) {
  if (pid <= 0) return TY_ENOTFOUND;
  /* The group leader may be gone while its children live on; only a
   * leader that is still there and is someone else stops us. */
  int64_t t = rankproc_start_ticks(pid);
  if (t >= 0 && start_ticks > 0 && t != start_ticks) return TY_ENOTFOUND;
  if (killpg(pid, sig) && errno == ESRCH) return TY_ENOTFOUND;
  return 0;
}

bool rankproc_group_alive(pid_t pgid) {
  return pgid > 0 && (killpg(pgid, 0) == 0 || errno == EPERM);
}

bool rankproc_reap(pid_t pid, int *status) {
  if (pid <= 0) return false;
  pid_t w = waitpid(pid, status, WNOHANG);
  if (w < 0 && errno == ECHILD) { /* reaped by someone else: status unknown */
    *status = W_EXITCODE(255, 0);
    return true;
  }
  return w == pid;
}

/* LLVM's OpenMP runtime registers each process in /dev/shm
 * (__KMP_REGISTERED_LIB_<pid>[_<uid>]) and removes it only at a clean exit:
 * a rank killed with -9 would leave it behind. */
static void remove_omp_registration(pid_t pid) {
  char name[96];
  snprintf(name, sizeof name, "/__KMP_REGISTERED_LIB_%d_%d", (int)pid, (int)getuid());
  shm_unlink(name);
  snprintf(name, sizeof name, "/__KMP_REGISTERED_LIB_%d", (int)pid);
  shm_unlink(name);
}

void rankproc_clear_group(pid_t pgid) {
  if (pgid <= 0) return;
  if (rankproc_group_alive(pgid)) killpg(pgid, SIGKILL);
  remove_omp_registration(pgid);
}
