/* tok_pretokenizer.c - tokenizer.json pre-tokenizers: Sequence, Split,
 * ByteLevel, Metaspace. One loader per "type" in a table; any other type,
 * and any option these do not implement, is refused by name. */
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

/* ---- the ByteLevel byte map ---- */

static tok_bytelevel_t bytelevel_map;
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

/* Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves;
 * the others, in byte order, for U+0100 onwards. */
static void bytelevel_build(void) {
  unsigned next = 256;
  for (int i = 0; i < 324; i++) bytelevel_map.byte_of[i] = -1;
  for (unsigned b = 0; b < 256; b++) {
    int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    unsigned cp = keep ? b : next++;
    char tmp[4];
    bytelevel_map.len[b] = (unsigned char)tok_utf8_encode(cp, tmp);
    memcpy(bytelevel_map.ch[b], tmp, 2);
    bytelevel_map.byte_of[cp] = (int16_t)b;
  }
}

const tok_bytelevel_t *tok_bytelevel(void) {
  pthread_once(&bytelevel_once, bytelevel_build);
  return &bytelevel_map;
}

/* GPT-2's split, used by ByteLevel when use_regex is true. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Split's behaviors, as tokenizer.json names them. */
typedef enum {
  SPLIT_ISOLATED,
  SPLIT_REMOVED,
  SPLIT_MERGED_WITH_PREVIOUS,
  SPLIT_MERGED_WITH_NEXT,
  SPLIT_CONTIGUOUS
} split_behavior_t;

static const char *const split_behaviors[] = {"Isolated", "Removed", "MergedWithPrevious",
                                              "MergedWithNext", "Contiguous"};

typedef struct {
  size_t s, e;
  int match;
} span_t;

typedef struct {
  span_t *v;
  size_t n, cap;
} spans_t;

static void span_push(spans_t *a, size_t s, size_t e, int match) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 32;
    a->v = xrealloc(a->v, a->cap * sizeof *a->v);
  }
  a->v[a->n++] = (span_t){s, e, match};
}

/* Cuts s[0..n) into the spans between and of re's matches (an empty match
 * cuts there too, and the search moves on one character, as the
 * reference's matchAll loop does), then joins or drops them as behavior
 * says, and appends the non-empty pieces to out. invert makes the spans
 * between the matches the delimiters. */
static int regex_split(const tok_regex_t *re, tok_match_t *m, const char *s, size_t n,
                       split_behavior_t behavior, int invert, tok_pieces_t *out, char *err,
                       size_t errlen) {
  spans_t sp = {0};
  size_t prev = 0, from = 0;
  int rc = 0;
  while (from <= n) {
    size_t ms, me;
    rc = tok_regex_find(re, m, s, n, from, &ms, &me, err, errlen);
    if (rc < 0) goto done;
    if (rc == 0) break;
    if (ms > prev) span_push(&sp, prev, ms, invert);
    span_push(&sp, ms, me, !invert);
    prev = me;
    if (me > ms) {
      from = me;
    } else {
      if (me >= n) break;
      size_t cl = tok_utf8_char_len((const unsigned char *)s + me, n - me);
      from = me + (cl ? cl : 1);
    }
  }
  rc = 0;
  if (prev < n) span_push(&sp, prev, n, invert);
  /* join: each rule says when a span extends the piece before it */
  spans_t pieces = {0};
  int previous_match = 0;
  if (behavior == SPLIT_MERGED_WITH_NEXT) { /* a delimiter starts the piece after it */
    for (size_t i = sp.n; i-- > 0;) {
      span_t x = sp.v[i];
      if (x.match && !previous_match && pieces.n)
        pieces.v[pieces.n - 1].s = x.s;
      else
        span_push(&pieces, x.s, x.e, 0);
      previous_match = x.match;
    }
    for (size_t i = pieces.n; i-- > 0;)
      if (pieces.v[i].e > pieces.v[i].s)
        tok_pieces_push(out, s + pieces.v[i].s, pieces.v[i].e - pieces.v[i].s);
  } else {
    for (size_t i = 0; i < sp.n; i++) {
      span_t x = sp.v[i];
      int join = (behavior == SPLIT_MERGED_WITH_PREVIOUS && x.match && !previous_match) ||
                 (behavior == SPLIT_CONTIGUOUS && i > 0 && x.match == previous_match);
      if (behavior == SPLIT_REMOVED && x.match) {
        /* dropped */
      } else if (join && pieces.n) {
        pieces.v[pieces.n - 1].e = x.e;
      } else {
        span_push(&pieces, x.s, x.e, 0);
      }
      previous_match = x.match;
    }
    for (size_t i = 0; i < pieces.n; i++)
      if (pieces.v[i].e > pieces.v[i].s)
        tok_pieces_push(out, s + pieces.v[i].s, pieces.v[i].e - pieces.v[i].s);
  }
  free(pieces.v);
done:
  free(sp.v);
  return rc;
}

