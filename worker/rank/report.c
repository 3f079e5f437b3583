/* report.c - progress reports to the server (libcurl) or stdout, the
 * human-readable line on stderr, and the heartbeat that repeats the last
 * report while the rank is busy; see report.h. */
#include "worker/rank/report.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "common/errors.h"
#include "common/clock.h"
#include "common/json_util.h"
#include "common/rankenv.h"
#include "common/xalloc.h"

#define TIMEOUT_MS 3000L
/* Reports kept while the server cannot be reached (a restart of
 * trainyardd): the oldest dropped past this many. */
#define BACKLOG_MAX 4096
/* Kept reports sent at most per send or heartbeat, so that neither blocks
 * long; the heartbeat sends the rest. */
#define FLUSH_MAX 256

static struct {
  char job_id[128];
  int attempt, rank, world_size;
  char *url;
  struct curl_slist *headers;
  CURL *curl;
  /* The heartbeat (URL mode, heartbeat_ms > 0): a thread that sends the
   * last report again once nothing was sent for heartbeat_ms. */
  long heartbeat_ms;
  bool beating, closing;
  pthread_t beat;
  bool over;         /* the server answered that this attempt is over */
  char *last;        /* the last report's JSON text, owned; NULL before one */
  long long sent_ms; /* ty_mono_ms() of the last send */
  /* Reports that did not get through, oldest first (a ring of owned
   * texts): sent, in order, before any newer one once the server answers
   * again, so that its curves have no gap. */
  char *backlog[BACKLOG_MAX];
  int bl_head, bl_n;
  long bl_dropped; /* the oldest dropped from a full backlog */
} g_rep;

/* g_rep's sends and heartbeat fields are used under g_lock: a report and a
 * heartbeat never go at once, so the server sees them in order. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wake; /* report_close wakes the heartbeat; CLOCK_MONOTONIC */

/* The server's answer is not needed (the status says it all); without this
 * libcurl would print it on stdout. */
static size_t discard(char *p, size_t size, size_t n, void *ctx) {
  (void)p;
  (void)ctx;
  return size * n;
}

/* POSTs text to the server (under g_lock). 0; TY_EPRECONDITION (the
 * attempt is over); TY_EUNAVAILABLE (no answer, or a server error: worth
 * sending again) or TY_EINVAL (refused: sending it again would not help). */
static int post_locked(const char *text) {
  curl_easy_setopt(g_rep.curl, CURLOPT_URL, g_rep.url);
  curl_easy_setopt(g_rep.curl, CURLOPT_HTTPHEADER, g_rep.headers);
  curl_easy_setopt(g_rep.curl, CURLOPT_POSTFIELDS, text);
  curl_easy_setopt(g_rep.curl, CURLOPT_TIMEOUT_MS, TIMEOUT_MS);
  curl_easy_setopt(g_rep.curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(g_rep.curl, CURLOPT_WRITEFUNCTION, discard);
  CURLcode cc = curl_easy_perform(g_rep.curl);
  long status = 0;
  if (cc == CURLE_OK) curl_easy_getinfo(g_rep.curl, CURLINFO_RESPONSE_CODE, &status);
  g_rep.sent_ms = ty_mono_ms();
  if (cc != CURLE_OK) return TY_EUNAVAILABLE;
  if (status == 412 || status == 409) {
    g_rep.over = true;
    return TY_EPRECONDITION;
  }
  if (status >= 200 && status < 300) return 0;
  return status >= 400 && status < 500 && status != 408 && status != 429 ? TY_EINVAL
                                                                         : TY_EUNAVAILABLE;
}

/* Keeps text (owned) at the backlog's end, dropping the oldest when full. */
static void backlog_push(char *text) {
  if (g_rep.bl_n == BACKLOG_MAX) {
    free(g_rep.backlog[g_rep.bl_head]);
    g_rep.bl_head = (g_rep.bl_head + 1) % BACKLOG_MAX;
    g_rep.bl_n--;
    if (g_rep.bl_dropped++ == 0)
      fprintf(stderr,
              "[rank %d/%d] the server has been unreachable for %d reports: the oldest "
              "are dropped\n",
              g_rep.rank, g_rep.world_size, BACKLOG_MAX);
  }
  g_rep.backlog[(g_rep.bl_head + g_rep.bl_n) % BACKLOG_MAX] = text;
  g_rep.bl_n++;
}

static void backlog_clear(void) {
  for (; g_rep.bl_n; g_rep.bl_n--, g_rep.bl_head = (g_rep.bl_head + 1) % BACKLOG_MAX)
    free(g_rep.backlog[g_rep.bl_head]);
  g_rep.bl_head = 0;
}

/* Sends up to FLUSH_MAX kept reports, oldest first (under g_lock): 0 when
 * they went or were refused (some may be left), else post_locked's
 * failure, the rest kept (or dropped when the attempt is over). */
static int backlog_flush_locked(void) {
  for (int k = 0; k < FLUSH_MAX && g_rep.bl_n; k++) {
    int rc = post_locked(g_rep.backlog[g_rep.bl_head]);
    if (rc == TY_EPRECONDITION) backlog_clear();
    if (rc && rc != TY_EINVAL) return rc;
    free(g_rep.backlog[g_rep.bl_head]);
    g_rep.bl_head = (g_rep.bl_head + 1) % BACKLOG_MAX;
    g_rep.bl_n--;
  }
  return 0;
}

/* The heartbeat thread: while the rank computes (a long load, a long step)
 * it sends the last report again every heartbeat_ms, so that the server,
 * which fails a rank silent for its heartbeat_timeout, knows it is alive. A
 * repeat moves no phase, step or byte count: a rank that is stuck is still
 * caught by the server's progress_timeout. It stops once the server says the
 * attempt is over. */
static void *heartbeat_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_lock);
  while (!g_rep.closing && !g_rep.over) {
    long long due = g_rep.sent_ms + g_rep.heartbeat_ms, now = ty_mono_ms();
    if (g_rep.bl_n && now >= due) { /* the kept reports first; the last of them is the newest */
      (void)backlog_flush_locked();
      continue;
    }
    if (g_rep.last && now >= due) {
      (void)post_locked(g_rep.last); /* one that does not get through: the next may */
      continue;
    }
    if (!g_rep.last) due = now + g_rep.heartbeat_ms;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long wait_ms = due - now;
    ts.tv_sec += wait_ms / 1000;
    ts.tv_nsec += (wait_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&g_wake, &g_lock, &ts);
  }
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

