/* tok_regex.c - tokenizer.json patterns through PCRE2: UTF and UCP (so \p{L},
 * \s and \w are Unicode's), JIT-compiled when the platform has it. A
 * compiled pattern is shared by every thread; matching state (match data,
 * JIT stack) lives in a tok_match_t that one call owns. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "common/errors.h"
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

/* tokenizer.json's patterns are written for Oniguruma (the Rust library's
 * engine), whose shorthands differ from PCRE2's: \s is White_Space (PCRE2
 * adds U+180E), \w is Alphabetic, marks, decimal digits and connector
 * punctuation (plus a few Latin-1 digits), \h is a hexadecimal digit.
 * Rewrites those into explicit classes, as the reference does, copying
 * \Q...\E and every other escape as it is. \W and \H inside a class have
 * no simple rewrite and are refused. */
#define ONIG_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
static int onig_rewrite(const char *p, size_t n, tok_buf_t *out, char *err, size_t errlen) {
  int in_class = 0;
  size_t literal_close = (size_t)-1; /* where a ']' would be literal: first in its class */
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '[') {
      in_class++;
      literal_close = i + 1 < n && p[i + 1] == '^' ? i + 2 : i + 1;
    } else if (c == ']' && in_class && i != literal_close) {
      in_class--;
    }
    if (c != '\\' || i + 1 >= n) {
      tok_buf_append(out, &c, 1);
      continue;
    }
    char e = p[++i];
    const char *rep = NULL;
    switch (e) {
      case 's':
        rep = in_class ? "\\p{White_Space}" : "[\\p{White_Space}]";
        break;
      case 'S':
        rep = in_class ? "\\P{White_Space}" : "[^\\p{White_Space}]";
        break;
      case 'w':
        rep = in_class ? ONIG_WORD : "[" ONIG_WORD "]";
        break;
      case 'W':
        rep = in_class ? NULL : "[^" ONIG_WORD "]";
        break;
      case 'h':
        rep = in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
        break;
      case 'H':
        rep = in_class ? NULL : "[^0-9A-Fa-f]";
        break;
      case 'Q': { /* literal up to \E */
        const char *end = NULL;
        for (size_t k = i + 1; k + 1 < n; k++)
          if (p[k] == '\\' && p[k + 1] == 'E') {
            end = p + k + 2;
            break;
          }
        size_t stop = end ? (size_t)(end - p) : n;
        tok_buf_append(out, p + i - 1, stop - (i - 1));
        i = stop - 1;
        continue;
      }
      default:
        break;
    }
    if (!rep && (e == 'W' || e == 'H'))
      return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                     "tokenizer.json: pattern '%.*s': \\%c inside a character class is not "
                     "supported",
                     (int)(n > 200 ? 200 : n), p, e);
    if (rep) {
      tok_buf_append(out, rep, strlen(rep));
    } else {
      tok_buf_append(out, p + i - 1, 2); /* any other escape, as it is */
      if (e == '[' || e == ']') continue;
    }
  }
  tok_buf_append(out, "", 0);
  return 0;
}

int tok_regex_compile(const char *pattern, size_t len, int literal, tok_regex_t **out, char *err,
                      size_t errlen) {
  tok_buf_t rw = {0};
  if (!literal) {
    int rc = onig_rewrite(pattern, len, &rw, err, errlen);
    if (rc) {
      tok_buf_free(&rw);
      return rc;
    }
  }
  const char *given = pattern;
  size_t given_len = len;
  if (!literal) {
    pattern = rw.s;
    len = rw.len;
  }
  int ec;
  PCRE2_SIZE eo;
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &ec, &eo, NULL);
  tok_buf_free(&rw);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: pattern '%.*s': %s",
                   (int)(given_len > 200 ? 200 : given_len), given, (const char *)msg);
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
