/* rest.c - the REST front end: THE route table, matching (404 versus 405
 * with Allow), bearer-token auth, body limits (413), request counters,
 * /healthz and /metrics; see rest.h. Job handlers live in rest_jobs.c and
 * rest_events.c. */
#include "server/rest_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "common/log.h"
#include "common/numbers.h"
#include "common/xalloc.h"
#include "db/db_obs.h"
#include "server/prom_jobs.h"
#include "server/rest_deadline.h"
#include "server/service.h"
#include "server/token.h"

/* How long shutdown waits for open event streams to end cleanly. */
#define STREAM_END_S 2.0
/* A connection silent this long is closed; event streams write at least
 * every --sse_keepalive seconds (at most 60), so they stay open. */
#define IDLE_TIMEOUT_S 120u

static enum MHD_Result h_healthz(rest_t *r, struct MHD_Connection *c, rest_req_t *q);
static enum MHD_Result h_prometheus(rest_t *r, struct MHD_Connection *c, rest_req_t *q);

/* THE route table: method, path pattern, handler, body limit, auth. */
static const rest_route_t g_routes[] = {
    {"POST", "/v1/jobs", rest_h_submit, -1, AUTH_API},
    {"GET", "/v1/jobs", rest_h_list, 0, AUTH_API},
    {"POST", "/v1/jobs:validate", rest_h_validate, -1, AUTH_API},
    {"GET", "/v1/jobs/{id}", rest_h_get, 0, AUTH_API},
    {"DELETE", "/v1/jobs/{id}", rest_h_delete, 0, AUTH_API},
    {"POST", "/v1/jobs/{id}:cancel", rest_h_cancel, 4096, AUTH_API},
    {"GET", "/v1/jobs/{id}/ranks", rest_h_ranks, 0, AUTH_API},
    {"GET", "/v1/jobs/{id}/metrics", rest_h_metrics, 0, AUTH_API},
    {"GET", "/v1/jobs/{id}/events", rest_h_events, 0, AUTH_API},
    {"GET", "/v1/jobs/{id}/ranks/{rank}/log", rest_h_log, 0, AUTH_API},
    {"POST", "/v1/internal/jobs/{id}/report", rest_h_report, 65536, AUTH_JOB},
    {"PUT", "/v1/jobs/{id}/attempts/{n}/rendezvous/{key}", rest_h_rdv_put, 65536, AUTH_JOB},
    {"GET", "/v1/jobs/{id}/attempts/{n}/rendezvous/{key}", rest_h_rdv_get, 0, AUTH_JOB},
    {"GET", "/healthz", h_healthz, 0, AUTH_NONE},
    {"GET", "/metrics", h_prometheus, 0, AUTH_API},
    {"GET", "/", rest_h_web, 0, AUTH_NONE},
    {"GET", "/assets/{file}", rest_h_web, 0, AUTH_NONE},
    {"GET", "/docs", rest_h_web, 0, AUTH_NONE},
    {"GET", "/v1/openapi.json", rest_h_web, 0, AUTH_NONE},
};
#define N_ROUTES (sizeof g_routes / sizeof g_routes[0])

/* Request counters for /metrics: per route (plus one row for requests that
 * matched none), a few distinct statuses each. Lock-free: a slot's status
 * is claimed once with a compare-and-swap, then only its count moves. */
#define STATUS_SLOTS 12
typedef struct {
  atomic_int status;
  atomic_llong count;
} status_count_t;
static status_count_t g_counts[N_ROUTES + 1][STATUS_SLOTS];

static void count_request(const rest_route_t *route, int status) {
  size_t row = route ? (size_t)(route - g_routes) : N_ROUTES;
  for (int i = 0; i < STATUS_SLOTS; i++) {
    status_count_t *sc = &g_counts[row][i];
    int seen = atomic_load_explicit(&sc->status, memory_order_acquire);
    if (seen == 0) {
      int expected = 0;
      seen = atomic_compare_exchange_strong(&sc->status, &expected, status) ? status : expected;
    }
    if (seen == status) {
      atomic_fetch_add_explicit(&sc->count, 1, memory_order_relaxed);
      return;
    }
  }
}

