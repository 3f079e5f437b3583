/* cmd_submit.c - trainyard submit: a job spec (file and/or dotted flags)
 * to the server; prints the new job's id (or the job as JSON). */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/grpc_client.h"
#include "common/json_util.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: trainyard submit [SPEC.json] [--dotted.field VALUE ...] [options]\n\n"
          "Sends the spec to trainyardd, which validates it (paths resolve on the server)\n"
          "and queues the job. Prints the job id; exit 1 with every error otherwise.\n\n"
          "  --server URL            trainyardd (default $TRAINYARD_SERVER or %s)\n"
          "  --token TOKEN           API token (default $TRAINYARD_TOKEN)\n"
          "  --grpc HOST:PORT        use the gRPC API there (default $TRAINYARD_GRPC)\n"
          "  --idempotency-key KEY   resubmitting with the same key returns the same job\n"
          "  --json                  print the job as JSON\n"
          "  --watch                 follow the job until it ends (as trainyard watch)\n",
          CLIENT_DEFAULT_SERVER);
}

/* POST /v1/jobs: 0 with *job (the caller's) and the HTTP status, or 1. */
static int submit_rest(const client_t *c, const jobspec_t *spec, const char *key, long *status,
                       json_t **job) {
  json_t *body = jobspec_to_json(spec);
  char keyhdr[600];
  const char *headers[2] = {NULL, NULL};
  if (key) {
    snprintf(keyhdr, sizeof keyhdr, "Idempotency-Key: %s", key);
    headers[0] = keyhdr;
  }
  int rc = client_json(c, "POST", "/v1/jobs", body, headers, status, job);
  json_decref(body);
  if (rc) {
    json_decref(*job);
    return 1;
  }
  return 0;
}

int cmd_submit(int argc, char **argv) {
  client_t c;
  if (!client_init(&c, &argc, argv)) return 2;
  const char *key = NULL;
  bool as_json = false, watch = false;
  int out = 1;
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (client_flag(argc, argv, &i, "--idempotency-key", &v))
      key = v;
    else if (!strcmp(argv[i], "--json"))
      as_json = true;
    else if (!strcmp(argv[i], "--watch"))
      watch = true;
    else
      argv[out++] = argv[i];
  }
  argc = out;
  jobspec_t spec;
  jobspec_init(&spec);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  if (jobspec_from_args(&spec, argc - 1, argv + 1, NULL, &errs)) {
    fprintf(stderr, "trainyard submit: the spec is invalid:\n");
    for (size_t i = 0; i < errs.len; i++)
      fprintf(stderr, "  %s: %s\n", errs.items[i].field, errs.items[i].message);
    ty_errlist_clear(&errs);
    return 2;
  }
  long status;
  json_t *job;
  if (*c.grpc) {
    bool existing = false;
    if (gcli_submit(&c, &spec, key, &job, &existing)) return 1;
    status = existing ? 200 : 201;
  } else if (submit_rest(&c, &spec, key, &status, &job)) {
    return 1;
  }
  char id[128];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(job, "id")));
  if (as_json) {
    ty_json_dumpf(job, stdout, JSON_INDENT(2));
    printf("\n");
  } else {
    printf("%s\n", id);
  }
  fflush(stdout);
  if (status == 200) fprintf(stderr, "trainyard submit: an earlier submit with this key made %s\n", id);
  json_decref(job);
  return watch ? client_watch(&c, id) : 0;
}
#endif
