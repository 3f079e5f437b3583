/* tok_util.c - the byte buffers, piece lists and id lists of the tokenizer. */
#include <stdio.h>
#include <string.h>

#include "common/errors.h"

#include "common/xalloc.h"
#include "text/tok_internal.h"

void tok_buf_append(tok_buf_t *b, const void *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    b->s = xrealloc(b->s, cap);
    b->cap = cap;
  }
  if (n) memcpy(b->s + b->len, p, n);
  b->len += n;
  b->s[b->len] = '\0';
}

void tok_buf_free(tok_buf_t *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

void tok_pieces_clear(tok_pieces_t *p) {
  p->buf.len = 0;
  p->n = 0;
  if (!p->off) {
    p->cap = 16;
    p->off = xmalloc((p->cap + 1) * sizeof *p->off);
  }
  p->off[0] = 0;
}

void tok_pieces_push(tok_pieces_t *p, const char *s, size_t n) {
  if (!p->off) tok_pieces_clear(p);
  if (p->n + 1 > p->cap) {
    p->cap *= 2;
    p->off = xrealloc(p->off, (p->cap + 1) * sizeof *p->off);
  }
  tok_buf_append(&p->buf, s, n);
  p->off[++p->n] = p->buf.len;
}

void tok_pieces_free(tok_pieces_t *p) {
  tok_buf_free(&p->buf);
  free(p->off);
  memset(p, 0, sizeof *p);
}

void tok_ids_push(tok_ids_t *a, uint32_t id) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 64;
    a->v = xrealloc(a->v, a->cap * sizeof *a->v);
  }
  a->v[a->n++] = id;
}

int tok_refuse(char *err, size_t errlen, const char *kind, const char *type, const void *table,
               size_t n, size_t stride) {
  char names[512] = "";
  size_t used = 0;
  for (size_t i = 0; i < n && used < sizeof names; i++) {
    const char *name = *(const char *const *)((const char *)table + i * stride);
    int w = snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", name);
    if (w < 0) break;
    used += (size_t)w;
  }
  return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                 "tokenizer.json: %s type '%s' is not supported (supported: %s)", kind, type,
                 names);
}
