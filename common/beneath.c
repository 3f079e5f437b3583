/* beneath.c - files opened only inside the process's roots; see beneath.h. */
#include "common/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/fsfault.h"
#include "common/numbers.h"
#include "common/rankenv.h"
#include "common/xalloc.h"

#define ROOTS_MAX 32
#define LINKS_MAX 40 /* as the kernel's own path walk */
#define DEPTH_MAX 256

/* One root: its resolved path (no trailing '/', "/" for the file system's
 * root) and a directory handle on it. */
typedef struct {
  char *path;
  size_t len;
  int fd;
  bool write;
} root_t;

static root_t g_roots[2 * ROOTS_MAX];
static size_t g_nroots;
static char *g_list[2]; /* ty_beneath_roots: [0] read, [1] write */
static bool g_on;       /* roots were given (even if none of them exists) */
static bool g_walk;
static atomic_bool g_no_openat2; /* the kernel answered ENOSYS once */

/* The O_NOFOLLOW walk. stack[0] is dirfd (borrowed); stack[1..depth] are
 * the directories entered, owned. The path still to resolve lives in buf,
 * from rest on: a link's target is put in front of what follows it. */
typedef struct {
  int stack[DEPTH_MAX + 1];
  int depth;
  char buf[2 * PATH_MAX];
  int links;
} walk_t;

static void walk_free(walk_t *w) {
  while (w->depth > 0) close(w->stack[w->depth--]);
}

/* Puts the target of the link fd (an O_PATH handle on it) in front of
 * after (a suffix of w->buf); *rest receives where to go on. -errno. */
static int walk_expand(walk_t *w, int fd, const char *after, char **rest) {
  struct statfs fs;
  if (fstatfs(fd, &fs) == 0 && fs.f_type == PROC_SUPER_MAGIC) return -ELOOP; /* magic */
  char target[PATH_MAX];
  ssize_t n = readlinkat(fd, "", target, sizeof target - 1);
  if (n < 0) return -errno;
  target[n] = '\0';
  if (target[0] == '/') return -EXDEV; /* as RESOLVE_BENEATH: never an absolute link */
  if (++w->links > LINKS_MAX) return -ELOOP;
  size_t a = strlen(after);
  if ((size_t)n + 1 + a + 1 > sizeof w->buf) return -ENAMETOOLONG;
  memmove(w->buf + n + 1, after, a + 1); /* after lies in w->buf */
  memcpy(w->buf, target, (size_t)n);
  w->buf[n] = '/';
  *rest = w->buf;
  return 0;
}

/* Opens the last component name (in the directory on top of the stack)
 * with flags: a descriptor, -errno, or 0 with *expanded set when it was a
 * link, now expanded into *rest. */
