/* grpc_service.c - the methods of trainyard.v1.Trainyard: decode the
 * request message, call server/service, encode the answer. No logic of its
 * own: every decision (validation, state, pagination, idempotency) is the
 * service's, so gRPC and REST answer alike.
 *
 * Answers are the JSON the REST API sends, turned into messages by
 * api/pbjson (trainyard.proto mirrors that JSON field for field), so both
 * front ends return the same job; request specs go through api/jobspec_pb,
 * the one converter of specs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec_pb.h"
#include "api/pbjson.h"
#include "api/trainyard.pb-c.h"
#include "common/xalloc.h"
#include "server/grpc_internal.h"
#include "server/grpc_wire.h"

/* A message from the service's JSON (the REST body); a failure is a
 * mismatch between that JSON and trainyard.proto, so it is INTERNAL with
 * the reason. */
static ProtobufCMessage *to_message(const json_t *j, const ProtobufCMessageDescriptor *d, char *msg,
                                    size_t msgsz) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  ProtobufCMessage *m = pbjson_to_message(j, d, "", &errs);
  if (!m)
    snprintf(msg, msgsz, "cannot encode a %s: %s: %s", d->short_name,
             errs.len ? errs.items[0].field : "", errs.len ? errs.items[0].message : "?");
  ty_errlist_clear(&errs);
  return m;
}

/* The trainyard.v1.Job of a job row: the REST API's JSON of the job
 * (svc_job_view) as a message. The caller frees it with
 * trainyard__v1__job__free_unpacked. */
static Trainyard__V1__Job *job_pb(svc_t *svc, const db_job_t *j, char *msg, size_t msgsz) {
  json_t *o = svc_job_view(svc, j);
  Trainyard__V1__Job *m =
      (Trainyard__V1__Job *)to_message(o, &trainyard__v1__job__descriptor, msg, msgsz);
  json_decref(o);
  return m;
}

/* Packs a job row as a bare Job (GetJob, CancelJob, DeleteJob). */
static int job_reply(svc_t *svc, const db_job_t *j, grpc_byte_buffer **resp, char *msg,
                     size_t msgsz) {
  Trainyard__V1__Job *m = job_pb(svc, j, msg, msgsz);
  if (!m) return TY_EINTERNAL;
  *resp = gwire_pack(&m->base);
  trainyard__v1__job__free_unpacked(m, NULL);
  return 0;
}

/* The spec of a request; false with errs filled when it is missing or
 * invalid (the REST body's checks, on the message). */
static bool request_spec(const Trainyard__V1__JobSpec *m, jobspec_t *spec, ty_errlist_t *errs) {
  jobspec_init(spec);
  if (!m) {
    ty_errlist_add(errs, "spec", "the request must carry a job spec (DESIGN.md \"Job spec\")");
    return false;
  }
  return jobspec_from_pb(spec, m, errs) == 0 && errs->len == 0;
}

static bool request_id(const char *id, ty_errlist_t *errs, char *msg, size_t msgsz) {
  if (id && *id) return true;
  ty_errlist_add(errs, "job_id", "give the id of a job (as returned by SubmitJob)");
  snprintf(msg, msgsz, "job_id is required");
  return false;
}

static int m_submit(svc_t *svc, const ProtobufCMessage *rq, grpc_byte_buffer **resp,
                    ty_errlist_t *errs, char *msg, size_t msgsz) {
  const Trainyard__V1__SubmitJobRequest *req = (const void *)rq;
  jobspec_t spec;
  if (!request_spec(req->spec, &spec, errs)) {
    snprintf(msg, msgsz, "the job spec is invalid (see details)");
    return TY_EINVAL;
  }
  db_job_t *job = NULL;
  bool created = false;
  int rc = svc_submit(svc, &spec, req->idempotency_key, &job, &created, errs, msg, msgsz);
  if (rc) return rc;
  Trainyard__V1__SubmitJobResponse out = TRAINYARD__V1__SUBMIT_JOB_RESPONSE__INIT;
  out.job = job_pb(svc, job, msg, msgsz);
  out.has_existing = true;
  out.existing = !created;
  db_job_free(job);
  if (!out.job) return TY_EINTERNAL;
  *resp = gwire_pack(&out.base);
  trainyard__v1__job__free_unpacked(out.job, NULL);
  return 0;
}

