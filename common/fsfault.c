/* fsfault.c - the file-operation fault hook; see fsfault.h. */
#include "common/fsfault.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static long g_nth;  /* 0: off */
static int g_errno; /* what the Nth fails with */
static int g_once_only;
static long g_count;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct {
  const char *name;
  int value;
} k_errnos[] = {{"ENOSPC", ENOSPC}, {"EIO", EIO}, {"EDQUOT", EDQUOT}, {"EROFS", EROFS}};

static int g_armed;

void ty_fsfault_arm(void) {
  g_armed = 1;
}

static void load(void) {
  const char *ctl = g_armed ? getenv("TY_TEST_FS_FAULTS") : NULL;
  if (!ctl || !*ctl) return;
  FILE *f = fopen(ctl, "r");
  if (!f) {
    fprintf(stderr, "fsfault: TY_TEST_FS_FAULTS=%s cannot be read: %s; no fault injected\n", ctl,
            strerror(errno));
    return;
  }
  char name[32] = "", once[16] = "";
  long n = 0;
  int got = fscanf(f, "%ld %31s %15s", &n, name, once);
  fclose(f);
  if (got < 2 || n < 1) {
    fprintf(stderr, "fsfault: %s: want \"N ERRNO [once]\" with N >= 1; no fault injected\n", ctl);
    return;
  }
  for (size_t i = 0; i < sizeof k_errnos / sizeof *k_errnos; i++)
    if (!strcmp(name, k_errnos[i].name)) g_errno = k_errnos[i].value;
  if (!g_errno) {
    fprintf(stderr, "fsfault: %s: errno %s is not one of ENOSPC, EIO, EDQUOT, EROFS\n", ctl, name);
    return;
  }
  g_once_only = !strcmp(once, "once");
  g_nth = n;
}

int ty_fsfault(const char *op, const char *path) {
  pthread_once(&g_once, load);
  if (!g_nth) return 0;
  pthread_mutex_lock(&g_lock);
  long k = ++g_count;
  pthread_mutex_unlock(&g_lock);
  if (k < g_nth || (g_once_only && k > g_nth)) return 0;
  fprintf(stderr, "fsfault: %s of %s fails with %s (operation %ld)\n", op, path, strerror(g_errno),
          k);
  errno = g_errno;
  return g_errno;
}
