/* cmd_logs.c - trainyard logs: one rank's log of a job. */
#ifdef TRAINYARD_WITH_CLIENT
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "cli/commands.h"

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
  const char *id = NULL, *rank = "0", *attempt = NULL;
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (client_flag(argc, argv, &i, "--rank", &v))
      rank = v;
    else if (client_flag(argc, argv, &i, "--attempt", &v))
      attempt = v;
    else if (argv[i][0] != '-' && !id)
      id = argv[i];
    else {
      bool help = !strcmp(argv[i], "--help");
      fprintf(help ? stdout : stderr,
              "usage: trainyard logs JOB_ID [--rank N] [--attempt N] [--server URL] [--token T]\n"
              "Prints a rank's log (default rank 0 of the newest attempt), over REST only.\n");
      return help ? 0 : 2;
    }
  }
  if (!id) {
    fprintf(stderr, "usage: trainyard logs JOB_ID [--rank N] [--attempt N]\n");
    return 2;
  }
  char esc[256], er[64], ea[64], path[512];
  client_escape(id, esc, sizeof esc);
  client_escape(rank, er, sizeof er);
  client_escape(attempt ? attempt : "", ea, sizeof ea);
  snprintf(path, sizeof path, "/v1/jobs/%s/ranks/%s/log%s%s", esc, er, attempt ? "?attempt=" : "",
           ea);
  long status;
  char *text;
  if (client_request(&c, "GET", path, NULL, NULL, &status, &text)) return 1;
  int rc = 0;
  if (status != 200) {
    json_t *body = json_loads(text, 0, NULL);
    rc = client_print_error(status, body, text);
    json_decref(body);
  } else {
    fputs(text, stdout);
  }
  free(text);
  return rc;
}
#endif
