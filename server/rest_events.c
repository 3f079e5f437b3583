/* rest_events.c - GET /v1/jobs/{id}/events as Server-Sent Events. Every
 * event carries its sequence number as the SSE id; a client reconnecting
 * with Last-Event-ID (or ?after=N) resumes right after it and misses
 * nothing. The stream ends after the job's final state change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xalloc.h"
#include "server/rest_internal.h"
#include "server/service.h"

#define BATCH 256          /* events read per query */
#define WAIT_SLICE_S 1.0   /* how often a waiting stream checks for shutdown */
#define KEEPALIVE_S 15.0   /* comment line sent on a quiet stream */

typedef struct {
  rest_t *rest;
  char id[DB_ID_MAX];
  int64_t last_seq;        /* last event sent */
  char *pending;           /* formatted, not yet handed to MHD; owned */
  size_t pending_len, pending_off;
  bool done;               /* the final event is in pending: end after it */
} sse_t;

/* Formats events (a JSON array) as SSE frames appended to pending. */
static void format_events(sse_t *s, json_t *events) {
  size_t i;
  json_t *ev;
  json_array_foreach(events, i, ev) {
    char *data = json_dumps(ev, JSON_COMPACT);
    const char *type = json_string_value(json_object_get(ev, "type"));
    long long seq = (long long)json_integer_value(json_object_get(ev, "seq"));
    size_t need = strlen(data) + 128;
    s->pending = xrealloc(s->pending, s->pending_len + need);
    s->pending_len += (size_t)snprintf(s->pending + s->pending_len, need,
                                       "id: %lld\nevent: %s\ndata: %s\n\n", seq,
                                       type ? type : "message", data);
    free(data);
  }
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  sse_t *s = cls;
  double waited = 0;
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
    svc_wait_events(svc, gen, WAIT_SLICE_S);
    waited += WAIT_SLICE_S;
    if (waited >= KEEPALIVE_S) {
      s->pending = xstrdup(": keepalive\n\n");
      s->pending_len = strlen(s->pending);
      waited = 0;
    }
  }
  size_t n = s->pending_len - s->pending_off;
  if (n > max) n = max;
  memcpy(buf, s->pending + s->pending_off, n);
  s->pending_off += n;
  return (ssize_t)n;
}

static void sse_free(void *cls) {
  sse_t *s = cls;
  free(s->pending);
  free(s);
}

enum MHD_Result rest_h_events(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int64_t after = 0;
  const char *last_id = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
  if (last_id && *last_id) {
    char *end;
    long long v = strtoll(last_id, &end, 10);
    if (*end || v < 0)
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
  snprintf(s->id, sizeof s->id, "%s", job->id);
  s->last_seq = after;
  db_job_free(job);
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, s, sse_free);
  MHD_add_response_header(resp, "Content-Type", "text/event-stream");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  return rest_queue(c, q, 200, resp);
}
