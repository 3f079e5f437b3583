/* grpc_client.c - trainyard.v1.Trainyard calls for the CLI on the gRPC C
 * core; see grpc_client.h. Each call makes its own channel and completion
 * queue and runs one batch at a time on it. */
#ifdef TRAINYARD_WITH_CLIENT
#include "cli/grpc_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "api/jobspec_pb.h"
#include "api/pbjson.h"
#include "api/trainyard.pb-c.h"

#define GCLI_PATH "/trainyard.v1.Trainyard/"
/* Seconds a unary call may take. */
#define GCLI_DEADLINE_S 60

typedef struct {
  grpc_channel *ch;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata auth;
  char authval[600];
  grpc_metadata_array trailing, initial;
  grpc_status_code status;
  grpc_slice details;
} gcall_t;

static bool gcall_open(gcall_t *g, const client_t *c, const char *method, bool stream) {
  memset(g, 0, sizeof *g);
  grpc_init();
  grpc_channel_credentials *cr = grpc_insecure_credentials_create();
  g->ch = grpc_channel_create(c->grpc, cr, NULL);
  grpc_channel_credentials_release(cr);
  g->cq = grpc_completion_queue_create_for_next(NULL);
  char path[128];
  snprintf(path, sizeof path, GCLI_PATH "%s", method);
  grpc_slice m = grpc_slice_from_copied_string(path);
  gpr_timespec deadline = stream
                              ? gpr_inf_future(GPR_CLOCK_REALTIME)
                              : gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                             gpr_time_from_seconds(GCLI_DEADLINE_S, GPR_TIMESPAN));
  g->call = grpc_channel_create_call(g->ch, NULL, GRPC_PROPAGATE_DEFAULTS, g->cq, m, NULL, deadline,
                                     NULL);
  grpc_slice_unref(m);
  grpc_metadata_array_init(&g->trailing);
  grpc_metadata_array_init(&g->initial);
  g->details = grpc_empty_slice();
  return g->call != NULL;
}