static int m_validate(svc_t *svc, const ProtobufCMessage *rq, grpc_byte_buffer **resp,
                      ty_errlist_t *errs, char *msg, size_t msgsz) {
  const Trainyard__V1__ValidateJobRequest *req = (const void *)rq;
  jobspec_t spec;
  if (!request_spec(req->spec, &spec, errs)) {
    snprintf(msg, msgsz, "the job spec is invalid (see details)");
    return TY_EINVAL;
  }
  if (svc_validate(svc, &spec, errs, msg, msgsz)) return TY_EINVAL;
  Trainyard__V1__ValidateJobResponse out = TRAINYARD__V1__VALIDATE_JOB_RESPONSE__INIT;
  out.has_valid = true;
  out.valid = true;
  out.spec = jobspec_to_pb(&spec);
  *resp = gwire_pack(&out.base);
  trainyard__v1__job_spec__free_unpacked(out.spec, NULL);
  return 0;
}

static int m_get(svc_t *svc, const ProtobufCMessage *rq, grpc_byte_buffer **resp,
                 ty_errlist_t *errs, char *msg, size_t msgsz) {
  const Trainyard__V1__GetJobRequest *req = (const void *)rq;
  if (!request_id(req->job_id, errs, msg, msgsz)) return TY_EINVAL;
  db_job_t *job;
  int rc = svc_get(svc, req->job_id, &job, msg, msgsz);
  if (rc) return rc;
  rc = job_reply(svc, job, resp, msg, msgsz);
  db_job_free(job);
  return rc;
}

static int m_list(svc_t *svc, const ProtobufCMessage *rq, grpc_byte_buffer **resp,
                  ty_errlist_t *errs, char *msg, size_t msgsz) {
  const Trainyard__V1__ListJobsRequest *req = (const void *)rq;
  /* The service takes states as "queued,running". */
  char states[256] = "";
  for (size_t i = 0; i < req->n_states; i++) {
    char buf[64];
    const char *name =
        pbjson_enum_name(&trainyard__v1__job_state__descriptor, req->states[i], buf, sizeof buf);
    if (!name || req->states[i] == TRAINYARD__V1__JOB_STATE__JOB_STATE_UNSPECIFIED) {
      ty_errlist_add(errs, "states", "%d is not a job state", req->states[i]);
      continue;
    }
    size_t len = strlen(states);
    snprintf(states + len, sizeof states - len, "%s%s", len ? "," : "", name);
  }
  if (errs->len) {
    snprintf(msg, msgsz, "invalid list request (see details)");
    return TY_EINVAL;
  }
  db_job_t **jobs = NULL;
  size_t n = 0;
  char *next = NULL;
  int rc = svc_list(svc, states, req->has_page_size ? req->page_size : 0, req->page_token, &jobs,
                    &n, &next, errs, msg, msgsz);
  if (rc) {
    if (!*msg) snprintf(msg, msgsz, "invalid list request (see details)");
    return rc;
  }
  Trainyard__V1__ListJobsResponse out = TRAINYARD__V1__LIST_JOBS_RESPONSE__INIT;
  out.jobs = n ? xcalloc(n, sizeof *out.jobs) : NULL;
  for (size_t i = 0; i < n && !rc; i++) {
    out.jobs[i] = job_pb(svc, jobs[i], msg, msgsz);
    if (!out.jobs[i])
      rc = TY_EINTERNAL;
    else
      out.n_jobs++;
  }
  out.next_page_token = next;
  if (!rc) *resp = gwire_pack(&out.base);
  for (size_t i = 0; i < out.n_jobs; i++) trainyard__v1__job__free_unpacked(out.jobs[i], NULL);
  free(out.jobs);
  free(next);
  db_jobs_free(jobs, n);
  return rc;
}

static int m_cancel(svc_t *svc, const ProtobufCMessage *rq, grpc_byte_buffer **resp,
                    ty_errlist_t *errs, char *msg, size_t msgsz) {
  const Trainyard__V1__CancelJobRequest *req = (const void *)rq;
  if (!request_id(req->job_id, errs, msg, msgsz)) return TY_EINVAL;
  db_job_t *job = NULL;
  int rc = svc_cancel(svc, req->job_id, req->reason, &job, errs, msg, msgsz);
  if (rc) return rc;
  rc = job_reply(svc, job, resp, msg, msgsz);
  db_job_free(job);
  return rc;
}

static int m_delete(svc_t *svc, const ProtobufCMessage *rq, grpc_byte_buffer **resp,
                    ty_errlist_t *errs, char *msg, size_t msgsz) {
  const Trainyard__V1__DeleteJobRequest *req = (const void *)rq;
  if (!request_id(req->job_id, errs, msg, msgsz)) return TY_EINVAL;
  db_job_t *job = NULL;
  int rc = svc_delete(svc, req->job_id, &job, msg, msgsz);
  if (rc) return rc;
  rc = job_reply(svc, job, resp, msg, msgsz);
  db_job_free(job);
  return rc;
}

