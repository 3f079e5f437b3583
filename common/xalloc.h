/* xalloc.h - checked allocation.
 *
 * Out of memory is not recoverable at these call sites, so these functions
 * never return NULL: they log the size and the caller's file:line and abort.
 * Every pointer they return is the caller's, released with free(). Large
 * buffers whose failure a caller can report (checkpoint shards, staging
 * buckets) use plain malloc and return an error instead. */
#ifndef TY_COMMON_XALLOC_H
#define TY_COMMON_XALLOC_H

#include <stddef.h>

void *ty_xmalloc_at(size_t n, const char *file, int line);
void *ty_xcalloc_at(size_t count, size_t size, const char *file, int line);
void *ty_xrealloc_at(void *p, size_t n, const char *file, int line);
char *ty_xstrdup_at(const char *s, const char *file, int line);

#define xmalloc(n) ty_xmalloc_at((n), __FILE__, __LINE__)
#define xcalloc(c, s) ty_xcalloc_at((c), (s), __FILE__, __LINE__)
#define xrealloc(p, n) ty_xrealloc_at((p), (n), __FILE__, __LINE__)
#define xstrdup(s) ty_xstrdup_at((s), __FILE__, __LINE__)

#endif
