/* fsfault.h - a test hook that fails one of a process's file writes,
 * renames or folder creations with an errno, so that the tests can see what
 * a rank does when the disk fills or errs in the middle of a save, swept
 * over every such operation of a job (in the manner of SQLite's ioerr
 * tests). Off, at the cost of one branch, unless TY_TEST_FS_FAULTS names a
 * control file, read once at the first check, holding "N ERRNO [once]":
 * the Nth operation of the process (counted from 1 over every kind) fails
 * with ERRNO (ENOSPC, EIO, EDQUOT, EROFS), and every later one too unless
 * "once" follows. Each failure injected is said on stderr. Only a process
 * that arms the hook counts (trainyard-worker does, at start): the server
 * and the CLI, which share the file code, never inject. */
#ifndef TY_COMMON_FSFAULT_H
#define TY_COMMON_FSFAULT_H

/* Makes this process subject to TY_TEST_FS_FAULTS (once, at start). */
void ty_fsfault_arm(void);

/* Counts one operation ("write", "rename", "mkdir") on path; returns 0, or
 * the errno it must fail with (errno is set to it too). */
int ty_fsfault(const char *op, const char *path);

#endif
