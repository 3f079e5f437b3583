/* tok_added.c - finding added tokens in text: leftmost-longest, as the
 * reference's dictionary splitter does. Candidates are bucketed by their
 * first byte and tried longest first, so a scan costs one table look-up
 * per byte of text that cannot start a token. */
#include <stdlib.h>
#include <string.h>

#include "common/xalloc.h"
#include "text/tok_internal.h"

typedef struct {
  const char *s;
  size_t len, ti;
} cand_t;

typedef struct {
  cand_t *v;
  size_t n;
} bucket_t;

struct tok_added_set_s {
  bucket_t b[256];
  size_t count;
};

tok_added_set_t *tok_added_set_new(void) {
  return xcalloc(1, sizeof(tok_added_set_t));
}

void tok_added_set_add(tok_added_set_t *set, const char *content, size_t len, size_t ti) {
  if (len == 0) return;
  bucket_t *b = &set->b[(unsigned char)content[0]];
  b->v = xrealloc(b->v, (b->n + 1) * sizeof *b->v);
  /* keep longest first; a second token of equal content keeps the first */
  size_t i = b->n;
  for (size_t k = 0; k < b->n; k++) {
    if (b->v[k].len == len && !memcmp(b->v[k].s, content, len)) return;
    if (b->v[k].len < len) {
      i = k;
      break;
    }
  }
  memmove(b->v + i + 1, b->v + i, (b->n - i) * sizeof *b->v);
  b->v[i] = (cand_t){content, len, ti};
  b->n++;
  set->count++;
}

void tok_added_set_free(tok_added_set_t *set) {
  if (!set) return;
  for (int i = 0; i < 256; i++) free(set->b[i].v);
  free(set);
}

int tok_added_set_find(const tok_added_set_t *set, const char *s, size_t n, size_t start,
                       size_t *ms, size_t *me, size_t *ti) {
  if (!set || set->count == 0) return 0;
  for (size_t i = start; i < n; i++) {
    const bucket_t *b = &set->b[(unsigned char)s[i]];
    for (size_t k = 0; k < b->n; k++) {
      const cand_t *c = &b->v[k];
      if (c->len <= n - i && !memcmp(c->s, s + i, c->len)) {
        *ms = i;
        *me = i + c->len;
        *ti = c->ti;
        return 1;
      }
    }
  }
  return 0;
}

int tok_added_set_exact(const tok_added_set_t *set, const char *s, size_t n, size_t *ti) {
  if (!set || n == 0) return 0;
  const bucket_t *b = &set->b[(unsigned char)s[0]];
  for (size_t k = 0; k < b->n; k++)
    if (b->v[k].len == n && !memcmp(b->v[k].s, s, n)) {
      *ti = b->v[k].ti;
      return 1;
    }
  return 0;
}
