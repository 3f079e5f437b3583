/* cmd_watch.c - trainyard watch: follows a job's event stream (SSE) and
 * shows live per-rank progress bars (a redrawn block on a terminal, one
 * line per change otherwise) until the job ends. Reconnects with
 * Last-Event-ID, so nothing is missed. With --grpc the events come from
 * WatchJob instead, resumed the same way from the last seq seen. */
#ifdef TRAINYARD_WITH_CLIENT
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/job_progress.h"
#include "cli/grpc_client.h"
#include "common/xalloc.h"

#define MAX_RANKS 1024
#define BAR 24

typedef struct {
  char phase[16];
  long long step, total;
  double loss, tps;
  long long loaded, btotal, host_peak;
  char note[160];
  char end[200];           /* "exited", "failed: ...": how the process ended */
} rank_view_t;

typedef struct {
  bool tty;
  int drawn;               /* lines of the block drawn last (tty) */
  char state[16];
  char reason[512];
  int attempt, world;
  rank_view_t ranks[MAX_RANKS];
  char *buf;               /* unparsed stream bytes */
  size_t len;
  char last_id[32];
  bool final;
  char job[128]; /* the job's progress in words (cli_progress_text) */
} watch_t;

static void bar(char *out, double frac) {
  if (!(frac >= 0)) frac = 0;
  if (frac > 1) frac = 1;
  int n = (int)lround(frac * BAR);
  for (int i = 0; i < BAR; i++) out[i] = i < n ? '#' : '.';
  out[BAR] = '\0';
}

static void progress_line(const watch_t *w, int r, char *out, size_t size) {
  const rank_view_t *v = &w->ranks[r];
  const double mib = 1024.0 * 1024.0;
  char b[BAR + 1];
  if (!strcmp(v->phase, "loading") && v->btotal > 0) {
    bar(b, (double)v->loaded / (double)v->btotal);
    snprintf(out, size, "[rank %d/%d] load  [%s] %.1f/%.1f MiB  host-peak %.0f MiB", r, w->world,
             b, v->loaded / mib, v->btotal / mib, v->host_peak / mib);
  } else if (!strcmp(v->phase, "reference") && v->btotal > 0) {
    bar(b, (double)v->loaded / (double)v->btotal);
    snprintf(out, size, "[rank %d/%d] reference [%s] %lld/%lld pairs scored", r, w->world, b,
             v->loaded, v->btotal);
  } else if (!strcmp(v->phase, "tokenizing") && v->btotal > 0) {
    bar(b, (double)v->loaded / (double)v->btotal);
    snprintf(out, size, "[rank %d/%d] tokenize [%s] %.1f/%.1f MiB of the data", r, w->world, b,
             v->loaded / mib, v->btotal / mib);
  } else if (!strcmp(v->phase, "training") || !strcmp(v->phase, "saving") ||
             !strcmp(v->phase, "done")) {
    bar(b, v->total ? (double)v->step / (double)v->total : 0);
    char loss[32] = "";
    if (isfinite(v->loss)) snprintf(loss, sizeof loss, "loss %.3f", v->loss);
    snprintf(out, size, "[rank %d/%d] %-8s [%s] %lld/%lld %s  %.0f tok/s  host-peak %.0f MiB", r,
             w->world, v->phase, b, v->step, v->total, loss, v->tps, v->host_peak / mib);
  } else {
    snprintf(out, size, "[rank %d/%d] %s%s%s", r, w->world, v->phase[0] ? v->phase : "waiting",
             v->note[0] ? ": " : "", v->note);
  }
}

static void rank_line(const watch_t *w, int r, char *out, size_t size) {
  progress_line(w, r, out, size);
  const rank_view_t *v = &w->ranks[r];
  size_t n = strlen(out);
  if (v->end[0] && n < size) snprintf(out + n, size - n, "  (%s)", v->end);
}

static void draw(watch_t *w) {
  if (!w->tty) return;
  if (w->drawn) printf("\033[%dA", w->drawn);
  printf("\033[2K%s attempt %d: %.200s\n", w->state, w->attempt, w->reason);
  if (w->job[0]) printf("\033[2Kjob %s\n", w->job);
  int n = w->world < MAX_RANKS ? w->world : MAX_RANKS;
  for (int r = 0; r < n; r++) {
    char line[400];
    rank_line(w, r, line, sizeof line);
    printf("\033[2K%s\n", line);
  }
  w->drawn = n + 1 + (w->job[0] != '\0');
  fflush(stdout);
}

