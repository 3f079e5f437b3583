/* db_faults.c - fault injection for tests, in the manner of SQLite's
 * test_vfs.c: a VFS that wraps the default one and fails the Nth write,
 * sync or truncate (and, unless told "once", every one after it) with
 * SQLITE_FULL or an I/O error, so that a test can sweep N over every write
 * of a job's life and check what survives.
 *
 * Off unless TRAINYARD_TEST_DB_FAULTS names a control file; trainyardd
 * then says so loudly at start. The file holds "N full|ioerr [once]" and is
 * read again whenever it changes (which restarts the count from 0); while
 * it is missing, nothing fails. Each fault hit is counted in "<control>.hits"
 * and every write seen in "<control>.seen", so a sweep knows when N has
 * passed the last write of what it drives. */
#include "db/db_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

#define FAULTS_VFS "trainyard-faults"

typedef struct {
  sqlite3_file base;
  sqlite3_file *real; /* the default VFS's file, right after this struct */
} ffile_t;

static struct {
  pthread_mutex_t lock;
  char ctl[PATH_MAX];
  struct stat seen_st; /* the control file as last read */
  bool armed;          /* the control file exists and parses */
  long nth;            /* fail the nth operation (1-based) ... */
  bool once;           /* ... and only it */
  int code;            /* SQLITE_FULL or SQLITE_IOERR_* */
  long count;          /* operations since the control file changed */
  sqlite3_vfs *real;
  sqlite3_vfs vfs;
  sqlite3_io_methods io;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void bump_file(const char *suffix) {
  char path[PATH_MAX + 8];
  snprintf(path, sizeof path, "%s.%s", g.ctl, suffix);
  long n = 0;
  FILE *f = fopen(path, "r");
  if (f) {
    if (fscanf(f, "%ld", &n) != 1) n = 0;
    fclose(f);
  }
  f = fopen(path, "w");
  if (f) {
    fprintf(f, "%ld\n", n + 1);
    fclose(f);
  }
}

/* Whether this operation fails, and with which code: a write, sync or
 * truncate (step false) or a statement step (step true; SQLITE_INTERRUPT).
 * Each counts only where the control file's kind is its own. */
static int fault_of(int ioerr, bool step) {
  pthread_mutex_lock(&g.lock);
  struct stat st;
  int rc = SQLITE_OK;
  if (stat(g.ctl, &st)) {
    g.armed = false;
  } else {
    if (!g.armed || st.st_ino != g.seen_st.st_ino ||
        st.st_mtim.tv_sec != g.seen_st.st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != g.seen_st.st_mtim.tv_nsec || st.st_size != g.seen_st.st_size) {
      g.seen_st = st;
      g.count = 0;
      g.armed = false;
      FILE *f = fopen(g.ctl, "r");
      char kind[16] = "", mode[16] = "";
      if (f && fscanf(f, "%ld %15s %15s", &g.nth, kind, mode) >= 2 && g.nth >= 1) {
        g.armed = true;
        g.once = !strcmp(mode, "once");
        g.code = !strcmp(kind, "full")        ? SQLITE_FULL
                 : !strcmp(kind, "interrupt") ? SQLITE_INTERRUPT
                                              : -1;
      }
      if (f) fclose(f);
    }
    if (g.armed && step == (g.code == SQLITE_INTERRUPT)) {
      g.count++;
      bump_file("seen");
      if (g.count == g.nth || (!g.once && g.count > g.nth)) {
        rc = g.code == SQLITE_FULL || step ? g.code : ioerr;
        bump_file("hits");
      }
    }
  }
  pthread_mutex_unlock(&g.lock);
  return rc;
}

static int fault(int ioerr) { return fault_of(ioerr, false); }

bool dbi_fault_step(void) { return g.real && fault_of(SQLITE_INTERRUPT, true) != SQLITE_OK; }

#define REAL(f) (((ffile_t *)(f))->real)

static int f_close(sqlite3_file *f) {
  return REAL(f)->pMethods->xClose(REAL(f));
}
static int f_read(sqlite3_file *f, void *buf, int n, sqlite3_int64 off) {
  return REAL(f)->pMethods->xRead(REAL(f), buf, n, off);
}
static int f_write(sqlite3_file *f, const void *buf, int n, sqlite3_int64 off) {
  int rc = fault(SQLITE_IOERR_WRITE);
  return rc ? rc : REAL(f)->pMethods->xWrite(REAL(f), buf, n, off);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 size) {
  int rc = fault(SQLITE_IOERR_TRUNCATE);
  return rc ? rc : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int f_sync(sqlite3_file *f, int flags) {
  int rc = fault(SQLITE_IOERR_FSYNC);
  return rc ? rc : REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *size) {
  return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int f_lock(sqlite3_file *f, int l) {
  return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int f_unlock(sqlite3_file *f, int l) {
  return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int f_check(sqlite3_file *f, int *out) {
  return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int f_control(sqlite3_file *f, int op, void *arg) {
  return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int f_sector(sqlite3_file *f) {
  return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int f_chars(sqlite3_file *f) {
  return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int f_shm_map(sqlite3_file *f, int pg, int sz, int ext, void volatile **p) {
  return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, ext, p);
}
static int f_shm_lock(sqlite3_file *f, int off, int n, int flags) {
  return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void f_shm_barrier(sqlite3_file *f) {
  REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int f_shm_unmap(sqlite3_file *f, int del) {
  return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int f_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **p) {
  return REAL(f)->pMethods->xFetch(REAL(f), off, n, p);
}
static int f_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p) {
  return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out) {
  (void)vfs;
  ffile_t *ff = (ffile_t *)f;
  ff->real = (sqlite3_file *)&ff[1];
  int rc = g.real->xOpen(g.real, name, ff->real, flags, out);
  /* SQLite calls xClose only when pMethods is set: leave it NULL on failure. */
  ff->base.pMethods = rc == SQLITE_OK && ff->real->pMethods ? &g.io : NULL;
  return rc;
}

const char *dbi_faults_vfs(void) {
  const char *ctl = getenv("TRAINYARD_TEST_DB_FAULTS");
  if (!ctl || !*ctl) return NULL;
  pthread_mutex_lock(&g.lock);
  if (!g.real) {
    snprintf(g.ctl, sizeof g.ctl, "%s", ctl);
    g.real = sqlite3_vfs_find(NULL);
    g.vfs = *g.real;
    g.vfs.zName = FAULTS_VFS;
    g.vfs.szOsFile = (int)sizeof(ffile_t) + g.real->szOsFile;
    g.vfs.xOpen = v_open;
    g.vfs.pNext = NULL;
    g.io = (sqlite3_io_methods){
        3,          f_close,       f_read,      f_write,   f_truncate, f_sync,  f_size,
        f_lock,     f_unlock,      f_check,     f_control, f_sector,   f_chars, f_shm_map,
        f_shm_lock, f_shm_barrier, f_shm_unmap, f_fetch,   f_unfetch};
    sqlite3_vfs_register(&g.vfs, 0);
    ty_warn(
        "TEST FAULT INJECTION ON: database writes fail as %s says (TRAINYARD_TEST_DB_FAULTS); "
        "never set this outside tests",
        ctl);
  }
  pthread_mutex_unlock(&g.lock);
  return FAULTS_VFS;
}
