/* grpc.c - the gRPC core of trainyardd: one thread owns a completion queue
 * and every call's state, answers unary calls through the method table of
 * server/grpc_service.c, and feeds WatchJob streams when the service's event
 * generation moves.
 *
 * Each call is a gcall_t with one tag per kind of batch (request arrived,
 * client closed, message written, status sent) and a count of batches in
 * flight; it is freed when that count reaches zero. A RECV_CLOSE_ON_SERVER
 * batch is started on every call as soon as it arrives: it completes when
 * the client goes away (cancel, deadline, broken connection) or the call
 * ends, which is how a stream learns to free its state. Only this thread
 * touches a gcall_t, so none of it is locked. */
#include "server/grpc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/log.h"
#include "common/xalloc.h"
#include "server/grpc_internal.h"
#include "server/grpc_wire.h"
#include "server/token.h"

/* Requests kept posted per method, so that a burst of calls does not wait
 * for this thread to re-arm one at a time. */
#define GSRV_POSTED 8
/* Open WatchJob streams at most; more get RESOURCE_EXHAUSTED. */
#define GSRV_MAX_STREAMS 4096
/* How often (ms) the thread looks at the event generation when idle. */
#define GSRV_TICK_MS 10
/* Seconds unary calls get to finish at shutdown before being cancelled. */
#define GSRV_GRACE_S 2

typedef enum { TAG_NEW, TAG_CLOSE, TAG_WRITE, TAG_STATUS, TAG_SHUTDOWN } gtag_kind_t;

typedef struct gcall gcall_t;
typedef struct {
  gcall_t *c; /* NULL for the server's shutdown tag */
  gtag_kind_t kind;
} gtag_t;

struct gcall {
  gsrv_t *g;
  int method; /* index in gsvc_methods; -1 for an unregistered path */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_call_details details; /* only for unregistered paths */
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  gtag_t t_new, t_close, t_write, t_status;
  int inflight;     /* batches started and not yet completed */
  int cancelled;    /* set by RECV_CLOSE_ON_SERVER */
  bool closed;      /* RECV_CLOSE_ON_SERVER completed */
  bool md_sent;     /* initial metadata went out */
  bool status_sent; /* SEND_STATUS started: nothing more may be sent */
  /* Streams only. */
  bool is_stream, done, writing;
  void *state;
  grpc_byte_buffer *queue[GSRV_BATCH];
  size_t qhead, qlen;
  gcall_t *prev, *next; /* the list of open streams */
  /* Kept alive until the status batch completes. */
  grpc_slice status_msg, details_bin, error_bin;
  grpc_metadata trailer[2];
  grpc_byte_buffer *resp;
};

struct gsrv {
  svc_t *svc;
  const srv_config_t *cfg;
  grpc_server *server;
  grpc_completion_queue *cq;
  void **reg; /* registered method handles, one per gsvc_methods entry */
  pthread_t thread;
  bool thread_started;
  atomic_bool stop;
  size_t max_message;
  gcall_t *streams;  /* open streams (this thread only) */
  int64_t live;      /* gcall_t allocated (this thread only) */
  uint64_t seen_gen; /* service event generation last fed to streams */
  gtag_t t_shutdown;
  atomic_llong calls, streams_open, streams_total;
};

static void call_post(gsrv_t *g, int method);
static void stream_pump(gcall_t *c);

static void call_start(gcall_t *c, const grpc_op *ops, size_t n, gtag_t *tag) {
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (e != GRPC_CALL_OK) {
    /* Cannot happen with the op sequences below; if it did, the call would
     * never complete that batch, so do not count it. */
    ty_error("grpc: start_batch failed: %s", grpc_call_error_to_string(e));
    return;
  }
  c->inflight++;
}