bool rest_route_match(const char *pattern, const char *path, char params[][128]) {
  int np = 0;
  while (*pattern) {
    if (*pattern == '{') {
      pattern = strchr(pattern, '}');
      if (!pattern) return false;
      pattern++;
      size_t len = strcspn(path, "/:");
      if (len == 0 || len >= 128 || np >= REST_MAX_PARAMS) return false;
      memcpy(params[np], path, len);
      params[np++][len] = '\0';
      path += len;
    } else if (*pattern++ != *path++) {
      return false;
    }
  }
  if (*path) return false;
  for (int i = np; i < REST_MAX_PARAMS; i++) params[i][0] = '\0';
  return true;
}

const char *rest_bearer(struct MHD_Connection *c) {
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (!h || strncasecmp(h, "Bearer ", 7)) return NULL;
  h += 7;
  while (*h == ' ') h++;
  return *h ? h : NULL;
}


enum MHD_Result rest_queue(struct MHD_Connection *c, rest_req_t *q, int status,
                           struct MHD_Response *resp) {
  q->status = status;
  MHD_add_response_header(resp, "Cache-Control", "no-store");
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static struct MHD_Response *text_response(const char *content_type, char *text /* freed */) {
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header(resp, "Content-Type", content_type);
  return resp;
}

enum MHD_Result rest_send_text(struct MHD_Connection *c, rest_req_t *q, int status,
                               const char *content_type, char *text) {
  return rest_queue(c, q, status, text_response(content_type, text));
}

/* body (consumed) as compact JSON and a newline. */
static struct MHD_Response *json_response(json_t *body) {
  char *text = ty_json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (!text) text = xstrdup("{}");
  size_t n = strlen(text);
  text = xrealloc(text, n + 2);
  text[n] = '\n';
  text[n + 1] = '\0';
  return text_response("application/json", text);
}

enum MHD_Result rest_send_json(struct MHD_Connection *c, rest_req_t *q, int status, json_t *body) {
  return rest_queue(c, q, status, json_response(body));
}

/* An error (the error model, code and message) with the HTTP status given
 * and extra headers: name, value pairs ending with NULL. */
static enum MHD_Result send_error_with(struct MHD_Connection *c, rest_req_t *q, int status,
                                       int code, const char *message, ...) {
  struct MHD_Response *resp = json_response(ty_error_json(code, message, NULL));
  va_list ap;
  va_start(ap, message);
  for (const char *name; (name = va_arg(ap, const char *));)
    MHD_add_response_header(resp, name, va_arg(ap, const char *));
  va_end(ap);
  return rest_queue(c, q, status, resp);
}

enum MHD_Result rest_send_error(struct MHD_Connection *c, rest_req_t *q, int code,
                                const char *message, const ty_errlist_t *details) {
  return rest_send_json(c, q, ty_err_http_status(code), ty_error_json(code, message, details));
}

/* A body over its limit: RESOURCE_EXHAUSTED is the code, and 413 (not the
 * code's usual 429) says which resource. */
static enum MHD_Result send_too_large(struct MHD_Connection *c, rest_req_t *q, const char *msg) {
  return send_error_with(c, q, MHD_HTTP_CONTENT_TOO_LARGE, TY_EEXHAUSTED, msg, NULL);
}

bool rest_query_int(struct MHD_Connection *c, const char *name, int64_t min, int64_t max,
                    int64_t *out, ty_errlist_t *errs) {
  const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
  if (!v) return true;
  long x;
  if (!ty_parse_long(v, (long)min, (long)max, &x)) {
    ty_errlist_add(errs, name, "must be an integer between %lld and %lld, got '%s'",
                   (long long)min, (long long)max, v);
    return false;
  }
  *out = x;
  return true;
}

/* Whether method may use route (HEAD wherever GET may). */
static bool method_ok(const rest_route_t *route, const char *method) {
  return !strcmp(method, route->method) ||
         (!strcmp(method, "HEAD") && !strcmp(route->method, "GET"));
}

/* No route has this method and path: 404 when no route has the path, else
 * 405 with the methods it has in Allow. */
static enum MHD_Result no_route(struct MHD_Connection *c, rest_req_t *q, const char *url,
                                const char *method) {
  char allow[128] = "";
  for (size_t i = 0; i < N_ROUTES; i++) {
    char params[REST_MAX_PARAMS][128];
    if (!rest_route_match(g_routes[i].pattern, url, params) || strstr(allow, g_routes[i].method))
      continue;
    if (*allow) strcat(allow, ", ");
    strcat(allow, g_routes[i].method);
    if (!strcmp(g_routes[i].method, "GET")) strcat(allow, ", HEAD");
  }
  if (!*allow) {
    char msg[300];
    snprintf(msg, sizeof msg, "no such resource: %.200s (the API lives under /v1)", url);
    return rest_send_error(c, q, TY_ENOTFOUND, msg, NULL);
  }
  char msg[300];
  snprintf(msg, sizeof msg, "%s is not allowed on %.200s; allowed: %s", method, url, allow);
  return send_error_with(c, q, MHD_HTTP_METHOD_NOT_ALLOWED, TY_EUNIMPLEMENTED, msg, "Allow", allow,
                         NULL);
}

typedef struct {
  char *name; /* the first argument found with a NUL byte */
  size_t size;
  bool found;
} nul_find_t;

static enum MHD_Result nul_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                               const char *value, size_t value_size) {
  (void)kind;
  nul_find_t *f = cls;
  if ((key && (strlen(key) != key_size || strstr(key, "%00"))) ||
      (value && (strlen(value) != value_size || strstr(value, "%00")))) {
    snprintf(f->name, f->size, "%.*s", (int)strnlen(key ? key : "", 48), key ? key : "");
    f->found = true;
    return MHD_NO;
  }
  return MHD_YES;
}