/* ---- Sequence ---- */

typedef struct {
  tok_pretok_t base;
  tok_pretok_t **items;
  size_t n;
} pt_sequence_t;

static int sequence_apply(const tok_pretok_t *pt, tok_scratch_t *sc, const tok_pieces_t *in,
                          tok_pieces_t *out, size_t section, char *err, size_t errlen) {
  const pt_sequence_t *q = (const pt_sequence_t *)pt;
  if (q->n == 0) {
    for (size_t i = 0; i < in->n; i++) {
      size_t len;
      const char *p = tok_piece(in, i, &len);
      tok_pieces_push(out, p, len);
    }
    return 0;
  }
  /* in -> (tmp[0] <-> tmp[1]) -> out: the last step writes out. Local
   * lists, so that a Sequence may hold a Sequence. */
  const tok_pieces_t *src = in;
  tok_pieces_t tmp[2];
  memset(tmp, 0, sizeof tmp);
  int rc = 0;
  for (size_t i = 0; i < q->n && rc == 0; i++) {
    tok_pieces_t *dst = i + 1 == q->n ? out : &tmp[i % 2];
    if (dst != out) tok_pieces_clear(dst);
    rc = q->items[i]->apply(q->items[i], sc, src, dst, section, err, errlen);
    src = dst;
  }
  tok_pieces_free(&tmp[0]);
  tok_pieces_free(&tmp[1]);
  return rc;
}

static void sequence_free(tok_pretok_t *pt) {
  pt_sequence_t *q = (pt_sequence_t *)pt;
  for (size_t i = 0; i < q->n; i++) tok_pretok_free(q->items[i]);
  free(q->items);
  free(q);
}

/* ---- Split ---- */

typedef struct {
  tok_pretok_t base;
  tok_regex_t *re;
  split_behavior_t behavior;
  int invert;
} pt_split_t;