static void stream_unlink(gcall_t *c) {
  gsrv_t *g = c->g;
  if (c->prev)
    c->prev->next = c->next;
  else if (g->streams == c)
    g->streams = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

/* Frees a call whose batches have all completed. */
static void call_maybe_free(gcall_t *c) {
  if (c->inflight > 0) return;
  gsrv_t *g = c->g;
  if (c->is_stream) {
    stream_unlink(c);
    if (c->state) gsvc_methods[c->method].close(c->state);
    for (size_t i = 0; i < c->qlen; i++)
      grpc_byte_buffer_destroy(c->queue[(c->qhead + i) % GSRV_BATCH]);
    long long open = atomic_fetch_sub(&g->streams_open, 1) - 1;
    if (c->cancelled)
      ty_info(
          "grpc: a %s stream cancelled by the client (cancel, deadline or lost connection) "
          "was freed; %lld open",
          gsvc_methods[c->method].path, open);
  }
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->resp) grpc_byte_buffer_destroy(c->resp);
  grpc_slice_unref(c->status_msg);
  grpc_slice_unref(c->details_bin);
  grpc_slice_unref(c->error_bin);
  grpc_metadata_array_destroy(&c->md);
  grpc_call_details_destroy(&c->details);
  if (c->call) grpc_call_unref(c->call);
  free(c);
  g->live--;
}

/* Ends a call with a status (and, for unary successes, the response resp,
 * which the call now owns). code is 0 or a TY_E* code; errs, when not
 * empty, become google.rpc.Status details. */
static void call_finish(gcall_t *c, int code, const char *msg, const ty_errlist_t *errs,
                        grpc_byte_buffer *resp) {
  if (c->status_sent) {
    if (resp) grpc_byte_buffer_destroy(resp);
    return;
  }
  c->status_sent = true;
  atomic_fetch_add(&c->g->calls, 1);
  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = true;
  }
  if (resp && code == 0) {
    c->resp = resp;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = resp;
  } else if (resp) {
    grpc_byte_buffer_destroy(resp);
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)ty_err_grpc_status(code);
  if (code) {
    const char *text = msg && *msg ? msg : ty_err_name(code);
    c->status_msg = grpc_slice_from_copied_string(text);
    ops[n].data.send_status_from_server.status_details = &c->status_msg;
    /* The error in both forms: google.rpc.Status for stock clients and
     * trainyard.v1.Error of our proto. */
    c->details_bin = gwire_status_details(code, text, errs);
    c->error_bin = gwire_error_details(code, text, errs);
    c->trailer[0].key = grpc_slice_from_static_string(GWIRE_DETAILS_KEY);
    c->trailer[0].value = c->details_bin;
    c->trailer[1].key = grpc_slice_from_static_string(GWIRE_ERROR_KEY);
    c->trailer[1].value = c->error_bin;
    ops[n].data.send_status_from_server.trailing_metadata_count = 2;
    ops[n].data.send_status_from_server.trailing_metadata = c->trailer;
  }
  n++;
  call_start(c, ops, n, &c->t_status);
}

/* Whether the call carries a valid API token (or none is needed):
 * server/token.h's constant-time comparison, as for REST. */
static bool call_authorized(gcall_t *c, char *msg, size_t msgsz) {
  const char *tokens = c->g->cfg->tokens;
  if (!token_required(tokens)) return true;
  char value[1024];
  const char *tok = NULL;
  if (gwire_metadata_get(&c->md, "authorization", value, sizeof value)) tok = gwire_bearer(value);
  if (!tok) {
    snprintf(msg, msgsz, "this server needs the metadata 'authorization: Bearer <token>'");
    return false;
  }
  bool ok = token_listed(tokens, tok);
  if (!ok) snprintf(msg, msgsz, "the bearer token is not valid for this server");
  return ok;
}

