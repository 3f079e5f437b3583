/* cmd_list.c - trainyard list: jobs as a table, newest first. */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/job_progress.h"
#include "cli/grpc_client.h"
#include "common/json_util.h"
#include "common/numbers.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: trainyard list [--state S[,S...]] [--limit N | --all] [--json]\n"
          "                      [--server URL | --grpc HOST:PORT] [--token TOKEN]\n"
          "Jobs, newest first: the first --limit of them (default 50), or every one with --all,\n"
          "over as many of the server's pages as that takes.\n"
          "States: queued, starting, running, succeeded, failed, cancelled.\n");
}

static void print_row(json_t *j) {
  const char *created = json_string_value(json_object_get(j, "created_at"));
  char progress[96];
  cli_progress_text(j, "", progress, sizeof progress);
  printf("%-20s %-24.24s %-10s %7lld %5lld  %-19.19s  %-40.40s  %s\n",
         json_string_value(json_object_get(j, "id")), json_string_value(json_object_get(j, "name")),
         json_string_value(json_object_get(j, "state")),
         (long long)json_integer_value(json_object_get(j, "attempt")),
         (long long)json_integer_value(json_object_get(j, "world_size")), created ? created : "",
         progress, json_string_value(json_object_get(j, "reason")));
}

int cmd_list(int argc, char **argv) {
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  const char *state = NULL, *limit_arg = NULL;
  bool all = false, as_json = false;
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (client_flag(argc, argv, &i, "--state", &v))
      state = v;
    else if (client_flag(argc, argv, &i, "--limit", &v))
      limit_arg = v;
    else if (!strcmp(argv[i], "--all"))
      all = true;
    else if (!strcmp(argv[i], "--json"))
      as_json = true;
    else {
      bool help = !strcmp(argv[i], "--help");
      usage(help ? stdout : stderr);
      return help ? 0 : 2;
    }
  }
  long limit = 50;
  if (limit_arg && all) {
    fprintf(stderr, "trainyard list: --all lists every job; drop it or --limit\n");
    return 2;
  }
  if (limit_arg && !ty_parse_long(limit_arg, 1, 1L << 30, &limit)) {
    fprintf(stderr, "trainyard list: --limit wants a whole number of jobs in 1..%ld, got '%s'\n",
            1L << 30, limit_arg);
    return 2;
  }
  /* The server's own page size (it caps what a request may ask for), and
   * as many pages as the jobs wanted take. */
  char token[128] = "";
  json_t *every = json_array();
  long shown = 0;
  do {
    char es[256] = "", et[256], path[700];
    if (state) client_escape(state, es, sizeof es);
    client_escape(token, et, sizeof et);
    int n = snprintf(path, sizeof path, "/v1/jobs");
    char sep = '?';
    if (state) n += snprintf(path + n, sizeof path - (size_t)n, "%cstate=%s", sep, es), sep = '&';
    if (*token) snprintf(path + n, sizeof path - (size_t)n, "%cpage_token=%s", sep, et);
    long status;
    json_t *page = NULL;
    int rc = *c.grpc ? gcli_list(&c, state, token, &page)
                     : client_json(&c, "GET", path, NULL, NULL, &status, &page);
    if (rc) {
      json_decref(page);
      json_decref(every);
      return rc == 2 ? 2 : 1;
    }
    if (!as_json && !*token) /* the first page came: the table's header */
      printf("%-20s %-24s %-10s %7s %5s  %-19s  %-40s  %s\n", "ID", "NAME", "STATE", "ATTEMPT",
             "RANKS", "CREATED", "PROGRESS", "REASON");
    size_t i;
    json_t *j;
    json_array_foreach(json_object_get(page, "jobs"), i, j) {
      if (!all && shown == limit) break;
      shown++;
      if (as_json)
        json_array_append(every, j);
      else
        print_row(j);
    }
    const char *next = json_string_value(json_object_get(page, "next_page_token"));
    snprintf(token, sizeof token, "%s", next ? next : "");
    json_decref(page);
  } while (*token && (all || shown < limit));
  if (as_json) {
    ty_json_dumpf(every, stdout, JSON_INDENT(2));
    printf("\n");
  }
  json_decref(every);
  return 0;
}
#endif
