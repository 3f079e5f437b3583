/* rest_events.c - GET /v1/jobs/{id}/events as Server-Sent Events. Every
 * event carries its sequence number as the SSE id; a client reconnecting
 * with Last-Event-ID (or ?after=N) resumes right after it and misses
 * nothing. The stream ends after the job's final state change.
 *
 * REST runs on a small pool of epoll threads, so a stream must never block
 * one: a stream with nothing to send suspends its connection and joins the
 * waiting list; one waker thread resumes the waiting streams when the
 * service's event generation moves, when a stream is due a keepalive
 * (--sse_keepalive seconds without a write), and at shutdown. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/json_util.h"
#include "common/xalloc.h"
#include "server/rest_internal.h"
#include "server/service.h"

#define BATCH 256        /* events read per query */
#define WAKE_SLICE_S 1.0 /* longest wait before the waker looks at the keepalive clocks */

struct sse {
  rest_t *rest;
  struct MHD_Connection *conn;
  char id[DB_ID_MAX];
  int64_t last_seq; /* last event sent */
  char *pending;    /* formatted, not yet handed to MHD; owned */
  size_t pending_len, pending_off;
  bool done;         /* the final event is in pending: end after it */
  uint64_t seen_gen; /* event generation of the last empty query */
  double last_write; /* monotonic seconds of the last bytes handed to MHD */
  sse_t *next;       /* in the waiting list while suspended */
};

/* Formats events (a JSON array) as SSE frames appended to pending. */
static void format_events(sse_t *s, json_t *events) {
  size_t i;
  json_t *ev;
  json_array_foreach(events, i, ev) {
    char *data = ty_json_dumps(ev, JSON_COMPACT);
    const char *type = json_string_value(json_object_get(ev, "type"));
    long long seq = (long long)json_integer_value(json_object_get(ev, "seq"));
    size_t need = strlen(data) + 128;
    s->pending = xrealloc(s->pending, s->pending_len + need);
    s->pending_len +=
        (size_t)snprintf(s->pending + s->pending_len, need, "id: %lld\nevent: %s\ndata: %s\n\n",
                         seq, type ? type : "message", data);
    free(data);
  }
}

/* Whether s has written nothing for --sse_keepalive seconds by time now. */
static bool keepalive_due(const sse_t *s, double now) {
  return now - s->last_write >= s->rest->cfg->sse_keepalive;
}

/* Suspends s's connection unless the generation moved past gen or the
 * server is stopping (then false: look again). Under the waiting lock, so
 * the waker cannot miss it. */
static bool suspend(sse_t *s, uint64_t gen) {
  rest_t *r = s->rest;
  pthread_mutex_lock(&r->sse_lock);
  bool ok = !atomic_load(&r->stopping) && svc_event_generation(r->svc) == gen;
  if (ok) {
    s->seen_gen = gen;
    if (!r->sse_waiting) pthread_cond_signal(&r->sse_cond); /* the waker sleeps on an empty list */
    s->next = r->sse_waiting;
    r->sse_waiting = s;
    MHD_suspend_connection(s->conn);
  }
  pthread_mutex_unlock(&r->sse_lock);
  return ok;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  sse_t *s = cls;
  while (s->pending_off == s->pending_len) {
    free(s->pending);
    s->pending = NULL;
    s->pending_len = s->pending_off = 0;
    if (s->done || atomic_load(&s->rest->stopping)) return MHD_CONTENT_READER_END_OF_STREAM;
    svc_t *svc = s->rest->svc;
    uint64_t gen = svc_event_generation(svc);
    json_t *events = NULL;
    bool final = false;
    int64_t last = s->last_seq;
    if (svc_events(svc, s->id, s->last_seq, BATCH, &events, &last, &final, NULL, 0))
      return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = json_array_size(events);
    format_events(s, events);
    json_decref(events);
    s->last_seq = last;
    /* final was read before the events: when it is set and this batch was
     * not full, every event of the job has been sent. */
    if (final && n < BATCH) s->done = true;
    if (n || s->done) continue;
    if (keepalive_due(s, ty_mono_s())) {
      s->pending = xstrdup(": keepalive\n\n");
      s->pending_len = strlen(s->pending);
      continue;
    }
    if (suspend(s, gen)) return 0; /* MHD calls again once resumed */
  }
  size_t n = s->pending_len - s->pending_off;
  if (n > max) n = max;
  memcpy(buf, s->pending + s->pending_off, n);
  s->pending_off += n;
  s->last_write = ty_mono_s();
  return (ssize_t)n;
}

