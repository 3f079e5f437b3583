/* cmd_cancel.c - trainyard cancel: stop a queued or running job. */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdio.h>
#include <string.h>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/grpc_client.h"

int cmd_cancel(int argc, char **argv) {
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  const char *id = NULL, *reason = NULL;
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (client_flag(argc, argv, &i, "--reason", &v))
      reason = v;
    else if (argv[i][0] != '-' && !id)
      id = argv[i];
    else {
      bool help = !strcmp(argv[i], "--help");
      fprintf(help ? stdout : stderr,
              "usage: trainyard cancel JOB_ID [--reason TEXT] [--server URL | --grpc HOST:PORT]\n"
              "                        [--token TOKEN]\n"
              "Cancels a queued or running job (its ranks get SIGTERM, then SIGKILL after\n"
              "the server's grace period). Prints the job's state and reason.\n");
      return help ? 0 : 2;
    }
  }
  if (!id) {
    fprintf(stderr, "usage: trainyard cancel JOB_ID [--reason TEXT]\n");
    return 2;
  }
  char esc[256], path[300];
  client_escape(id, esc, sizeof esc);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", esc);
  json_t *body = reason ? json_pack("{s:s}", "reason", reason) : NULL;
  long status;
  json_t *job = NULL;
  int rc = *c.grpc ? gcli_cancel(&c, id, reason, &job)
                   : client_json(&c, "POST", path, body, NULL, &status, &job);
  json_decref(body);
  if (!rc)
    printf("%s %s: %s\n", json_string_value(json_object_get(job, "id")),
           json_string_value(json_object_get(job, "state")),
           json_string_value(json_object_get(job, "reason")));
  json_decref(job);
  return rc ? 1 : 0;
}
#endif
