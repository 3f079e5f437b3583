/* chat_template_strings.c - the string operations of chat templates'
 * filters and methods: strip, case, replace, split, prefix tests, each on
 * UTF-8 text, with the render's work budget charged by the caller or here. */
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

json_t *tmpl_str_of(const char *s, size_t n) {
  return json_stringn_nocheck(s, n);
}

static int is_strip_char(const char *s, size_t n, const char *chars, size_t nchars, size_t *len) {
  if (!chars) return (*len = tmpl_ws_at(s, n)) != 0;
  /* chars: a set of code points */
  size_t l = 1;
  while (l < n && ((unsigned char)s[l] & 0xC0) == 0x80) l++;
  for (size_t i = 0; i < nchars;) {
    size_t cl = 1;
    while (i + cl < nchars && ((unsigned char)chars[i + cl] & 0xC0) == 0x80) cl++;
    if (cl == l && !memcmp(chars + i, s, l)) return (int)(*len = l);
    i += cl;
  }
  return 0;
}

size_t tmpl_last_cp_len(const char *s, size_t n) {
  size_t l = 1;
  while (l < n && ((unsigned char)s[n - l] & 0xC0) == 0x80) l++;
  return l;
}

json_t *tmpl_str_strip(json_t *v, json_t *chars, int left, int right) {
  const char *s = json_string_value(v), *c = chars ? json_string_value(chars) : NULL;
  size_t n = json_string_length(v), nc = chars ? json_string_length(chars) : 0, b = 0, e = n, l;
  while (left && b < e && is_strip_char(s + b, e - b, c, nc, &l)) b += l;
  while (right && e > b) {
    size_t cl = c ? tmpl_last_cp_len(s + b, e - b) : tmpl_ws_before(s + b, e - b);
    if (!cl || !is_strip_char(s + e - cl, cl, c, nc, &l) || l != cl) break;
    e -= cl;
  }
  return tmpl_str_of(s + b, e - b);
}

/* ASCII case mapping; other characters are kept as they are. */
json_t *tmpl_str_recase(json_t *v, int mode) {
  size_t n = json_string_length(v);
  char *s = xmalloc(n + 1);
  memcpy(s, json_string_value(v), n + 1);
  int word_start = 1;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int up = mode == 'u' || (mode == 'c' && i == 0) || (mode == 't' && word_start);
    int down = mode == 'l' || (mode == 't' && !word_start);
    if (up && c >= 'a' && c <= 'z') s[i] = (char)(c - 32);
    if (down && c >= 'A' && c <= 'Z') s[i] = (char)(c + 32);
    unsigned char u = (unsigned char)c;
    word_start =
        !((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || u >= 0x80);
  }
  json_t *o = tmpl_str_of(s, n);
  free(s);
  return o;
}

int tmpl_str_replace(tmpl_render_t *r, const node_t *at, json_t *v, json_t *old, json_t *new_,
                     json_t *count, json_t **out) {
  if (!json_is_string(old) || !json_is_string(new_))
    return tmpl_fail(r, at, TY_EINVAL, "replace needs two strings");
  if (count && !json_is_integer(count))
    return tmpl_fail(r, at, TY_EINVAL, "replace's count must be an integer");
  long long left = count ? json_integer_value(count) : -1;
  const char *s = json_string_value(v), *o = json_string_value(old), *w = json_string_value(new_);
  size_t n = json_string_length(v), no = json_string_length(old), nw = json_string_length(new_);
  tmpl_buf_t b = {0};
  size_t i = 0;
  if (no == 0) { /* Python: the new text between every character and at both ends */
    while (i <= n) {
      if (left-- == 0) {
        tmpl_buf_add(&b, s + i, n - i);
        break;
      }
      tmpl_buf_add(&b, w, nw);
      if (i == n) break;
      size_t cl = 1;
      while (i + cl < n && ((unsigned char)s[i + cl] & 0xC0) == 0x80) cl++;
      tmpl_buf_add(&b, s + i, cl);
      i += cl;
    }
  } else {
    while (i < n) {
      const char *hit = left != 0 ? memmem(s + i, n - i, o, no) : NULL;
      if (!hit) {
        tmpl_buf_add(&b, s + i, n - i);
        break;
      }
      tmpl_buf_add(&b, s + i, (size_t)(hit - (s + i)));
      tmpl_buf_add(&b, w, nw);
      i = (size_t)(hit - s) + no;
      if (left > 0) left--;
    }
  }
  int rc = tmpl_charge(r, at, b.len);
  if (rc) {
    free(b.p);
    return rc;
  }
  *out = tmpl_string_take(&b);
  return 0;
}

