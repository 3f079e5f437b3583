/* tok_decoder.c - tokenizer.json decoders: Sequence, ByteLevel, Replace,
 * ByteFallback, Fuse, Strip, Metaspace. Each rewrites a list of token
 * strings; the tokenizer joins the last list. One loader per "type" in a
 * table; any other type is refused by name.
 *
 * Bytes that are not valid UTF-8 (a ByteLevel or ByteFallback run that
 * ends inside a character) become U+FFFD per maximal invalid subsequence, as
 * the reference's TextDecoder does. */
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

static void copy_all(const tok_pieces_t *in, tok_pieces_t *out) {
  for (size_t i = 0; i < in->n; i++) {
    size_t n;
    const char *p = tok_piece(in, i, &n);
    tok_pieces_push(out, p, n);
  }
}

/* ---- Sequence ---- */

typedef struct {
  tok_decoder_t base;
  tok_decoder_t **items;
  size_t n;
} dec_sequence_t;

static int sequence_apply(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc,
                          const tok_pieces_t *in, tok_pieces_t *out, char *err, size_t errlen) {
  const dec_sequence_t *q = (const dec_sequence_t *)d;
  if (q->n == 0) {
    copy_all(in, out);
    return 0;
  }
  tok_pieces_t tmp[2];
  memset(tmp, 0, sizeof tmp);
  const tok_pieces_t *src = in;
  int rc = 0;
  for (size_t i = 0; i < q->n && rc == 0; i++) {
    tok_pieces_t *dst = i + 1 == q->n ? out : &tmp[i % 2];
    if (dst != out) tok_pieces_clear(dst);
    rc = q->items[i]->apply(q->items[i], t, sc, src, dst, err, errlen);
    src = dst;
  }
  tok_pieces_free(&tmp[0]);
  tok_pieces_free(&tmp[1]);
  return rc;
}

static void sequence_free(tok_decoder_t *d) {
  dec_sequence_t *q = (dec_sequence_t *)d;
  for (size_t i = 0; i < q->n; i++) tok_decoder_free(q->items[i]);
  free(q->items);
  free(q);
}

/* ---- ByteLevel ---- */

/* Appends the bytes a ByteLevel token stands for; a token with a character
 * outside the byte map stands for its own UTF-8 bytes. */
static void bytelevel_bytes(const char *s, size_t n, tok_buf_t *raw) {
  const tok_bytelevel_t *bl = tok_bytelevel();
  size_t start = raw->len;
  for (size_t i = 0; i < n;) {
    size_t cl;
    uint32_t cp = tok_utf8_decode((const unsigned char *)s + i, &cl);
    if (cp >= 324 || bl->byte_of[cp] < 0) {
      raw->len = start;
      tok_buf_append(raw, s, n);
      return;
    }
    char b = (char)bl->byte_of[cp];
    tok_buf_append(raw, &b, 1);
    i += cl;
  }
}

static void flush_bytes(tok_buf_t *raw, tok_pieces_t *out) {
  if (!raw->len) return;
  tok_buf_t clean = {0};
  tok_utf8_sanitize(raw->s, raw->len, &clean);
  tok_pieces_push(out, clean.s ? clean.s : "", clean.len);
  tok_buf_free(&clean);
  raw->len = 0;
}

/* Runs of ordinary tokens become their bytes; an added token stays itself. */
static int bytelevel_apply(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc,
                           const tok_pieces_t *in, tok_pieces_t *out, char *err, size_t errlen) {
  tok_buf_t raw = {0};
  for (size_t i = 0; i < in->n; i++) {
    size_t n;
    const char *p = tok_piece(in, i, &n);
    if (tok_is_added_content(t, p, n)) {
      flush_bytes(&raw, out);
      tok_pieces_push(out, p, n);
    } else {
      bytelevel_bytes(p, n, &raw);
    }
  }
  flush_bytes(&raw, out);
  tok_buf_free(&raw);
  return 0;
}

static void plain_free(tok_decoder_t *d) {
  free(d);
}

/* ---- Replace ---- */

typedef struct {
  tok_decoder_t base;
  tok_regex_t *re;
  char *content;
  size_t len;
} dec_replace_t;

