/* cmd_version.c - trainyard version: the version and how this build was made. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("trainyard 0.1.0\n");
#ifdef TRAINYARD_HAVE_CUDA
  printf("cuda: yes\n");
#else
  printf("cuda: no\n");
#endif
#ifdef TRAINYARD_WITH_CLIENT
  printf("server client: yes\n");
#else
  printf("server client: no (worker-only build)\n");
#endif
  return 0;
}
