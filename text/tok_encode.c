/* tok_encode.c - the encode and decode pipelines.
 *
 * encode: the input made valid UTF-8 -> split on added tokens that match
 * unnormalized text (lstrip/rstrip trim the white space beside them) ->
 * each other section normalized -> split on added tokens that match
 * normalized text -> pre-tokenized -> BPE per pre-token -> the special
 * tokens of the post-processor (or of tokenizer_config.json's
 * add_bos_token/add_eos_token) around the result.
 * decode: ids -> token strings (special ones dropped on request) -> the
 * decoder -> joined -> tokenizer_config.json's clean-up of spaces. */
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

typedef struct {
  size_t s, e;
  long ti; /* the added token, or -1 for text */
} seg_t;

typedef struct {
  seg_t *v;
  size_t n, cap;
} segs_t;

static void seg_push(segs_t *a, size_t s, size_t e, long ti) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 16;
    a->v = xrealloc(a->v, a->cap * sizeof *a->v);
  }
  a->v[a->n++] = (seg_t){s, e, ti};
}

/* 1 when s[s0..e) ends with a white-space character, whose start goes to *at. */
static int ends_with_space(const char *s, size_t s0, size_t e, size_t *at) {
  size_t i = e - 1;
  while (i > s0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
  size_t cl;
  uint32_t cp = tok_utf8_decode((const unsigned char *)s + i, &cl);
  *at = i;
  return i + cl == e && tok_is_white_space(cp);
}

/* Splits s[0..n) on the set's tokens; a token's lstrip/rstrip removes the
 * white space of the text beside it. */
static void split_added(const tok_t *t, const tok_added_set_t *set, const char *s, size_t n,
                        segs_t *out) {
  out->n = 0;
  size_t pos = 0, ms, me, ti;
  while (pos < n && tok_added_set_find(set, s, n, pos, &ms, &me, &ti)) {
    if (ms > pos) seg_push(out, pos, ms, -1);
    seg_push(out, ms, me, (long)ti);
    pos = me;
  }
  if (pos < n) seg_push(out, pos, n, -1);
  for (size_t i = 0; i < out->n; i++) {
    if (out->v[i].ti < 0) continue;
    const tok_added_token_t *a = &t->added[out->v[i].ti];
    if (a->lstrip && i > 0 && out->v[i - 1].ti < 0) {
      seg_t *p = &out->v[i - 1];
      size_t at;
      while (p->e > p->s && ends_with_space(s, p->s, p->e, &at)) p->e = at;
    }
    if (a->rstrip && i + 1 < out->n && out->v[i + 1].ti < 0) {
      seg_t *q = &out->v[i + 1];
      while (q->s < q->e) {
        size_t cl;
        uint32_t cp = tok_utf8_decode((const unsigned char *)s + q->s, &cl);
        if (!tok_is_white_space(cp)) break;
        q->s += cl;
      }
    }
  }
}

/* Pre-tokenizes one section of normalized text and runs the model on it. */
static int encode_section(const tok_t *t, tok_scratch_t *sc, const char *s, size_t n,
                          size_t section, tok_ids_t *ids, char *err, size_t errlen) {
  tok_pieces_clear(&sc->pa);
  tok_pieces_push(&sc->pa, s, n);
  const tok_pieces_t *words = &sc->pa;
  if (t->pretok) {
    tok_pieces_clear(&sc->pb);
    int rc = t->pretok->apply(t->pretok, sc, &sc->pa, &sc->pb, section, err, errlen);
    if (rc) return rc;
    words = &sc->pb;
  }
  for (size_t i = 0; i < words->n; i++) {
    size_t len;
    const char *w = tok_piece(words, i, &len);
    int rc = tok_bpe_encode(t->bpe, w, len, ids, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

int tok_encode(const tok_t *t, const char *text, size_t len, int add_special, uint32_t **ids_out,
               size_t *n_out, char *err, size_t errlen) {
  *ids_out = NULL;
  *n_out = 0;
  tok_scratch_t sc = {0};
  sc.match = tok_match_new();
  tok_buf_t in = {0};
  tok_utf8_sanitize(text, len, &in);
  const char *s = in.s ? in.s : "";
  tok_ids_t ids = {0}, before = {0}, after = {0};
  segs_t outer = {0}, inner = {0};
  int rc = 0;
  if (add_special) {
    if (t->config_specials) {
      if (t->add_bos && t->bos_id >= 0) tok_ids_push(&before, (uint32_t)t->bos_id);
      if (t->add_eos && t->eos_id >= 0) tok_ids_push(&after, (uint32_t)t->eos_id);
    } else {
      tok_post_specials(t->post, &before, &after);
    }
  }
  for (size_t k = 0; k < before.n; k++) tok_ids_push(&ids, before.v[k]);
  split_added(t, t->added_raw, s, in.len, &outer);
  for (size_t i = 0; i < outer.n && rc == 0; i++) {
    const seg_t *g = &outer.v[i];
    if (g->ti >= 0) {
      tok_ids_push(&ids, t->added[g->ti].id);
      continue;
    }
    if (g->e == g->s) continue;
    if ((rc = tok_normalize(t->normalizer, &sc, s + g->s, g->e - g->s, &sc.nb, err, errlen))) break;
    split_added(t, t->added_norm, sc.nb.s, sc.nb.len, &inner);
    for (size_t k = 0; k < inner.n && rc == 0; k++) {
      const seg_t *h = &inner.v[k];
      if (h->ti >= 0)
        tok_ids_push(&ids, t->added[h->ti].id);
      else if (h->e > h->s)
        rc = encode_section(t, &sc, sc.nb.s + h->s, h->e - h->s, i, &ids, err, errlen);
    }
  }
  for (size_t k = 0; k < after.n; k++) tok_ids_push(&ids, after.v[k]);
  free(before.v);
  free(after.v);
  free(outer.v);
  free(inner.v);
  tok_buf_free(&in);
  tok_buf_free(&sc.nb);
  tok_pieces_free(&sc.pa);
  tok_pieces_free(&sc.pb);
  tok_match_free(sc.match);
  if (rc) {
    free(ids.v);
    return rc;
  }
  *ids_out = ids.v;
  *n_out = ids.n;
  return 0;
}

/* transformers' clean_up_tokenization: no space before . ? ! , and English
 * contractions; each rule replaces every occurrence, in this order. */
static void clean_up_spaces(tok_buf_t *b) {
  static const char *const rules[][2] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (size_t r = 0; r < sizeof rules / sizeof *rules; r++) {
    const char *from = rules[r][0], *to = rules[r][1];
    size_t fl = strlen(from), tl = strlen(to), w = 0;
    for (size_t i = 0; i < b->len;) {
      if (b->len - i >= fl && !memcmp(b->s + i, from, fl)) {
        memmove(b->s + w, to, tl);
        w += tl;
        i += fl;
      } else {
        b->s[w++] = b->s[i++];
      }
    }
    b->len = w;
    b->s[w] = '\0';
  }
}

int tok_decode(const tok_t *t, const uint32_t *ids, size_t n, int skip_special, char **text,
               size_t *len, char *err, size_t errlen) {
  *text = NULL;
  *len = 0;
  tok_pieces_t toks = {0}, out = {0};
  tok_pieces_clear(&toks);
  tok_pieces_clear(&out);
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t id = ids[i];
    const tok_added_token_t *a =
        id < t->vocab_end && t->added_of[id] >= 0 ? &t->added[t->added_of[id]] : NULL;
    if (a) {
      if (!(skip_special && a->special)) tok_pieces_push(&toks, a->content, a->len);
      continue;
    }
    size_t tl;
    const char *ts = tok_bpe_id_to_token(t->bpe, id, &tl);
    if (!ts) {
      rc = ty_errf(err, errlen, TY_EINVAL, "token id %u is not in the vocabulary (size %u)", id,
                   t->vocab_end);
      goto done;
    }
    tok_pieces_push(&toks, ts, tl);
  }
  tok_buf_t joined = {0};
  tok_buf_append(&joined, "", 0);
  if (t->decoder) {
    tok_scratch_t sc = {0};
    sc.match = tok_match_new();
    rc = t->decoder->apply(t->decoder, t, &sc, &toks, &out, err, errlen);
    tok_match_free(sc.match);
    if (rc) {
      tok_buf_free(&joined);
      goto done;
    }
    tok_buf_append(&joined, out.buf.s ? out.buf.s : "", out.buf.len);
  } else {
    for (size_t i = 0; i < toks.n; i++) {
      size_t pl;
      const char *p = tok_piece(&toks, i, &pl);
      if (i) tok_buf_append(&joined, " ", 1);
      tok_buf_append(&joined, p, pl);
    }
  }
  if (t->clean_up_spaces) clean_up_spaces(&joined);
  *text = joined.s;
  *len = joined.len;
done:
  tok_pieces_free(&toks);
  tok_pieces_free(&out);
  return rc;
}
