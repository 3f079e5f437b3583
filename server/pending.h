/* pending.h - no lost state change: the writes that record what happened to
 * a job (a state change, a rank started, a rank ended) go through here.
 * One that cannot be written (disk full, read-only, I/O error) is kept in
 * memory, with every later one behind it, and retried in order with
 * backoff (0.1 s doubling to 5 s) until written, so that a job's final state
 * lands once the database takes writes again. While anything is kept, the
 * HEALTH_DB_WRITE condition holds, naming the database's error.
 *
 * Lock order: the queue's lock, then the database's. on_written is called
 * under the queue's lock and must not call back in here. */
#ifndef TY_SERVER_PENDING_H
#define TY_SERVER_PENDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db/db.h"
#include "server/health.h"

typedef enum { PEND_TRANSITION, PEND_SPAWNED, PEND_FINISHED } pend_kind_t;

/* One write. Strings are borrowed by pend_write and pend_write_now (copied
 * when kept). */
typedef struct pend_op {
  pend_kind_t kind;
  char id[DB_ID_MAX];
  /* PEND_TRANSITION: db_job_transition(id, from_mask, to, text) */
  unsigned from_mask;
  int to;
  /* PEND_SPAWNED: db_rank_spawned(id, attempt, rank, pid, pid_start, text);
   * PEND_FINISHED: db_rank_finished(id, attempt, rank, state, exit_code, text) */
  int attempt, rank, pid, exit_code;
  int64_t pid_start;
  char state[16];
  const char *text; /* reason, log path or message */
  struct pend_op *next;
} pend_op_t;

typedef void (*pend_written_fn)(void *ctx, const pend_op_t *op);

typedef struct pend pend_t;

pend_t *pend_new(db_t *db, health_t *health, pend_written_fn on_written, void *ctx);
/* Frees what is still kept, saying in the log how many writes are lost (a
 * restart's recovery then reconciles those jobs). */
void pend_free(pend_t *p);

/* Writes op now if nothing is kept, else keeps it behind the rest. 0 when
 * written, 1 when kept (the database answered TY_EUNAVAILABLE: disk full,
 * read-only, I/O error, busy); any other failure (a refusal of the op
 * itself: TY_EPRECONDITION with the state found in *cur, TY_ENOTFOUND) is
 * returned as it is and nothing is kept. *cur and *attempt (optional, for transitions) are set only
 * when it was written now. */
int pend_write(pend_t *p, const pend_op_t *op, int *cur, int *attempt);
/* For writes a client waits on (and may repeat): retries what is kept, and
 * writes op only when nothing is left; otherwise, or when op's own write
 * fails, returns the error (TY_EUNAVAILABLE for one worth retrying) and
 * keeps nothing. */
int pend_write_now(pend_t *p, const pend_op_t *op, int *cur, int *attempt);
/* Retries the kept writes in order when their backoff is due (force: now).
 * Returns how many are still kept. */
size_t pend_retry(pend_t *p, bool force);
/* Whether a write of job id is kept. */
bool pend_has_job(pend_t *p, const char *id);

#endif
