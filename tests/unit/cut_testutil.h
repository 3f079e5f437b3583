/* cut_testutil.h - a checkpoint cut short under a running load: the loader
 * tests' progress callback empties every safetensors file of a folder once
 * a given number of tensors are in. No test framework needed. */
#ifndef TY_TESTS_CUT_TESTUTIL_H
#define TY_TESTS_CUT_TESTUTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The callback's state: the folder, after how many tensors, how many so far. */
typedef struct {
  const char *dir;
  int after, seen;
  int failed; /* a truncate failed */
} tu_cut_t;

/* A loader progress callback (ctx a tu_cut_t): at the after-th call it
 * truncates every *.safetensors file of dir to nothing. */
static inline void tu_cut_files(void *ctx, uint64_t done, uint64_t total) {
  (void)done, (void)total;
  tu_cut_t *c = ctx;
  if (++c->seen != c->after) return;
  DIR *d = opendir(c->dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    char p[4096];
    if (!strstr(e->d_name, ".safetensors") || strstr(e->d_name, ".json")) continue;
    snprintf(p, sizeof p, "%s/%s", c->dir, e->d_name);
    if (truncate(p, 0)) c->failed = 1, perror(p);
  }
  if (d) closedir(d);
}

#endif
