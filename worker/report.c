/* report.c - progress reports to the server (libcurl) or stdout, and the
 * human-readable line on stderr; see report.h. */
#include "worker/report.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "api/errors.h"
#include "common/json_util.h"

#define TIMEOUT_MS 3000L

static struct {
  char job_id[128];
  int attempt, rank, world_size;
  char *url;
  struct curl_slist *headers;
  CURL *curl;
} g_rep;

/* The server's answer is not needed (the status says it all); without this
 * libcurl would print it on stdout. */
static size_t discard(char *p, size_t size, size_t n, void *ctx) {
  (void)p;
  (void)ctx;
  return size * n;
}

int report_open(const worker_env_t *e) {
  report_close();
  snprintf(g_rep.job_id, sizeof g_rep.job_id, "%s", e->job_id);
  g_rep.attempt = e->attempt, g_rep.rank = e->rank, g_rep.world_size = e->world_size;
  const char *url = getenv("TRAINYARD_REPORT_URL");
  if (url && *url) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    g_rep.url = strdup(url);
    g_rep.curl = curl_easy_init();
    if (!g_rep.url || !g_rep.curl) return TY_EUNAVAILABLE;
    g_rep.headers = curl_slist_append(NULL, "Content-Type: application/json");
    const char *tok = getenv("TRAINYARD_TOKEN");
    if (tok && *tok) {
      char auth[512];
      snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
      g_rep.headers = curl_slist_append(g_rep.headers, auth);
    }
  }
  return 0;
}

void report_close(void) {
  if (g_rep.curl) curl_easy_cleanup(g_rep.curl);
  curl_slist_free_all(g_rep.headers);
  free(g_rep.url);
  memset(&g_rep, 0, sizeof g_rep);
}

static json_t *report_json(const report_t *r) {
  return json_pack(
      "{s:s, s:i, s:i, s:i, s:s, s:I, s:I, s:o, s:f, s:I, s:I, s:I, s:I, s:f, s:s}", "job_id",
      g_rep.job_id, "attempt", g_rep.attempt, "rank", g_rep.rank, "world_size",
      g_rep.world_size, "phase", r->phase ? r->phase : "starting", "step", (json_int_t)r->step,
      "total_steps", (json_int_t)r->total_steps, "loss",
      isfinite(r->loss) ? json_real(r->loss) : json_null(), "tokens_per_s",
      isfinite(r->tokens_per_s) ? r->tokens_per_s : 0.0, "bytes_loaded",
      (json_int_t)r->bytes_loaded, "bytes_total", (json_int_t)r->bytes_total,
      "host_peak_bytes", (json_int_t)r->host_peak_bytes, "device_peak_bytes",
      (json_int_t)r->device_peak_bytes, "load_seconds",
      isfinite(r->load_seconds) ? r->load_seconds : 0.0, "message",
      r->message ? r->message : "");
}

/* The line of DESIGN.md "Progress" on stderr. */
static void human_line(const report_t *r) {
  const double mib = 1024.0 * 1024.0;
  const char *ph = r->phase ? r->phase : "starting";
  char head[64];
  snprintf(head, sizeof head, "[rank %d/%d]", g_rep.rank, g_rep.world_size);
  if (!strcmp(ph, "loading"))
    fprintf(stderr, "%s load  %.1f/%.1f MiB  host-peak %.0f MiB\n", head, r->bytes_loaded / mib,
            r->bytes_total / mib, r->host_peak_bytes / mib);
  else if (!strcmp(ph, "training") && isfinite(r->loss))
    fprintf(stderr, "%s train step %lld/%lld loss %.3f  %.0f tok/s  host-peak %.0f MiB\n", head,
            (long long)r->step, (long long)r->total_steps, r->loss, r->tokens_per_s,
            r->host_peak_bytes / mib);
  else if (!strcmp(ph, "training"))
    fprintf(stderr, "%s train step %lld/%lld  %.0f tok/s  host-peak %.0f MiB\n", head,
            (long long)r->step, (long long)r->total_steps, r->tokens_per_s,
            r->host_peak_bytes / mib);
  else
    fprintf(stderr, "%s %s%s%s  host-peak %.0f MiB\n", head, ph,
            r->message && *r->message ? ": " : "", r->message ? r->message : "",
            r->host_peak_bytes / mib);
}

int report_send(const report_t *r) {
  human_line(r);
  json_t *o = report_json(r);
  char *text = ty_json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!text) return TY_EINTERNAL;
  int rc = 0;
  if (!g_rep.curl) {
    printf("%s\n", text);
    fflush(stdout);
  } else {
    curl_easy_setopt(g_rep.curl, CURLOPT_URL, g_rep.url);
    curl_easy_setopt(g_rep.curl, CURLOPT_HTTPHEADER, g_rep.headers);
    curl_easy_setopt(g_rep.curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(g_rep.curl, CURLOPT_TIMEOUT_MS, TIMEOUT_MS);
    curl_easy_setopt(g_rep.curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(g_rep.curl, CURLOPT_WRITEFUNCTION, discard);
    CURLcode cc = curl_easy_perform(g_rep.curl);
    long status = 0;
    if (cc == CURLE_OK) curl_easy_getinfo(g_rep.curl, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK)
      rc = TY_EUNAVAILABLE;
    else if (status == 412 || status == 409)
      rc = TY_EPRECONDITION;
    else if (status < 200 || status >= 300)
      rc = TY_EUNAVAILABLE;
  }
  free(text);
  return rc;
}