/* Whether a query argument's name or value holds a NUL byte (left as "%00"
 * by unescape below; "state=%00" would read as no filter at all); name
 * receives it. */
static bool query_has_nul(struct MHD_Connection *c, char *name, size_t size) {
  name[0] = '\0';
  nul_find_t f = {name, size, false};
  MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND, nul_arg, &f);
  return f.found;
}

static int hexval(char ch) {
  return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch - 'A' + 10;
}

/* Percent-decoding of the path and the query (MHD_OPTION_UNESCAPE_CALLBACK),
 * as libmicrohttpd's own except that "%00" stays as it is: decoded, the NUL
 * would cut a job id short without a word ("/v1/jobs/<id>%00x" would be
 * <id>); first_call refuses it instead. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
  (void)cls;
  (void)c;
  if (!strstr(s, "%00")) return MHD_http_unescape(s);
  char *w = s;
  for (const char *p = s; *p;) {
    if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2]) &&
        (p[1] != '0' || p[2] != '0')) {
      *w++ = (char)(hexval(p[1]) * 16 + hexval(p[2]));
      p += 3;
    } else {
      *w++ = *p++;
    }
  }
  *w = '\0';
  return (size_t)(w - s);
}

/* The first call of a request: route, auth and Content-Length checks. An
 * error is queued at once (MHD then skips the body). */
