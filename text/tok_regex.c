/* tok_regex.c - tokenizer.json patterns through PCRE2: UTF and UCP (so \p{L},
 * \s and \w are Unicode's), JIT-compiled when the platform has it. A
 * compiled pattern is shared by every thread; matching state (match data,
 * JIT stack) lives in a tok_match_t that one call owns. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "api/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

struct tok_regex_s {
  pcre2_code *code;
  int jit; /* JIT compiled */
};

struct tok_match_s {
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  pcre2_jit_stack *stack;
};

int tok_regex_compile(const char *pattern, size_t len, int literal, tok_regex_t **out, char *err,
                      size_t errlen) {
  int ec;
  PCRE2_SIZE eo;
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &ec, &eo, NULL);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: pattern '%.*s': %s at offset %zu",
                   (int)(len > 200 ? 200 : len), pattern, (const char *)msg, (size_t)eo);
  }
  tok_regex_t *re = xcalloc(1, sizeof *re);
  re->code = code;
  re->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  *out = re;
  return 0;
}

void tok_regex_free(tok_regex_t *re) {
  if (!re) return;
  pcre2_code_free(re->code);
  free(re);
}

tok_match_t *tok_match_new(void) {
  tok_match_t *m = xcalloc(1, sizeof *m);
  m->md = pcre2_match_data_create(16, NULL);
  m->mctx = pcre2_match_context_create(NULL);
  if (!m->md || !m->mctx) abort(); /* out of memory, as xalloc */
  return m;
}

void tok_match_free(tok_match_t *m) {
  if (!m) return;
  pcre2_match_data_free(m->md);
  pcre2_match_context_free(m->mctx);
  if (m->stack) pcre2_jit_stack_free(m->stack);
  free(m);
}

int tok_regex_find(const tok_regex_t *re, tok_match_t *m, const char *s, size_t n, size_t start,
                   size_t *ms, size_t *me, char *err, size_t errlen) {
  int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !m->stack) {
    /* Long runs of one class (a page of spaces) can need more than JIT's
     * default 32 KiB; the larger stack is made on first need, since most
     * calls never need it. */
    m->stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, NULL);
    if (m->stack) {
      pcre2_jit_stack_assign(m->mctx, NULL, m->stack);
      rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
    }
  }
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return ty_errf(err, errlen, TY_EINTERNAL, "tokenizer: regular expression match: %s",
                   (const char *)msg);
  }
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
  *ms = ov[0];
  *me = ov[1];
  return 1;
}

int tok_regex_replace(const tok_regex_t *re, tok_match_t *m, const char *s, size_t n,
                      const char *rep, size_t rep_len, tok_buf_t *out, char *err, size_t errlen) {
  size_t pos = 0, from = 0;
  while (from <= n) {
    size_t ms, me;
    int rc = tok_regex_find(re, m, s, n, from, &ms, &me, err, errlen);
    if (rc < 0) return rc;
    if (rc == 0) break;
    tok_buf_append(out, s + pos, ms - pos);
    tok_buf_append(out, rep, rep_len);
    pos = me;
    if (me == ms) { /* an empty match: step over one character */
      if (me >= n) break;
      size_t cl = tok_utf8_char_len((const unsigned char *)s + me, n - me);
      from = me + (cl ? cl : 1);
    } else {
      from = me;
    }
  }
  tok_buf_append(out, s + pos, n - pos);
  return 0;
}

int tok_regex_from_json(json_t *pattern, const char *what, tok_regex_t **out, char *err,
                        size_t errlen) {
  json_t *str = json_object_get(pattern, "String");
  json_t *rx = json_object_get(pattern, "Regex");
  if (json_is_string(str))
    return tok_regex_compile(json_string_value(str), json_string_length(str), 1, out, err, errlen);
  if (json_is_string(rx))
    return tok_regex_compile(json_string_value(rx), json_string_length(rx), 0, out, err, errlen);
  return ty_errf(err, errlen, TY_EINVAL,
                 "tokenizer.json: %s: pattern must be {\"String\": ...} or {\"Regex\": ...}", what);
}
