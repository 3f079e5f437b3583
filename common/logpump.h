/* logpump.h - a rank's output copied into its log file with a cap on the
 * bytes kept: trainyardd's local dispatcher runs it on a thread for each
 * rank it starts (server/dispatch.c), a rank that srun started runs it in
 * a process of its own (worker/rank/rank_log.h). */
#ifndef TY_COMMON_LOGPUMP_H
#define TY_COMMON_LOGPUMP_H

#include <stddef.h>
#include <stdint.h>

/* Called with each chunk read, before it is written (or dropped). */
typedef void (*ty_logpump_fn)(void *ctx, const char *buf, size_t n);

/* Copies in_fd into out_fd until in_fd's end: the first max bytes, then
 * once a note "[<who>: log capped at <max> bytes; later output dropped]",
 * then reads on, dropping the rest, so that the writer never blocks on a
 * full pipe. each (may be NULL) sees every chunk. Closes neither fd. */
void ty_logpump(int in_fd, int out_fd, int64_t max, const char *who, ty_logpump_fn each, void *ctx);

#endif