static enum MHD_Result first_call(rest_t *r, struct MHD_Connection *c, rest_req_t *q,
                                  const char *url, const char *method) {
  if (strstr(url, "%00")) {
    ty_errlist_t errs = TY_ERRLIST_INIT;
    ty_errlist_add(&errs, "path", "holds a NUL byte (%%00); no value of this API may hold one");
    enum MHD_Result ret = rest_send_error(c, q, TY_EINVAL, "invalid path", &errs);
    ty_errlist_clear(&errs);
    return ret;
  }
  for (size_t i = 0; i < N_ROUTES && !q->route; i++)
    if (method_ok(&g_routes[i], method) && rest_route_match(g_routes[i].pattern, url, q->params))
      q->route = &g_routes[i];
  if (!q->route) return no_route(c, q, url, method);
  if (q->route->auth == AUTH_API && token_required(r->cfg->tokens)) {
    const char *tok = rest_bearer(c);
    if (!tok || !token_listed(r->cfg->tokens, tok))
      return send_error_with(c, q, MHD_HTTP_UNAUTHORIZED, TY_EUNAUTHENTICATED,
                             tok ? "the bearer token is not valid for this server"
                                 : "this server needs 'Authorization: Bearer <token>'",
                             "WWW-Authenticate", "Bearer realm=\"trainyard\"", NULL);
  }
  char bad[64];
  if (query_has_nul(c, bad, sizeof bad)) {
    ty_errlist_t errs = TY_ERRLIST_INIT;
    ty_errlist_add(&errs, bad, "holds a NUL byte (%%00); no value of this API may hold one");
    enum MHD_Result ret = rest_send_error(c, q, TY_EINVAL, "invalid query string", &errs);
    ty_errlist_clear(&errs);
    return ret;
  }
  int64_t limit = q->route->body_limit < 0 ? r->cfg->max_body : q->route->body_limit;
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
  if (cl && strtoll(cl, NULL, 10) > limit) {
    char msg[200];
    snprintf(msg, sizeof msg, "the request body (%s bytes) is over this route's limit of %lld bytes",
             cl, (long long)limit);
    return send_too_large(c, q, msg);
  }
  return MHD_YES;
}

