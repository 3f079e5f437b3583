/* launch.h - the local launcher: runs one job's ranks as trainyard-worker
 * processes on this host, in the foreground (`trainyard train`, `trainyard
 * load`).
 *
 * launch_run() starts world_size processes of `worker`, each in its own
 * process group and with the environment of DESIGN.md's "Worker contract"
 * (RANKENV_SPEC, _MODE, _JOB_ID, _ATTEMPT, _RANK, _WORLD_SIZE,
 * _RENDEZVOUS, _REPORT_URL, _TOKEN; the caller's other variables are
 * inherited), hands every line the ranks write on stdout (JSON reports) and
 * stderr (logs) to a callback, and returns when every rank is gone:
 *   - a rank exiting non-zero (or killed) fails the job: the others get
 *     SIGTERM, then SIGKILL after grace_ms (so all are gone within ~5 s);
 *   - so does a rank making no progress for progress_timeout_ms: progress
 *     is its start, and each stdout report whose phase, step or
 *     bytes_loaded differ from its previous one (heartbeats repeating them
 *     do not count); the stuck rank is killed at once;
 *   - SIGINT, SIGTERM or SIGHUP to the launcher is forwarded to every rank
 *     (SIGHUP as SIGTERM), then SIGKILL after grace_ms; a second one kills
 *     at once;
 *   - ranks die with the launcher (PR_SET_PDEATHSIG), even on kill -9;
 *   - every rank's process group is killed once the rank has exited, so no
 *     subprocess it started outlives it; every process is reaped;
 *   - the job's shm segment is removed whatever happened, and so is the
 *     /dev/shm registration LLVM's OpenMP runtime leaves for a killed rank.
 * The reason of a failure is the rank's last `failed` report message, else
 * its exit status or signal and its last stderr line.
 *
 * While it runs, launch_run blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP in
 * the calling thread (and reads them through a signalfd), restoring the
 * mask before it returns: call it from a program's only thread, or block
 * those signals in every other thread. It reaps only its own children. */
#ifndef TY_WORKER_LAUNCH_H
#define TY_WORKER_LAUNCH_H

#include <stddef.h>

typedef enum { LAUNCH_STDOUT = 1, LAUNCH_STDERR = 2 } launch_stream_t;

/* Longest line handed over whole; longer ones arrive in pieces this long. */
#define LAUNCH_LINE_MAX 65536

/* One line from `rank`, without its newline (borrowed: copy it to keep). */
typedef void (*launch_line_fn)(void *ctx, int rank, launch_stream_t stream, const char *line);

typedef struct {
  const char *worker;      /* path of the trainyard-worker binary (required) */
  const char *const *args; /* arguments after argv[0], NULL-terminated; NULL: none */
  int world_size;          /* ranks, >= 1 */
  const char *spec_path;   /* RANKENV_SPEC; NULL: not set */
  const char *mode;        /* RANKENV_MODE ("train", "load"); NULL: not set */
  const char *job_id;      /* RANKENV_JOB_ID; NULL: made up, "local-<pid>-<ms>" */
  int attempt;             /* RANKENV_ATTEMPT; 0 means 1 */
  const char *rendezvous;  /* NULL: "self" for one rank, else "shm:<job_id>-<attempt>" */
  const char *report_url;  /* RANKENV_REPORT_URL; NULL: reports on stdout */
  const char *token;       /* RANKENV_TOKEN; NULL: not set */
  const char *read_roots;  /* RANKENV_READ_ROOTS, RANKENV_WRITE_ROOTS: the folders the */
  const char *write_roots; /* ranks open files in (common/beneath.h); both NULL: anywhere */
  const char *const *env;  /* more "NAME=value" for every rank, NULL-terminated; NULL: none */
  int grace_ms;            /* SIGTERM to SIGKILL; 0: 2000 */
  int progress_timeout_ms; /* fail a rank whose reports show no progress this long; 0: never */
  launch_line_fn on_line;  /* NULL: "[rank R] line" to this process's stdout/stderr */
  void *ctx;               /* passed to on_line */
} launch_opts_t;

typedef struct {
  int failed_rank;  /* the rank that failed the job, or -1 */
  int exit_code;    /* its exit status, or -1 when a signal ended it */
  int term_signal;  /* the signal that ended it, or 0 */
  int interrupted;  /* the signal (SIGINT, SIGTERM, SIGHUP) that stopped the job, or 0 */
  char reason[512]; /* why the job failed or stopped; "" on success */
  char job_id[128]; /* the job id the ranks got */
} launch_result_t;

/* Runs the job's ranks to the end; see above. Returns 0 when every rank
 * exited 0; TY_EABORTED when a rank failed (res says which and why);
 * TY_ECANCELLED when a signal stopped the job; TY_EINVAL for bad options
 * (res->reason says which); TY_EUNAVAILABLE when the ranks could not be
 * started. res is always filled. */
int launch_run(const launch_opts_t *opts, launch_result_t *res);

#endif
