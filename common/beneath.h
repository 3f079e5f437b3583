/* beneath.h - files opened only inside the process's roots.
 *
 * A process that is given roots (trainyardd: --roots and --output-roots; a
 * rank: TRAINYARD_READ_ROOTS and TRAINYARD_WRITE_ROOTS) opens each root
 * once as a directory handle and reaches every model, data and output file
 * from that handle with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS):
 * a symbolic link on the way may lead anywhere inside the root, never out
 * of it (an absolute link, '..' above the root, a /proc magic link), and
 * what it names cannot change between a check and the open. Folders are
 * made, renamed and removed with mkdirat, renameat and unlinkat relative
 * to a parent opened the same way, so none of them follows a link out.
 * Where the kernel has no openat2 (ENOSYS) the same rules are kept by a
 * walk, one component at a time, with O_NOFOLLOW.
 *
 * Without roots (ty_beneath_set_roots(NULL, NULL), the default) every
 * function here does what the plain system call does: `trainyard train`
 * run by hand opens what its user can.
 *
 * Paths are absolute or relative to the working directory; the root that
 * holds a path is found by its spelling (the roots are kept resolved), so
 * a caller gives the resolved form that trainyardd stores at submit.
 * Reading may use any root; creating, writing, renaming and removing only
 * the write roots. A root of "/" holds everything, and is opened plainly. Functions that fail return a negative TY_E* code (or
 * NULL) with a message in err (may be NULL) that names the path and, for
 * a path that leads out, the root and how to fix it; errno then holds the
 * system's reason: EXDEV for a path that leads outside its root (or lies
 * under none), ELOOP for a magic link or a loop of links.
 *
 * The roots are set once, before the process starts threads, and only
 * read after that. */
#ifndef TY_COMMON_BENEATH_H
#define TY_COMMON_BENEATH_H

#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

/* How ty_beneath_openat resolves. */
typedef enum {
  TY_BENEATH_AUTO = 0, /* openat2, or the walk where the kernel has no openat2 */
  TY_BENEATH_WALK = 1, /* the O_NOFOLLOW walk always (tests; TRAINYARD_BENEATH_WALK=1) */
} ty_beneath_how_t;

/* Opens rel (relative; "" or "." is dirfd itself) beneath the directory
 * dirfd with flags (O_CLOEXEC added) and mode (for O_CREAT). Returns the
 * descriptor, or -errno: -EXDEV where the resolution would leave dirfd's
 * tree, -ELOOP at a magic link or after 40 links. */
int ty_beneath_openat(int dirfd, const char *rel, int flags, mode_t mode, ty_beneath_how_t how);

/* Confines the process to the colon-separated directories of read (may be
 * read) and write (may also be written; readable too). Both NULL or empty:
 * no confinement. Each root is resolved and opened now; 0, or TY_EINVAL
 * naming a root that does not exist or is not a directory (with
 * missing_ok, a root that does not exist is left out: it holds nothing).
 * Replaces the roots set before. */
int ty_beneath_set_roots(const char *read, const char *write, bool missing_ok, char *err,
                         size_t errlen);

/* ty_beneath_set_roots from TRAINYARD_READ_ROOTS and TRAINYARD_WRITE_ROOTS
 * (a root that does not exist is an error); either set, even empty, makes
 * the process confined (both empty: to nothing). TRAINYARD_BENEATH_WALK
 * (0 or 1, default 0) forces the O_NOFOLLOW walk. */
int ty_beneath_roots_from_env(char *err, size_t errlen);

/* Forces (true) or releases the O_NOFOLLOW walk for the process's roots;
 * ty_beneath_walks says which is in force. */
void ty_beneath_force_walk(bool walk);
bool ty_beneath_walks(void);

/* Whether the process has roots. */
bool ty_beneath_confined(void);

/* The resolved roots, colon-separated, of the write roots (write) or of
 * the read roots alone; "" when there are none. Borrowed until the next
 * ty_beneath_set_roots. */
const char *ty_beneath_roots(bool write);

/* open(2) of path inside the roots: flags that write (O_WRONLY, O_RDWR,
 * O_CREAT, O_TRUNC) need a write root. Returns the descriptor or a
 * negative TY_E* code (TY_ENOTFOUND where it does not exist). */
int ty_beneath_open(const char *path, int flags, mode_t mode, char *err, size_t errlen);

/* fopen(3) of path inside the roots ("r", "rb", "w", "wb"); NULL on failure. */
FILE *ty_beneath_fopen(const char *path, const char *mode, char *err, size_t errlen);

/* opendir(3) of path inside the roots; NULL on failure (errno ENOENT: it
 * does not exist). */
DIR *ty_beneath_opendir(const char *path, char *err, size_t errlen);

/* stat(2) of path inside the roots (links followed, inside the root). */
int ty_beneath_stat(const char *path, struct stat *st, char *err, size_t errlen);

/* mkdir -p of dir inside a write root (mode 0755); an existing directory
 * is success. */
int ty_beneath_mkdirs(const char *dir, char *err, size_t errlen);

/* rename(2) of from onto to, both inside write roots; the last component
 * of each is the entry itself (a link is renamed, never followed). */
int ty_beneath_rename(const char *from, const char *to, char *err, size_t errlen);

/* unlink(2) (dir false) or rmdir(2) (dir true) of path inside a write
 * root; the last component is the entry itself. A missing path is
 * TY_ENOTFOUND with errno ENOENT. */
int ty_beneath_remove(const char *path, bool dir, char *err, size_t errlen);

/* Opens path (O_PATH, links followed inside the root) and, when it is a
 * directory, every entry in it and, depth - 1 levels further, in its
 * subdirectories: 0 when nothing leads outside the roots, else TY_EPERM
 * naming the first entry that does. A missing path or entry, and a link
 * inside the root that names nothing, are no error. */
int ty_beneath_check_tree(const char *path, bool write, int depth, char *err, size_t errlen);

#endif