/* Connections past --max_connections get a 429 instead of a silent close:
 * MHD itself accepts a margin more (see rest_start). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  rest_t *r = cls;
  atomic_fetch_add(&r->connections, code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    *socket_ctx = ci ? rdl_opened(r->deadlines, ci->connect_fd) : NULL;
  } else {
    rdl_closed(r->deadlines, *socket_ctx);
    *socket_ctx = NULL;
  }
}

/* The connection's deadline handle (rest_deadline.h), or NULL. */
static rdl_conn_t *conn_deadline(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

static enum MHD_Result too_many(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  char msg[160];
  snprintf(msg, sizeof msg,
           "this server holds its limit of %lld connections; retry later or close idle ones",
           (long long)r->cfg->max_connections);
  return send_error_with(c, q, MHD_HTTP_TOO_MANY_REQUESTS, TY_EEXHAUSTED, msg, "Retry-After", "1",
                         "Connection", "close", NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  rest_t *r = cls;
  rest_req_t *q = *con_cls;
  if (!q) {
    q = xcalloc(1, sizeof *q);
    *con_cls = q;
    if (atomic_load(&r->connections) > r->cfg->max_connections) return too_many(r, c, q);
    return first_call(r, c, q, url, method);
  }
  if (q->status) return MHD_YES; /* an early error is queued; the body is dropped */
  if (*upload_data_size) {
    int64_t limit = q->route->body_limit < 0 ? r->cfg->max_body : q->route->body_limit;
    if (!q->body_too_big && (int64_t)(q->body_len + *upload_data_size) <= limit) {
      q->body = xrealloc(q->body, q->body_len + *upload_data_size + 1);
      memcpy(q->body + q->body_len, upload_data, *upload_data_size);
      q->body_len += *upload_data_size;
      q->body[q->body_len] = '\0';
    } else {
      q->body_too_big = true;
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (q->body_too_big) {
    char msg[160];
    snprintf(msg, sizeof msg, "the request body is over this route's limit of %lld bytes",
             (long long)(q->route->body_limit < 0 ? r->cfg->max_body : q->route->body_limit));
    return send_too_large(c, q, msg);
  }
  rdl_answering(r->deadlines, conn_deadline(c)); /* read whole in time */
  return q->route->fn(r, c, q);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  rest_t *r = cls;
  rdl_answered(r->deadlines, conn_deadline(c));
  rest_req_t *q = *con_cls;
  if (!q) return;
  count_request(q->route, q->status ? q->status : 500);
  free(q->body);
  if (q->ctx_free)
    q->ctx_free(q->ctx);
  else
    free(q->ctx);
  free(q);
  *con_cls = NULL;
}

static enum MHD_Result h_healthz(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  svc_stats_t st;
  if (svc_stats(r->svc, &st))
    return rest_send_error(c, q, TY_EUNAVAILABLE, "the database cannot be read", NULL);
  char why[1024];
  if (!svc_health(r->svc, why, sizeof why))
    return rest_send_error(c, q, TY_EUNAVAILABLE, why, NULL);
  return rest_send_json(c, q, 200, json_pack("{s:s, s:i}", "status", "ok", "schema_version",
                                             db_schema_version()));
}

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < *cap - *len) {
      *len += (size_t)n;
      return;
    }
    *cap = *cap * 2 + (size_t)(n > 0 ? n : 0);
    *buf = xrealloc(*buf, *cap);
  }
}

static enum MHD_Result h_prometheus(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  svc_stats_t st;
  if (svc_stats(r->svc, &st))
    return rest_send_error(c, q, TY_EUNAVAILABLE, "the database cannot be read", NULL);
  size_t len = 0, cap = 4096;
  char *b = xmalloc(cap);
  b[0] = '\0';
  append(&b, &len, &cap, "# HELP trainyard_jobs Jobs by state.\n# TYPE trainyard_jobs gauge\n");
  for (int s = 0; s < DB_JOB_STATE_COUNT; s++)
    append(&b, &len, &cap, "trainyard_jobs{state=\"%s\"} %lld\n", db_state_name(s),
           (long long)st.jobs[s]);
  append(&b, &len, &cap,
         "# HELP trainyard_ranks_running Rank processes running now.\n"
         "# TYPE trainyard_ranks_running gauge\ntrainyard_ranks_running %lld\n"
         "# HELP trainyard_reports_ingested_total Progress reports accepted.\n"
         "# TYPE trainyard_reports_ingested_total counter\n"
         "trainyard_reports_ingested_total %lld\n"
         "# HELP trainyard_reports_rejected_total Progress reports refused.\n"
         "# TYPE trainyard_reports_rejected_total counter\n"
         "trainyard_reports_rejected_total %lld\n"
         "# HELP trainyard_http_connections Open REST client connections.\n"
         "# TYPE trainyard_http_connections gauge\ntrainyard_http_connections %d\n"
         "# HELP trainyard_event_streams Open event streams (Server-Sent Events).\n"
         "# TYPE trainyard_event_streams gauge\ntrainyard_event_streams %d\n"
         "# HELP trainyard_http_requests_total HTTP requests by route and status.\n"
         "# TYPE trainyard_http_requests_total counter\n",
         (long long)st.ranks_running, (long long)st.reports_ingested,
         (long long)st.reports_rejected, atomic_load(&r->connections), atomic_load(&r->sse_open));
  for (size_t i = 0; i <= N_ROUTES; i++)
    for (int k = 0; k < STATUS_SLOTS; k++) {
      int status = atomic_load_explicit(&g_counts[i][k].status, memory_order_acquire);
      if (!status) break;
      append(&b, &len, &cap, "trainyard_http_requests_total{route=\"%s %s\",status=\"%d\"} %lld\n",
             i < N_ROUTES ? g_routes[i].method : "", i < N_ROUTES ? g_routes[i].pattern : "other",
             status, (long long)atomic_load_explicit(&g_counts[i][k].count, memory_order_relaxed));
    }
  db_rank_figures_t *ranks = NULL;
  size_t nranks = 0;
  if (db_rank_figures(svc_db(r->svc), NULL, &ranks, &nranks) == 0) {
    char *jobs = prom_jobs_text(ranks, nranks, db_now());
    append(&b, &len, &cap, "%s", jobs);
    free(jobs);
  }
  free(ranks);
  return rest_send_text(c, q, 200, "text/plain; version=0.0.4", b);
}

__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt,
                                                          va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = '\0';
  ty_warn("http: %s", msg);
}

