/* chat_template_value.c - chat template values: JSON values (jansson), with
 * NULL standing for Jinja's undefined; their truth, text and JSON forms as
 * @huggingface/jinja writes them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xalloc.h"
#include "text/chat_template_internal.h"

void tmpl_buf_add(tmpl_buf_t *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void tmpl_buf_adds(tmpl_buf_t *b, const char *s) {
  tmpl_buf_add(b, s, strlen(s));
}

json_t *tmpl_string_take(tmpl_buf_t *b) {
  json_t *s = json_stringn_nocheck(b->p ? b->p : "", b->len);
  free(b->p);
  memset(b, 0, sizeof *b);
  return s;
}

int tmpl_truthy(const json_t *v) {
  if (!v) return 0;
  switch (json_typeof(v)) {
    case JSON_NULL:
    case JSON_FALSE:
      return 0;
    case JSON_TRUE:
      return 1;
    case JSON_INTEGER:
      return json_integer_value(v) != 0;
    case JSON_REAL:
      return json_real_value(v) != 0;
    case JSON_STRING:
      return json_string_length(v) != 0;
    case JSON_ARRAY:
      return json_array_size(v) != 0;
    case JSON_OBJECT:
      return json_object_size(v) != 0;
  }
  return 0;
}

const char *tmpl_kind(const json_t *v) {
  if (!v) return "undefined";
  switch (json_typeof(v)) {
    case JSON_NULL:
      return "none";
    case JSON_TRUE:
    case JSON_FALSE:
      return "a boolean";
    case JSON_INTEGER:
      return "an integer";
    case JSON_REAL:
      return "a float";
    case JSON_STRING:
      return "a string";
    case JSON_ARRAY:
      return "a list";
    case JSON_OBJECT:
      return "a dict";
  }
  return "value";
}

size_t tmpl_utf8_len(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
  return k;
}

/* JavaScript's Number.prototype.toString: the shortest digits that read
 * back to d, in fixed notation for 1e-7 < |d| < 1e21, else d.ddde+N. */
void tmpl_number_js(tmpl_buf_t *b, double d) {
  char tmp[64];
  if (isnan(d)) return tmpl_buf_adds(b, "NaN");
  if (isinf(d)) return tmpl_buf_adds(b, d < 0 ? "-Infinity" : "Infinity");
  if (d == 0) return tmpl_buf_adds(b, "0");
  int prec;
  for (prec = 1; prec <= 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
    if (strtod(tmp, NULL) == d) break;
  }
  /* tmp: [-]D.DDDDe[+-]XX */
  char digits[32];
  size_t nd = 0;
  const char *q = tmp;
  int neg = *q == '-';
  if (neg) q++;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[nd++] = *q;
  digits[nd] = 0;
  int exp10 = atoi(q + 1); /* d = 0.DIGITS * 10^(exp10+1) */
  int n = exp10 + 1;       /* position of the decimal point */
  if (neg) tmpl_buf_adds(b, "-");
  if (n >= (int)nd && n <= 21) {
    tmpl_buf_add(b, digits, nd);
    for (int i = (int)nd; i < n; i++) tmpl_buf_adds(b, "0");
  } else if (n > 0 && n <= 21) {
    tmpl_buf_add(b, digits, (size_t)n);
    tmpl_buf_adds(b, ".");
    tmpl_buf_add(b, digits + n, nd - (size_t)n);
  } else if (n > -6 && n <= 0) {
    tmpl_buf_adds(b, "0.");
    for (int i = n; i < 0; i++) tmpl_buf_adds(b, "0");
    tmpl_buf_add(b, digits, nd);
  } else {
    tmpl_buf_add(b, digits, 1);
    if (nd > 1) {
      tmpl_buf_adds(b, ".");
      tmpl_buf_add(b, digits + 1, nd - 1);
    }
    snprintf(tmp, sizeof tmp, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
    tmpl_buf_adds(b, tmp);
  }
}

static void float_str(tmpl_buf_t *b, double d) {
  /* a whole float prints with ".0", as Python does: 2.0, -0.0 */
  if (d == 0 && signbit(d)) return tmpl_buf_adds(b, "-0.0");
  if (isfinite(d) && d == floor(d) && fabs(d) < 1e21) {
    tmpl_number_js(b, d);
    tmpl_buf_adds(b, ".0");
    return;
  }
  tmpl_number_js(b, d);
}

void tmpl_value_str(tmpl_buf_t *b, const json_t *v) {
  char tmp[32];
  if (!v) return;
  switch (json_typeof(v)) {
    case JSON_NULL:
      return;
    case JSON_TRUE:
      return tmpl_buf_adds(b, "true");
    case JSON_FALSE:
      return tmpl_buf_adds(b, "false");
    case JSON_INTEGER:
      snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
      return tmpl_buf_adds(b, tmp);
    case JSON_REAL:
      return float_str(b, json_real_value(v));
    case JSON_STRING:
      return tmpl_buf_add(b, json_string_value(v), json_string_length(v));
    case JSON_ARRAY:
    case JSON_OBJECT:
      return tmpl_value_json(b, v, 0, 0);
  }
}

static void json_string_out(tmpl_buf_t *b, const char *s, size_t n) {
  tmpl_buf_adds(b, "\"");
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    switch (c) {
      case '"':
        tmpl_buf_adds(b, "\\\"");
        break;
      case '\\':
        tmpl_buf_adds(b, "\\\\");
        break;
      case '\n':
        tmpl_buf_adds(b, "\\n");
        break;
      case '\r':
        tmpl_buf_adds(b, "\\r");
        break;
      case '\t':
        tmpl_buf_adds(b, "\\t");
        break;
      case '\b':
        tmpl_buf_adds(b, "\\b");
        break;
      case '\f':
        tmpl_buf_adds(b, "\\f");
        break;
      default:
        if (c < 0x20) {
          snprintf(esc, sizeof esc, "\\u%04x", c);
          tmpl_buf_adds(b, esc);
        } else {
          tmpl_buf_add(b, (const char *)&s[i], 1);
        }
    }
  }
  tmpl_buf_adds(b, "\"");
}

