/* fsutil.h - small filesystem helpers every binary uses. */
#ifndef TY_COMMON_FSUTIL_H
#define TY_COMMON_FSUTIL_H

#include <stddef.h>

/* Creates dir and every missing parent (mode 0755), like mkdir -p. An
 * existing directory is success. Returns 0, or TY_EINVAL (path too long) /
 * TY_EPERM (a component could not be created) with a message naming the
 * component and the system's reason in err (may be NULL). */
int ty_mkdirs(const char *dir, char *err, size_t errlen);

/* Removes directory dir with everything in it, like rm -rf, without
 * following symbolic links (a link is removed, never what it names) and at
 * most 16 levels deep. A missing dir is success. Returns 0, or TY_EPERM
 * with a message naming the first entry that could not be removed in err
 * (may be NULL); what was removed before it stays removed. */
int ty_rmtree(const char *dir, char *err, size_t errlen);

/* flock(fd, LOCK_EX | LOCK_NB), retried when a signal interrupts it: 0;
 * TY_EPRECONDITION when another open of the file holds the lock; TY_EPERM
 * when it cannot be taken at all (errno tells why). */
int ty_flock_try(int fd);

/* Takes an exclusive advisory lock (flock) on directory dir, creating it and
 * its parents when missing (inside the process's roots, common/beneath.h),
 * for as long as the returned descriptor stays open: close it to release (the kernel releases it
 * when the process ends, however it ends). The descriptor is close-on-exec, so processes started
 * meanwhile do not hold the lock. Returns the descriptor (>= 0);
 * TY_EPRECONDITION when another open of dir holds the lock (another run
 * writes there); TY_EPERM or TY_EINVAL, with a message in err (may be
 * NULL), when dir cannot be made or opened. */
int ty_dir_lock(const char *dir, char *err, size_t errlen);

/* Where our programs (trainyardd, trainyard) find trainyard-worker: beside
 * the running executable (an installed layout), else in ../worker/ of it
 * (the build tree). Writes the path into out (n bytes); returns 0 when that
 * file is executable, -1 otherwise (out then holds the last path tried, or
 * "trainyard-worker" when the executable's own path is unknown). */
int ty_find_worker(char *out, size_t n);

#endif
