/* rest_rendezvous.c - PUT and GET /v1/jobs/{id}/attempts/{n}/rendezvous/
 * {key}: one rank (rank 0) publishes a value, the others read it, all
 * under the job's own token and confined to its current attempt
 * (server/rendezvous.h holds the values). A GET of a key not yet
 * published waits up to ?timeout_s seconds (default 30, at most 60) for
 * it: its connection is suspended, never a REST thread blocked, and one
 * waker thread resumes it when the key is published, when its time is up,
 * and at shutdown; a wait that ends without the key answers 404. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/xalloc.h"
#include "server/rendezvous.h"
#include "server/rest_internal.h"
#include "server/service.h"

#define WAIT_DEFAULT_S 30
#define WAIT_MAX_S 60

/* One suspended GET. */
typedef struct waiter {
  struct rest_rdv *rdv;
  struct MHD_Connection *conn;
  char job[128], key[RDV_KEY_MAX + 1];
  int attempt;
  double deadline; /* monotonic seconds */
  bool waiting;    /* in the list (suspended) */
  struct waiter *next;
} waiter_t;

struct rest_rdv {
  rdv_store_t *store;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  waiter_t *waiting;
  int open; /* readers whose request has not completed */
  bool quit;
  pthread_t thread;
};

/* The request of a reader has completed (its answer sent, or the
 * connection closed). */
static void waiter_free(void *p) {
  waiter_t *w = p;
  pthread_mutex_lock(&w->rdv->lock);
  w->rdv->open--;
  pthread_mutex_unlock(&w->rdv->lock);
  free(w);
}

/* Resumes w (under the lock): it leaves the list, and MHD calls its
 * handler again. */
static void resume(rest_rdv_t *v, waiter_t **link) {
  waiter_t *w = *link;
  *link = w->next;
  w->next = NULL;
  w->waiting = false;
  MHD_resume_connection(w->conn);
  (void)v;
}

static void *waker_main(void *arg) {
  rest_rdv_t *v = arg;
  pthread_mutex_lock(&v->lock);
  while (!v->quit) {
    double now = ty_mono_s(), next = now + 3600;
    for (waiter_t **pp = &v->waiting; *pp;) {
      if ((*pp)->deadline <= now) {
        resume(v, pp);
        continue;
      }
      if ((*pp)->deadline < next) next = (*pp)->deadline;
      pp = &(*pp)->next;
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    double wait = next - now;
    until.tv_sec += (time_t)wait;
    until.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&v->cond, &v->lock, &until);
  }
  pthread_mutex_unlock(&v->lock);
  return NULL;
}

int rest_rdv_start(rest_t *r) {
  rest_rdv_t *v = xcalloc(1, sizeof *v);
  v->store = rdv_store_new();
  pthread_mutex_init(&v->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&v->cond, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&v->thread, NULL, waker_main, v)) {
    rdv_store_free(v->store);
    free(v);
    return -1;
  }
  r->rdv = v;
  return 0;
}

void rest_rdv_release(rest_t *r) {
  rest_rdv_t *v = r->rdv;
  if (!v) return;
  pthread_mutex_lock(&v->lock);
  while (v->waiting) resume(v, &v->waiting); /* stopping is set: none waits again */
  v->quit = true;
  pthread_cond_signal(&v->cond);
  pthread_mutex_unlock(&v->lock);
  /* Each resumed reader is answered (404) and its answer sent before the
   * daemon stops, so that it sees an answer rather than a closed
   * connection. */
  for (double until = ty_mono_s() + 2;; nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL)) {
    pthread_mutex_lock(&v->lock);
    int left = v->open;
    pthread_mutex_unlock(&v->lock);
    if (!left || ty_mono_s() > until) break;
  }
}

void rest_rdv_join(rest_t *r) {
  rest_rdv_t *v = r->rdv;
  if (!v) return;
  pthread_join(v->thread, NULL);
  pthread_cond_destroy(&v->cond);
  pthread_mutex_destroy(&v->lock);
  rdv_store_free(v->store);
  free(v);
  r->rdv = NULL;
}

/* The request's attempt number, or an error answer sent (false). */
static bool parse_attempt(struct MHD_Connection *c, rest_req_t *q, int *attempt,
                          enum MHD_Result *ret) {
  char *end;
  errno = 0;
  long n = strtol(q->params[1], &end, 10);
  if (*end || end == q->params[1] || errno || n < 1 || n > (1L << 30)) {
    ty_errlist_t errs = TY_ERRLIST_INIT;
    ty_errlist_add(&errs, "attempt", "must be an attempt number (1, 2, ...), got '%s'",
                   q->params[1]);
    *ret = rest_send_error(c, q, TY_EINVAL, "invalid rendezvous request", &errs);
    ty_errlist_clear(&errs);
    return false;
  }
  *attempt = (int)n;
  return true;
}