static void on_event(watch_t *w, const char *type, json_t *ev) {
  json_t *d = json_object_get(ev, "data");
  int attempt = (int)json_integer_value(json_object_get(d, "attempt"));
  if (attempt > w->attempt) {
    w->attempt = attempt;
    memset(w->ranks, 0, sizeof w->ranks);
  }
  if (!strcmp(type, "state")) {
    snprintf(w->state, sizeof w->state, "%s", json_string_value(json_object_get(d, "to")));
    snprintf(w->reason, sizeof w->reason, "%s", json_string_value(json_object_get(d, "reason")));
    w->final = client_state_final(w->state);
    if (!w->tty) printf("%s (attempt %d): %s\n", w->state, w->attempt, w->reason);
    return;
  }
  int r = (int)json_integer_value(json_object_get(d, "rank"));
  if (r < 0 || r >= MAX_RANKS || attempt != w->attempt) return;
  if (!strcmp(type, "sample")) { /* train.sample_prompts: a line, not a table row */
    if (!w->tty) {
      char *p = json_dumps(json_object_get(d, "prompt"), JSON_ENCODE_ANY);
      char *t = json_dumps(json_object_get(d, "text"), JSON_ENCODE_ANY);
      printf("[rank %d/%d] sample at step %lld: %s -> %s\n", r, w->world,
             (long long)json_integer_value(json_object_get(d, "step")), p ? p : "?", t ? t : "?");
      free(p);
      free(t);
    }
    return;
  }
  rank_view_t *v = &w->ranks[r];
  if (!strcmp(type, "rank")) {
    const char *st = json_string_value(json_object_get(d, "state"));
    const char *msg = json_string_value(json_object_get(d, "message"));
    snprintf(v->end, sizeof v->end, "%s%s%s", st ? st : "?", msg && *msg ? ": " : "",
             msg ? msg : "");
    if (!w->tty) printf("[rank %d/%d] %s\n", r, w->world, v->end);
    return;
  }
  if (strcmp(type, "progress")) return; /* a kind of event this client does not know */
  snprintf(v->phase, sizeof v->phase, "%s", json_string_value(json_object_get(d, "phase")));
  v->step = json_integer_value(json_object_get(d, "step"));
  v->total = json_integer_value(json_object_get(d, "total_steps"));
  json_t *loss = json_object_get(d, "loss");
  v->loss = json_is_number(loss) ? json_number_value(loss) : NAN;
  v->tps = json_number_value(json_object_get(d, "tokens_per_s"));
  v->loaded = json_integer_value(json_object_get(d, "bytes_loaded"));
  v->btotal = json_integer_value(json_object_get(d, "bytes_total"));
  v->host_peak = json_integer_value(json_object_get(d, "host_peak_bytes"));
  snprintf(v->note, sizeof v->note, "%s", json_string_value(json_object_get(d, "message")));
  if (json_object_get(d, "job_progress_phase")) {
    char job[sizeof w->job];
    cli_progress_text(d, "job_", job, sizeof job);
    /* Without a terminal, a line each time the words change. */
    if (!w->tty && strcmp(job, w->job)) printf("job %s\n", job);
    snprintf(w->job, sizeof w->job, "%s", job);
  }
  if (!w->tty) {
    char line[400];
    rank_line(w, r, line, sizeof line);
    printf("%s\n", line);
  }
}