static int walk_last(walk_t *w, const char *name, char *after, char **rest, int flags, mode_t mode,
                     bool *expanded) {
  const int cur = w->stack[w->depth];
  int fd;
  if (flags & O_PATH) {
    fd = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
  } else {
    fd = openat(cur, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) return fd;
    if (errno != ELOOP && errno != ENOTDIR) return -errno;
    int e = errno;
    fd = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -e;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  if (!S_ISLNK(st.st_mode)) {
    if (!(flags & O_PATH)) { /* ENOTDIR of a file that is not a link */
      close(fd);
      return -ENOTDIR;
    }
    if ((flags & O_DIRECTORY) && !S_ISDIR(st.st_mode)) {
      close(fd);
      return -ENOTDIR;
    }
    return fd;
  }
  if (flags & O_NOFOLLOW) { /* the caller's own: the link itself, as openat2 gives it */
    if (flags & O_PATH) return fd;
    close(fd);
    return -ELOOP;
  }
  int rc = walk_expand(w, fd, after, rest);
  close(fd);
  *expanded = rc == 0;
  return rc;
}

static int walk_openat(int dirfd, const char *rel, int flags, mode_t mode) {
  walk_t *w = xcalloc(1, sizeof *w);
  w->stack[0] = dirfd;
  if (strlen(rel) >= sizeof w->buf) {
    free(w);
    return -ENAMETOOLONG;
  }
  snprintf(w->buf, sizeof w->buf, "%s", rel);
  char *rest = w->buf;
  int rc;
  for (;;) {
    rest += strspn(rest, "/");
    if (!*rest) { /* the path ends at a directory on the stack */
      rc = openat(w->stack[w->depth], ".", flags | O_CLOEXEC, mode);
      rc = rc < 0 ? -errno : rc;
      break;
    }
    size_t n = strcspn(rest, "/");
    char name[NAME_MAX + 1];
    if (n > NAME_MAX) {
      rc = -ENAMETOOLONG;
      break;
    }
    memcpy(name, rest, n);
    name[n] = '\0';
    char *after = rest + n;
    after += strspn(after, "/");
    const bool last = !*after;
    if (!strcmp(name, ".")) {
      rest = after;
      continue;
    }
    if (!strcmp(name, "..")) {
      if (w->depth == 0) {
        rc = -EXDEV;
        break;
      }
      close(w->stack[w->depth--]);
      rest = after;
      continue;
    }
    if (last) {
      /* after is "" here, so an expanded link goes on from its target. */
      bool expanded = false;
      rc = walk_last(w, name, after, &rest, flags, mode, &expanded);
      if (expanded) continue;
      break;
    }
    int fd = openat(w->stack[w->depth], name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      rc = -errno;
      if (fd >= 0) close(fd);
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      if (w->depth == DEPTH_MAX) {
        close(fd);
        rc = -ENAMETOOLONG;
        break;
      }
      w->stack[++w->depth] = fd;
      rest = after;
      continue;
    }
    rc = S_ISLNK(st.st_mode) ? walk_expand(w, fd, after, &rest) : -ENOTDIR;
    close(fd);
    if (rc) break;
  }
  walk_free(w);
  free(w);
  return rc;
}

int ty_beneath_openat(int dirfd, const char *rel, int flags, mode_t mode, ty_beneath_how_t how) {
  if (!rel[0]) rel = ".";
  if (how == TY_BENEATH_AUTO && !atomic_load(&g_no_openat2)) {
    struct open_how oh = {
        .flags = (unsigned long long)(flags | O_CLOEXEC),
        .mode = (flags & O_CREAT) ? mode : 0,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    for (int tries = 0; tries < 8; tries++) {
      long fd = syscall(SYS_openat2, dirfd, rel, &oh, sizeof oh);
      if (fd >= 0) return (int)fd;
      if (errno == EAGAIN) continue; /* a rename raced the lookup */
      if (errno != ENOSYS) return -errno;
      atomic_store(&g_no_openat2, true);
      break;
    }
  }
  return walk_openat(dirfd, rel, flags, mode);
}

/* ty_errf's twin (common links below api/): the message into err, code back. */
static int errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int errf(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* ---- the process's roots ---- */

static void clear_roots(void) {
  for (size_t i = 0; i < g_nroots; i++) {
    close(g_roots[i].fd);
    free(g_roots[i].path);
  }
  g_nroots = 0;
  g_on = false;
  free(g_list[0]), free(g_list[1]);
  g_list[0] = g_list[1] = NULL;
}

/* Adds the roots of the colon-separated list to g_roots and to g_list[write]. */
static int add_roots(const char *list, bool write, bool missing_ok, char *err, size_t errlen) {
  char *copy = xstrdup(list ? list : ""), *save = NULL;
  size_t cap = strlen(copy) * 4 + PATH_MAX + 1, used = 0;
  g_list[write] = xcalloc(1, cap);
  int rc = 0;
  for (char *tok = strtok_r(copy, ":", &save); tok && !rc; tok = strtok_r(NULL, ":", &save)) {
    char real[PATH_MAX];
    struct stat st;
    g_on = true;
    const bool found = realpath(tok, real) && stat(real, &st) == 0;
    if (!found && missing_ok) continue; /* it holds nothing */
    if (!found || !S_ISDIR(st.st_mode)) {
      rc = errf(err, errlen, TY_EINVAL, "root %s %s; give existing directories", tok,
                found ? "is not a directory" : "does not exist");
      break;
    }
    if (g_nroots == sizeof g_roots / sizeof *g_roots) {
      rc = errf(err, errlen, TY_EINVAL, "more than %d roots", ROOTS_MAX);
      break;
    }
    int fd = open(real, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      rc = errf(err, errlen, TY_EINVAL, "root %s: cannot open: %s", real, strerror(errno));
      break;
    }
    g_roots[g_nroots++] = (root_t){xstrdup(real), strcmp(real, "/") ? strlen(real) : 0, fd, write};
    size_t n = strlen(real);
    if (used + n + 2 < cap) {
      if (used) g_list[write][used++] = ':';
      memcpy(g_list[write] + used, real, n + 1);
      used += n;
    }
  }
  free(copy);
  return rc;
}

int ty_beneath_set_roots(const char *read, const char *write, bool missing_ok, char *err,
                         size_t errlen) {
  clear_roots();
  int rc = add_roots(write, true, missing_ok, err, errlen);
  if (!rc) rc = add_roots(read, false, missing_ok, err, errlen);
  if (rc) clear_roots();
  return rc;
}

int ty_beneath_roots_from_env(char *err, size_t errlen) {
  long walk = 0;
  int rc = rankenv_long(RANKENV_BENEATH_WALK, &walk, err, errlen);
  if (rc) return rc;
  g_walk = walk == 1;
  const char *read = getenv(rankenv_name(RANKENV_READ_ROOTS));
  const char *write = getenv(rankenv_name(RANKENV_WRITE_ROOTS));
  rc = ty_beneath_set_roots(read, write, false, err, errlen);
  /* Set but empty (a server none of whose roots exists): confined to nothing. */
  if (!rc && (read || write)) g_on = true;
  return rc;
}

void ty_beneath_force_walk(bool walk) {
  g_walk = walk;
}

bool ty_beneath_walks(void) {
  return g_walk;
}

bool ty_beneath_confined(void) {
  return g_on;
}

const char *ty_beneath_roots(bool write) {
  return g_list[write] ? g_list[write] : "";
}

/* ---- paths inside the roots ---- */

/* A path made absolute (the working directory before a relative one) and
 * without trailing '/', into out (PATH_MAX bytes); -ENAMETOOLONG. */
static int absolute(const char *path, char *out) {
  char cwd[PATH_MAX];
  int n;
  if (path[0] == '/')
    n = snprintf(out, PATH_MAX, "%s", path);
  else if (!getcwd(cwd, sizeof cwd))
    return -errno;
  else
    n = snprintf(out, PATH_MAX, "%s/%s", cwd, path);
  if (n >= PATH_MAX) return -ENAMETOOLONG;
  size_t k = 0; /* "//" as "/" */
  for (int i = 0; i < n; i++)
    if (!(out[i] == '/' && k && out[k - 1] == '/')) out[k++] = out[i];
  while (k > 1 && out[k - 1] == '/') k--;
  out[k] = '\0';
  return 0;
}

/* path's part below root r ("." for the root itself), or NULL when r does
 * not hold path. */
static const char *below(const root_t *r, const char *abs) {
  if (r->len == 0) return abs[1] ? abs + 1 : ".";
  if (strncmp(abs, r->path, r->len) || (abs[r->len] && abs[r->len] != '/')) return NULL;
  const char *rel = abs + r->len;
  rel += strspn(rel, "/");
  return *rel ? rel : ".";
}

/* Why path leads out of root r, for a message: the first symbolic link
 * on its way and where it points, as the file system has them now. */
static void first_link(const root_t *r, const char *path, char *out, size_t n) {
  char abs[PATH_MAX], target[PATH_MAX];
  snprintf(out, n, "a symbolic link on its way is absolute or climbs above the root with '..'");
  if (absolute(path, abs) || !below(r, abs)) return;
  for (char *p = abs + r->len + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    const char c = *p;
    *p = '\0';
    struct stat st;
    ssize_t k;
    if (lstat(abs, &st) != 0) return;
    if (S_ISLNK(st.st_mode) && (k = readlink(abs, target, sizeof target - 1)) > 0) {
      target[k] = '\0';
      snprintf(out, n, "%s is a symbolic link to %s", abs, target);
      return;
    }
    if (!strcmp(strrchr(abs, '/') + 1, "..")) {
      snprintf(out, n, "'..' climbs above the root");
      return;
    }
    *p = c;
    if (!c) return;
  }
}

/* The message for errno e at path inside root (NULL: under no root). */
static int fail(char *err, size_t errlen, const char *path, const root_t *root, bool write, int e) {
  int code = e == ENOENT ? TY_ENOTFOUND : TY_EPERM;
  if (!root && e == EXDEV) {
    char list[2 * PATH_MAX];
    const char *r = ty_beneath_roots(false), *w = ty_beneath_roots(true);
    snprintf(list, sizeof list, "%s%s%s", write ? "" : r, !write && *r && *w ? ", " : "", w);
    for (char *c = list; (c = strchr(c, ':'));) *c = ','; /* "a:b" reads "a,b" */
    errf(err, errlen, code, "%s lies outside the %sroots (%s); give a path inside one of them",
         path, write ? "output " : "", *list ? list : "none exists");
  } else if (e == EXDEV) {
    char why[2 * PATH_MAX + 64];
    first_link(root, path, why, sizeof why);
    errf(err, errlen, code,
         "%s leads outside the root %s (%s); replace the link with the file or folder itself, "
         "or with a relative link that stays inside the root",
         path, root->path, why);
  } else if (e == ELOOP)
    errf(err, errlen, code,
         "%s: a /proc magic link, or more than %d symbolic links, on its way inside the root "
         "%s; replace the link with the file or folder itself",
         path, LINKS_MAX, root ? root->path : "(none)");
  else
    errf(err, errlen, code, "%s: %s", path, strerror(e));
  errno = e;
  return code;
}

/* Opens path inside the roots (write: the write roots only) with flags.
 * Each root that holds it is tried; the first that opens it wins. Without
 * roots, a plain open. */
static int open_in(const char *path, bool write, int flags, mode_t mode, char *err, size_t errlen) {
  if (!g_on) {
    int fd = open(path, flags | O_CLOEXEC, mode);
    if (fd < 0) return fail(err, errlen, path, NULL, write, errno);
    return fd;
  }
  char abs[PATH_MAX];
  int e = absolute(path, abs);
  if (e) return fail(err, errlen, path, NULL, write, -e);
  const root_t *first = NULL;
  int first_e = EXDEV;
  for (size_t i = 0; i < g_nroots; i++) {
    const root_t *r = &g_roots[i];
    const char *rel = write && !r->write ? NULL : below(r, abs);
    if (!rel) continue;
    int fd;
    if (r->len == 0) { /* the root "/" holds everything: nothing to refuse */
      fd = openat(r->fd, rel, flags | O_CLOEXEC, mode);
      if (fd < 0) fd = -errno;
    } else {
      fd = ty_beneath_openat(r->fd, rel, flags, mode, g_walk ? TY_BENEATH_WALK : TY_BENEATH_AUTO);
    }
    if (fd >= 0) return fd;
    /* Report a plain failure (a missing file) before a way out. */
    if (!first || (first_e == EXDEV || first_e == ELOOP)) first = r, first_e = -fd;
  }
  return fail(err, errlen, path, first, write, first_e);
}

static bool writes(int flags) {
  return (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC));
}

int ty_beneath_open(const char *path, int flags, mode_t mode, char *err, size_t errlen) {
  return open_in(path, writes(flags), flags, mode, err, errlen);
}

FILE *ty_beneath_fopen(const char *path, const char *mode, char *err, size_t errlen) {
  int flags = mode[0] == 'w' ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY;
  int fd = ty_beneath_open(path, flags, 0666, err, errlen); /* as fopen: the umask applies */
  if (fd < 0) return NULL;
  FILE *f = fdopen(fd, mode);
  if (!f) {
    int e = errno;
    close(fd);
    errf(err, errlen, TY_EPERM, "%s: %s", path, strerror(e));
    errno = e;
  }
  return f;
}

DIR *ty_beneath_opendir(const char *path, char *err, size_t errlen) {
  int fd = open_in(path, false, O_RDONLY | O_DIRECTORY, 0, err, errlen);
  if (fd < 0) return NULL;
  DIR *d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    errf(err, errlen, TY_EPERM, "%s: %s", path, strerror(e));
    errno = e;
  }
  return d;
}

int ty_beneath_stat(const char *path, struct stat *st, char *err, size_t errlen) {
  if (!g_on) {
    if (stat(path, st) == 0) return 0;
    return fail(err, errlen, path, NULL, false, errno);
  }
  int fd = open_in(path, false, O_PATH, 0, err, errlen);
  if (fd < 0) return fd;
  int rc = fstat(fd, st) == 0 ? 0 : fail(err, errlen, path, NULL, false, errno);
  close(fd);
  return rc;
}

/* Splits path into its parent, opened (O_PATH | O_DIRECTORY) inside a
 * write root, and its last component (into name, NAME_MAX + 1 bytes).
 * Returns the parent's descriptor or a negative TY_E* code. */
static int open_parent(const char *path, char *name, char *err, size_t errlen) {
  char abs[PATH_MAX];
  int e = g_on ? absolute(path, abs) : 0;
  if (!g_on) snprintf(abs, sizeof abs, "%s", path);
  if (e) return fail(err, errlen, path, NULL, true, -e);
  char *slash = strrchr(abs, '/');
  const char *last = slash ? slash + 1 : abs;
  if (strlen(last) > NAME_MAX || !strcmp(last, ".") || !strcmp(last, "..") || !*last)
    return errf(err, errlen, TY_EINVAL, "%s: not a name that can be made or removed", path);
  snprintf(name, NAME_MAX + 1, "%s", last);
  if (!slash) return open_in(".", true, O_PATH | O_DIRECTORY, 0, err, errlen);
  if (slash == abs)
    slash[1] = '\0';
  else
    *slash = '\0';
  int fd = open_in(abs, true, O_PATH | O_DIRECTORY, 0, err, errlen);
  if (fd < 0) {
    /* The message names the parent; say which entry it was for. */
    char why[1024];
    snprintf(why, sizeof why, "%s", err ? err : "");
    if (err) errf(err, errlen, fd, "%s (the folder of %s)", why, path);
  }
  return fd;
}

int ty_beneath_mkdirs(const char *dir, char *err, size_t errlen) {
  int fe = ty_fsfault("mkdir", dir);
  if (fe) return errf(err, errlen, TY_EUNAVAILABLE, "cannot make %s: %s", dir, strerror(fe));
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
    return errf(err, errlen, TY_EINVAL, "path too long: %.64s...", dir);
  char *start = path + 1;
  if (g_on) {
    /* The folders down to a write root exist: they are not made, nor
     * opened (they lie outside it), from there on each one is. */
    int e = absolute(dir, path);
    if (e) return fail(err, errlen, dir, NULL, true, -e);
    const root_t *r = NULL;
    for (size_t i = 0; i < g_nroots && !r; i++)
      if (g_roots[i].write && below(&g_roots[i], path)) r = &g_roots[i];
    if (!r) return fail(err, errlen, dir, NULL, true, EXDEV);
    start = path + r->len + 1;
    if (start > path + strlen(path)) return 0; /* the root itself */
  }
  /* Each '/' (and the end) closes one component, made where missing. */
  for (char *p = start;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    int fd = open_in(path, true, O_PATH | O_DIRECTORY, 0, NULL, 0);
    if (fd < 0 && errno == ENOENT) {
      char name[NAME_MAX + 1];
      int pfd = open_parent(path, name, err, errlen);
      if (pfd < 0) return pfd;
      int made = mkdirat(pfd, name, 0755);
      int e = errno;
      close(pfd);
      if (made != 0 && e != EEXIST) {
        errno = e;
        return errf(err, errlen, TY_EPERM, "cannot create directory %s: %s", path, strerror(e));
      }
    }
    if (fd < 0) fd = open_in(path, true, O_PATH | O_DIRECTORY, 0, err, errlen);
    if (fd < 0) {
      if (errno == ENOTDIR && err)
        errf(err, errlen, TY_EPERM, "cannot create directory %s: a file of that name exists", path);
      else if (errno == ENOENT && err)
        errf(err, errlen, TY_EPERM,
             "cannot create directory %s: a symbolic link of that name names nothing", path);
      return TY_EPERM;
    }
    close(fd);
    *p = c;
    if (!c) break;
  }
  return 0;
}

int ty_beneath_rename(const char *from, const char *to, char *err, size_t errlen) {
  int fe = ty_fsfault("rename", to);
  if (fe)
    return errf(err, errlen, TY_EUNAVAILABLE, "cannot rename %s to %s: %s", from, to,
                strerror(fe));
  char a[NAME_MAX + 1], b[NAME_MAX + 1];
  int pa = open_parent(from, a, err, errlen);
  if (pa < 0) return pa;
  int pb = open_parent(to, b, err, errlen);
  if (pb < 0) {
    close(pa);
    return pb;
  }
  int rc = 0;
  if (renameat(pa, a, pb, b) != 0)
    rc = errf(err, errlen, errno == ENOENT ? TY_ENOTFOUND : TY_EPERM, "cannot rename %s to %s: %s",
              from, to, strerror(errno));
  int e = errno;
  close(pa), close(pb);
  errno = e;
  return rc;
}

int ty_beneath_remove(const char *path, bool dir, char *err, size_t errlen) {
  char name[NAME_MAX + 1];
  int pfd = open_parent(path, name, err, errlen);
  if (pfd < 0) return pfd;
  int rc = 0;
  if (unlinkat(pfd, name, dir ? AT_REMOVEDIR : 0) != 0)
    rc = fail(err, errlen, path, NULL, true, errno);
  int e = errno;
  close(pfd);
  errno = e;
  return rc;
}

int ty_beneath_check_tree(const char *path, bool write, int depth, char *err, size_t errlen) {
  int fd = open_in(path, write, O_PATH, 0, err, errlen);
  if (fd < 0) return errno == ENOENT ? 0 : TY_EPERM;
  struct stat st;
  bool isdir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
  close(fd);
  if (!isdir || depth <= 0) return 0;
  DIR *d = ty_beneath_opendir(path, err, errlen);
  if (!d) return errno == ENOENT ? 0 : TY_EPERM;
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char sub[PATH_MAX];
    if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) continue;
    rc = ty_beneath_check_tree(sub, write, depth - 1, err, errlen);
  }
  closedir(d);
  return rc;
}
