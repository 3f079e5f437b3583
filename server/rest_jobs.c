/* rest_jobs.c - REST handlers for jobs and the internal report endpoint:
 * decode the request, call server/service, encode the answer. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/json_util.h"
#include "common/numbers.h"
#include "common/xalloc.h"
#include "server/rest_internal.h"
#include "server/service.h"
#include "server/thin.h"

#define MSG_MAX 512
/* The most points per rank one metrics answer may ask for. */
#define METRICS_MAX_POINTS 1000000

/* Parses the request body as a job spec; false when it is not one (errs
 * holds why). */
static bool body_spec(rest_req_t *q, jobspec_t *spec, ty_errlist_t *errs) {
  jobspec_init(spec);
  if (!q->body || !q->body_len) {
    ty_errlist_add(errs, "", "the request body must be a JSON job spec (DESIGN.md \"Job spec\")");
    return false;
  }
  return jobspec_parse_json(spec, q->body, q->body_len, errs) == 0 && errs->len == 0;
}

static enum MHD_Result send_rc(struct MHD_Connection *c, rest_req_t *q, int rc, const char *msg,
                               const ty_errlist_t *errs) {
  return rest_send_error(c, q, rc, *msg ? msg : NULL, errs);
}

enum MHD_Result rest_h_submit(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  jobspec_t spec;
  enum MHD_Result ret;
  if (!body_spec(q, &spec, &errs)) {
    ret = rest_send_error(c, q, TY_EINVAL, "the job spec is invalid (see details)", &errs);
    ty_errlist_clear(&errs);
    return ret;
  }
  const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
  db_job_t *job = NULL;
  bool created = false;
  char msg[MSG_MAX] = "";
  int rc = svc_submit(r->svc, &spec, key, &job, &created, &errs, msg, sizeof msg);
  if (rc) {
    ret = send_rc(c, q, rc, msg, &errs);
  } else {
    char location[128];
    snprintf(location, sizeof location, "/v1/jobs/%s", job->id);
    json_t *body = svc_job_view(r->svc, job);
    char *text = ty_json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Location", location);
    /* 201 for a new job; 200 when an Idempotency-Key replay found it. */
    ret = rest_queue(c, q, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, resp);
  }
  db_job_free(job);
  ty_errlist_clear(&errs);
  return ret;
}

enum MHD_Result rest_h_validate(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  jobspec_t spec;
  enum MHD_Result ret;
  char msg[MSG_MAX] = "";
  if (!body_spec(q, &spec, &errs)) {
    ret = rest_send_error(c, q, TY_EINVAL, "the job spec is invalid (see details)", &errs);
  } else if (svc_validate(r->svc, &spec, &errs, msg, sizeof msg)) {
    ret = send_rc(c, q, TY_EINVAL, msg, &errs);
  } else {
    ret = rest_send_json(c, q, 200,
                         json_pack("{s:b, s:o}", "valid", 1, "spec", jobspec_to_json(&spec)));
  }
  ty_errlist_clear(&errs);
  return ret;
}

enum MHD_Result rest_h_list(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int64_t page_size = 0;
  /* 0, as unset, asks for the default page: as gRPC's page_size does. */
  rest_query_int(c, "page_size", 0, r->cfg->page_max, &page_size, &errs);
  const char *states = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "state");
  const char *token = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "page_token");
  db_job_t **jobs = NULL;
  size_t n = 0;
  char *next = NULL;
  char msg[MSG_MAX] = "";
  enum MHD_Result ret;
  int rc = errs.len ? TY_EINVAL
                    : svc_list(r->svc, states, page_size, token, &jobs, &n, &next, &errs, msg,
                               sizeof msg);
  if (rc) {
    ret = send_rc(c, q, rc, *msg ? msg : "invalid list request (see details)", &errs);
  } else {
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, svc_job_view(r->svc, jobs[i]));
    json_t *body = json_pack("{s:o}", "jobs", arr);
    json_object_set_new(body, "next_page_token", next ? json_string(next) : json_null());
    ret = rest_send_json(c, q, 200, body);
  }
  db_jobs_free(jobs, n);
  free(next);
  ty_errlist_clear(&errs);
  return ret;
}