/* Runs one batch and waits for it. */
static bool gcall_batch(gcall_t *g, const grpc_op *ops, size_t n) {
  if (grpc_call_start_batch(g->call, ops, n, g, NULL) != GRPC_CALL_OK) return false;
  grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static void gcall_close(gcall_t *g) {
  if (g->call) grpc_call_unref(g->call);
  grpc_completion_queue_shutdown(g->cq);
  while (grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(g->cq);
  grpc_channel_destroy(g->ch);
  grpc_metadata_array_destroy(&g->trailing);
  grpc_metadata_array_destroy(&g->initial);
  grpc_slice_unref(g->details);
  grpc_shutdown();
}

/* Sends the request (with the token) and closes the sending side. */
static bool gcall_send(gcall_t *g, const client_t *c, const ProtobufCMessage *req) {
  size_t len = protobuf_c_message_get_packed_size(req);
  grpc_slice s = grpc_slice_malloc(len);
  protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (*c->token) {
    snprintf(g->authval, sizeof g->authval, "Bearer %s", c->token);
    g->auth.key = grpc_slice_from_static_string("authorization");
    g->auth.value = grpc_slice_from_static_string(g->authval);
    ops[0].data.send_initial_metadata.count = 1;
    ops[0].data.send_initial_metadata.metadata = &g->auth;
  }
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &g->initial;
  bool ok = gcall_batch(g, ops, 4);
  grpc_byte_buffer_destroy(bb);
  return ok;
}

/* Receives one message into *out (NULL at the end of the stream). */
static bool gcall_recv(gcall_t *g, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out) {
  grpc_byte_buffer *bb = NULL;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &bb;
  *out = NULL;
  if (!gcall_batch(g, &op, 1)) return false;
  if (!bb) return true;
  grpc_byte_buffer_reader r;
  grpc_byte_buffer_reader_init(&r, bb);
  grpc_slice all = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  grpc_byte_buffer_destroy(bb);
  *out = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
  grpc_slice_unref(all);
  return *out != NULL;
}

static void gcall_status(gcall_t *g) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &g->trailing;
  op.data.recv_status_on_client.status = &g->status;
  op.data.recv_status_on_client.status_details = &g->details;
  if (!gcall_batch(g, &op, 1)) g->status = GRPC_STATUS_UNKNOWN;
}

/* Prints a failed call as the REST client prints the error model. */
static int gcall_print_error(const gcall_t *g, const client_t *c) {
  int code = -(int)g->status;
  char *text = grpc_slice_to_c_string(g->details);
  json_t *body = NULL;
  for (size_t i = 0; i < g->trailing.count && !body; i++) {
    if (grpc_slice_str_cmp(g->trailing.metadata[i].key, "trainyard-error-bin")) continue;
    Trainyard__V1__Error *e =
        trainyard__v1__error__unpack(NULL, GRPC_SLICE_LENGTH(g->trailing.metadata[i].value),
                                     GRPC_SLICE_START_PTR(g->trailing.metadata[i].value));
    if (!e) continue;
    body = pbjson_from_message(&e->base, "", NULL);
    trainyard__v1__error__free_unpacked(e, NULL);
    json_t *wrapped = json_pack("{s:o}", "error", body);
    body = wrapped;
  }
  if (!body) body = ty_error_json(code, *text ? text : NULL, NULL);
  if (g->status == GRPC_STATUS_UNAVAILABLE)
    fprintf(stderr,
            "trainyard: cannot reach the gRPC API at %s (is trainyardd running with "
            "--grpc-listen?)\n",
            c->grpc);
  client_print_error(ty_err_http_status(code), body, text);
  json_decref(body);
  gpr_free(text);
  return 1;
}

/* One unary call: *out is the answer as a message (the caller's). */
static int gcli_unary(const client_t *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *d, ProtobufCMessage **out) {
  gcall_t g;
  *out = NULL;
  int rc = 0;
  if (!gcall_open(&g, c, method, false)) {
    fprintf(stderr, "trainyard: cannot start a gRPC call to %s\n", c->grpc);
    rc = 1;
  } else {
    /* The status tells what went wrong with either batch. */
    if (gcall_send(&g, c, req)) gcall_recv(&g, d, out);
    gcall_status(&g);
    if (g.status != GRPC_STATUS_OK || !*out) {
      if (*out) protobuf_c_message_free_unpacked(*out, NULL);
      *out = NULL;
      rc = g.status != GRPC_STATUS_OK ? gcall_print_error(&g, c) : 1;
      if (g.status == GRPC_STATUS_OK)
        fprintf(stderr, "trainyard: the server's %s answer is not a valid message\n", method);
    }
  }
  gcall_close(&g);
  return rc;
}

/* A message as the REST API's JSON. */
static json_t *as_json(const ProtobufCMessage *m) {
  return pbjson_from_message(m, "", NULL);
}

int gcli_submit(const client_t *c, const jobspec_t *spec, const char *key, json_t **job,
                bool *existing) {
  Trainyard__V1__SubmitJobRequest req = TRAINYARD__V1__SUBMIT_JOB_REQUEST__INIT;
  req.spec = jobspec_to_pb(spec);
  req.idempotency_key = (char *)key;
  ProtobufCMessage *out;
  int rc =
      gcli_unary(c, "SubmitJob", &req.base, &trainyard__v1__submit_job_response__descriptor, &out);
  trainyard__v1__job_spec__free_unpacked(req.spec, NULL);
  if (rc) return rc;
  Trainyard__V1__SubmitJobResponse *resp = (void *)out;
  *job = resp->job ? as_json(&resp->job->base) : json_object();
  *existing = resp->has_existing && resp->existing;
  protobuf_c_message_free_unpacked(out, NULL);
  return 0;
}

/* gcli_unary with the answer (of type d) as the REST API's JSON in *out
 * (the caller's). */
static int gcli_unary_json(const client_t *c, const char *method, const ProtobufCMessage *req,
                           const ProtobufCMessageDescriptor *d, json_t **out) {
  ProtobufCMessage *m;
  int rc = gcli_unary(c, method, req, d, &m);
  if (rc) return rc;
  *out = as_json(m);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}

int gcli_get(const client_t *c, const char *id, json_t **job) {
  Trainyard__V1__GetJobRequest req = TRAINYARD__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  return gcli_unary_json(c, "GetJob", &req.base, &trainyard__v1__job__descriptor, job);
}

int gcli_list(const client_t *c, const char *states, const char *page_token, json_t **page) {
  *page = NULL;
  /* The request from its JSON form, so that state names are read as the
   * server writes them ("running"). */
  json_t *names = json_array();
  char buf[256];
  snprintf(buf, sizeof buf, "%s", states ? states : "");
  for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
    int v;
    if (pbjson_enum_value(&trainyard__v1__job_state__descriptor, w, &v)) {
      fprintf(stderr,
              "trainyard list: --state: unknown state '%s' (use queued, starting, "
              "running, succeeded, failed or cancelled, comma-separated)\n",
              w);
      json_decref(names);
      return 2;
    }
    json_array_append_new(names, json_string(w));
  }
  json_t *j = json_pack("{s:o}", "states", names);
  if (*page_token) json_object_set_new(j, "page_token", json_string(page_token));
  ty_errlist_t errs = TY_ERRLIST_INIT;
  ProtobufCMessage *req =
      pbjson_to_message(j, &trainyard__v1__list_jobs_request__descriptor, "", &errs);
  json_decref(j);
  if (!req) { /* cannot happen: names and token were checked or are strings */
    for (size_t i = 0; i < errs.len; i++)
      fprintf(stderr, "trainyard list: %s: %s\n", errs.items[i].field, errs.items[i].message);
    ty_errlist_clear(&errs);
    return 2;
  }
  int rc =
      gcli_unary_json(c, "ListJobs", req, &trainyard__v1__list_jobs_response__descriptor, page);
  protobuf_c_message_free_unpacked(req, NULL);
  return rc;
}