/* Parses every complete "\n\n"-terminated frame in the buffer. */
static void parse_frames(watch_t *w) {
  char *start = w->buf, *end;
  while ((end = strstr(start, "\n\n"))) {
    *end = '\0';
    char type[32] = "message";
    const char *data = NULL;
    for (char *save = NULL, *line = strtok_r(start, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
      if (!strncmp(line, "id: ", 4)) snprintf(w->last_id, sizeof w->last_id, "%s", line + 4);
      if (!strncmp(line, "event: ", 7)) snprintf(type, sizeof type, "%s", line + 7);
      if (!strncmp(line, "data: ", 6)) data = line + 6;
    }
    json_t *ev = data ? json_loads(data, 0, NULL) : NULL;
    if (ev) on_event(w, type, ev);
    json_decref(ev);
    start = end + 2;
  }
  size_t rest = w->len - (size_t)(start - w->buf);
  memmove(w->buf, start, rest);
  w->len = rest;
  w->buf[w->len] = '\0';
  draw(w);
  fflush(stdout);
}

static size_t on_data(char *p, size_t size, size_t n, void *ctx) {
  watch_t *w = ctx;
  w->buf = xrealloc(w->buf, w->len + size * n + 1);
  memcpy(w->buf + w->len, p, size * n);
  w->len += size * n;
  w->buf[w->len] = '\0';
  parse_frames(w);
  return size * n;
}

/* A WatchJob event: the same JSON as an SSE event's data. */
static void on_grpc_event(void *ctx, const json_t *ev) {
  watch_t *w = ctx;
  snprintf(w->last_id, sizeof w->last_id, "%lld",
           (long long)json_integer_value(json_object_get(ev, "seq")));
  const char *type = json_string_value(json_object_get(ev, "type"));
  on_event(w, type ? type : "", (json_t *)ev);
  draw(w);
  fflush(stdout);
}

/* Follows the job over gRPC until it ends or the server stays away. */
static void watch_grpc(const client_t *c, const char *id, watch_t *w) {
  for (int failures = 0; !w->final && failures < 5;) {
    int rc = gcli_watch(c, id, atoll(w->last_id), on_grpc_event, w);
    if (rc == 0) break; /* the stream ends after the job's final state */
    if (rc > 0) break;
    failures++;
    sleep(1);
  }
}

int client_watch(const client_t *c, const char *id) {
  char esc[256], path[300];
  client_escape(id, esc, sizeof esc);
  snprintf(path, sizeof path, "/v1/jobs/%s", esc);
  long status;
  json_t *job = NULL;
  if (*c->grpc ? gcli_get(c, id, &job) : client_json(c, "GET", path, NULL, NULL, &status, &job)) {
    json_decref(job);
    return 1;
  }
  watch_t *w = xcalloc(1, sizeof *w);
  w->tty = isatty(STDOUT_FILENO);
  w->world = (int)json_integer_value(json_object_get(job, "world_size"));
  printf("job %s (%s), %d rank%s\n", id, json_string_value(json_object_get(job, "name")), w->world,
         w->world == 1 ? "" : "s");
  json_decref(job);
  int failures = 0;
  if (*c->grpc) watch_grpc(c, id, w);
  while (!*c->grpc && !w->final && failures < 5) {
    CURL *curl = curl_easy_init();
    char url[2048], auth[600], resume[64];
    snprintf(url, sizeof url, "%s/v1/jobs/%s/events", c->server, esc);
    struct curl_slist *hl = NULL;
    if (*c->token) {
      snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
      hl = curl_slist_append(hl, auth);
    }
    if (*w->last_id) {
      snprintf(resume, sizeof resume, "Last-Event-ID: %s", w->last_id);
      hl = curl_slist_append(hl, resume);
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    CURLcode cc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(curl);
    if (cc == CURLE_OK && status == 200) {
      failures = 0;
    } else {
      failures++;
      if (status >= 400) {
        fprintf(stderr, "trainyard watch: HTTP %ld on the event stream\n", status);
        break;
      }
      fprintf(stderr, "trainyard watch: stream lost (%s); reconnecting\n", curl_easy_strerror(cc));
      sleep(1);
    }
  }
  int rc = !strcmp(w->state, "succeeded") ? 0 : 1;
  if (w->final) printf("job %s %s: %s\n", id, w->state, w->reason);
  free(w->buf);
  free(w);
  return rc;
}

int cmd_watch(int argc, char **argv) {
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  if (argc != 2 || argv[1][0] == '-') {
    bool help = argc == 2 && !strcmp(argv[1], "--help");
    fprintf(help ? stdout : stderr,
            "usage: trainyard watch JOB_ID [--server URL | --grpc HOST:PORT] [--token TOKEN]\n"
            "Follows the job live (per-rank progress) until it ends; exit 0 when it\n"
            "succeeded, 1 when it failed or was cancelled.\n");
    return help ? 0 : 2;
  }
  return client_watch(&c, argv[1]);
}
#endif