/* ---- WatchJob ---- */

typedef struct {
  char id[DB_ID_MAX];
  int64_t last_seq; /* events up to this one were handed to the stream */
} watch_t;

static int w_open(svc_t *svc, const ProtobufCMessage *rq, void **state, ty_errlist_t *errs,
                  char *msg, size_t msgsz) {
  const Trainyard__V1__WatchJobRequest *req = (const void *)rq;
  if (!request_id(req->job_id, errs, msg, msgsz)) return TY_EINVAL;
  if (req->has_after_seq && req->after_seq < 0) {
    ty_errlist_add(errs, "after_seq", "must be 0 (from the start) or a seq already seen");
    snprintf(msg, msgsz, "after_seq is negative");
    return TY_EINVAL;
  }
  db_job_t *job;
  int rc = svc_get(svc, req->job_id, &job, msg, msgsz);
  if (rc) return rc;
  watch_t *w = xcalloc(1, sizeof *w);
  snprintf(w->id, sizeof w->id, "%s", job->id);
  w->last_seq = req->has_after_seq ? req->after_seq : 0;
  db_job_free(job);
  *state = w;
  return 0;
}

/* One stored event ({"seq","job_id","t","type","data"}, the SSE event's
 * data) as a JobEvent. */
static grpc_byte_buffer *event_pack(const json_t *ev, char *msg, size_t msgsz) {
  ProtobufCMessage *m = to_message(ev, &trainyard__v1__job_event__descriptor, msg, msgsz);
  if (!m) return NULL;
  grpc_byte_buffer *bb = gwire_pack(m);
  protobuf_c_message_free_unpacked(m, NULL);
  return bb;
}

static int w_next(svc_t *svc, void *state, grpc_byte_buffer **out, size_t max, size_t *n,
                  bool *done, char *msg, size_t msgsz) {
  watch_t *w = state;
  json_t *arr = NULL;
  int64_t last = w->last_seq;
  bool final = false;
  *n = 0;
  int rc = svc_events(svc, w->id, w->last_seq, (int)max, &arr, &last, &final, msg, msgsz);
  if (rc) return rc;
  size_t i;
  json_t *ev;
  json_array_foreach(arr, i, ev) {
    out[*n] = event_pack(ev, msg, msgsz);
    if (!out[*n]) {
      rc = TY_EINTERNAL;
      break;
    }
    (*n)++;
    w->last_seq = json_integer_value(json_object_get(ev, "seq"));
  }
  /* final: the job was final before the read, so every event it will ever
   * have was readable; a full batch may have left some for the next call. */
  *done = !rc && final && json_array_size(arr) < max;
  json_decref(arr);
  return rc;
}

static void w_resume_hint(void *state, char *msg, size_t msgsz) {
  watch_t *w = state;
  snprintf(msg, msgsz, "trainyardd is shutting down; watch again with after_seq = %lld",
           (long long)w->last_seq);
}

static void w_close(void *state) {
  free(state);
}

#define TY_PATH(m) "/trainyard.v1.Trainyard/" m
const gsrv_method_t gsvc_methods[] = {
    {.path = TY_PATH("SubmitJob"),
     .request = &trainyard__v1__submit_job_request__descriptor,
     .unary = m_submit},
    {.path = TY_PATH("ValidateJob"),
     .request = &trainyard__v1__validate_job_request__descriptor,
     .unary = m_validate},
    {.path = TY_PATH("GetJob"),
     .request = &trainyard__v1__get_job_request__descriptor,
     .unary = m_get},
    {.path = TY_PATH("ListJobs"),
     .request = &trainyard__v1__list_jobs_request__descriptor,
     .unary = m_list},
    {.path = TY_PATH("CancelJob"),
     .request = &trainyard__v1__cancel_job_request__descriptor,
     .unary = m_cancel},
    {.path = TY_PATH("DeleteJob"),
     .request = &trainyard__v1__delete_job_request__descriptor,
     .unary = m_delete},
    {.path = TY_PATH("WatchJob"),
     .request = &trainyard__v1__watch_job_request__descriptor,
     .open = w_open,
     .next = w_next,
     .resume_hint = w_resume_hint,
     .close = w_close},
};
const size_t gsvc_method_count = sizeof gsvc_methods / sizeof gsvc_methods[0];