enum MHD_Result rest_h_get(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  char *text;
  size_t len;
  char msg[MSG_MAX] = "";
  int rc = svc_get_text(r->svc, q->params[0], &text, &len, msg, sizeof msg);
  if (rc) return send_rc(c, q, rc, msg, NULL);
  return rest_send_text(c, q, 200, "application/json", text);
}

enum MHD_Result rest_h_cancel(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  json_t *o = NULL;
  const char *reason = NULL;
  if (q->body_len) {
    json_error_t jerr;
    o = json_loadb(q->body, q->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(o)) {
      ty_errlist_add(&errs, "", "the body, when given, is {\"reason\": \"...\"}");
    } else {
      const char *key;
      json_t *v;
      json_object_foreach(o, key, v) {
        if (!strcmp(key, "reason") && (json_is_string(v) || json_is_null(v)))
          reason = json_string_value(v);
        else if (!strcmp(key, "reason"))
          ty_errlist_add(&errs, "reason", "must be a string (why the job is cancelled)");
        else
          ty_errlist_add(&errs, key, "unknown field; the body is {\"reason\": \"...\"}");
      }
    }
  }
  db_job_t *job = NULL;
  char msg[MSG_MAX] = "";
  int rc = TY_EINVAL;
  if (errs.len)
    snprintf(msg, sizeof msg, "invalid cancel request");
  else
    rc = svc_cancel(r->svc, q->params[0], reason, &job, &errs, msg, sizeof msg);
  json_decref(o);
  enum MHD_Result ret =
      rc ? send_rc(c, q, rc, msg, &errs) : rest_send_json(c, q, 200, svc_job_view(r->svc, job));
  ty_errlist_clear(&errs);
  db_job_free(job);
  return ret;
}

/* DELETE /v1/jobs/{id}: 200 with the job as it was. */
enum MHD_Result rest_h_delete(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  db_job_t *job = NULL;
  char msg[MSG_MAX] = "";
  int rc = svc_delete(r->svc, q->params[0], &job, msg, sizeof msg);
  enum MHD_Result ret =
      rc ? send_rc(c, q, rc, msg, NULL) : rest_send_json(c, q, 200, svc_job_view(r->svc, job));
  db_job_free(job);
  return ret;
}

/* GET of one view of a job's attempt (?attempt=N, default the latest):
 * the ranks table or the metric series, as the service renders them. */
typedef int (*attempt_view_fn)(svc_t *s, const char *id, int attempt, json_t **out, char *msg,
                               size_t msgsz);

static enum MHD_Result send_attempt_view(rest_t *r, struct MHD_Connection *c, rest_req_t *q,
                                         attempt_view_fn view) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int64_t attempt = 0;
  enum MHD_Result ret;
  if (!rest_query_int(c, "attempt", 1, 1000000, &attempt, &errs)) {
    ret = rest_send_error(c, q, TY_EINVAL, "invalid attempt", &errs);
  } else {
    json_t *out;
    char msg[MSG_MAX] = "";
    int rc = view(r->svc, q->params[0], (int)attempt, &out, msg, sizeof msg);
    ret = rc ? send_rc(c, q, rc, msg, NULL) : rest_send_json(c, q, 200, out);
  }
  ty_errlist_clear(&errs);
  return ret;
}

enum MHD_Result rest_h_ranks(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  return send_attempt_view(r, c, q, svc_ranks);
}