/* A request arrived: re-arm, watch for the client going away, answer. */
static void call_arrived(gcall_t *c) {
  gsrv_t *g = c->g;
  if (!atomic_load(&g->stop)) call_post(g, c->method);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  call_start(c, &op, 1, &c->t_close);

  char msg[1024] = "";
  ty_errlist_t errs = TY_ERRLIST_INIT;
  if (c->method < 0) {
    char *path = grpc_slice_to_c_string(c->details.method);
    int n = snprintf(msg, sizeof msg, "unknown method %s; trainyard.v1.Trainyard has", path);
    for (size_t i = 0; i < gsvc_method_count && n > 0 && (size_t)n < sizeof msg; i++)
      n += snprintf(msg + n, sizeof msg - (size_t)n, "%s %s",
                    i == 0                       ? ""
                    : i + 1 == gsvc_method_count ? " and"
                                                 : ",",
                    strrchr(gsvc_methods[i].path, '/') + 1);
    gpr_free(path);
    call_finish(c, TY_EUNIMPLEMENTED, msg, NULL, NULL);
    return;
  }
  if (atomic_load(&g->stop)) {
    call_finish(c, TY_EUNAVAILABLE, "trainyardd is shutting down", NULL, NULL);
    return;
  }
  gpr_timespec now = gpr_now(c->deadline.clock_type);
  if (gpr_time_cmp(c->deadline, now) <= 0) {
    call_finish(c, TY_EDEADLINE, "the call's deadline passed before it was served", NULL, NULL);
    return;
  }
  if (!call_authorized(c, msg, sizeof msg)) {
    call_finish(c, TY_EUNAUTHENTICATED, msg, NULL, NULL);
    return;
  }
  const gsrv_method_t *m = &gsvc_methods[c->method];
  ProtobufCMessage *req = NULL;
  int rc = gwire_unpack(c->payload, m->request, g->max_message, &req, msg, sizeof msg);
  if (rc) {
    call_finish(c, rc, msg, NULL, NULL);
    return;
  }
  if (m->unary) {
    grpc_byte_buffer *resp = NULL;
    rc = m->unary(g->svc, req, &resp, &errs, msg, sizeof msg);
    call_finish(c, rc, msg, &errs, resp);
  } else if (atomic_load(&g->streams_open) >= GSRV_MAX_STREAMS) {
    snprintf(msg, sizeof msg, "this server has %d streams open, its limit; retry later",
             GSRV_MAX_STREAMS);
    call_finish(c, TY_EEXHAUSTED, msg, NULL, NULL);
  } else if ((rc = m->open(g->svc, req, &c->state, &errs, msg, sizeof msg))) {
    call_finish(c, rc, msg, &errs, NULL);
  } else {
    c->is_stream = true;
    atomic_fetch_add(&g->streams_open, 1);
    atomic_fetch_add(&g->streams_total, 1);
    c->next = g->streams;
    if (g->streams) g->streams->prev = c;
    g->streams = c;
    stream_pump(c);
  }
  ty_errlist_clear(&errs);
  protobuf_c_message_free_unpacked(req, NULL);
}

/* Sends the next queued message, refilling the queue from the service
 * when it is empty, and ends the stream when the service says it is done. */
static void stream_pump(gcall_t *c) {
  if (c->writing || c->status_sent || c->closed) return;
  const gsrv_method_t *m = &gsvc_methods[c->method];
  if (!c->qlen && !c->done) {
    char msg[512] = "";
    size_t n = 0;
    int rc = m->next(c->g->svc, c->state, c->queue, GSRV_BATCH, &n, &c->done, msg, sizeof msg);
    if (rc) {
      for (size_t i = 0; i < n; i++) grpc_byte_buffer_destroy(c->queue[i]);
      call_finish(c, rc, msg, NULL, NULL);
      return;
    }
    c->qhead = 0;
    c->qlen = n;
  }
  if (c->qlen) {
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
      ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
      c->md_sent = true;
    }
    /* The queue keeps the buffer until the write completes. */
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->queue[c->qhead];
    c->writing = true;
    call_start(c, ops, n, &c->t_write);
  } else if (c->done) {
    call_finish(c, 0, NULL, NULL, NULL);
  }
}

