/* worker_path.c - finds trainyard-worker for the local commands; see worker_path.h. */
#include "cli/worker_path.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int worker_path_find(char *out, size_t n) {
  const char *env = getenv("TRAINYARD_WORKER");
  if (env && *env) {
    snprintf(out, n, "%s", env);
    return access(out, X_OK);
  }
  char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) return -1;
  self[k] = 0;
  char *slash = strrchr(self, '/');
  if (!slash) return -1;
  *slash = 0;
  snprintf(out, n, "%s/trainyard-worker", self);
  if (!access(out, X_OK)) return 0;
  snprintf(out, n, "%s/../worker/trainyard-worker", self);
  return access(out, X_OK);
}