static int replace_apply(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc,
                         const tok_pieces_t *in, tok_pieces_t *out, char *err, size_t errlen) {
  const dec_replace_t *q = (const dec_replace_t *)d;
  tok_buf_t b = {0};
  int rc = 0;
  for (size_t i = 0; i < in->n && rc == 0; i++) {
    size_t n;
    const char *p = tok_piece(in, i, &n);
    b.len = 0;
    rc = tok_regex_replace(q->re, sc->match, p, n, q->content, q->len, &b, err, errlen);
    tok_pieces_push(out, b.s ? b.s : "", b.len);
  }
  tok_buf_free(&b);
  return rc;
}

static void replace_free(tok_decoder_t *d) {
  dec_replace_t *q = (dec_replace_t *)d;
  tok_regex_free(q->re);
  free(q->content);
  free(q);
}

/* ---- ByteFallback ---- */

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

static int bytefallback_apply(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc,
                              const tok_pieces_t *in, tok_pieces_t *out, char *err, size_t errlen) {
  tok_buf_t raw = {0};
  for (size_t i = 0; i < in->n; i++) {
    size_t n;
    const char *p = tok_piece(in, i, &n);
    int hi, lo;
    if (n == 6 && !memcmp(p, "<0x", 3) && p[5] == '>' && (hi = hexval(p[3])) >= 0 &&
        (lo = hexval(p[4])) >= 0) {
      char b = (char)(hi * 16 + lo);
      tok_buf_append(&raw, &b, 1);
    } else {
      flush_bytes(&raw, out);
      tok_pieces_push(out, p, n);
    }
  }
  flush_bytes(&raw, out);
  tok_buf_free(&raw);
  return 0;
}

/* ---- Fuse ---- */

static int fuse_apply(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc,
                      const tok_pieces_t *in, tok_pieces_t *out, char *err, size_t errlen) {
  tok_pieces_push(out, in->buf.s ? in->buf.s + in->off[0] : "",
                  in->n ? in->off[in->n] - in->off[0] : 0);
  return 0;
}

/* ---- Strip ---- */

typedef struct {
  tok_decoder_t base;
  char content[8];
  size_t len;
  long start, stop;
} dec_strip_t;

static int strip_apply(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc,
                       const tok_pieces_t *in, tok_pieces_t *out, char *err, size_t errlen) {
  const dec_strip_t *q = (const dec_strip_t *)d;
  for (size_t i = 0; i < in->n; i++) {
    size_t n;
    const char *p = tok_piece(in, i, &n);
    size_t a = 0, b = n;
    for (long k = 0; k < q->start && b - a >= q->len && !memcmp(p + a, q->content, q->len); k++)
      a += q->len;
    for (long k = 0; k < q->stop && b - a >= q->len && !memcmp(p + b - q->len, q->content, q->len);
         k++)
      b -= q->len;
    tok_pieces_push(out, p + a, b - a);
  }
  return 0;
}

/* ---- Metaspace ---- */

typedef struct {
  tok_decoder_t base;
  char rep[8];
  size_t rep_len;
  int strip_first; /* prepend_scheme other than never */
} dec_metaspace_t;

static int metaspace_apply(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc,
                           const tok_pieces_t *in, tok_pieces_t *out, char *err, size_t errlen) {
  const dec_metaspace_t *q = (const dec_metaspace_t *)d;
  tok_buf_t b = {0};
  for (size_t i = 0; i < in->n; i++) {
    size_t n;
    const char *p = tok_piece(in, i, &n);
    b.len = 0;
    tok_buf_append(&b, "", 0);
    for (size_t k = 0; k < n;) {
      if (n - k >= q->rep_len && !memcmp(p + k, q->rep, q->rep_len)) {
        tok_buf_append(&b, " ", 1);
        k += q->rep_len;
      } else {
        tok_buf_append(&b, p + k, 1);
        k++;
      }
    }
    size_t skip = i == 0 && q->strip_first && b.len && b.s[0] == ' ';
    tok_pieces_push(out, b.s + skip, b.len - skip);
  }
  tok_buf_free(&b);
  return 0;
}

/* ---- loaders ---- */

static int load_sequence(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  json_t *arr = json_object_get(j, "decoders");
  if (!json_is_array(arr))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: decoder Sequence needs a \"decoders\" array");
  dec_sequence_t *q = xcalloc(1, sizeof *q);
  q->base.apply = sequence_apply;
  q->base.free = sequence_free;
  q->items = xcalloc(json_array_size(arr) + 1, sizeof *q->items);
  size_t i;
  json_t *v;
  json_array_foreach(arr, i, v) {
    tok_decoder_t *item = NULL;
    int rc = tok_decoder_load(v, &item, err, errlen);
    if (rc) {
      sequence_free(&q->base);
      return rc;
    }
    if (item) q->items[q->n++] = item;
  }
  *out = &q->base;
  return 0;
}