static void stream_written(gcall_t *c, bool ok) {
  c->writing = false;
  grpc_byte_buffer_destroy(c->queue[c->qhead]);
  c->qhead = (c->qhead + 1) % GSRV_BATCH;
  c->qlen--;
  /* A failed write means the call is gone; RECV_CLOSE reports it. */
  if (!ok) return;
  if (atomic_load(&c->g->stop)) {
    char msg[512];
    gsvc_methods[c->method].resume_hint(c->state, msg, sizeof msg);
    call_finish(c, TY_EUNAVAILABLE, msg, NULL, NULL);
    return;
  }
  stream_pump(c);
}

static void call_post(gsrv_t *g, int method) {
  gcall_t *c = xcalloc(1, sizeof *c);
  c->g = g;
  c->method = method;
  c->t_new = (gtag_t){c, TAG_NEW};
  c->t_close = (gtag_t){c, TAG_CLOSE};
  c->t_write = (gtag_t){c, TAG_WRITE};
  c->t_status = (gtag_t){c, TAG_STATUS};
  c->status_msg = grpc_empty_slice();
  c->details_bin = grpc_empty_slice();
  c->error_bin = grpc_empty_slice();
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  grpc_call_error e;
  if (method >= 0)
    e = grpc_server_request_registered_call(g->server, g->reg[method], &c->call, &c->deadline,
                                            &c->md, &c->payload, g->cq, g->cq, &c->t_new);
  else
    e = grpc_server_request_call(g->server, &c->call, &c->details, &c->md, g->cq, g->cq, &c->t_new);
  g->live++;
  if (e != GRPC_CALL_OK) {
    ty_error("grpc: cannot post a request: %s", grpc_call_error_to_string(e));
    call_maybe_free(c);
    return;
  }
  c->inflight = 1;
}

/* Feeds every idle stream when the service has new events. */
static void streams_tick(gsrv_t *g) {
  uint64_t gen = svc_event_generation(g->svc);
  if (gen == g->seen_gen) return;
  g->seen_gen = gen;
  for (gcall_t *c = g->streams, *next; c; c = next) {
    next = c->next;
    stream_pump(c);
  }
}

/* Ends every stream that is not mid-write with UNAVAILABLE; the others end
 * when their write completes (stream_written). */
static void streams_end(gsrv_t *g) {
  for (gcall_t *c = g->streams, *next; c; c = next) {
    next = c->next;
    if (c->writing || c->status_sent || c->closed) continue;
    char msg[512];
    gsvc_methods[c->method].resume_hint(c->state, msg, sizeof msg);
    call_finish(c, TY_EUNAVAILABLE, msg, NULL, NULL);
  }
}

static void handle(gsrv_t *g, gtag_t *t, bool ok) {
  gcall_t *c = t->c;
  c->inflight--;
  switch (t->kind) {
    case TAG_NEW:
      if (ok) call_arrived(c);
      break;
    case TAG_CLOSE:
      c->closed = true;
      /* Nothing more can be sent; free the stream's state now rather than
       * when its last batch drains. */
      c->status_sent = c->status_sent || c->cancelled;
      break;
    case TAG_WRITE:
      stream_written(c, ok);
      break;
    case TAG_STATUS:
    case TAG_SHUTDOWN:
      break;
  }
  call_maybe_free(c);
}

static void *gsrv_thread(void *arg) {
  gsrv_t *g = arg;
  bool shutting = false, cancelled_all = false, server_done = false, cq_down = false;
  gpr_timespec shutdown_at = gpr_inf_future(GPR_CLOCK_MONOTONIC);
  for (;;) {
    gpr_timespec until = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                      gpr_time_from_millis(GSRV_TICK_MS, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_next(g->cq, until, NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_OP_COMPLETE) {
      gtag_t *t = ev.tag;
      if (t->kind == TAG_SHUTDOWN)
        server_done = true;
      else
        handle(g, t, ev.success != 0);
    }
    if (!shutting && atomic_load(&g->stop)) {
      shutting = true;
      shutdown_at = gpr_now(GPR_CLOCK_MONOTONIC);
      streams_end(g);
      grpc_server_shutdown_and_notify(g->server, g->cq, &g->t_shutdown);
    }
    if (shutting && !cancelled_all &&
        gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_add(shutdown_at, gpr_time_from_seconds(GSRV_GRACE_S, GPR_TIMESPAN))) >
            0) {
      grpc_server_cancel_all_calls(g->server);
      cancelled_all = true;
    }
    if (shutting && server_done && g->live == 0 && !cq_down) {
      grpc_completion_queue_shutdown(g->cq); /* then drain until GRPC_QUEUE_SHUTDOWN */
      cq_down = true;
    }
    if (!shutting) streams_tick(g);
  }
  return NULL;
}