int gcli_cancel(const client_t *c, const char *id, const char *reason, json_t **job) {
  Trainyard__V1__CancelJobRequest req = TRAINYARD__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  req.reason = (char *)reason;
  return gcli_unary_json(c, "CancelJob", &req.base, &trainyard__v1__job__descriptor, job);
}

int gcli_delete(const client_t *c, const char *id, json_t **job) {
  Trainyard__V1__DeleteJobRequest req = TRAINYARD__V1__DELETE_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  return gcli_unary_json(c, "DeleteJob", &req.base, &trainyard__v1__job__descriptor, job);
}

int gcli_watch(const client_t *c, const char *id, long long after_seq,
               void (*fn)(void *ctx, const json_t *ev), void *ctx) {
  Trainyard__V1__WatchJobRequest req = TRAINYARD__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  req.has_after_seq = true;
  req.after_seq = after_seq;
  gcall_t g;
  int rc = 0;
  if (!gcall_open(&g, c, "WatchJob", true)) {
    fprintf(stderr, "trainyard: cannot start a gRPC call to %s\n", c->grpc);
    gcall_close(&g);
    return 1;
  }
  if (gcall_send(&g, c, &req.base)) {
    ProtobufCMessage *m;
    while (gcall_recv(&g, &trainyard__v1__job_event__descriptor, &m) && m) {
      json_t *ev = as_json(m);
      fn(ctx, ev);
      json_decref(ev);
      protobuf_c_message_free_unpacked(m, NULL);
    }
  }
  gcall_status(&g);
  if (g.status == GRPC_STATUS_UNAVAILABLE) {
    char *text = grpc_slice_to_c_string(g.details);
    fprintf(stderr, "trainyard watch: stream lost (%s); reconnecting\n", text);
    gpr_free(text);
    rc = -1;
  } else if (g.status != GRPC_STATUS_OK) {
    rc = gcall_print_error(&g, c);
  }
  gcall_close(&g);
  return rc;
}
#endif
