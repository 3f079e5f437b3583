/* rest_internal.h - what rest.c (routing, auth, limits, counters) shares
 * with the handler files rest_*.c. Not for use elsewhere. */
#ifndef TY_SERVER_REST_INTERNAL_H
#define TY_SERVER_REST_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/errors.h"
#include "server/config.h"
#include "server/rest.h"

#define REST_MAX_PARAMS 4

/* One request's state, from its first call to its completion callback. */
typedef struct {
  const struct route_s *route;
  char params[REST_MAX_PARAMS][128]; /* path captures, in pattern order */
  char *body;                        /* request body, NUL-terminated; owned */
  size_t body_len;
  bool body_too_big;
  int status;                        /* HTTP status sent (for /metrics) */
  void *ctx;                         /* a handler's state across calls (a suspended wait) */
  void (*ctx_free)(void *ctx);       /* frees ctx at completion; NULL: free() */
} rest_req_t;

typedef enum MHD_Result (*rest_handler_fn)(rest_t *r, struct MHD_Connection *c, rest_req_t *q);

typedef enum { AUTH_NONE, AUTH_API, AUTH_JOB } rest_auth_t;

typedef struct route_s {
  const char *method;
  const char *pattern; /* "{name}" captures one segment up to '/' or ':' */
  rest_handler_fn fn;
  int64_t body_limit;  /* bytes; -1: the server's max_body */
  rest_auth_t auth;    /* AUTH_JOB: the job's own token, checked by the handler */
} rest_route_t;

typedef struct sse sse_t; /* one event stream (rest_events.c) */
typedef struct rest_rdv rest_rdv_t; /* rendezvous keys and their waiting readers */

struct rest {
  svc_t *svc;
  const srv_config_t *cfg;
  struct MHD_Daemon *mhd;
  atomic_bool stopping;
  atomic_int connections;  /* open client connections */
  struct rdl *deadlines;   /* each request's deadline (rest_deadline.c) */
  /* Event streams with nothing to send, their connections suspended, and
   * the thread that resumes them (rest_events.c). */
  pthread_mutex_t sse_lock;
  pthread_cond_t sse_cond; /* signalled when the list stops being empty, and at quit */
  sse_t *sse_waiting;
  atomic_int sse_open;     /* streams not yet freed */
  bool sse_quit;
  pthread_t sse_waker;
  rest_rdv_t *rdv; /* rest_rendezvous.c */
};

/* Response helpers: each queues its response, records the status in q and
 * returns what MHD_queue_response returned. */
enum MHD_Result rest_send_json(struct MHD_Connection *c, rest_req_t *q, int status, json_t *body);
/* The error model: {"error": {code, message, details}}; status from code. */
enum MHD_Result rest_send_error(struct MHD_Connection *c, rest_req_t *q, int code,
                                const char *message, const ty_errlist_t *details);
enum MHD_Result rest_send_text(struct MHD_Connection *c, rest_req_t *q, int status,
                               const char *content_type, char *text /* freed */);
enum MHD_Result rest_queue(struct MHD_Connection *c, rest_req_t *q, int status,
                           struct MHD_Response *resp);

/* Handlers (rest_jobs.c, rest_events.c). */
enum MHD_Result rest_h_submit(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_validate(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_list(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_get(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_cancel(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_delete(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_ranks(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_metrics(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_log(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_report(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_events(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_rdv_put(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
enum MHD_Result rest_h_rdv_get(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
/* The rendezvous waker (rest_rendezvous.c): started with the daemon;
 * released (every waiting reader resumed, none waits again) before it
 * stops, joined after. */
int rest_rdv_start(rest_t *r);
void rest_rdv_release(rest_t *r);
void rest_rdv_join(rest_t *r);
enum MHD_Result rest_h_web(rest_t *r, struct MHD_Connection *c, rest_req_t *q); /* rest_web.c */

/* The event streams' waker: started before the daemon; released once
 * stopping is set and before the daemon stops: every waiting stream is
 * resumed to end cleanly (none suspends again), and the call returns when
 * all have ended or after timeout_s. Joined after the daemon stops. */
int rest_events_start(rest_t *r);
void rest_events_release(rest_t *r, double timeout_s);
void rest_events_join(rest_t *r);

/* Matches path against pattern, capturing each "{name}" (one segment: no
 * '/' or ':', 1..127 bytes) into params in order; on a match the slots
 * past the captures are empty strings. */
bool rest_route_match(const char *pattern, const char *path, char params[][128]);

/* The token of "Authorization: Bearer <token>", or NULL. */
const char *rest_bearer(struct MHD_Connection *c);
/* Parses an optional integer query argument; false (with an error in
 * errs) when present but not an integer in [min, max]. */
bool rest_query_int(struct MHD_Connection *c, const char *name, int64_t min, int64_t max,
                    int64_t *out, ty_errlist_t *errs);

#endif
