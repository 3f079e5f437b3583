/* tok_normalizer.c - tokenizer.json normalizers: Sequence, Prepend, Replace,
 * and the Unicode normalization forms NFC, NFD, NFKC, NFKD (utf8proc).
 * One loader per "type" in a table; any other type is refused by name. */
#include <string.h>

#include <utf8proc.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

typedef struct {
  tok_normalizer_t base;
  tok_normalizer_t **items;
  size_t n;
} norm_sequence_t;

typedef struct {
  tok_normalizer_t base;
  char *text;
  size_t len;
} norm_prepend_t;

typedef struct {
  tok_normalizer_t base;
  tok_regex_t *re;
  char *content;
  size_t len;
} norm_replace_t;

static int sequence_apply(const tok_normalizer_t *nz, tok_scratch_t *sc, const char *s, size_t n,
                          tok_buf_t *out, char *err, size_t errlen) {
  const norm_sequence_t *q = (const norm_sequence_t *)nz;
  /* Each step reads one buffer and writes the other; out gets the last. */
  tok_buf_t a = {0}, b = {0};
  tok_buf_append(&a, s, n);
  int rc = 0;
  for (size_t i = 0; i < q->n && rc == 0; i++) {
    b.len = 0;
    tok_buf_append(&b, "", 0);
    rc = q->items[i]->apply(q->items[i], sc, a.s, a.len, &b, err, errlen);
    tok_buf_t t = a;
    a = b;
    b = t;
  }
  if (rc == 0) tok_buf_append(out, a.s, a.len);
  tok_buf_free(&a);
  tok_buf_free(&b);
  return rc;
}

static void sequence_free(tok_normalizer_t *nz) {
  norm_sequence_t *q = (norm_sequence_t *)nz;
  for (size_t i = 0; i < q->n; i++) tok_normalizer_free(q->items[i]);
  free(q->items);
  free(q);
}

/* Prepend adds its text to a non-empty input (an empty one stays empty). */
static int prepend_apply(const tok_normalizer_t *nz, tok_scratch_t *sc, const char *s, size_t n,
                         tok_buf_t *out, char *err, size_t errlen) {
  const norm_prepend_t *p = (const norm_prepend_t *)nz;
  if (n) tok_buf_append(out, p->text, p->len);
  tok_buf_append(out, s, n);
  return 0;
}

static void prepend_free(tok_normalizer_t *nz) {
  norm_prepend_t *p = (norm_prepend_t *)nz;
  free(p->text);
  free(p);
}

static int replace_apply(const tok_normalizer_t *nz, tok_scratch_t *sc, const char *s, size_t n,
                         tok_buf_t *out, char *err, size_t errlen) {
  const norm_replace_t *r = (const norm_replace_t *)nz;
  return tok_regex_replace(r->re, sc->match, s, n, r->content, r->len, out, err, errlen);
}

static void replace_free(tok_normalizer_t *nz) {
  norm_replace_t *r = (norm_replace_t *)nz;
  tok_regex_free(r->re);
  free(r->content);
  free(r);
}

/* ---- NFC, NFD, NFKC, NFKD ---- */

typedef struct {
  tok_normalizer_t base;
  utf8proc_option_t options;
} norm_unicode_t;

static int unicode_apply(const tok_normalizer_t *nz, tok_scratch_t *sc, const char *s, size_t n,
                         tok_buf_t *out, char *err, size_t errlen) {
  const norm_unicode_t *u = (const norm_unicode_t *)nz;
  size_t i = 0;
  while (i < n && !((unsigned char)s[i] & 0x80)) i++;
  if (i == n) { /* ASCII is its own normal form, in all four */
    tok_buf_append(out, s, n);
    return 0;
  }
  utf8proc_uint8_t *dst = NULL;
  utf8proc_ssize_t r =
      utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, u->options);
  if (r < 0) /* cannot happen: the text was made valid UTF-8 first */
    return ty_errf(err, errlen, TY_EINTERNAL, "tokenizer: Unicode normalization: %s",
                   utf8proc_errmsg(r));
  tok_buf_append(out, dst, (size_t)r);
  free(dst);
  return 0;
}

