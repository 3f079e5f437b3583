/* worker_path.c - finds trainyard-worker for the local commands; see worker_path.h. */
#include "cli/worker_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/fsutil.h"

int worker_path_find(char *out, size_t n) {
  const char *env = getenv("TRAINYARD_WORKER");
  if (env && *env) {
    snprintf(out, n, "%s", env);
    return access(out, X_OK);
  }
  return ty_find_worker(out, n);
}