static int split_apply(const tok_pretok_t *pt, tok_scratch_t *sc, const tok_pieces_t *in,
                       tok_pieces_t *out, size_t section, char *err, size_t errlen) {
  const pt_split_t *q = (const pt_split_t *)pt;
  for (size_t i = 0; i < in->n; i++) {
    size_t len;
    const char *p = tok_piece(in, i, &len);
    int rc = regex_split(q->re, sc->match, p, len, q->behavior, q->invert, out, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

static void split_free(tok_pretok_t *pt) {
  pt_split_t *q = (pt_split_t *)pt;
  tok_regex_free(q->re);
  free(q);
}

/* ---- ByteLevel ---- */

typedef struct {
  tok_pretok_t base;
  tok_regex_t *re; /* GPT-2's split, or NULL (use_regex: false) */
  int add_prefix_space;
} pt_bytelevel_t;

static void bytelevel_map_piece(const char *s, size_t n, tok_pieces_t *out) {
  const tok_bytelevel_t *bl = tok_bytelevel();
  char stack[256];
  char *buf = n * 2 <= sizeof stack ? stack : xmalloc(n * 2);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)s[i];
    buf[k++] = bl->ch[b][0];
    if (bl->len[b] == 2) buf[k++] = bl->ch[b][1];
  }
  tok_pieces_push(out, buf, k);
  if (buf != stack) free(buf);
}

static int bytelevel_apply(const tok_pretok_t *pt, tok_scratch_t *sc, const tok_pieces_t *in,
                           tok_pieces_t *out, size_t section, char *err, size_t errlen) {
  const pt_bytelevel_t *q = (const pt_bytelevel_t *)pt;
  tok_buf_t pref = {0};
  tok_pieces_t split = {0};
  int rc = 0;
  for (size_t i = 0; i < in->n && rc == 0; i++) {
    size_t len;
    const char *p = tok_piece(in, i, &len);
    if (q->add_prefix_space && (len == 0 || p[0] != ' ')) {
      pref.len = 0;
      tok_buf_append(&pref, " ", 1);
      tok_buf_append(&pref, p, len);
      p = pref.s;
      len = pref.len;
    }
    if (!q->re) {
      bytelevel_map_piece(p, len, out);
      continue;
    }
    tok_pieces_clear(&split);
    rc = regex_split(q->re, sc->match, p, len, SPLIT_ISOLATED, 0, &split, err, errlen);
    for (size_t k = 0; k < split.n && rc == 0; k++) {
      size_t sl;
      const char *sp = tok_piece(&split, k, &sl);
      bytelevel_map_piece(sp, sl, out);
    }
  }
  tok_buf_free(&pref);
  tok_pieces_free(&split);
  return rc;
}

static void bytelevel_free(tok_pretok_t *pt) {
  pt_bytelevel_t *q = (pt_bytelevel_t *)pt;
  tok_regex_free(q->re);
  free(q);
}

/* ---- Metaspace ---- */

typedef struct {
  tok_pretok_t base;
  char rep[8];
  size_t rep_len;
  int prepend; /* 0 never, 1 always, 2 first (the first section only) */
  int split;   /* split before each replacement character */
} pt_metaspace_t;

static int metaspace_apply(const tok_pretok_t *pt, tok_scratch_t *sc, const tok_pieces_t *in,
                           tok_pieces_t *out, size_t section, char *err, size_t errlen) {
  const pt_metaspace_t *q = (const pt_metaspace_t *)pt;
  tok_buf_t b = {0};
  for (size_t i = 0; i < in->n; i++) {
    size_t len;
    const char *p = tok_piece(in, i, &len);
    b.len = 0;
    tok_buf_append(&b, "", 0);
    int add = q->prepend == 1 || (q->prepend == 2 && section == 0 && i == 0);
    if (add && !(len >= q->rep_len && !memcmp(p, q->rep, q->rep_len)) && !(len && p[0] == ' '))
      tok_buf_append(&b, q->rep, q->rep_len);
    for (size_t k = 0; k < len; k++) {
      if (p[k] == ' ')
        tok_buf_append(&b, q->rep, q->rep_len);
      else
        tok_buf_append(&b, p + k, 1);
    }
    if (!q->split) {
      tok_pieces_push(out, b.s, b.len);
      continue;
    }
    /* Each replacement character starts a new piece (merged with what follows). */
    size_t start = 0;
    for (size_t k = 1; k + q->rep_len <= b.len; k++) {
      if (!memcmp(b.s + k, q->rep, q->rep_len)) {
        tok_pieces_push(out, b.s + start, k - start);
        start = k;
      }
    }
    if (start < b.len) tok_pieces_push(out, b.s + start, b.len - start);
  }
  tok_buf_free(&b);
  return 0;
}

static void metaspace_free(tok_pretok_t *pt) {
  free(pt);
}

/* ---- loaders ---- */

static int load_sequence(json_t *j, tok_pretok_t **out, char *err, size_t errlen) {
  json_t *arr = json_object_get(j, "pretokenizers");
  if (!json_is_array(arr))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: pre_tokenizer Sequence needs a \"pretokenizers\" array");
  pt_sequence_t *q = xcalloc(1, sizeof *q);
  q->base.apply = sequence_apply;
  q->base.free = sequence_free;
  q->items = xcalloc(json_array_size(arr) + 1, sizeof *q->items);
  size_t i;
  json_t *v;
  json_array_foreach(arr, i, v) {
    tok_pretok_t *item = NULL;
    int rc = tok_pretok_load(v, &item, err, errlen);
    if (rc) {
      sequence_free(&q->base);
      return rc;
    }
    if (item) q->items[q->n++] = item;
  }
  *out = &q->base;
  return 0;
}