/* The checks both methods share: attempt, token and confinement, key. */
static bool check(rest_t *r, struct MHD_Connection *c, rest_req_t *q, int *attempt,
                  enum MHD_Result *ret) {
  if (!parse_attempt(c, q, attempt, ret)) return false;
  char msg[512];
  int rc = svc_rendezvous_check(r->svc, q->params[0], rest_bearer(c), *attempt, msg, sizeof msg);
  if (rc == TY_EPRECONDITION) rdv_forget(r->rdv->store, q->params[0]);
  if (!rc && !rdv_key_ok(q->params[2], msg, sizeof msg)) rc = TY_EINVAL;
  if (rc) {
    *ret = rest_send_error(c, q, rc, msg, NULL);
    return false;
  }
  return true;
}

enum MHD_Result rest_h_rdv_put(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  int attempt;
  enum MHD_Result ret;
  if (!check(r, c, q, &attempt, &ret)) return ret;
  char msg[512];
  rest_rdv_t *v = r->rdv;
  int rc = rdv_put(v->store, q->params[0], attempt, q->params[2], q->body ? q->body : "",
                   q->body_len, msg, sizeof msg);
  if (rc) return rest_send_error(c, q, rc, msg, NULL);
  /* The readers waiting for this key go on at once. */
  pthread_mutex_lock(&v->lock);
  for (waiter_t **pp = &v->waiting; *pp;) {
    waiter_t *w = *pp;
    if (w->attempt == attempt && !strcmp(w->job, q->params[0]) && !strcmp(w->key, q->params[2]))
      resume(v, pp);
    else
      pp = &w->next;
  }
  pthread_mutex_unlock(&v->lock);
  struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
  return rest_queue(c, q, MHD_HTTP_NO_CONTENT, resp);
}

enum MHD_Result rest_h_rdv_get(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  rest_rdv_t *v = r->rdv;
  waiter_t *w = q->ctx;
  int attempt;
  enum MHD_Result ret;
  if (!check(r, c, q, &attempt, &ret)) return ret;
  if (!w) { /* the first call: how long it may wait */
    ty_errlist_t errs = TY_ERRLIST_INIT;
    int64_t timeout = WAIT_DEFAULT_S;
    if (!rest_query_int(c, "timeout_s", 0, WAIT_MAX_S, &timeout, &errs)) {
      ret = rest_send_error(c, q, TY_EINVAL, "invalid rendezvous request", &errs);
      ty_errlist_clear(&errs);
      return ret;
    }
    w = xcalloc(1, sizeof *w);
    w->rdv = v;
    w->conn = c;
    pthread_mutex_lock(&v->lock);
    v->open++;
    pthread_mutex_unlock(&v->lock);
    q->ctx_free = waiter_free;
    snprintf(w->job, sizeof w->job, "%s", q->params[0]);
    snprintf(w->key, sizeof w->key, "%.64s", q->params[2]);
    w->attempt = attempt;
    w->deadline = ty_mono_s() + (double)timeout;
    q->ctx = w; /* freed with the request */
  }
  void *value;
  size_t len;
  if (rdv_get(v->store, q->params[0], attempt, q->params[2], &value, &len)) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, value, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    return rest_queue(c, q, 200, resp);
  }
  pthread_mutex_lock(&v->lock);
  /* Not published: wait, unless the time is up or the server stops. A put
   * takes the same lock before it looks for waiters, so none is missed. */
  if (!v->quit && !atomic_load(&r->stopping) && ty_mono_s() < w->deadline) {
    bool again = rdv_get(v->store, q->params[0], attempt, q->params[2], &value, &len);
    if (again) {
      pthread_mutex_unlock(&v->lock);
      struct MHD_Response *resp =
          MHD_create_response_from_buffer(len, value, MHD_RESPMEM_MUST_FREE);
      MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
      return rest_queue(c, q, 200, resp);
    }
    w->waiting = true;
    w->next = v->waiting;
    v->waiting = w;
    MHD_suspend_connection(c);
    pthread_cond_signal(&v->cond); /* its deadline may be the nearest */
    pthread_mutex_unlock(&v->lock);
    return MHD_YES; /* MHD calls again once resumed */
  }
  pthread_mutex_unlock(&v->lock);
  char msg[512];
  snprintf(msg, sizeof msg,
           "rendezvous key %s of attempt %d of job %s was not published within the wait; ask "
           "again",
           q->params[2], attempt, q->params[0]);
  return rest_send_error(c, q, TY_ENOTFOUND, msg, NULL);
}
