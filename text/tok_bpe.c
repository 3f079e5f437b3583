/* tok_bpe.c - the BPE model of tokenizer.json.
 *
 * The vocabulary is an open-addressing table from token string to id; the
 * merges a table from the pair of ids (left << 32 | right) to (rank,
 * merged id). A word starts as one symbol per character (a character
 * outside the vocabulary becomes its <0xXX> byte tokens with byte_fallback,
 * else unk_token, fused when fuse_unk), and the pair of lowest rank, leftmost
 * first, is merged until none is left: a binary heap of candidate pairs over
 * a linked list of symbols, O(n log n) per word. Words up to
 * TOK_CACHE_MAX_WORD bytes are cached (tok_cache.c). */
#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

#define TOK_CACHE_MAX_WORD 256

typedef struct {
  uint64_t key; /* left << 32 | right; UINT64_MAX: empty */
  uint32_t rank, id;
} merge_slot_t;

/* A vocabulary slot: the id + 1 (0: empty) and the high half of the
 * string's hash, so that a probe past another string rarely reads it. */
typedef struct {
  uint32_t id1, tag;
} vocab_slot_t;

struct tok_bpe_s {
  char **str;    /* (vocab_end) id -> token, NUL-terminated; NULL for a hole */
  uint32_t *len; /* (vocab_end) */
  uint32_t vocab_end;
  vocab_slot_t *vslots; /* (vmask + 1) */
  uint64_t vmask;
  merge_slot_t *mslots; /* (mmask + 1) */
  uint64_t mmask;
  int64_t unk;          /* -1 without unk_token */
  int64_t byte_id[256]; /* <0xXX> ids with byte_fallback, else -1 */
  int byte_fallback, fuse_unk, ignore_merges;
  tok_cache_t *cache;
};

int64_t tok_bpe_lookup(const tok_bpe_t *m, const char *s, size_t n) {
  uint64_t h = tok_hash(s, n);
  uint32_t tag = (uint32_t)(h >> 32);
  for (uint64_t i = h & m->vmask;; i = (i + 1) & m->vmask) {
    vocab_slot_t v = m->vslots[i];
    if (!v.id1) return -1;
    uint32_t id = v.id1 - 1;
    if (v.tag == tag && m->len[id] == n && !memcmp(m->str[id], s, n)) return id;
  }
}

const char *tok_bpe_id_to_token(const tok_bpe_t *m, uint32_t id, size_t *n) {
  if (id >= m->vocab_end || !m->str[id]) return NULL;
  *n = m->len[id];
  return m->str[id];
}

uint32_t tok_bpe_vocab_end(const tok_bpe_t *m) {
  return m->vocab_end;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

static const merge_slot_t *merge_find(const tok_bpe_t *m, uint32_t a, uint32_t b) {
  uint64_t key = (uint64_t)a << 32 | b;
  for (uint64_t i = mix64(key) & m->mmask;; i = (i + 1) & m->mmask) {
    const merge_slot_t *s = &m->mslots[i];
    if (s->key == key) return s;
    if (s->key == UINT64_MAX) return NULL;
  }
}

/* ---- encoding one word ---- */

typedef struct {
  uint32_t rank, pos, right, lid, rid, id;
} cand_t;

typedef struct {
  cand_t *v;
  size_t n, cap;
} heap_t;

static int cand_less(const cand_t *a, const cand_t *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_t *h, cand_t c) {
  if (h->n == h->cap) {
    h->cap = h->cap ? h->cap * 2 : 64;
    h->v = xrealloc(h->v, h->cap * sizeof *h->v);
  }
  size_t i = h->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!cand_less(&c, &h->v[p])) break;
    h->v[i] = h->v[p];
    i = p;
  }
  h->v[i] = c;
}

static cand_t heap_pop(heap_t *h) {
  cand_t top = h->v[0], last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const cand_t *mv = &last;
    if (l < h->n && cand_less(&h->v[l], mv)) m = l, mv = &h->v[l];
    if (r < h->n && cand_less(&h->v[r], mv)) m = r;
    if (m == i) break;
    h->v[i] = h->v[m];
    i = m;
  }
  if (h->n) h->v[i] = last;
  return top;
}

typedef struct {
  uint32_t *id;
  int32_t *prev, *next;
  uint8_t *alive;
  size_t n, cap;
} symbols_t;

static void sym_push(symbols_t *s, uint32_t id) {
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 64;
    s->id = xrealloc(s->id, s->cap * sizeof *s->id);
    s->prev = xrealloc(s->prev, s->cap * sizeof *s->prev);
    s->next = xrealloc(s->next, s->cap * sizeof *s->next);
    s->alive = xrealloc(s->alive, s->cap);
  }
  s->id[s->n] = id;
  s->prev[s->n] = (int32_t)s->n - 1;
  s->next[s->n] = (int32_t)s->n + 1;
  s->alive[s->n] = 1;
  s->n++;
}

static void sym_free(symbols_t *s) {
  free(s->id);
  free(s->prev);
  free(s->next);
  free(s->alive);
}