int gsrv_start(svc_t *svc, const srv_config_t *cfg, const char *listen, gsrv_t **out, int *port,
               char *msg, size_t msgsz) {
  *out = NULL;
  if (!srv_config_is_loopback(listen) && !token_required(cfg->tokens)) {
    snprintf(msg, msgsz,
             "--grpc-listen %s is not a loopback address; give an API token (--tokens) or "
             "listen on 127.0.0.1",
             listen);
    return TY_EINVAL;
  }
  grpc_init();
  gsrv_t *g = xcalloc(1, sizeof *g);
  g->svc = svc;
  g->cfg = cfg;
  g->max_message = (size_t)cfg->max_body;
  g->t_shutdown = (gtag_t){NULL, TAG_SHUTDOWN};
  grpc_arg args[] = {
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = (int)cfg->max_body}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_CONCURRENT_STREAMS, {.integer = GSRV_MAX_STREAMS}},
      /* Pings on idle connections, so a watcher whose host vanished is
       * noticed (its RECV_CLOSE completes) and its stream freed. */
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 60000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 20000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, {.integer = 0}},
  };
  grpc_channel_args chargs = {sizeof args / sizeof args[0], args};
  g->server = grpc_server_create(&chargs, NULL);
  g->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(g->server, g->cq, NULL);
  g->reg = xcalloc(gsvc_method_count, sizeof *g->reg);
  for (size_t i = 0; i < gsvc_method_count; i++)
    g->reg[i] = grpc_server_register_method(g->server, gsvc_methods[i].path, NULL,
                                            GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  *port = grpc_server_add_http2_port(g->server, listen, creds);
  grpc_server_credentials_release(creds);
  if (*port <= 0) {
    snprintf(msg, msgsz, "cannot listen for gRPC on %s (in use, or not host:port)", listen);
    grpc_server_destroy(g->server);
    grpc_completion_queue_shutdown(g->cq);
    while (grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(g->cq);
    free(g->reg);
    free(g);
    grpc_shutdown();
    return TY_EUNAVAILABLE;
  }
  grpc_server_start(g->server);
  g->seen_gen = svc_event_generation(svc);
  for (size_t i = 0; i < gsvc_method_count; i++)
    for (int k = 0; k < GSRV_POSTED; k++) call_post(g, (int)i);
  call_post(g, -1);
  if (pthread_create(&g->thread, NULL, gsrv_thread, g)) {
    snprintf(msg, msgsz, "cannot start the gRPC thread");
    atomic_store(&g->stop, true);
    gsrv_thread(g); /* drains and shuts down on this thread */
    grpc_server_destroy(g->server);
    grpc_completion_queue_destroy(g->cq);
    free(g->reg);
    free(g);
    grpc_shutdown();
    return TY_EINTERNAL;
  }
  g->thread_started = true;
  *out = g;
  return 0;
}

void gsrv_stop(gsrv_t *g) {
  if (!g) return;
  atomic_store(&g->stop, true);
  if (g->thread_started) pthread_join(g->thread, NULL);
  grpc_server_destroy(g->server);
  grpc_completion_queue_destroy(g->cq);
  free(g->reg);
  free(g);
  grpc_shutdown();
}

void gsrv_stats(gsrv_t *g, gsrv_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (!g) return;
  out->calls = atomic_load(&g->calls);
  out->streams_open = atomic_load(&g->streams_open);
  out->streams = atomic_load(&g->streams_total);
}