static void newline_indent(tmpl_buf_t *b, int indent, int depth) {
  tmpl_buf_adds(b, "\n");
  for (int i = 0; i < indent * depth; i++) tmpl_buf_adds(b, " ");
}

void tmpl_value_json(tmpl_buf_t *b, const json_t *v, int indent, int depth) {
  char tmp[32];
  if (!v) return tmpl_buf_adds(b, "null");
  const char *item_sep = indent > 0 ? "," : ", ";
  switch (json_typeof(v)) {
    case JSON_NULL:
      return tmpl_buf_adds(b, "null");
    case JSON_TRUE:
      return tmpl_buf_adds(b, "true");
    case JSON_FALSE:
      return tmpl_buf_adds(b, "false");
    case JSON_INTEGER:
      snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
      return tmpl_buf_adds(b, tmp);
    case JSON_REAL: {
      double d = json_real_value(v);
      if (!isfinite(d)) return tmpl_buf_adds(b, "null"); /* as JSON.stringify */
      return tmpl_number_js(b, d);
    }
    case JSON_STRING:
      return json_string_out(b, json_string_value(v), json_string_length(v));
    case JSON_ARRAY: {
      size_t n = json_array_size(v);
      tmpl_buf_adds(b, "[");
      for (size_t i = 0; i < n; i++) {
        if (i) tmpl_buf_adds(b, item_sep);
        if (indent > 0) newline_indent(b, indent, depth + 1);
        tmpl_value_json(b, json_array_get(v, i), indent, depth + 1);
      }
      if (indent > 0 && n) newline_indent(b, indent, depth);
      tmpl_buf_adds(b, "]");
      return;
    }
    case JSON_OBJECT: {
      const char *key;
      json_t *val;
      size_t i = 0;
      tmpl_buf_adds(b, "{");
      json_object_foreach((json_t *)v, key, val) {
        if (i++) tmpl_buf_adds(b, item_sep);
        if (indent > 0) newline_indent(b, indent, depth + 1);
        json_string_out(b, key, strlen(key));
        tmpl_buf_adds(b, ": ");
        tmpl_value_json(b, val, indent, depth + 1);
      }
      if (indent > 0 && i) newline_indent(b, indent, depth);
      tmpl_buf_adds(b, "}");
      return;
    }
  }
}

json_t *tmpl_chars(const json_t *v) {
  const char *s = json_string_value(v);
  size_t n = json_string_length(v);
  json_t *list = json_array();
  for (size_t i = 0; i < n;) {
    size_t l = 1;
    while (i + l < n && ((unsigned char)s[i + l] & 0xC0) == 0x80) l++;
    json_array_append_new(list, json_stringn_nocheck(s + i, l));
    i += l;
  }
  return list;
}