static void add_cand(const tok_bpe_t *m, const symbols_t *s, heap_t *h, int32_t pos) {
  int32_t r = s->next[pos];
  if (pos < 0 || r >= (int32_t)s->n) return;
  const merge_slot_t *ms = merge_find(m, s->id[pos], s->id[r]);
  if (!ms) return;
  cand_t c = {ms->rank, (uint32_t)pos, (uint32_t)r, s->id[pos], s->id[r], ms->id};
  heap_push(h, c);
}

static void bpe_word(const tok_bpe_t *m, const char *s, size_t n, tok_ids_t *ids) {
  symbols_t sy = {0};
  int last_unk = 0;
  for (size_t i = 0; i < n;) {
    size_t cl = tok_utf8_char_len((const unsigned char *)s + i, n - i);
    if (!cl) cl = 1; /* cannot happen: the input was made valid UTF-8 */
    int64_t id = tok_bpe_lookup(m, s + i, cl);
    if (id >= 0) {
      sym_push(&sy, (uint32_t)id);
      last_unk = 0;
    } else {
      int bytes_ok = m->byte_fallback;
      for (size_t k = 0; k < cl && bytes_ok; k++)
        bytes_ok = m->byte_id[(unsigned char)s[i + k]] >= 0;
      if (bytes_ok) {
        for (size_t k = 0; k < cl; k++)
          sym_push(&sy, (uint32_t)m->byte_id[(unsigned char)s[i + k]]);
        last_unk = 0;
      } else if (m->unk >= 0) {
        if (!(m->fuse_unk && last_unk)) sym_push(&sy, (uint32_t)m->unk);
        last_unk = 1;
      }
    }
    i += cl;
  }
  heap_t h = {0};
  for (size_t i = 0; i + 1 < sy.n; i++) add_cand(m, &sy, &h, (int32_t)i);
  while (h.n) {
    cand_t c = heap_pop(&h);
    if (!sy.alive[c.pos] || sy.next[c.pos] != (int32_t)c.right || sy.id[c.pos] != c.lid ||
        sy.id[c.right] != c.rid)
      continue; /* stale: one side was merged since */
    sy.id[c.pos] = c.id;
    sy.alive[c.right] = 0;
    int32_t nx = sy.next[c.right];
    sy.next[c.pos] = nx;
    if (nx < (int32_t)sy.n) sy.prev[nx] = (int32_t)c.pos;
    if (sy.prev[c.pos] >= 0) add_cand(m, &sy, &h, sy.prev[c.pos]);
    add_cand(m, &sy, &h, (int32_t)c.pos);
  }
  for (int32_t i = 0; i < (int32_t)sy.n; i = sy.next[i]) tok_ids_push(ids, sy.id[i]);
  free(h.v);
  sym_free(&sy);
}

int tok_bpe_encode(const tok_bpe_t *m, const char *s, size_t n, tok_ids_t *ids, char *err,
                   size_t errlen) {
  if (n == 0) return 0;
  if (m->ignore_merges) {
    int64_t id = tok_bpe_lookup(m, s, n);
    if (id >= 0) {
      tok_ids_push(ids, (uint32_t)id);
      return 0;
    }
  }
  int cacheable = n < TOK_CACHE_MAX_WORD;
  if (cacheable && tok_cache_get(m->cache, s, n, ids)) return 0;
  size_t first = ids->n;
  bpe_word(m, s, n, ids);
  if (cacheable) tok_cache_put(m->cache, s, n, ids->v ? ids->v + first : NULL, ids->n - first);
  return 0;
}

/* ---- loading ---- */

static void vocab_insert(tok_bpe_t *m, uint32_t id) {
  uint64_t h = tok_hash(m->str[id], m->len[id]);
  uint64_t i = h & m->vmask;
  while (m->vslots[i].id1) i = (i + 1) & m->vmask;
  m->vslots[i] = (vocab_slot_t){id + 1, (uint32_t)(h >> 32)};
}

static int merge_insert(tok_bpe_t *m, const char *a, size_t al, const char *b, size_t bl,
                        uint32_t rank, char *err, size_t errlen) {
  int64_t ia = tok_bpe_lookup(m, a, al), ib = tok_bpe_lookup(m, b, bl);
  char stack[512];
  char *ab = al + bl <= sizeof stack ? stack : xmalloc(al + bl);
  memcpy(ab, a, al);
  memcpy(ab + al, b, bl);
  int64_t iab = tok_bpe_lookup(m, ab, al + bl);
  if (ab != stack) free(ab);
  if (ia < 0 || ib < 0 || iab < 0)
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: merge %u ('%.*s' '%.*s'): %s is not in the vocabulary", rank,
                   (int)(al > 64 ? 64 : al), a, (int)(bl > 64 ? 64 : bl), b,
                   ia < 0   ? "its left token"
                   : ib < 0 ? "its right token"
                            : "the merged token");
  uint64_t key = (uint64_t)ia << 32 | (uint64_t)ib;
  uint64_t i = mix64(key) & m->mmask;
  for (; m->mslots[i].key != UINT64_MAX; i = (i + 1) & m->mmask)
    if (m->mslots[i].key == key) return 0; /* a repeated merge keeps its first rank */
  m->mslots[i].key = key;
  m->mslots[i].rank = rank;
  m->mslots[i].id = (uint32_t)iab;
  return 0;
}

