/* fsutil.c - small filesystem helpers; see fsutil.h. */
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/beneath.h"

int ty_mkdirs(const char *dir, char *err, size_t errlen) {
  char path[PATH_MAX];
  if (strlen(dir) >= sizeof path) {
    if (err) snprintf(err, errlen, "path too long: %.64s...", dir);
    return TY_EINVAL;
  }
  strcpy(path, dir);
  /* Each '/' (and the end) closes one component; the leading '/' of an
   * absolute path is skipped. */
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    struct stat st;
    if (mkdir(path, 0755) != 0 &&
        !(errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
      if (err)
        snprintf(err, errlen, "cannot create directory %s: %s", path,
                 errno == EEXIST ? "a file of that name exists" : strerror(errno));
      return TY_EPERM;
    }
    *p = c;
    if (!c) break;
  }
  return 0;
}

/* Removes every entry of the open directory dfd (consumed), depth levels at
 * most below it; path names it for messages. */
static int rm_contents(int dfd, const char *path, int depth, char *err, size_t errlen) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    if (err) snprintf(err, errlen, "cannot read directory %s: %s", path, strerror(errno));
    close(dfd);
    return TY_EPERM;
  }
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      int sfd = depth > 0
                    ? openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                    : -1;
      if (sfd < 0) {
        if (err)
          snprintf(err, errlen, "cannot open directory %s: %s", sub,
                   depth > 0 ? strerror(errno) : "nested too deep");
        rc = TY_EPERM;
        break;
      }
      rc = rm_contents(sfd, sub, depth - 1, err, errlen);
      if (!rc && unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) != 0) {
        if (err) snprintf(err, errlen, "cannot remove directory %s: %s", sub, strerror(errno));
        rc = TY_EPERM;
      }
    } else if (unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT) {
      if (err) snprintf(err, errlen, "cannot remove %s: %s", sub, strerror(errno));
      rc = TY_EPERM;
    }
  }
  closedir(d);
  return rc;
}

int ty_rmtree(const char *dir, char *err, size_t errlen) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return 0;
  if (fd < 0) {
    if (err) snprintf(err, errlen, "cannot open directory %s: %s", dir, strerror(errno));
    return TY_EPERM;
  }
  int rc = rm_contents(fd, dir, 16, err, errlen);
  if (!rc && rmdir(dir) != 0 && errno != ENOENT) {
    if (err) snprintf(err, errlen, "cannot remove directory %s: %s", dir, strerror(errno));
    rc = TY_EPERM;
  }
  return rc;
}

int ty_flock_try(int fd) {
  while (flock(fd, LOCK_EX | LOCK_NB) != 0)
    if (errno != EINTR) return errno == EWOULDBLOCK ? TY_EPRECONDITION : TY_EPERM;
  return 0;
}

int ty_dir_lock(const char *dir, char *err, size_t errlen) {
  int rc = ty_beneath_mkdirs(dir, err, errlen);
  if (rc) return rc;
  char why[1024];
  int fd = ty_beneath_open(dir, O_RDONLY | O_DIRECTORY, 0, why, sizeof why);
  if (fd < 0) {
    if (err) snprintf(err, errlen, "cannot open the directory: %s", why);
    return TY_EPERM;
  }
  rc = ty_flock_try(fd);
  if (rc) {
    int e = errno;
    close(fd);
    if (rc == TY_EPERM && err)
      snprintf(err, errlen, "cannot lock directory %s: %s", dir, strerror(e));
    return rc;
  }
  return fd;
}

int ty_find_worker(char *out, size_t n) {
  char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  char *slash = NULL;
  if (k > 0) {
    self[k] = '\0';
    slash = strrchr(self, '/');
  }
  if (!slash) {
    snprintf(out, n, "trainyard-worker");
    return -1;
  }
  *slash = '\0';
  snprintf(out, n, "%s/trainyard-worker", self);
  if (!access(out, X_OK)) return 0;
  snprintf(out, n, "%s/../worker/trainyard-worker", self);
  return access(out, X_OK) ? -1 : 0;
}
