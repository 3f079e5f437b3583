/* cmd_logs.c - trainyard logs: one rank's log of a job, whole or followed
 * as it grows (--follow) until the job has ended. */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/client.h"
#include "cli/commands.h"
#include "common/numbers.h"

#define FOLLOW_POLL_MS 500

static void usage(FILE *f) {
  fprintf(f,
          "usage: trainyard logs JOB_ID [--rank N] [--attempt N] [--follow] [--server URL]\n"
          "                      [--token T]\n"
          "Prints a rank's log (default rank 0 of the newest attempt), over REST only.\n"
          "--follow keeps printing what the rank writes, like tail -f, until the job has\n"
          "ended: it waits for a queued job to start and, without --attempt, goes on to\n"
          "the next attempt when the job is retried.\n");
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The job's state, attempt and world size: 0; 1 after printing the
 * server's error; -1 when the server could not be reached (said). */
static int job_now(const client_t *c, const char *esc_id, char *state, size_t size, long *attempt,
                   long *world) {
  char path[300];
  snprintf(path, sizeof path, "/v1/jobs/%s", esc_id);
  long status;
  json_t *job;
  int rc = client_json(c, "GET", path, NULL, NULL, &status, &job);
  if (rc) return rc;
  const char *s = json_string_value(json_object_get(job, "state"));
  snprintf(state, size, "%s", s ? s : "");
  *attempt = (long)json_integer_value(json_object_get(job, "attempt"));
  *world = (long)json_integer_value(json_object_get(job, "world_size"));
  json_decref(job);
  return 0;
}

/* GET of the log from byte offset (-1: all of it) of attempt (0: the
 * newest): *text and *len the bytes, *status the HTTP status. 0, or -1
 * when the server could not be reached (said on stderr). */
static int get_log(const client_t *c, const char *esc_id, const char *esc_rank, long attempt,
                   long long offset, long *status, char **text, size_t *len) {
  char path[600];
  int n = snprintf(path, sizeof path, "/v1/jobs/%s/ranks/%s/log", esc_id, esc_rank);
  char sep = '?';
  if (attempt > 0)
    n += snprintf(path + n, sizeof path - (size_t)n, "%cattempt=%ld", sep, attempt), sep = '&';
  if (offset >= 0) snprintf(path + n, sizeof path - (size_t)n, "%coffset=%lld", sep, offset);
  return client_request(c, "GET", path, NULL, NULL, status, text, len);
}

static int print_error(long status, char *text) {
  json_t *body = json_loads(text, 0, NULL);
  int rc = client_print_error(status, body, text);
  json_decref(body);
  return rc;
}

/* Whether every rank of the attempt has stopped (a rank never started,
 * without a pid, counts as stopped): their last lines are then in. */
static bool ranks_stopped(const client_t *c, const char *esc_id, long attempt) {
  char path[320];
  snprintf(path, sizeof path, "/v1/jobs/%s/ranks?attempt=%ld", esc_id, attempt);
  long status;
  json_t *body;
  if (client_json(c, "GET", path, NULL, NULL, &status, &body)) return true;
  bool all = true;
  size_t i;
  json_t *r;
  json_array_foreach(json_object_get(body, "ranks"), i, r) {
    const char *st = json_string_value(json_object_get(r, "state"));
    bool stopped = st && (!strcmp(st, "exited") || !strcmp(st, "failed") || !strcmp(st, "stopped"));
    if (!stopped && !json_is_null(json_object_get(r, "pid"))) all = false;
  }
  json_decref(body);
  return all;
}

/* Prints what the log of attempt holds past *offset and moves *offset on:
 * 0 with the HTTP status in *status (an error printed, but a 404 only when
 * report_404: it may mean "not started yet") and the bytes read in *len;
 * -1 when the server could not be reached. */
static int read_more(const client_t *c, const char *esc_id, const char *esc_rank, long attempt,
                     bool report_404, long long *offset, long *status, size_t *len) {
  char *text = NULL;
  if (get_log(c, esc_id, esc_rank, attempt, *offset, status, &text, len)) return -1;
  if (*status == 200) {
    fwrite(text, 1, *len, stdout);
    fflush(stdout);
    *offset += (long long)*len;
  } else {
    *len = 0;
    if (*status != 404 || report_404) print_error(*status, text);
  }
  free(text);
  return 0;
}

/* --follow: reads the log from where the last read ended, every
 * FOLLOW_POLL_MS. A 404 while the job or the rank has not started yet is
 * waited out. The attempt is over when the job has ended or a newer one
 * began; the log is then read until it has
 * nothing new once the attempt's ranks have all stopped (or for at most
 * FOLLOW_GRACE_MS, should a rank never be reaped). Without a pinned
 * attempt, each newer attempt's log follows the rest of its predecessor's.
 * A server that cannot be reached (restarting) is tried again, for
 * FOLLOW_LOST_MAX reads in a row. */
#define FOLLOW_GRACE_MS 30000
#define FOLLOW_LOST_MAX 10  /* reads in a row without a server before giving up */
#define FOLLOW_LOST_MS 1000 /* the wait after each */
static int follow(const client_t *c, const char *esc_id, const char *esc_rank, long rank,
                  long pinned) {
  long attempt = pinned, over_ms = -1, status = 0;
  long long offset = 0;
  size_t len = 0;
  bool first = true;
  int lost = 0; /* reads in a row that found no server */
  for (;; sleep_ms(FOLLOW_POLL_MS)) {
    char state[32];
    long newest, world;
    int rc = job_now(c, esc_id, state, sizeof state, &newest, &world);
    if (rc < 0 && ++lost < FOLLOW_LOST_MAX) {
      fprintf(stderr, "trainyard logs: trying again\n");
      sleep_ms(FOLLOW_LOST_MS);
      continue;
    }
    if (rc) return 1;
    /* No such rank will ever have a log: the server says so at once. */
    bool final = client_state_final(state) || rank >= world;
    /* Unpinned, the attempt running when the command started, then each
     * later one in turn, however briefly it ran. */
    if (!pinned && first) {
      attempt = newest;
    } else if (!pinned && newest > attempt) {
      if (attempt > 0) {
        if (read_more(c, esc_id, esc_rank, attempt, false, &offset, &status, &len)) {
          if (++lost >= FOLLOW_LOST_MAX) return 1;
          sleep_ms(FOLLOW_LOST_MS);
          continue;
        }
        fprintf(stderr, "trainyard logs: attempt %ld is over; attempt %ld follows\n", attempt,
                attempt + 1);
      }
      attempt++;
      offset = 0;
      over_ms = -1;
    }
    first = false;
    bool over = final || newest > attempt;
    bool stopped = over && attempt > 0 && ranks_stopped(c, esc_id, attempt);
    status = 0;
    len = 0;
    if ((attempt > 0 || final) &&
        read_more(c, esc_id, esc_rank, attempt, final, &offset, &status, &len)) {
      if (++lost >= FOLLOW_LOST_MAX) return 1;
      fprintf(stderr, "trainyard logs: trying again\n");
      sleep_ms(FOLLOW_LOST_MS);
      continue;
    }
    lost = 0;
    if (status != 200 && status != 0 && (status != 404 || final)) return 1;
    if (over) over_ms = over_ms < 0 ? 0 : over_ms + FOLLOW_POLL_MS;
    if (over && len == 0 && (stopped || over_ms >= FOLLOW_GRACE_MS)) return 0;
  }
}

int cmd_logs(int argc, char **argv) {
  /* The gRPC API has no logs: asked for by name, say so rather than ask
   * another server (TRAINYARD_GRPC alone leaves logs to --server). */
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], "--grpc", 6) && (!argv[i][6] || argv[i][6] == '=')) {
      fprintf(stderr,
              "trainyard logs: rank logs are served over REST only, not gRPC; drop --grpc and "
              "give the server's --server URL\n");
      return 2;
    }
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  const char *id = NULL, *rank = "0", *attempt_arg = NULL;
  bool follow_on = false;
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (client_flag(argc, argv, &i, "--rank", &v))
      rank = v;
    else if (client_flag(argc, argv, &i, "--attempt", &v))
      attempt_arg = v;
    else if (!strcmp(argv[i], "--follow") || !strcmp(argv[i], "-f"))
      follow_on = true;
    else if (argv[i][0] != '-' && !id)
      id = argv[i];
    else {
      bool help = !strcmp(argv[i], "--help");
      usage(help ? stdout : stderr);
      return help ? 0 : 2;
    }
  }
  if (!id) {
    usage(stderr);
    return 2;
  }
  long attempt = 0, rank_n;
  if (attempt_arg && !ty_parse_long(attempt_arg, 1, 1000000, &attempt)) {
    fprintf(stderr, "trainyard logs: --attempt wants an attempt number in 1..1000000, got '%s'\n",
            attempt_arg);
    return 2;
  }
  if (!ty_parse_long(rank, 0, 1000000, &rank_n)) {
    fprintf(stderr, "trainyard logs: --rank wants a rank number in 0..1000000, got '%s'\n", rank);
    return 2;
  }
  char esc[256], er[64];
  client_escape(id, esc, sizeof esc);
  client_escape(rank, er, sizeof er);
  if (follow_on) return follow(&c, esc, er, rank_n, attempt);
  long status;
  char *text;
  size_t len;
  if (get_log(&c, esc, er, attempt, -1, &status, &text, &len)) return 1;
  int rc = 0;
  if (status != 200)
    rc = print_error(status, text);
  else
    fwrite(text, 1, len, stdout);
  free(text);
  return rc;
}
#endif