int tmpl_str_split(tmpl_render_t *r, const node_t *at, json_t *v, json_t *sep, json_t *maxsplit,
                   json_t **out) {
  if (sep && !json_is_null(sep) && !json_is_string(sep))
    return tmpl_fail(r, at, TY_EINVAL, "split's separator must be a string");
  if (sep && json_is_string(sep) && json_string_length(sep) == 0)
    return tmpl_fail(r, at, TY_EINVAL, "split's separator cannot be empty");
  if (maxsplit && !json_is_integer(maxsplit))
    return tmpl_fail(r, at, TY_EINVAL, "split's maxsplit must be an integer");
  long long left = maxsplit ? json_integer_value(maxsplit) : -1;
  const char *s = json_string_value(v);
  size_t n = json_string_length(v), i = 0, w;
  json_t *list = json_array();
  if (!sep || json_is_null(sep)) { /* runs of whitespace; no empty parts */
    for (;;) {
      while (i < n && (w = tmpl_ws_at(s + i, n - i))) i += w;
      if (i >= n) break;
      size_t b = i;
      if (left == 0) { /* the rest, trailing whitespace and all, as Python */
        json_array_append_new(list, tmpl_str_of(s + b, n - b));
        break;
      }
      while (i < n && !tmpl_ws_at(s + i, n - i)) i++;
      json_array_append_new(list, tmpl_str_of(s + b, i - b));
      if (left > 0) left--;
    }
  } else {
    const char *p = json_string_value(sep);
    size_t np = json_string_length(sep);
    for (;;) {
      const char *hit = left != 0 ? memmem(s + i, n - i, p, np) : NULL;
      if (!hit) {
        json_array_append_new(list, tmpl_str_of(s + i, n - i));
        break;
      }
      json_array_append_new(list, tmpl_str_of(s + i, (size_t)(hit - (s + i))));
      i = (size_t)(hit - s) + np;
      if (left > 0) left--;
    }
  }
  int rc = tmpl_charge(r, at, n + json_array_size(list) * TMPL_ITEM_COST);
  if (rc) {
    json_decref(list);
    return rc;
  }
  *out = list;
  return 0;
}

int tmpl_str_affix(tmpl_render_t *r, const node_t *at, json_t *v, json_t *x, int end, int *res) {
  size_t n = json_string_length(v);
  const char *s = json_string_value(v);
  *res = 0;
  if (json_is_array(x)) { /* a tuple of choices */
    for (size_t i = 0; i < json_array_size(x) && !*res; i++) {
      int rc = tmpl_str_affix(r, at, v, json_array_get(x, i), end, res);
      if (rc) return rc;
    }
    return 0;
  }
  if (!json_is_string(x))
    return tmpl_fail(r, at, TY_EINVAL, "%s needs a string, not %s", end ? "endswith" : "startswith",
                     tmpl_kind(x));
  size_t k = json_string_length(x);
  *res = k <= n && !memcmp(end ? s + n - k : s, json_string_value(x), k);
  return 0;
}

json_t *tmpl_items_of(json_t *v) {
  const char *key;
  json_t *val, *list = json_array();
  json_object_foreach(v, key, val) json_array_append_new(list, json_pack("[sO]", key, val));
  return list;
}
