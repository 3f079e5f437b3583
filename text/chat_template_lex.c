/* chat_template_lex.c - the chat template lexer: Hugging Face's
 * preprocessing of the template text, then tokens with their lines.
 *
 * Hugging Face renders chat templates with trim_blocks and lstrip_blocks on
 * and drops one trailing newline; @huggingface/jinja does this as text
 * rewriting before it tokenizes, and so do we, carrying each byte's line
 * along so that messages name the line as written. */
#include <stdarg.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

/* Text with the source line of every byte. */
typedef struct {
  char *s;
  int *ln;
  size_t n, cap;
} lined_t;

static void lined_put(lined_t *o, char c, int line) {
  if (o->n == o->cap) {
    o->cap = o->cap ? 2 * o->cap : 256;
    o->s = xrealloc(o->s, o->cap);
    o->ln = xrealloc(o->ln, o->cap * sizeof *o->ln);
  }
  o->s[o->n] = c;
  o->ln[o->n++] = line;
}

static void lined_free(lined_t *o) {
  free(o->s);
  free(o->ln);
  memset(o, 0, sizeof *o);
}

size_t tmpl_ws_at(const char *s, size_t n) {
  if (n == 0) return 0;
  unsigned char c = (unsigned char)s[0];
  if (c == ' ' || (c >= 9 && c <= 13)) return 1;
  if (c < 0x80) return 0;
  /* U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F, U+205F, U+3000,
   * U+FEFF in UTF-8 */
  const unsigned char *u = (const unsigned char *)s;
  if (n >= 2 && u[0] == 0xC2 && u[1] == 0xA0) return 2;
  if (n < 3) return 0;
  if (u[0] == 0xE1 && u[1] == 0x9A && u[2] == 0x80) return 3;
  if (u[0] == 0xE2 && u[1] == 0x80 &&
      ((u[2] >= 0x80 && u[2] <= 0x8A) || u[2] == 0xA8 || u[2] == 0xA9 || u[2] == 0xAF))
    return 3;
  if (u[0] == 0xE2 && u[1] == 0x81 && u[2] == 0x9F) return 3;
  if (u[0] == 0xE3 && u[1] == 0x80 && u[2] == 0x80) return 3;
  if (u[0] == 0xEF && u[1] == 0xBB && u[2] == 0xBF) return 3;
  return 0;
}

size_t tmpl_ws_before(const char *s, size_t n) {
  if (n >= 1 && tmpl_ws_at(s + n - 1, 1) == 1) return 1;
  if (n >= 2 && tmpl_ws_at(s + n - 2, 2) == 2) return 2;
  if (n >= 3 && tmpl_ws_at(s + n - 3, 3) == 3) return 3;
  return 0;
}

