/* cmd_get.c - trainyard get: one job as JSON. */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdio.h>
#include <string.h>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/grpc_client.h"
#include "common/json_util.h"

int cmd_get(int argc, char **argv) {
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  if (argc != 2 || argv[1][0] == '-') {
    fprintf(argc == 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
            "usage: trainyard get JOB_ID [--server URL | --grpc HOST:PORT] [--token TOKEN]\n"
            "Prints the job (state, reason, attempt, times, normalized spec) as JSON.\n");
    return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
  }
  char id[256], path[300];
  client_escape(argv[1], id, sizeof id);
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  long status;
  json_t *job = NULL;
  if (*c.grpc ? gcli_get(&c, argv[1], &job)
               : client_json(&c, "GET", path, NULL, NULL, &status, &job)) {
    json_decref(job);
    return 1;
  }
  ty_json_dumpf(job, stdout, JSON_INDENT(2));
  printf("\n");
  json_decref(job);
  return 0;
}
#endif
