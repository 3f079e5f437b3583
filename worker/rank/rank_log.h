/* rank_log.h - a rank that writes its own log: where no launcher of ours
 * reads its output (ranks srun started under trainyardd --dispatcher
 * slurm, whose output file Slurm would let grow without bound), the rank
 * sends its stdout and stderr through a pipe to a process of its own that
 * appends them to <RANKENV_LOG_DIR>/rank-<rank>.log, keeping the first
 * RANKENV_LOG_MAX bytes (common/logpump.h: then a note, the rest dropped),
 * as trainyardd's local dispatcher does for the ranks it starts. That
 * process (named trainyard-log in ps) ignores SIGTERM, SIGINT and SIGHUP
 * and ends when the rank's last copy of the pipe closes, so a rank that
 * crashes still leaves every line it wrote. */
#ifndef TY_WORKER_RANK_LOG_H
#define TY_WORKER_RANK_LOG_H

#include <stddef.h>

/* With RANKENV_LOG_DIR set: starts the log process for rank and points
 * this process's stdout and stderr at it. Unset: nothing. 0, or TY_EINVAL
 * (RANKENV_LOG_MAX out of range) / TY_EUNAVAILABLE (the log cannot be
 * opened, no pipe or process) with the reason in err, the output left as
 * it was. */
int rank_log_start(int rank, char *err, size_t errlen);

#endif