/* GET /v1/jobs/{id}/metrics?attempt&from_step&to_step&max_points. */
enum MHD_Result rest_h_metrics(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int64_t attempt = 0, from = 0, to = INT64_MAX, max_points = 0;
  bool ok = rest_query_int(c, "attempt", 1, 1000000, &attempt, &errs);
  ok &= rest_query_int(c, "from_step", 0, INT64_MAX, &from, &errs);
  ok &= rest_query_int(c, "to_step", 0, INT64_MAX, &to, &errs);
  ok &= rest_query_int(c, "max_points", THIN_MIN_POINTS, METRICS_MAX_POINTS, &max_points, &errs);
  if (ok && to < from) {
    ty_errlist_add(&errs, "to_step", "must not be below from_step (%lld), got %lld",
                   (long long)from, (long long)to);
    ok = false;
  }
  enum MHD_Result ret;
  if (!ok) {
    ret = rest_send_error(c, q, TY_EINVAL, "invalid metrics request (see details)", &errs);
  } else {
    json_t *out;
    char msg[MSG_MAX] = "";
    int rc = svc_metrics_range(r->svc, q->params[0], (int)attempt, from, to, max_points, &out, msg,
                               sizeof msg);
    ret = rc ? send_rc(c, q, rc, msg, NULL) : rest_send_json(c, q, 200, out);
  }
  ty_errlist_clear(&errs);
  return ret;
}

enum MHD_Result rest_h_log(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int64_t attempt = 0;
  long rank = 0;
  if (!ty_parse_long(q->params[1], 0, 1000000, &rank))
    ty_errlist_add(&errs, "rank", "must be a rank number, got '%s'", q->params[1]);
  rest_query_int(c, "attempt", 1, 1000000, &attempt, &errs);
  /* A part of the log: from byte offset (to follow it), or its last tail
   * bytes (to show its end); the whole log by default. */
  int64_t offset = -1, tail = -1;
  rest_query_int(c, "offset", 0, INT64_MAX, &offset, &errs);
  rest_query_int(c, "tail", 1, INT64_MAX, &tail, &errs);
  if (offset >= 0 && tail > 0)
    ty_errlist_add(&errs, "tail", "give offset (bytes from there) or tail (the last bytes), "
                   "not both");
  enum MHD_Result ret;
  if (errs.len) {
    ret = rest_send_error(c, q, TY_EINVAL, "invalid log request", &errs);
    ty_errlist_clear(&errs);
    return ret;
  }
  char *path = NULL;
  char msg[MSG_MAX] = "";
  int rc = svc_log_path(r->svc, q->params[0], (int)attempt, (int)rank, &path, msg, sizeof msg);
  if (rc) return send_rc(c, q, rc, msg, NULL);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    if (fd >= 0) close(fd);
    snprintf(msg, sizeof msg, "the log of rank %ld is gone from the server's state directory",
             rank);
    free(path);
    return rest_send_error(c, q, TY_ENOTFOUND, msg, NULL);
  }
  free(path);
  /* MHD owns fd from here and sends [start, end) of the file as it is now;
   * X-Log-End is where a client following the log asks from next. */
  int64_t end_at = st.st_size, start = 0;
  if (offset >= 0) start = offset < end_at ? offset : end_at;
  if (tail > 0) start = tail < end_at ? end_at - tail : 0;
  struct MHD_Response *resp =
      MHD_create_response_from_fd_at_offset64((uint64_t)(end_at - start), fd, (uint64_t)start);
  char num[32];
  snprintf(num, sizeof num, "%lld", (long long)start);
  MHD_add_response_header(resp, "X-Log-Start", num);
  snprintf(num, sizeof num, "%lld", (long long)end_at);
  MHD_add_response_header(resp, "X-Log-End", num);
  MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
  return rest_queue(c, q, 200, resp);
}

enum MHD_Result rest_h_report(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  json_error_t jerr;
  json_t *o = q->body_len ? json_loadb(q->body, q->body_len, 0, &jerr) : NULL;
  char msg[MSG_MAX] = "";
  /* A body that is not JSON reaches the service as NULL, which checks the
   * token before it says so. */
  int rc = svc_report(r->svc, q->params[0], rest_bearer(c), o, &errs, msg, sizeof msg);
  json_decref(o);
  enum MHD_Result ret;
  if (rc) {
    ret = send_rc(c, q, rc, msg, &errs);
  } else {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    ret = rest_queue(c, q, MHD_HTTP_NO_CONTENT, resp);
  }
  ty_errlist_clear(&errs);
  return ret;
}
