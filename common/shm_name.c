/* shm_name.c - names of the ranks' shared-memory segments; see
 * shm_name.h. */
#include "common/shm_name.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/errors.h"

int ty_shm_path(const char *rendezvous, char *out, size_t outlen, char *err, size_t errlen) {
  if (!rendezvous || strncmp(rendezvous, "shm:", 4)) {
    if (err)
      snprintf(err, errlen, "rendezvous '%s' is not shm:<name>", rendezvous ? rendezvous : "");
    return TY_EINVAL;
  }
  const char *name = rendezvous + 4;
  size_t n = strlen(name);
  if (n < 1 || n > 200) {
    if (err) snprintf(err, errlen, "shm rendezvous name '%s' must be 1-200 characters", name);
    return TY_EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '.' || ch == '_' || ch == '-')) {
      if (err)
        snprintf(err, errlen,
                 "shm rendezvous name '%s' has '%c' at %zu: use only letters, digits, '.', '_', "
                 "'-'",
                 name, ch, i);
      return TY_EINVAL;
    }
  }
  if ((size_t)snprintf(out, outlen, "/" TY_SHM_PREFIX "%s", name) >= outlen) {
    if (err) snprintf(err, errlen, "shm rendezvous name '%s' is too long", name);
    return TY_EINVAL;
  }
  return 0;
}

int ty_shm_remove(const char *rendezvous) {
  char path[256];
  int rc = ty_shm_path(rendezvous, path, sizeof path, NULL, 0);
  if (rc) return rc;
  if (shm_unlink(path) == 0) return 0;
  return errno == ENOENT ? 1 : TY_EINTERNAL;
}

void ty_shm_server_rendezvous(const char *id, int attempt, char *out, size_t outlen) {
  snprintf(out, outlen, "shm:" TY_SHM_SERVER "%s-%d", id, attempt);
}

int ty_shm_server_parse(const char *entry, char *id, size_t idsz, int *attempt) {
  const char *pre = TY_SHM_PREFIX TY_SHM_SERVER;
  if (strncmp(entry, pre, strlen(pre))) return 0;
  const char *rest = entry + strlen(pre), *dash = strrchr(rest, '-');
  if (!dash || dash == rest || !dash[1] || (size_t)(dash - rest) >= idsz) return 0;
  char *end;
  long a = strtol(dash + 1, &end, 10);
  if (*end || a < 1 || a > 1000000) return 0;
  snprintf(id, idsz, "%.*s", (int)(dash - rest), rest);
  *attempt = (int)a;
  return 1;
}

int ty_shm_sweep_local(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  const char *pre = TY_SHM_PREFIX "local-";
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, pre, strlen(pre))) continue;
    char *end;
    long pid = strtol(e->d_name + strlen(pre), &end, 10);
    if (pid <= 0 || *end != '-') continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
    char path[300];
    snprintf(path, sizeof path, "/%s", e->d_name);
    if (shm_unlink(path) == 0) n++;
  }
  closedir(d);
  return n;
}