/* Parses "host:port" / "[v6]:port" into a socket address. */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, bool *v6, char *msg,
                        size_t msgsz) {
  char host[256];
  const char *port;
  if (listen[0] == '[') {
    const char *end = strchr(listen, ']');
    if (!end || end[1] != ':') goto bad;
    snprintf(host, sizeof host, "%.*s", (int)(end - listen - 1), listen + 1);
    port = end + 2;
  } else {
    const char *colon = strrchr(listen, ':');
    if (!colon) goto bad;
    snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
    port = colon + 1;
  }
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  if (getaddrinfo(host, port, &hints, &res) || !res) goto bad;
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *v6 = res->ai_family == AF_INET6;
  freeaddrinfo(res);
  return 0;
bad:
  snprintf(msg, msgsz, "listen address '%s' is not host:port (e.g. 127.0.0.1:8080)", listen);
  return TY_EINVAL;
}

int rest_start(svc_t *svc, const srv_config_t *cfg, rest_t **out, int *port, char *msg,
               size_t msgsz) {
  struct sockaddr_storage ss;
  bool v6;
  int rc = parse_listen(cfg->listen, &ss, &v6, msg, msgsz);
  if (rc) return rc;
  rest_t *r = xcalloc(1, sizeof *r);
  r->svc = svc;
  r->cfg = cfg;
  /* The connection's memory pool holds the request head; twice the head
   * limit leaves room for MHD's own bookkeeping. */
  size_t mem = (size_t)cfg->max_header * 2;
  if (mem < 32768) mem = 32768;
  /* A pool of epoll threads, each serving many connections; no handler
   * blocks (event streams suspend their connection while idle). */
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TURBO |
                   MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  if (!(r->deadlines = rdl_start(cfg->request_timeout))) {
    snprintf(msg, msgsz, "cannot start the request deadline thread");
    free(r);
    return TY_EINTERNAL;
  }
  if (rest_events_start(r)) {
    snprintf(msg, msgsz, "cannot start the event stream thread");
    rdl_stop(r->deadlines);
    free(r);
    return TY_EINTERNAL;
  }
  if (rest_rdv_start(r)) {
    snprintf(msg, msgsz, "cannot start the rendezvous thread");
    atomic_store(&r->stopping, true);
    rest_events_release(r, 0);
    rest_events_join(r);
    rdl_stop(r->deadlines);
    free(r);
    return TY_EINTERNAL;
  }
  r->mhd = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, r, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, r,
      MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->http_threads, MHD_OPTION_SOCK_ADDR, &ss,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, mem, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)cfg->max_connections + 64, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)cfg->max_connections_per_ip, MHD_OPTION_NOTIFY_CONNECTION, on_connection, r,
      MHD_OPTION_CONNECTION_TIMEOUT, IDLE_TIMEOUT_S, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, r, MHD_OPTION_END);
  if (!r->mhd) {
    snprintf(msg, msgsz, "cannot listen on %s (address in use, or not this host's?)",
             cfg->listen);
    atomic_store(&r->stopping, true);
    rest_events_release(r, 0);
    rest_events_join(r);
    rest_rdv_release(r);
    rest_rdv_join(r);
    rdl_stop(r->deadlines);
    free(r);
    return TY_EUNAVAILABLE;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(r->mhd, MHD_DAEMON_INFO_BIND_PORT);
  *port = info ? info->port : 0;
  *out = r;
  return 0;
}

void rest_stop(rest_t *r) {
  if (!r) return;
  atomic_store(&r->stopping, true);
  rest_events_release(r, STREAM_END_S);
  rest_rdv_release(r);
  MHD_stop_daemon(r->mhd);
  rest_events_join(r);
  rest_rdv_join(r);
  rdl_stop(r->deadlines); /* after the daemon: every connection has closed */
  free(r);
}