/* The rewrites of @huggingface/jinja's preprocess(), in its order. */
static void preprocess(const char *src, size_t len, lined_t *out) {
  lined_t a = {0}, b = {0};
  int line = 1;
  if (len > 0 && src[len - 1] == '\n') len--; /* one trailing newline */
  for (size_t i = 0; i < len; i++) {
    lined_put(&a, src[i], line);
    if (src[i] == '\n') line++;
  }
  /* lstrip_blocks: spaces and tabs that start a line before {% {# {- */
  for (size_t i = 0; i < a.n;) {
    if (i == 0 || a.s[i - 1] == '\n' || a.s[i - 1] == '\r') {
      size_t j = i;
      while (j < a.n && (a.s[j] == ' ' || a.s[j] == '\t')) j++;
      if (j > i && j + 1 < a.n && a.s[j] == '{' && strchr("#%-", a.s[j + 1]) && a.s[j + 1]) {
        i = j;
        continue;
      }
    }
    lined_put(&b, a.s[i], a.ln[i]);
    i++;
  }
  /* trim_blocks: the newline after %} #} -} */
  a.n = 0;
  for (size_t i = 0; i < b.n; i++) {
    if (b.s[i] == '\n' && i >= 2 && b.s[i - 1] == '}' && strchr("#%-", b.s[i - 2]) && b.s[i - 2])
      continue;
    lined_put(&a, b.s[i], b.ln[i]);
  }
  /* {% generation %} and {% endgeneration %} (a transformers extension that
   * marks assistant text) are dropped, honouring their - markers. */
  size_t last = 0;
  for (size_t i = 0; i + 1 < a.n; i++) {
    if (a.s[i] != '{' || a.s[i + 1] != '%') continue;
    size_t k = i + 2, w;
    int lstrip = 0, rstrip = 0;
    if (k < a.n && a.s[k] == '-') lstrip = 1, k++;
    while ((w = tmpl_ws_at(a.s + k, a.n - k))) k += w;
    if (k + 3 <= a.n && !memcmp(a.s + k, "end", 3)) k += 3;
    if (k + 10 > a.n || memcmp(a.s + k, "generation", 10)) continue;
    k += 10;
    while ((w = tmpl_ws_at(a.s + k, a.n - k))) k += w;
    if (k < a.n && a.s[k] == '-') rstrip = 1, k++;
    if (k + 2 > a.n || a.s[k] != '%' || a.s[k + 1] != '}') continue;
    k += 2;
    size_t after = k;
    while ((w = tmpl_ws_at(a.s + k, a.n - k))) k += w;
    size_t end = i;
    while (lstrip && end > last && (w = tmpl_ws_before(a.s + last, end - last))) end -= w;
    for (size_t j = last; j < end; j++) lined_put(out, a.s[j], a.ln[j]);
    if (!rstrip)
      for (size_t j = after; j < k; j++) lined_put(out, a.s[j], a.ln[j]);
    last = k;
    i = k - 1;
  }
  for (size_t j = last; j < a.n; j++) lined_put(out, a.s[j], a.ln[j]);
  lined_free(&a);
  lined_free(&b);
}

static tk_t *tk_push(tk_list_t *l, tk_kind_t kind, int line) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->v = xrealloc(l->v, l->cap * sizeof *l->v);
  }
  tk_t *t = &l->v[l->n++];
  memset(t, 0, sizeof *t);
  t->kind = kind;
  t->line = line;
  return t;
}

static char *dup_n(const char *s, size_t n) {
  char *p = xmalloc(n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

static void put_utf8(tmpl_buf_t *b, unsigned cp) {
  char u[4];
  size_t n;
  if (cp < 0x80) {
    u[0] = (char)cp, n = 1;
  } else if (cp < 0x800) {
    u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
  } else {
    u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
  }
  tmpl_buf_add(b, u, n);
}

static int hexval(const char *s, size_t n, unsigned *v) {
  *v = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return -1;
    *v = *v * 16 + (unsigned)d;
  }
  return 0;
}

/* A string literal at s[*i] (the opening quote) into a new TK_STRING. */
static int lex_string(const lined_t *p, size_t *i, tk_list_t *out, char *err, size_t errlen) {
  const char *s = p->s;
  char q = s[*i];
  int line = p->ln[*i];
  tmpl_buf_t b = {0};
  size_t k = *i + 1;
  for (;;) {
    if (k >= p->n) {
      free(b.p);
      return ty_errf(err, errlen, TY_EINVAL, "chat template line %d: unterminated string", line);
    }
    char c = s[k++];
    if (c == q) break;
    if (c != '\\') {
      tmpl_buf_add(&b, &c, 1);
      continue;
    }
    if (k >= p->n) continue; /* reported as unterminated above */
    char e = s[k++];
    const char *simple = strchr("ntrbfv'\"\\", e);
    if (e && simple) {
      static const char to[] = "\n\t\r\b\f\v'\"\\";
      tmpl_buf_add(&b, &to[simple - "ntrbfv'\"\\"], 1);
    } else if (e == 'x' || e == 'u') {
      size_t hl = e == 'x' ? 2 : 4;
      unsigned cp;
      if (k + hl > p->n || hexval(s + k, hl, &cp)) {
        free(b.p);
        return ty_errf(err, errlen, TY_EINVAL,
                       "chat template line %d: invalid escape \\%c in a string", p->ln[k - 1], e);
      }
      k += hl;
      if (cp >= 0xD800 && cp < 0xDC00 && k + 6 <= p->n && s[k] == '\\' && s[k + 1] == 'u') {
        unsigned lo;
        if (!hexval(s + k + 2, 4, &lo) && lo >= 0xDC00 && lo < 0xE000) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          k += 6;
        }
      }
      if (cp >= 0xD800 && cp < 0xE000) {
        free(b.p);
        return ty_errf(err, errlen, TY_EINVAL,
                       "chat template line %d: a lone surrogate \\u%04X in a string", line, cp);
      }
      put_utf8(&b, cp);
    } else {
      free(b.p);
      return ty_errf(err, errlen, TY_EINVAL,
                     "chat template line %d: unknown escape \\%c in a string", p->ln[k - 1],
                     e ? e : '0');
    }
  }
  tk_t *t = tk_push(out, TK_STRING, line);
  t->len = b.len;
  t->str = b.p ? b.p : xstrdup("");
  if (b.p) t->str[b.len] = 0; /* tmpl_buf keeps a spare byte */
  *i = k;
  return 0;
}

