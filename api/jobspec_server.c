/* jobspec_server.c - the rules that need the server's configuration: paths
 * inside the configured roots, one GPU per rank for device cuda. They are
 * rows "paths-in-roots" and "cuda-gpus" of the rule table; see jobspec.h. */
#include "api/jobspec.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The absolute, canonical form of path (relative to base), following
 * symbolic links and ".." through the part that exists. Returns 0; -1 when
 * the part that does not exist yet holds "." or ".." (which could still
 * step out once created); -2 when it starts at a symbolic link that points
 * nowhere (or in a loop). out has PATH_MAX bytes. */
static int resolve(const char *path, const char *base, char *out) {
  char abs[PATH_MAX * 2], cwd[PATH_MAX];
  if (path[0] == '/') {
    snprintf(abs, sizeof abs, "%s", path);
  } else {
    if (!base) base = getcwd(cwd, sizeof cwd);
    if (!base) return -1;
    snprintf(abs, sizeof abs, "%s/%s", base, path);
  }
  if (realpath(abs, out)) return 0;
  /* Walk up to the nearest existing ancestor. */
  size_t n = strlen(abs);
  while (n > 1) {
    while (n > 1 && abs[n - 1] != '/') n--;
    while (n > 1 && abs[n - 1] == '/') n--;
    char head[PATH_MAX * 2];
    snprintf(head, sizeof head, "%.*s", (int)n, abs);
    if (!realpath(n == 1 && abs[0] == '/' ? "/" : head, out)) continue;
    const char *rest = abs + n;
    /* The first missing component must really be missing: a dangling
     * symbolic link there would let a worker create files wherever it
     * points. */
    struct stat st;
    const char *first = rest + strspn(rest, "/");
    char probe[PATH_MAX * 2 + 2];
    snprintf(probe, sizeof probe, "%s/%.*s", n == 1 ? "" : head, (int)strcspn(first, "/"), first);
    if (lstat(probe, &st) == 0) return -2;
    for (const char *p = rest; *p;) {
      while (*p == '/') p++;
      const char *e = strchr(p, '/');
      size_t len = e ? (size_t)(e - p) : strlen(p);
      if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) return -1;
      p += len;
    }
    size_t o = strlen(out);
    if (o == 1) o = 0; /* out is "/" */
    while (*rest == '/') rest++;
    snprintf(out + o, PATH_MAX - o, "/%s", rest);
    return 0;
  }
  return -1;
}

static bool inside_any(const char *resolved, const char *const *roots) {
  for (size_t i = 0; roots && roots[i]; i++) {
    char r[PATH_MAX];
    if (!realpath(roots[i], r)) continue; /* a root that does not exist holds nothing */
    size_t n = strlen(r);
    if (!strcmp(r, "/")) return true;
    if (!strncmp(resolved, r, n) && (resolved[n] == '\0' || resolved[n] == '/')) return true;
  }
  return false;
}

static void roots_list(char *buf, size_t cap, const char *const *a, const char *const *b) {
  buf[0] = '\0';
  const char *const *lists[2] = {a, b};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; lists[k] && lists[k][i]; i++) {
      size_t l = strlen(buf);
      snprintf(buf + l, cap - l, "%s%s", l ? ", " : "", lists[k][i]);
    }
  if (!buf[0]) snprintf(buf, cap, "none configured");
}

static void check_one_root(const char *field, const char *path, bool write,
                           const jobspec_roots_t *r, ty_errlist_t *errs) {
  char res[PATH_MAX], list[1024];
  if (!path[0]) return;
  int rc = resolve(path, r->base, res);
  if (rc == -2) {
    ty_errlist_add(errs, field,
                   "%s passes through a symbolic link that points nowhere; remove the link or "
                   "give a plain path inside the roots",
                   path);
    return;
  }
  if (rc != 0) {
    ty_errlist_add(errs, field,
                   "%s cannot be resolved safely (a part that does not exist yet "
                   "holds '.' or '..'); give a plain path inside the roots",
                   path);
    return;
  }
  bool ok = inside_any(res, r->write) || (!write && inside_any(res, r->read));
  if (ok) return;
  roots_list(list, sizeof list, write ? NULL : r->read, r->write);
  ty_errlist_add(errs, field,
                 "%s resolves to %s, outside the server's %s roots (%s); move it "
                 "under one of them",
                 path, res, write ? "output" : "allowed", list);
}

int jobspec_check_roots(const jobspec_t *s, const jobspec_roots_t *roots, ty_errlist_t *errs) {
  size_t before = errs->len;
  check_one_root("model_path", s->model_path, false, roots, errs);
  check_one_root("data.path", s->data.path, false, roots, errs);
  check_one_root("output_dir", s->output_dir, true, roots, errs);
  return errs->len > before ? TY_EINVAL : 0;
}

int jobspec_check_devices(const jobspec_t *s, int gpus_available, ty_errlist_t *errs) {
  if (s->device != JOBSPEC_DEVICE_CUDA) return 0;
  if (gpus_available <= 0) {
    ty_errlist_add(errs, "device",
                   "is cuda but this server has no GPU (it runs with --gpus 0); on a GPU "
                   "host start trainyardd with --gpus N (or TRAINYARD_GPUS=N), else use "
                   "\"auto\" or \"cpu\"");
    return TY_EINVAL;
  }
  if (s->world_size > gpus_available) {
    ty_errlist_add(errs, "device",
                   "cuda with world_size %d needs %d GPUs, this server has %d; "
                   "lower world_size (and allocation_mode) to at most %d, or "
                   "use \"cpu\"",
                   s->world_size, s->world_size, gpus_available, gpus_available);
    return TY_EINVAL;
  }
  return 0;
}
