/* pending.c - state changes kept until the database takes them; see
 * pending.h. */
#include "server/pending.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/xalloc.h"

#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 5.0

struct pend {
  db_t *db;
  health_t *health;
  pend_written_fn on_written;
  void *ctx;
  pthread_mutex_t lock;
  pend_op_t *head, **tail; /* kept writes, oldest first */
  size_t n;
  double backoff, retry_at; /* seconds; ty_mono_s() of the next retry */
};

pend_t *pend_new(db_t *db, health_t *health, pend_written_fn on_written, void *ctx) {
  pend_t *p = xcalloc(1, sizeof *p);
  p->db = db;
  p->health = health;
  p->on_written = on_written;
  p->ctx = ctx;
  p->tail = &p->head;
  p->backoff = BACKOFF_MIN_S;
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

static void op_free(pend_op_t *op) {
  free((char *)op->text);
  free(op);
}

void pend_free(pend_t *p) {
  if (!p) return;
  if (p->n)
    ty_error(
        "%zu state change%s could not be written before shutdown; the next start's "
        "recovery reconciles the jobs concerned",
        p->n, p->n == 1 ? "" : "s");
  while (p->head) {
    pend_op_t *op = p->head;
    p->head = op->next;
    op_free(op);
  }
  pthread_mutex_destroy(&p->lock);
  free(p);
}

/* Whether rc is the database failing for now (disk full, read-only, I/O
 * error, busy: worth a retry), not a refusal of the write itself or an
 * error that no retry mends (which would hold every later change back). */
static bool retryable(int rc) {
  return rc == TY_EUNAVAILABLE;
}

static int exec(pend_t *p, const pend_op_t *op, int *cur, int *attempt) {
  int rc;
  switch (op->kind) {
    case PEND_TRANSITION:
      rc = db_job_transition(p->db, op->id, op->from_mask, op->to, op->text, cur, attempt);
      break;
    case PEND_SPAWNED:
      rc = db_rank_spawned(p->db, op->id, op->attempt, op->rank, op->pid, op->pid_start, op->text);
      break;
    case PEND_FINISHED:
      rc = db_rank_finished(p->db, op->id, op->attempt, op->rank, op->state, op->exit_code,
                            op->text);
      break;
    default:
      rc = TY_EINTERNAL; /* cannot happen */
  }
  if (!rc && p->on_written) p->on_written(p->ctx, op);
  return rc;
}

static void keep(pend_t *p, const pend_op_t *op) {
  pend_op_t *k = xmalloc(sizeof *k);
  *k = *op;
  k->text = xstrdup(op->text ? op->text : "");
  k->next = NULL;
  *p->tail = k;
  p->tail = &k->next;
  if (p->n++ == 0) {
    p->backoff = BACKOFF_MIN_S;
    p->retry_at = ty_mono_s() + p->backoff;
    char err[512], cause[768];
    db_last_error(p->db, err, sizeof err);
    snprintf(cause, sizeof cause,
             "the database cannot be written (%s): state changes are kept in memory and "
             "retried until they are written",
             err);
    health_set(p->health, HEALTH_DB_WRITE, cause);
  }
}

/* Retries the kept writes in order, stopping at the first that fails
 * again (caller holds p->lock). */
static void drain(pend_t *p, bool force) {
  if (!p->n) return;
  double now = ty_mono_s();
  if (!force && now < p->retry_at) return;
  while (p->head) {
    pend_op_t *op = p->head;
    int rc = exec(p, op, NULL, NULL);
    if (retryable(rc)) {
      p->backoff = p->backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : p->backoff * 2;
      p->retry_at = now + p->backoff;
      return;
    }
    if (rc == TY_EPRECONDITION || rc == TY_ENOTFOUND)
      ty_info("job %s: a kept %s was no longer needed (%s)", op->id,
              op->kind == PEND_TRANSITION ? "state change" : "rank record", ty_err_name(rc));
    else if (rc)
      ty_error("job %s: a kept %s cannot be written (%s) and is dropped", op->id,
               op->kind == PEND_TRANSITION ? "state change" : "rank record", ty_err_name(rc));
    p->head = op->next;
    if (!p->head) p->tail = &p->head;
    p->n--;
    op_free(op);
  }
  p->backoff = BACKOFF_MIN_S;
  health_set(p->health, HEALTH_DB_WRITE, NULL);
}

int pend_write(pend_t *p, const pend_op_t *op, int *cur, int *attempt) {
  pthread_mutex_lock(&p->lock);
  drain(p, false);
  int rc = 1;
  if (!p->n) {
    rc = exec(p, op, cur, attempt);
    if (!retryable(rc)) {
      pthread_mutex_unlock(&p->lock);
      return rc;
    }
    rc = 1;
  }
  keep(p, op);
  pthread_mutex_unlock(&p->lock);
  return rc;
}

int pend_write_now(pend_t *p, const pend_op_t *op, int *cur, int *attempt) {
  pthread_mutex_lock(&p->lock);
  drain(p, true);
  int rc = p->n ? TY_EUNAVAILABLE : exec(p, op, cur, attempt);
  pthread_mutex_unlock(&p->lock);
  return rc;
}

size_t pend_retry(pend_t *p, bool force) {
  pthread_mutex_lock(&p->lock);
  drain(p, force);
  size_t n = p->n;
  pthread_mutex_unlock(&p->lock);
  return n;
}

bool pend_has_job(pend_t *p, const char *id) {
  pthread_mutex_lock(&p->lock);
  bool has = false;
  for (const pend_op_t *op = p->head; op && !has; op = op->next) has = !strcmp(op->id, id);
  pthread_mutex_unlock(&p->lock);
  return has;
}
