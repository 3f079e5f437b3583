/* rank_log.c - a rank's own capped log; see rank_log.h. */
#include "worker/rank/rank_log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/logpump.h"
#include "common/rankenv.h"

int rank_log_start(int rank, char *err, size_t errlen) {
  const char *dir = rankenv_str(RANKENV_LOG_DIR);
  if (!dir) return 0;
  long max = 0;
  int rc = rankenv_long(RANKENV_LOG_MAX, &max, err, errlen);
  if (rc) return rc;
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/rank-%d.log", dir, rank) >= (int)sizeof path)
    return ty_errf(err, errlen, TY_EINVAL, "%s is too long a folder for the rank's log",
                   rankenv_name(RANKENV_LOG_DIR));
  /* Appended: Slurm may have written into it before this process ran. */
  int logfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logfd < 0)
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot open the rank's log %s: %s", path,
                   strerror(errno));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) {
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "no pipe for the rank's log: %s", strerror(errno));
    close(logfd);
    return rc;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    rc =
        ty_errf(err, errlen, TY_EUNAVAILABLE, "no process for the rank's log: %s", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    close(logfd);
    return rc;
  }
  if (pid == 0) {
    /* The log's process: a stop request is for the rank, which says what
     * it does before it ends; this one drains the pipe to its end. */
    prctl(PR_SET_NAME, "trainyard-log"); /* so ps and top tell it from the rank */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    close(fds[1]);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
    }
    ty_logpump(fds[0], logfd, max, "trainyard-worker", NULL, NULL);
    _exit(0);
  }
  close(fds[0]);
  close(logfd);
  if (dup2(fds[1], STDOUT_FILENO) < 0 || dup2(fds[1], STDERR_FILENO) < 0) {
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot point the output at the rank's log: %s",
                 strerror(errno));
    close(fds[1]);
    return rc;
  }
  close(fds[1]);
  /* Lines reach the log as they are written, as on a terminal. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  return 0;
}
