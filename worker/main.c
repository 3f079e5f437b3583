/* main.c - trainyard-worker: one rank of a job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/worker_load.h"

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "--help"))) {
    printf("trainyard-worker 0.1.0: one rank of a trainyard job (started by trainyardd or "
           "'trainyard train')\n");
    return 0;
  }
  const char *mode = getenv("TRAINYARD_MODE");
  if (mode && !strcmp(mode, "load")) return wload_main();
  fprintf(stderr, "trainyard-worker: started without a job (run it through 'trainyard train' "
                  "or trainyardd)\n");
  return 2;
}