static void unicode_free(tok_normalizer_t *nz) {
  free(nz);
}

static int load_unicode(utf8proc_option_t options, tok_normalizer_t **out) {
  norm_unicode_t *u = xcalloc(1, sizeof *u);
  u->base.apply = unicode_apply;
  u->base.free = unicode_free;
  u->options = UTF8PROC_STABLE | options;
  *out = &u->base;
  return 0;
}

static int load_nfc(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  return load_unicode(UTF8PROC_COMPOSE, out);
}
static int load_nfd(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  return load_unicode(UTF8PROC_DECOMPOSE, out);
}
static int load_nfkc(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  return load_unicode(UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
}
static int load_nfkd(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  return load_unicode(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
}

/* ---- loaders ---- */

static int load_sequence(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  json_t *arr = json_object_get(j, "normalizers");
  if (!json_is_array(arr))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: normalizer Sequence needs a \"normalizers\" array");
  norm_sequence_t *q = xcalloc(1, sizeof *q);
  q->base.apply = sequence_apply;
  q->base.free = sequence_free;
  q->items = xcalloc(json_array_size(arr) + 1, sizeof *q->items);
  size_t i;
  json_t *v;
  json_array_foreach(arr, i, v) {
    tok_normalizer_t *item = NULL;
    int rc = tok_normalizer_load(v, &item, err, errlen);
    if (rc) {
      sequence_free(&q->base);
      return rc;
    }
    if (item) q->items[q->n++] = item;
  }
  *out = &q->base;
  return 0;
}

static int load_prepend(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  json_t *p = json_object_get(j, "prepend");
  if (!json_is_string(p))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: normalizer Prepend needs a \"prepend\" string");
  norm_prepend_t *q = xcalloc(1, sizeof *q);
  q->base.apply = prepend_apply;
  q->base.free = prepend_free;
  q->len = json_string_length(p);
  q->text = xmalloc(q->len + 1);
  memcpy(q->text, json_string_value(p), q->len + 1);
  *out = &q->base;
  return 0;
}

static int load_replace(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  json_t *c = json_object_get(j, "content");
  if (!json_is_string(c))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: normalizer Replace needs a \"content\" string");
  tok_regex_t *re;
  int rc =
      tok_regex_from_json(json_object_get(j, "pattern"), "normalizer Replace", &re, err, errlen);
  if (rc) return rc;
  norm_replace_t *q = xcalloc(1, sizeof *q);
  q->base.apply = replace_apply;
  q->base.free = replace_free;
  q->re = re;
  q->len = json_string_length(c);
  q->content = xmalloc(q->len + 1);
  memcpy(q->content, json_string_value(c), q->len + 1);
  *out = &q->base;
  return 0;
}

static const struct {
  const char *type;
  int (*load)(json_t *j, tok_normalizer_t **out, char *err, size_t errlen);
} normalizer_types[] = {
    {"Sequence", load_sequence}, {"Prepend", load_prepend}, {"Replace", load_replace},
    {"NFC", load_nfc},           {"NFD", load_nfd},         {"NFKC", load_nfkc},
    {"NFKD", load_nfkd},
};

int tok_normalizer_load(json_t *j, tok_normalizer_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (!j || json_is_null(j)) return 0;
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: a normalizer has no type");
  for (size_t i = 0; i < sizeof normalizer_types / sizeof *normalizer_types; i++)
    if (!strcmp(type, normalizer_types[i].type))
      return normalizer_types[i].load(j, out, err, errlen);
  return TOK_REFUSE(err, errlen, "normalizer", type, normalizer_types);
}

void tok_normalizer_free(tok_normalizer_t *nz) {
  if (nz) nz->free(nz);
}

int tok_normalize(const tok_normalizer_t *nz, tok_scratch_t *sc, const char *s, size_t n,
                  tok_buf_t *out, char *err, size_t errlen) {
  out->len = 0;
  tok_buf_append(out, "", 0);
  if (!nz) {
    tok_buf_append(out, s, n);
    return 0;
  }
  return nz->apply(nz, sc, s, n, out, err, errlen);
}