static int check_option(json_t *model, const char *name, char *err, size_t errlen) {
  json_t *v = json_object_get(model, name);
  if (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0) ||
      (json_is_number(v) && json_number_value(v) == 0.0) || json_is_false(v))
    return 0;
  return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                 "tokenizer.json: BPE option '%s' is not supported (it must be null)", name);
}

int tok_bpe_load(json_t *model, tok_bpe_t **out, char *err, size_t errlen) {
  json_t *vocab = json_object_get(model, "vocab");
  json_t *merges = json_object_get(model, "merges");
  if (!json_is_object(vocab) || !json_is_array(merges))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: model BPE needs a \"vocab\" object and a \"merges\" array");
  int rc;
  if ((rc = check_option(model, "dropout", err, errlen)) ||
      (rc = check_option(model, "continuing_subword_prefix", err, errlen)) ||
      (rc = check_option(model, "end_of_word_suffix", err, errlen)))
    return rc;
  tok_bpe_t *m = xcalloc(1, sizeof *m);
  m->unk = -1;
  for (int b = 0; b < 256; b++) m->byte_id[b] = -1;
  const char *key;
  json_t *v;
  uint32_t end = 0;
  json_object_foreach(vocab, key, v) {
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0 || id >= (json_int_t)TOK_MAX_ID) {
      rc = ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: vocab entry '%.64s' has no valid id",
                   key);
      goto fail;
    }
    if ((uint32_t)id + 1 > end) end = (uint32_t)id + 1;
  }
  m->vocab_end = end;
  m->str = xcalloc(end + 1, sizeof *m->str);
  m->len = xcalloc(end + 1, sizeof *m->len);
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)json_object_size(vocab) + 16) cap *= 2;
  m->vslots = xcalloc(cap, sizeof *m->vslots);
  m->vmask = cap - 1;
  /* jansson keys are NUL-terminated; a key holding "\u0000" is cut there,
   * so the length comes from json_object_iter_key_len. */
  for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
    const char *k = json_object_iter_key(it);
    size_t kl = json_object_iter_key_len(it);
    uint32_t id = (uint32_t)json_integer_value(json_object_iter_value(it));
    if (m->str[id]) {
      rc = ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: vocab id %u is given twice", id);
      goto fail;
    }
    m->str[id] = xmalloc(kl + 1);
    memcpy(m->str[id], k, kl + 1);
    m->len[id] = (uint32_t)kl;
    if (tok_bpe_lookup(m, k, kl) >= 0) {
      rc = ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: vocab token '%.64s' is given twice", k);
      goto fail;
    }
    vocab_insert(m, id);
  }
  size_t nm = json_array_size(merges);
  cap = 16;
  while (cap < 2 * (uint64_t)nm + 16) cap *= 2;
  m->mslots = xmalloc(cap * sizeof *m->mslots);
  for (uint64_t i = 0; i < cap; i++) m->mslots[i].key = UINT64_MAX;
  m->mmask = cap - 1;
  for (size_t r = 0; r < nm; r++) {
    json_t *e = json_array_get(merges, r);
    const char *a, *b;
    size_t al, bl;
    if (json_is_string(e)) {
      a = json_string_value(e);
      const char *sp = strchr(a, ' ');
      if (!sp) {
        rc = ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: merge %zu ('%.64s') has no space", r,
                     a);
        goto fail;
      }
      al = (size_t)(sp - a);
      b = sp + 1;
      bl = json_string_length(e) - al - 1;
    } else if (json_is_array(e) && json_array_size(e) == 2 &&
               json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
      a = json_string_value(json_array_get(e, 0));
      al = json_string_length(json_array_get(e, 0));
      b = json_string_value(json_array_get(e, 1));
      bl = json_string_length(json_array_get(e, 1));
    } else {
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", r);
      goto fail;
    }
    if ((rc = merge_insert(m, a, al, b, bl, (uint32_t)r, err, errlen))) goto fail;
  }
  json_t *unk = json_object_get(model, "unk_token");
  if (json_is_string(unk)) {
    m->unk = tok_bpe_lookup(m, json_string_value(unk), json_string_length(unk));
    if (m->unk < 0) {
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: unk_token '%.64s' is not in the vocabulary",
                   json_string_value(unk));
      goto fail;
    }
  }
  m->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
  m->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
  m->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
  if (m->byte_fallback)
    for (int b = 0; b < 256; b++) {
      char name[8];
      snprintf(name, sizeof name, "<0x%02X>", b);
      m->byte_id[b] = tok_bpe_lookup(m, name, 6);
    }
  m->cache = tok_cache_new();
  *out = m;
  return 0;
fail:
  tok_bpe_free(m);
  return rc;
}

void tok_bpe_free(tok_bpe_t *m) {
  if (!m) return;
  if (m->str)
    for (uint32_t i = 0; i < m->vocab_end; i++) free(m->str[i]);
  free(m->str);
  free(m->len);
  free(m->vslots);
  free(m->mslots);
  tok_cache_free(m->cache);
  free(m);
}
