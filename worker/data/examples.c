/* examples.c - the tokenized data set's file: writer and read-only map;
 * see examples.h. */
#include "worker/data/examples.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/partial.h"
#include "common/xalloc.h"

#define MAGIC "TYEXMPL1"
#define HEADER_BYTES 64
#define WBUF_TOKENS 65536 /* tokens buffered before a write */

struct examples_writer_s {
  char *path, *tmp;
  int fd, slot;
  uint64_t *offsets; /* [cap]; offsets[0] = 0 */
  size_t n_off, cap;
  uint32_t *buf; /* [WBUF_TOKENS] tokens waiting to be written */
  size_t nbuf;
  uint64_t tokens;
};

static int write_all(int fd, const void *p, size_t n, off_t off) {
  const char *c = p;
  while (n) {
    ssize_t r = off >= 0 ? pwrite(fd, c, n, off) : write(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
    if (off >= 0) off += r;
  }
  return 0;
}

int examples_writer_open(examples_writer_t **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  examples_writer_t *w = xcalloc(1, sizeof *w);
  w->path = xstrdup(path);
  size_t len = strlen(path) + 16;
  w->tmp = xmalloc(len);
  snprintf(w->tmp, len, "%s.partial", path);
  w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    int e = errno;
    free(w->tmp), free(w->path), free(w);
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot create %s.partial: %s", path, strerror(e));
  }
  w->slot = ty_partial_track(w->tmp);
  w->cap = 1024;
  w->offsets = xmalloc(w->cap * sizeof *w->offsets);
  w->offsets[w->n_off++] = 0;
  w->buf = xmalloc(WBUF_TOKENS * sizeof *w->buf);
  static const char zero[HEADER_BYTES];
  if (write_all(w->fd, zero, sizeof zero, -1)) {
    int e = errno;
    examples_abort(w);
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "writing %s.partial: %s", path, strerror(e));
  }
  *out = w;
  return 0;
}

static int flush(examples_writer_t *w, char *err, size_t errlen) {
  if (w->nbuf && write_all(w->fd, w->buf, w->nbuf * sizeof *w->buf, -1))
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "writing %s: %s", w->tmp, strerror(errno));
  w->nbuf = 0;
  return 0;
}

int examples_add(examples_writer_t *w, const uint32_t *ids, const uint8_t *counted, size_t n,
                 char *err, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    if (ids[i] > EXAMPLES_ID_MAX)
      return ty_errf(err, errlen, TY_EINVAL, "token id %u is beyond 2^31", ids[i]);
    if (w->nbuf == WBUF_TOKENS) {
      int rc = flush(w, err, errlen);
      if (rc) return rc;
    }
    w->buf[w->nbuf++] = ids[i] | (counted && counted[i] ? EXAMPLES_COUNTED : 0);
  }
  w->tokens += n;
  if (w->n_off == w->cap) {
    w->cap *= 2;
    w->offsets = xrealloc(w->offsets, w->cap * sizeof *w->offsets);
  }
  w->offsets[w->n_off++] = w->tokens;
  return 0;
}

int64_t examples_written(const examples_writer_t *w) {
  return (int64_t)w->n_off - 1;
}

static void writer_free(examples_writer_t *w) {
  if (w->fd >= 0) close(w->fd);
  ty_partial_untrack(w->slot);
  free(w->offsets);
  free(w->buf);
  free(w->tmp);
  free(w->path);
  free(w);
}

void examples_abort(examples_writer_t *w) {
  if (!w) return;
  unlink(w->tmp);
  writer_free(w);
}