/* Operators, longest first where one is a prefix of another. */
static const char *const kOps[] = {"{%", "%}", "{{", "}}", "(",  ")",  "{",  "}",  "[", "]",
                                   ",",  ".",  ":",  "|",  "<=", ">=", "==", "!=", "<", ">",
                                   "+",  "-",  "~",  "**", "*",  "//", "/",  "%",  "="};

int tmpl_lex(const char *source, size_t len, tk_list_t *out, char *err, size_t errlen) {
  lined_t p = {0};
  preprocess(source, len, &p);
  const char *s = p.s;
  size_t n = p.n, i = 0;
  int in_tag = 0, curly = 0, rc = 0;
  while (i < n) {
    if (!in_tag) {
      size_t e = i;
      while (e < n && !(s[e] == '{' && e + 1 < n && strchr("%{#", s[e + 1]) && s[e + 1])) e++;
      if (e > i) {
        tk_t *t = tk_push(out, TK_TEXT, p.ln[i]);
        t->str = dup_n(s + i, e - i);
        t->len = e - i;
        i = e;
        continue;
      }
      /* s[i] is '{' opening a tag */
      int line = p.ln[i];
      if (s[i + 1] == '#') {
        size_t k = i + 2;
        int strip_before = k < n && s[k] == '-';
        if (strip_before) k++;
        const char *end = memmem(s + k, n - k, "#}", 2);
        if (!end) {
          rc = ty_errf(err, errlen, TY_EINVAL, "chat template line %d: comment {# never closed",
                       line);
          goto out;
        }
        size_t ce = (size_t)(end - s);
        int strip_after = ce > k && s[ce - 1] == '-';
        if (strip_before && out->n && out->v[out->n - 1].kind == TK_TEXT) {
          tk_t *t = &out->v[out->n - 1];
          size_t w;
          while ((w = tmpl_ws_before(t->str, t->len))) t->len -= w;
          t->str[t->len] = 0;
          if (!t->len) free(t->str), out->n--;
        }
        tk_push(out, TK_COMMENT, line);
        i = ce + 2;
        if (strip_after) {
          size_t w;
          while ((w = tmpl_ws_at(s + i, n - i))) i += w;
        }
        continue;
      }
      int expr = s[i + 1] == '{';
      if (i + 2 < n && s[i + 2] == '-') {
        if (out->n && out->v[out->n - 1].kind == TK_TEXT) {
          tk_t *t = &out->v[out->n - 1];
          size_t w;
          while ((w = tmpl_ws_before(t->str, t->len))) t->len -= w;
          t->str[t->len] = 0;
          if (!t->len) free(t->str), out->n--;
        }
        i += 3;
      } else {
        i += 2;
      }
      tk_push(out, expr ? TK_OPEN_EXPR : TK_OPEN_STMT, line);
      in_tag = 1;
      curly = 0;
      continue;
    }
    size_t w;
    while ((w = tmpl_ws_at(s + i, n - i))) i += w;
    if (i >= n) break;
    int line = p.ln[i];
    char c = s[i];
    if (c == '-' && i + 2 < n && s[i + 2] == '}' && (s[i + 1] == '%' || s[i + 1] == '}')) {
      tk_push(out, s[i + 1] == '%' ? TK_CLOSE_STMT : TK_CLOSE_EXPR, line);
      i += 3;
      while ((w = tmpl_ws_at(s + i, n - i))) i += w;
      in_tag = 0;
      continue;
    }
    if (c == '\'' || c == '"') {
      if ((rc = lex_string(&p, &i, out, err, errlen))) goto out;
      continue;
    }
    if (c >= '0' && c <= '9') {
      size_t k = i;
      while (k < n && s[k] >= '0' && s[k] <= '9') k++;
      int is_float = 0;
      int after_dot =
          out->n && out->v[out->n - 1].kind == TK_OP && !strcmp(out->v[out->n - 1].str, ".");
      if (!after_dot && k + 1 < n && s[k] == '.' && s[k + 1] >= '0' && s[k + 1] <= '9') {
        is_float = 1;
        k++;
        while (k < n && s[k] >= '0' && s[k] <= '9') k++;
      }
      char *num = dup_n(s + i, k - i);
      tk_t *t = tk_push(out, is_float ? TK_FLOAT : TK_INT, line);
      if (is_float) {
        t->fval = strtod(num, NULL);
      } else {
        errno = 0;
        t->ival = strtoll(num, NULL, 10);
        if (errno) {
          free(num);
          rc = ty_errf(err, errlen, TY_EINVAL, "chat template line %d: integer %.*s too large",
                       line, (int)(k - i > 40 ? 40 : k - i), s + i);
          goto out;
        }
      }
      free(num);
      i = k;
      continue;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      size_t k = i;
      while (k < n && ((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') ||
                       (s[k] >= '0' && s[k] <= '9') || s[k] == '_'))
        k++;
      tk_t *t = tk_push(out, TK_NAME, line);
      t->str = dup_n(s + i, k - i);
      t->len = k - i;
      i = k;
      continue;
    }
    const char *op = NULL;
    for (size_t k = 0; k < sizeof kOps / sizeof *kOps; k++) {
      size_t ol = strlen(kOps[k]);
      if (!strcmp(kOps[k], "}}") && curly > 0) continue;
      if (i + ol <= n && !memcmp(s + i, kOps[k], ol)) {
        op = kOps[k];
        break;
      }
    }
    if (!op) {
      rc = ty_errf(err, errlen, TY_EINVAL, "chat template line %d: unexpected character '%c'", line,
                   c);
      goto out;
    }
    i += strlen(op);
    if (!strcmp(op, "%}") || !strcmp(op, "}}")) {
      tk_push(out, !strcmp(op, "%}") ? TK_CLOSE_STMT : TK_CLOSE_EXPR, line);
      in_tag = 0;
    } else if (!strcmp(op, "{%") || !strcmp(op, "{{")) {
      tk_push(out, op[1] == '%' ? TK_OPEN_STMT : TK_OPEN_EXPR, line);
      curly = 0;
    } else {
      if (!strcmp(op, "{")) curly++;
      if (!strcmp(op, "}")) curly--;
      tk_t *t = tk_push(out, TK_OP, line);
      t->str = xstrdup(op);
      t->len = strlen(op);
    }
  }
  tk_push(out, TK_EOF, n ? p.ln[n - 1] : 1);
out:
  lined_free(&p);
  return rc;
}

void tmpl_tokens_free(tk_list_t *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i].str);
  free(l->v);
  memset(l, 0, sizeof *l);
}
