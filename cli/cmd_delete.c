/* cmd_delete.c - trainyard delete: remove jobs that have ended from the
 * server (rows, events, rank logs), leaving their output folders. */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdio.h>
#include <string.h>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/grpc_client.h"

static void delete_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard delete JOB_ID... [--server URL | --grpc HOST:PORT] [--token TOKEN]\n"
          "Deletes jobs that have ended (succeeded, failed or cancelled) from the server:\n"
          "their state, attempts, ranks, metrics, events and rank logs. A job's output_dir\n"
          "(adapter, checkpoints, weights) is left as it is. A queued or running job is\n"
          "refused: cancel it first. Prints a line per deleted job; exit 1 when any id\n"
          "could not be deleted (each says why), after trying them all.\n");
}

int cmd_delete(int argc, char **argv) {
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  int ids = 0;
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] != '-') {
      ids++;
      continue;
    }
    bool help = !strcmp(argv[i], "--help");
    if (!help) fprintf(stderr, "trainyard delete: unknown option %s\n", argv[i]);
    delete_usage(help ? stdout : stderr);
    return help ? 0 : 2;
  }
  if (!ids) {
    delete_usage(stderr);
    return 2;
  }
  int failed = 0;
  for (int i = 1; i < argc; i++) {
    const char *id = argv[i];
    char esc[256], path[300];
    client_escape(id, esc, sizeof esc);
    snprintf(path, sizeof path, "/v1/jobs/%s", esc);
    long status;
    json_t *job = NULL;
    int rc = *c.grpc ? gcli_delete(&c, id, &job)
                     : client_json(&c, "DELETE", path, NULL, NULL, &status, &job);
    if (!rc) {
      const char *out =
          json_string_value(json_object_get(json_object_get(job, "spec"), "output_dir"));
      printf("deleted %s (%s, %s); its output_dir %s is left as it is\n",
             json_string_value(json_object_get(job, "id")),
             json_string_value(json_object_get(job, "name")),
             json_string_value(json_object_get(job, "state")), out && *out ? out : "(none)");
    }
    failed += rc != 0;
    json_decref(job);
  }
  return failed ? 1 : 0;
}
#endif
