/* rankproc.h - a rank's process on this host (DESIGN.md "Worker
 * contract"): started in a process group of its own, signalled as a group,
 * reaped, and its group cleared once it has ended. The local launcher
 * (worker/rank/launch.c) and trainyardd's local dispatcher (server/dispatch.c)
 * both start and stop ranks through it. */
#ifndef TY_COMMON_RANKPROC_H
#define TY_COMMON_RANKPROC_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* How to start one rank (all borrowed; everything is prepared before the
 * fork, since the child makes only async-signal-safe calls). */
typedef struct {
  const char *program;   /* path of the trainyard-worker binary */
  char *const *argv;     /* NULL-terminated, argv[0] included */
  char *const *envp;     /* NULL-terminated (common/rankenv.h's rankenv_envp) */
  int out_fd, err_fd;    /* become the rank's stdout and stderr */
  bool die_with_parent;  /* PR_SET_PDEATHSIG: SIGKILL when the starter dies */
  const char *exec_fail; /* written to err_fd when exec fails (exit 127) */
} rankproc_spec_t;

/* Forks and execs the rank in a new process group (its pid is the group's
 * id), stdin on /dev/null and every signal at its default, unblocked.
 * 0 with *pid and *start_ticks (rankproc_start_ticks) set, or an errno
 * value from fork. */
int rankproc_spawn(const rankproc_spec_t *spec, pid_t *pid, int64_t *start_ticks);

/* The exit status of a rank that stopped on SIGTERM at a step boundary
 * after writing a checkpoint with the others, or before its first step
 * (while it loaded: nothing newer than the last checkpoint to keep;
 * worker/rank/preempt.h):
 * trainyardd resubmits its attempt without counting it against
 * max_restarts (EX_TEMPFAIL). */
#define RANKPROC_EXIT_PREEMPTED 75

/* Signals the rank's whole process group when pid still names the process
 * that started at start_ticks (a pid may be reused after a restart; <= 0:
 * not checked). 0, or TY_ENOTFOUND when there is no such group. */
int rankproc_signal(pid_t pid, int64_t start_ticks, int sig);
/* The start time of a process in clock ticks since boot, or -1 when it does
 * not exist. */
int64_t rankproc_start_ticks(pid_t pid);
/* True when pid still names the process that started at start_ticks and it
 * has not exited (a zombie counts as gone). */
bool rankproc_alive(pid_t pid, int64_t start_ticks);
/* Whether any process is left in the process group pgid. */
bool rankproc_group_alive(pid_t pgid);

/* Reaps the rank pid without blocking: true when it has ended, with its
 * wait status in *status (exit 255 when another waiter took it). */
bool rankproc_reap(pid_t pid, int *status);
/* After the rank pgid ended: kills whatever it left in its process group
 * and removes what its runtime leaves behind for a killed process (LLVM
 * OpenMP's /dev/shm registration). */
void rankproc_clear_group(pid_t pgid);

#endif