static int load_split(json_t *j, tok_pretok_t **out, char *err, size_t errlen) {
  const char *behavior = json_string_value(json_object_get(j, "behavior"));
  size_t k = 0, nb = sizeof split_behaviors / sizeof *split_behaviors;
  while (behavior && k < nb && strcmp(behavior, split_behaviors[k])) k++;
  if (!behavior || k == nb)
    return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                   "tokenizer.json: pre_tokenizer Split behavior '%s' is not supported "
                   "(supported: Isolated, Removed, MergedWithPrevious, MergedWithNext, "
                   "Contiguous)",
                   behavior ? behavior : "(none)");
  tok_regex_t *re;
  int rc =
      tok_regex_from_json(json_object_get(j, "pattern"), "pre_tokenizer Split", &re, err, errlen);
  if (rc) return rc;
  pt_split_t *q = xcalloc(1, sizeof *q);
  q->base.apply = split_apply;
  q->base.free = split_free;
  q->re = re;
  q->behavior = (split_behavior_t)k;
  q->invert = json_is_true(json_object_get(j, "invert"));
  *out = &q->base;
  return 0;
}

static int load_bytelevel(json_t *j, tok_pretok_t **out, char *err, size_t errlen) {
  json_t *ur = json_object_get(j, "use_regex");
  pt_bytelevel_t *q = xcalloc(1, sizeof *q);
  q->base.apply = bytelevel_apply;
  q->base.free = bytelevel_free;
  q->add_prefix_space = json_is_true(json_object_get(j, "add_prefix_space"));
  if (!ur || json_is_true(ur)) {
    int rc = tok_regex_compile(gpt2_pattern, strlen(gpt2_pattern), 0, &q->re, err, errlen);
    if (rc) {
      free(q);
      return rc;
    }
  }
  *out = &q->base;
  return 0;
}

static int load_metaspace(json_t *j, tok_pretok_t **out, char *err, size_t errlen) {
  pt_metaspace_t *q = xcalloc(1, sizeof *q);
  q->base.apply = metaspace_apply;
  q->base.free = metaspace_free;
  json_t *rep = json_object_get(j, "replacement");
  const char *r = json_is_string(rep) ? json_string_value(rep) : "\xE2\x96\x81";
  q->rep_len = strlen(r);
  if (q->rep_len == 0 || q->rep_len > 4 ||
      tok_utf8_char_len((const unsigned char *)r, q->rep_len) != q->rep_len) {
    free(q);
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: pre_tokenizer Metaspace replacement must be one character");
  }
  memcpy(q->rep, r, q->rep_len);
  const char *scheme = json_string_value(json_object_get(j, "prepend_scheme"));
  json_t *aps = json_object_get(j, "add_prefix_space");
  if (scheme) {
    if (!strcmp(scheme, "always"))
      q->prepend = 1;
    else if (!strcmp(scheme, "first"))
      q->prepend = 2;
    else if (!strcmp(scheme, "never"))
      q->prepend = 0;
    else {
      free(q);
      return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                     "tokenizer.json: pre_tokenizer Metaspace prepend_scheme '%s' is not "
                     "supported (supported: always, first, never)",
                     scheme);
    }
  } else {
    q->prepend = !aps || json_is_true(aps);
  }
  json_t *sp = json_object_get(j, "split");
  q->split = !sp || json_is_true(sp);
  *out = &q->base;
  return 0;
}

static const struct {
  const char *type;
  int (*load)(json_t *j, tok_pretok_t **out, char *err, size_t errlen);
} pretok_types[] = {
    {"Sequence", load_sequence},
    {"Split", load_split},
    {"ByteLevel", load_bytelevel},
    {"Metaspace", load_metaspace},
};

int tok_pretok_load(json_t *j, tok_pretok_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (!j || json_is_null(j)) return 0;
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: a pre_tokenizer has no type");
  for (size_t i = 0; i < sizeof pretok_types / sizeof *pretok_types; i++)
    if (!strcmp(type, pretok_types[i].type)) return pretok_types[i].load(j, out, err, errlen);
  return TOK_REFUSE(err, errlen, "pre_tokenizer", type, pretok_types);
}

void tok_pretok_free(tok_pretok_t *pt) {
  if (pt) pt->free(pt);
}
