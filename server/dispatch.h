/* dispatch.h - starting and stopping one rank process on this host: a
 * trainyard-worker in its own process group, with the worker contract's
 * environment (DESIGN.md "Worker contract"), its stdout and stderr copied to
 * a log file capped at a size. */
#ifndef TY_SERVER_DISPATCH_H
#define TY_SERVER_DISPATCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* What one rank is told (all borrowed). */
typedef struct {
  const char *worker;      /* program to run */
  const char *spec_path;   /* RANKENV_SPEC */
  const char *job_id;      /* RANKENV_JOB_ID */
  int attempt;             /* RANKENV_ATTEMPT, from 1 */
  int rank, world_size;    /* RANKENV_RANK, RANKENV_WORLD_SIZE */
  const char *rendezvous;  /* RANKENV_RENDEZVOUS */
  const char *report_url;  /* RANKENV_REPORT_URL */
  const char *token;       /* RANKENV_TOKEN */
  int gpu;                 /* the GPU it gets (CUDA_VISIBLE_DEVICES), or -1 */
  const char *log_path;    /* where its output goes */
  int64_t log_max;         /* bytes of output kept */
  /* Called by the pump thread with each complete output line that starts
   * with '{' (a report printed as a JSON line; see DESIGN.md "Worker
   * contract"), NUL-terminated, without its newline; may be NULL. Lines
   * over 64 KiB are not passed. line_ctx is freed with free() when the pump
   * ends. */
  void (*on_line)(void *ctx, const char *line);
  void *line_ctx;
  int64_t gpu_mem_limit_mib; /* with a GPU: the device memory it may allocate
                              * (RANKENV_CUDA_MEM_LIMIT_MIB); 0: no cap */
  int heartbeat_ms;          /* RANKENV_HEARTBEAT_MS: how often the rank repeats
                              * its last report while it computes */
} dispatch_spec_t;

/* A started rank. The pump thread copies the rank's output into its log
 * file until every writer of the pipe has exited. */
typedef struct {
  pid_t pid;               /* also the process group id */
  int64_t start_ticks;     /* /proc/<pid>/stat start time, clock ticks */
  pthread_t pump;
  bool pump_started;
} dispatch_rank_t;

/* Forks and execs the worker. 0, or a TY_E* code with msg saying why (the
 * program is missing, the log cannot be created, ...). spec->line_ctx is
 * taken over in every case. */
int dispatch_start(const dispatch_spec_t *spec, dispatch_rank_t *out, char *msg, size_t msgsz);
/* Joins the pump thread (after the rank exited). */
void dispatch_release(dispatch_rank_t *r);

/* Signals the rank's whole process group when pid still names the process
 * that started at start_ticks (a pid may be reused after a restart). */
int dispatch_signal(pid_t pid, int64_t start_ticks, int sig);
/* The start time of a process in clock ticks since boot, or -1 when it does
 * not exist. */
int64_t dispatch_start_ticks(pid_t pid);
/* True when pid still names the process that started at start_ticks and it
 * has not exited (a zombie counts as gone). */
bool dispatch_alive(pid_t pid, int64_t start_ticks);
/* Whether any process is left in the process group pgid. */
bool dispatch_group_alive(pid_t pgid);

#endif