/* Starts the heartbeat with every signal blocked in it, so that the rank's
 * handlers (SIGTERM) run on the main thread. */
static int heartbeat_start(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g_wake, &ca);
  pthread_condattr_destroy(&ca);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&g_rep.beat, NULL, heartbeat_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    pthread_cond_destroy(&g_wake);
    return TY_EUNAVAILABLE;
  }
  g_rep.beating = true;
  return 0;
}

int report_open(const worker_env_t *e) {
  report_close();
  snprintf(g_rep.job_id, sizeof g_rep.job_id, "%s", e->job_id);
  g_rep.attempt = e->attempt, g_rep.rank = e->rank, g_rep.world_size = e->world_size;
  const char *url = rankenv_str(RANKENV_REPORT_URL);
  if (url) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    g_rep.url = strdup(url);
    g_rep.curl = curl_easy_init();
    if (!g_rep.url || !g_rep.curl) return TY_EUNAVAILABLE;
    g_rep.headers = curl_slist_append(NULL, "Content-Type: application/json");
    const char *tok = rankenv_str(RANKENV_TOKEN);
    if (tok) {
      char auth[512];
      snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
      g_rep.headers = curl_slist_append(g_rep.headers, auth);
    }
    g_rep.heartbeat_ms = e->heartbeat_ms;
    if (g_rep.heartbeat_ms > 0) return heartbeat_start();
  }
  return 0;
}

void report_close(void) {
  if (g_rep.beating) {
    pthread_mutex_lock(&g_lock);
    g_rep.closing = true;
    pthread_cond_signal(&g_wake);
    pthread_mutex_unlock(&g_lock);
    pthread_join(g_rep.beat, NULL);
    pthread_cond_destroy(&g_wake);
  }
  free(g_rep.last);
  backlog_clear();
  if (g_rep.curl) curl_easy_cleanup(g_rep.curl);
  curl_slist_free_all(g_rep.headers);
  free(g_rep.url);
  memset(&g_rep, 0, sizeof g_rep);
}

static json_t *report_json(const report_t *r) {
  report_wire_t w;
  report_wire_init(&w);
  snprintf(w.job_id, sizeof w.job_id, "%s", g_rep.job_id);
  w.attempt = g_rep.attempt, w.rank = g_rep.rank, w.world_size = g_rep.world_size;
  w.phase = r->phase;
  w.step = r->step, w.total_steps = r->total_steps;
  w.loss = r->loss, w.tokens_per_s = r->tokens_per_s;
  w.bytes_loaded = r->bytes_loaded, w.bytes_total = r->bytes_total;
  w.host_peak_bytes = r->host_peak_bytes, w.device_peak_bytes = r->device_peak_bytes;
  w.load_seconds = r->load_seconds;
  snprintf(w.message, sizeof w.message, "%s", r->message ? r->message : "");
  snprintf(w.sample_prompt, sizeof w.sample_prompt, "%s", r->sample_prompt ? r->sample_prompt : "");
  snprintf(w.sample_text, sizeof w.sample_text, "%s", r->sample_text ? r->sample_text : "");
  if (r->dpo) memcpy(w.dpo, r->dpo, sizeof w.dpo);
  return report_wire_json(&w);
}