int examples_commit(examples_writer_t *w, uint64_t key, uint64_t source_bytes, char *err,
                    size_t errlen) {
  int rc = flush(w, err, errlen);
  static const uint32_t pad = 0; /* the offsets start 8-byte aligned */
  if (!rc && (w->tokens % 2) && write_all(w->fd, &pad, sizeof pad, -1))
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "writing %s: %s", w->tmp, strerror(errno));
  if (!rc && write_all(w->fd, w->offsets, w->n_off * sizeof *w->offsets, -1))
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "writing %s: %s", w->tmp, strerror(errno));
  uint64_t h[8] = {0, key, (uint64_t)w->n_off - 1, w->tokens, source_bytes, 0, 0, 0};
  memcpy(h, MAGIC, 8);
  if (!rc && (write_all(w->fd, h, sizeof h, 0) || fsync(w->fd)))
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "writing %s: %s", w->tmp, strerror(errno));
  if (!rc && rename(w->tmp, w->path))
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "renaming %s onto %s: %s", w->tmp, w->path,
                 strerror(errno));
  if (rc) {
    examples_abort(w);
    return rc;
  }
  writer_free(w);
  return 0;
}

struct examples_s {
  void *map;
  size_t bytes;
  int64_t n_examples, n_tokens;
  const uint32_t *tokens;  /* [n_tokens] */
  const uint64_t *offsets; /* [n_examples + 1] */
};

int examples_open(examples_t **out, const char *path, uint64_t key, char *err, size_t errlen) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ty_errf(err, errlen, errno == ENOENT ? TY_ENOTFOUND : TY_EUNAVAILABLE,
                   "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || st.st_size < HEADER_BYTES) {
    close(fd);
    return ty_errf(err, errlen, TY_EDATALOSS, "%s is not a tokenized data file (too short)", path);
  }
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED)
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot map %s: %s", path, strerror(errno));
  uint64_t h[8];
  memcpy(h, map, sizeof h);
  const uint64_t E = h[2], N = h[3], size = (uint64_t)st.st_size;
  int rc = 0;
  if (memcmp(h, MAGIC, 8))
    rc = ty_errf(err, errlen, TY_EDATALOSS, "%s is not a tokenized data file (no %s magic)", path,
                 MAGIC);
  else if (h[1] != key)
    rc = ty_errf(err, errlen, TY_EPRECONDITION, "%s was built from other data or settings", path);
  else if (N > size / 4 || E > size / 8 || size != HEADER_BYTES + (N + N % 2) * 4 + (E + 1) * 8)
    rc = ty_errf(err, errlen, TY_EDATALOSS,
                 "%s holds %llu bytes, not the %llu examples and %llu tokens its header names",
                 path, (unsigned long long)size, (unsigned long long)E, (unsigned long long)N);
  const uint64_t *off = (const uint64_t *)((const char *)map + HEADER_BYTES + (N + N % 2) * 4);
  for (uint64_t e = 0; !rc && e < E; e++)
    if (off[e] > off[e + 1] || off[e + 1] > N || off[0] != 0)
      rc = ty_errf(err, errlen, TY_EDATALOSS, "%s: example %llu's token range is out of order",
                   path, (unsigned long long)e);
  if (!rc && off[E] != N)
    rc = ty_errf(err, errlen, TY_EDATALOSS, "%s: the examples do not cover its %llu tokens", path,
                 (unsigned long long)N);
  if (rc) {
    munmap(map, (size_t)st.st_size);
    return rc;
  }
  examples_t *x = xcalloc(1, sizeof *x);
  x->map = map;
  x->bytes = (size_t)st.st_size;
  x->n_examples = (int64_t)E;
  x->n_tokens = (int64_t)N;
  x->tokens = (const uint32_t *)((const char *)map + HEADER_BYTES);
  x->offsets = off;
  *out = x;
  return 0;
}

void examples_close(examples_t *x) {
  if (!x) return;
  munmap(x->map, x->bytes);
  free(x);
}

int64_t examples_count(const examples_t *x) {
  return x->n_examples;
}
int64_t examples_tokens(const examples_t *x) {
  return x->n_tokens;
}

const uint32_t *examples_get(const examples_t *x, int64_t e, size_t *n) {
  *n = (size_t)(x->offsets[e + 1] - x->offsets[e]);
  return x->tokens + x->offsets[e];
}

uint64_t examples_hash(uint64_t h, const void *bytes, size_t n) {
  const unsigned char *p = bytes;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
