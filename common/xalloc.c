/* xalloc.c - checked allocation; see xalloc.h. */
#include "common/xalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Noreturn void oom(size_t n, const char *file, int line) {
  fprintf(stderr, "fatal %s:%d: out of memory allocating %zu bytes\n", file, line, n);
  abort();
}

void *ty_xmalloc_at(size_t n, const char *file, int line) {
  void *p = malloc(n ? n : 1);
  if (!p) oom(n, file, line);
  return p;
}

void *ty_xcalloc_at(size_t count, size_t size, const char *file, int line) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p) oom(count * size, file, line);
  return p;
}

void *ty_xrealloc_at(void *p, size_t n, const char *file, int line) {
  void *q = realloc(p, n ? n : 1);
  if (!q) oom(n, file, line);
  return q;
}

char *ty_xstrdup_at(const char *s, const char *file, int line) {
  size_t n = strlen(s) + 1;
  char *p = ty_xmalloc_at(n, file, line);
  memcpy(p, s, n);
  return p;
}