/* The line of DESIGN.md "Progress" on stderr. */
static void human_line(const report_t *r) {
  const double mib = 1024.0 * 1024.0;
  const char *ph = report_phase_name(r->phase);
  char head[64];
  snprintf(head, sizeof head, "[rank %d/%d]", g_rep.rank, g_rep.world_size);
  if (r->sample_prompt && *r->sample_prompt) { /* quoted as JSON strings: one line */
    json_t *p = json_string(r->sample_prompt),
           *t = json_string(r->sample_text ? r->sample_text : "");
    char *ps = json_dumps(p, JSON_ENCODE_ANY), *ts = json_dumps(t, JSON_ENCODE_ANY);
    fprintf(stderr, "%s sample at step %lld: %s -> %s\n", head, (long long)r->step, ps ? ps : "?",
            ts ? ts : "?");
    free(ps);
    free(ts);
    json_decref(p);
    json_decref(t);
  } else if (r->phase == REPORT_PHASE_LOADING && r->bytes_total > 0)
    fprintf(stderr, "%s load  %.1f/%.1f MiB  host-peak %.0f MiB\n", head, r->bytes_loaded / mib,
            r->bytes_total / mib, r->host_peak_bytes / mib);
  else if (r->phase == REPORT_PHASE_TOKENIZING && r->bytes_total > 0)
    fprintf(stderr, "%s tokenize  %.1f/%.1f MiB of the data  host-peak %.0f MiB\n", head,
            r->bytes_loaded / mib, r->bytes_total / mib, r->host_peak_bytes / mib);
  else if (r->phase == REPORT_PHASE_LOADING) /* before the byte count is known: what it loads */
    fprintf(stderr, "%s load  %s  host-peak %.0f MiB\n", head,
            r->message && *r->message ? r->message : "starting", r->host_peak_bytes / mib);
  else if (r->phase == REPORT_PHASE_REFERENCE && r->bytes_total > 0)
    fprintf(stderr, "%s reference  %lld/%lld pairs scored  host-peak %.0f MiB\n", head,
            (long long)r->bytes_loaded, (long long)r->bytes_total, r->host_peak_bytes / mib);
  else if (r->phase == REPORT_PHASE_TRAINING && isfinite(r->loss) && r->dpo)
    fprintf(stderr,
            "%s train step %lld/%lld loss %.3f  accuracy %.2f margin %.3f  %.0f tok/s  "
            "host-peak %.0f MiB\n",
            head, (long long)r->step, (long long)r->total_steps, r->loss,
            r->dpo[REPORT_DPO_rewards_accuracies], r->dpo[REPORT_DPO_rewards_margins],
            r->tokens_per_s, r->host_peak_bytes / mib);
  else if (r->phase == REPORT_PHASE_TRAINING && isfinite(r->loss))
    fprintf(stderr, "%s train step %lld/%lld loss %.3f  %.0f tok/s  host-peak %.0f MiB\n", head,
            (long long)r->step, (long long)r->total_steps, r->loss, r->tokens_per_s,
            r->host_peak_bytes / mib);
  else if (r->phase == REPORT_PHASE_TRAINING)
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
  pthread_mutex_lock(&g_lock);
  if (!g_rep.curl) {
    printf("%s\n", text);
    fflush(stdout);
    free(text);
  } else {
    /* In order: the kept reports first; while any is left, this one too. */
    rc = backlog_flush_locked();
    if (!rc && !g_rep.bl_n)
      rc = post_locked(text);
    else if (!rc)
      backlog_push(xstrdup(text));
    if (rc == TY_EUNAVAILABLE) backlog_push(xstrdup(text));
    if (rc == TY_EINVAL) rc = TY_EUNAVAILABLE; /* refused: report_send's word for it */
    if (g_rep.over) rc = TY_EPRECONDITION;
    if (r->sample_prompt && *r->sample_prompt) { /* a heartbeat repeats no sample */
      free(text);
    } else {
      free(g_rep.last);
      g_rep.last = text;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}