static void sse_free(void *cls) {
  sse_t *s = cls;
  atomic_fetch_sub(&s->rest->sse_open, 1);
  free(s->pending);
  free(s);
}

/* Resumes the waiting streams that have something to do: all of them when
 * all is set. Called with sse_lock held. */
static void wake(rest_t *r, uint64_t gen, bool all) {
  double t = ty_mono_s();
  sse_t **link = &r->sse_waiting;
  while (*link) {
    sse_t *s = *link;
    if (all || s->seen_gen != gen || keepalive_due(s, t)) {
      *link = s->next;
      s->next = NULL;
      MHD_resume_connection(s->conn);
    } else {
      link = &s->next;
    }
  }
}

/* While no stream waits, the waker sleeps on sse_cond rather than on the
 * service's events, so that progress reports (an event each) cost it
 * nothing. */
static void *waker_main(void *arg) {
  rest_t *r = arg;
  double slice = r->cfg->sse_keepalive / 2;
  if (slice > WAKE_SLICE_S) slice = WAKE_SLICE_S;
  for (;;) {
    pthread_mutex_lock(&r->sse_lock);
    while (!r->sse_waiting && !r->sse_quit) pthread_cond_wait(&r->sse_cond, &r->sse_lock);
    pthread_mutex_unlock(&r->sse_lock);
    /* A stream joins the list with the generation it saw: the first pass
     * below resumes it at once if that has moved. */
    uint64_t gen = svc_event_generation(r->svc);
    for (;;) {
      pthread_mutex_lock(&r->sse_lock);
      bool quit = r->sse_quit, idle = !r->sse_waiting;
      if (!quit) wake(r, gen, false);
      pthread_mutex_unlock(&r->sse_lock);
      if (quit) return NULL;
      if (idle) break;
      gen = svc_wait_events(r->svc, gen, slice);
    }
  }
}

int rest_events_start(rest_t *r) {
  pthread_mutex_init(&r->sse_lock, NULL);
  pthread_cond_init(&r->sse_cond, NULL);
  return pthread_create(&r->sse_waker, NULL, waker_main, r);
}

void rest_events_release(rest_t *r, double timeout_s) {
  pthread_mutex_lock(&r->sse_lock);
  wake(r, 0, true); /* stopping is set: none suspends again */
  r->sse_quit = true;
  pthread_cond_signal(&r->sse_cond);
  pthread_mutex_unlock(&r->sse_lock);
  /* Each resumed stream sends its last bytes and the end of its chunked
   * body, so a client sees the stream end rather than break. */
  for (double until = ty_mono_s() + timeout_s;
       atomic_load(&r->sse_open) > 0 && ty_mono_s() < until;)
    nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
}

void rest_events_join(rest_t *r) {
  pthread_join(r->sse_waker, NULL);
  pthread_cond_destroy(&r->sse_cond);
  pthread_mutex_destroy(&r->sse_lock);
}

enum MHD_Result rest_h_events(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int64_t after = 0;
  const char *last_id = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
  if (last_id && *last_id) {
    char *end;
    errno = 0;
    long long v = strtoll(last_id, &end, 10);
    if (*end || v < 0 || errno == ERANGE || end == last_id)
      ty_errlist_add(&errs, "Last-Event-ID", "must be an event id sent by this server, got '%s'",
                     last_id);
    else
      after = v;
  } else {
    rest_query_int(c, "after", 0, INT64_MAX, &after, &errs);
  }
  if (errs.len) {
    enum MHD_Result ret = rest_send_error(c, q, TY_EINVAL, "invalid event stream request", &errs);
    ty_errlist_clear(&errs);
    return ret;
  }
  db_job_t *job;
  char msg[256] = "";
  int rc = svc_get(r->svc, q->params[0], &job, msg, sizeof msg);
  if (rc) return rest_send_error(c, q, rc, msg, NULL);
  sse_t *s = xcalloc(1, sizeof *s);
  s->rest = r;
  s->conn = c;
  snprintf(s->id, sizeof s->id, "%s", job->id);
  s->last_seq = after;
  s->last_write = ty_mono_s();
  atomic_fetch_add(&r->sse_open, 1);
  db_job_free(job);
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, s, sse_free);
  MHD_add_response_header(resp, "Content-Type", "text/event-stream");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  return rest_queue(c, q, 200, resp);
}
