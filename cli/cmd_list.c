/* cmd_list.c - trainyard list: jobs as a table, newest first. */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "cli/commands.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: trainyard list [--state S[,S...]] [--limit N] [--all] [--json]\n"
          "                      [--server URL] [--token TOKEN]\n"
          "Jobs, newest first: one page of --limit (default 50), or every page with --all.\n"
          "States: queued, starting, running, succeeded, failed, cancelled.\n");
}

static void print_row(json_t *j) {
  const char *created = json_string_value(json_object_get(j, "created_at"));
  printf("%-20s %-24.24s %-10s %7lld %5lld  %-19.19s  %s\n",
         json_string_value(json_object_get(j, "id")), json_string_value(json_object_get(j, "name")),
         json_string_value(json_object_get(j, "state")),
         (long long)json_integer_value(json_object_get(j, "attempt")),
         (long long)json_integer_value(json_object_get(j, "world_size")), created ? created : "",
         json_string_value(json_object_get(j, "reason")));
}

int cmd_list(int argc, char **argv) {
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  const char *state = NULL, *limit = "50";
  bool all = false, as_json = false;
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (client_flag(argc, argv, &i, "--state", &v))
      state = v;
    else if (client_flag(argc, argv, &i, "--limit", &v))
      limit = v;
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
  char token[128] = "";
  json_t *every = json_array();
  if (!as_json)
    printf("%-20s %-24s %-10s %7s %5s  %-19s  %s\n", "ID", "NAME", "STATE", "ATTEMPT", "RANKS",
           "CREATED", "REASON");
  do {
    char es[256] = "", el[32], et[256], path[700];
    if (state) client_escape(state, es, sizeof es);
    client_escape(limit, el, sizeof el);
    client_escape(token, et, sizeof et);
    snprintf(path, sizeof path, "/v1/jobs?page_size=%s%s%s%s%s", el, state ? "&state=" : "", es,
             *token ? "&page_token=" : "", et);
    long status;
    json_t *page;
    if (client_json(&c, "GET", path, NULL, NULL, &status, &page)) {
      json_decref(page);
      json_decref(every);
      return 1;
    }
    size_t i;
    json_t *j;
    json_array_foreach(json_object_get(page, "jobs"), i, j) {
      if (as_json)
        json_array_append(every, j);
      else
        print_row(j);
    }
    const char *next = json_string_value(json_object_get(page, "next_page_token"));
    snprintf(token, sizeof token, "%s", next ? next : "");
    json_decref(page);
  } while (all && *token);
  if (as_json) {
    json_dumpf(every, stdout, JSON_INDENT(2));
    printf("\n");
  }
  json_decref(every);
  return 0;
}
#endif