static int load_plain(tok_decoder_t **out,
                      int (*apply)(const tok_decoder_t *, const tok_t *, tok_scratch_t *,
                                   const tok_pieces_t *, tok_pieces_t *, char *, size_t)) {
  tok_decoder_t *d = xcalloc(1, sizeof *d);
  d->apply = apply;
  d->free = plain_free;
  *out = d;
  return 0;
}

static int load_bytelevel(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  return load_plain(out, bytelevel_apply);
}
static int load_bytefallback(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  return load_plain(out, bytefallback_apply);
}
static int load_fuse(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  return load_plain(out, fuse_apply);
}

static int load_replace(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  json_t *c = json_object_get(j, "content");
  if (!json_is_string(c))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: decoder Replace needs a \"content\" string");
  tok_regex_t *re;
  int rc = tok_regex_from_json(json_object_get(j, "pattern"), "decoder Replace", &re, err, errlen);
  if (rc) return rc;
  dec_replace_t *q = xcalloc(1, sizeof *q);
  q->base.apply = replace_apply;
  q->base.free = replace_free;
  q->re = re;
  q->len = json_string_length(c);
  q->content = xmalloc(q->len + 1);
  memcpy(q->content, json_string_value(c), q->len + 1);
  *out = &q->base;
  return 0;
}

/* A one-character string option (Strip's content, Metaspace's replacement). */
static int one_char(json_t *j, const char *key, const char *dflt, char *buf, size_t *len,
                    const char *what, char *err, size_t errlen) {
  json_t *v = json_object_get(j, key);
  const char *s = json_is_string(v) ? json_string_value(v) : dflt;
  size_t n = strlen(s);
  if (n == 0 || n > 4 || tok_utf8_char_len((const unsigned char *)s, n) != n)
    return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: decoder %s: %s must be one character",
                   what, key);
  memcpy(buf, s, n);
  *len = n;
  return 0;
}

static int load_strip(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  dec_strip_t *q = xcalloc(1, sizeof *q);
  q->base.apply = strip_apply;
  q->base.free = plain_free;
  int rc = one_char(j, "content", " ", q->content, &q->len, "Strip", err, errlen);
  if (rc) {
    free(q);
    return rc;
  }
  q->start = (long)json_integer_value(json_object_get(j, "start"));
  q->stop = (long)json_integer_value(json_object_get(j, "stop"));
  *out = &q->base;
  return 0;
}

static int load_metaspace(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  dec_metaspace_t *q = xcalloc(1, sizeof *q);
  q->base.apply = metaspace_apply;
  q->base.free = plain_free;
  int rc =
      one_char(j, "replacement", "\xE2\x96\x81", q->rep, &q->rep_len, "Metaspace", err, errlen);
  if (rc) {
    free(q);
    return rc;
  }
  const char *scheme = json_string_value(json_object_get(j, "prepend_scheme"));
  json_t *aps = json_object_get(j, "add_prefix_space");
  q->strip_first = scheme ? strcmp(scheme, "never") != 0 : (!aps || json_is_true(aps));
  *out = &q->base;
  return 0;
}

static const struct {
  const char *type;
  int (*load)(json_t *j, tok_decoder_t **out, char *err, size_t errlen);
} decoder_types[] = {
    {"Sequence", load_sequence},         {"ByteLevel", load_bytelevel}, {"Replace", load_replace},
    {"ByteFallback", load_bytefallback}, {"Fuse", load_fuse},           {"Strip", load_strip},
    {"Metaspace", load_metaspace},
};

int tok_decoder_load(json_t *j, tok_decoder_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (!j || json_is_null(j)) return 0;
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: a decoder has no type");
  for (size_t i = 0; i < sizeof decoder_types / sizeof *decoder_types; i++)
    if (!strcmp(type, decoder_types[i].type)) return decoder_types[i].load(j, out, err, errlen);
  return TOK_REFUSE(err, errlen, "decoder", type, decoder_types);
}

void tok_decoder_free(tok_decoder_t *d) {
  if (d) d->free(d);
}
