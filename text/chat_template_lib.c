/* chat_template_lib.c - the filters, tests, methods and functions chat
 * templates may call, each a table entry: name, implementation, argument
 * counts. The parser refuses any name not in these tables. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

#define FILTER_ARGS                                                                         \
  tmpl_render_t *r, const node_t *at, json_t *v, json_t **args, char **names, size_t nargs, \
      json_t **out
#define TEST_ARGS tmpl_render_t *r, const node_t *at, json_t *v, json_t **args, size_t nargs

/* Argument pos (positional) or keyword kw, or NULL; fails (returns -1) on
 * a keyword the callee does not take, which check_kw reports. */
static json_t *arg(json_t **args, char **names, size_t nargs, size_t pos, const char *kw) {
  if (pos < nargs && !(names && names[pos])) return args[pos];
  for (size_t i = 0; names && i < nargs; i++)
    if (names[i] && kw && !strcmp(names[i], kw)) return args[i];
  return NULL;
}

/* Refuses keywords not in the NULL-terminated list ok. */
static int check_kw(tmpl_render_t *r, const node_t *at, const char *what, char **names,
                    size_t nargs, const char *const *ok) {
  for (size_t i = 0; names && i < nargs; i++) {
    if (!names[i]) continue;
    int known = 0;
    for (size_t k = 0; ok && ok[k]; k++) known |= !strcmp(ok[k], names[i]);
    if (!known) return tmpl_fail(r, at, TY_EINVAL, "%s takes no argument '%s'", what, names[i]);
  }
  return 0;
}

static int need(tmpl_render_t *r, const node_t *at, const char *what, json_t *v, int ok,
                const char *kind) {
  if (ok) return 0;
  return tmpl_fail(r, at, TY_EINVAL, "%s needs %s, not %s", what, kind, tmpl_kind(v));
}

static json_t *str_of(const char *s, size_t n) {
  return json_stringn_nocheck(s, n);
}

/* ---- strings ---- */

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

static size_t last_cp_len(const char *s, size_t n) {
  size_t l = 1;
  while (l < n && ((unsigned char)s[n - l] & 0xC0) == 0x80) l++;
  return l;
}

static json_t *strip(json_t *v, json_t *chars, int left, int right) {
  const char *s = json_string_value(v), *c = chars ? json_string_value(chars) : NULL;
  size_t n = json_string_length(v), nc = chars ? json_string_length(chars) : 0, b = 0, e = n, l;
  while (left && b < e && is_strip_char(s + b, e - b, c, nc, &l)) b += l;
  while (right && e > b) {
    size_t cl = c ? last_cp_len(s + b, e - b) : tmpl_ws_before(s + b, e - b);
    if (!cl || !is_strip_char(s + e - cl, cl, c, nc, &l) || l != cl) break;
    e -= cl;
  }
  return str_of(s + b, e - b);
}

/* ASCII case mapping; other characters are kept as they are. */
static json_t *recase(json_t *v, int mode /* 'u' upper, 'l' lower, 'c' capitalize, 't' title */) {
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
  json_t *o = str_of(s, n);
  free(s);
  return o;
}

static int replace(tmpl_render_t *r, const node_t *at, json_t *v, json_t *old, json_t *new_,
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

static int split(tmpl_render_t *r, const node_t *at, json_t *v, json_t *sep, json_t *maxsplit,
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
        json_array_append_new(list, str_of(s + b, n - b));
        break;
      }
      while (i < n && !tmpl_ws_at(s + i, n - i)) i++;
      json_array_append_new(list, str_of(s + b, i - b));
      if (left > 0) left--;
    }
  } else {
    const char *p = json_string_value(sep);
    size_t np = json_string_length(sep);
    for (;;) {
      const char *hit = left != 0 ? memmem(s + i, n - i, p, np) : NULL;
      if (!hit) {
        json_array_append_new(list, str_of(s + i, n - i));
        break;
      }
      json_array_append_new(list, str_of(s + i, (size_t)(hit - (s + i))));
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

static int affix(tmpl_render_t *r, const node_t *at, json_t *v, json_t *x, int end, int *res) {
  size_t n = json_string_length(v);
  const char *s = json_string_value(v);
  *res = 0;
  if (json_is_array(x)) { /* a tuple of choices */
    for (size_t i = 0; i < json_array_size(x) && !*res; i++) {
      int rc = affix(r, at, v, json_array_get(x, i), end, res);
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

/* ---- filters ---- */

static int f_trim(FILTER_ARGS) {
  if (need(r, at, "filter 'trim'", v, json_is_string(v), "a string")) return TY_EINVAL;
  json_t *c = arg(args, names, nargs, 0, "chars");
  if (c && !json_is_string(c)) return tmpl_fail(r, at, TY_EINVAL, "trim's chars must be a string");
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = strip(v, c, 1, 1);
  return 0;
}

static int f_case(FILTER_ARGS, int mode, const char *what) {
  if (need(r, at, what, v, json_is_string(v), "a string")) return TY_EINVAL;
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = recase(v, mode);
  return 0;
}
static int f_upper(FILTER_ARGS) {
  return f_case(r, at, v, args, names, nargs, out, 'u', "upper");
}
static int f_lower(FILTER_ARGS) {
  return f_case(r, at, v, args, names, nargs, out, 'l', "lower");
}
static int f_capitalize(FILTER_ARGS) {
  return f_case(r, at, v, args, names, nargs, out, 'c', "capitalize");
}
static int f_title(FILTER_ARGS) {
  return f_case(r, at, v, args, names, nargs, out, 't', "title");
}

static int f_length(FILTER_ARGS) {
  if (json_is_string(v)) {
    if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
    *out = json_integer((json_int_t)tmpl_utf8_len(json_string_value(v), json_string_length(v)));
  } else if (json_is_array(v)) {
    *out = json_integer((json_int_t)json_array_size(v));
  } else if (json_is_object(v)) {
    *out = json_integer((json_int_t)json_object_size(v));
  } else {
    return need(r, at, "filter 'length'", v, 0, "a string, list or dict");
  }
  return 0;
}

static int f_tojson(FILTER_ARGS) {
  static const char *const kw[] = {"indent", NULL};
  if (check_kw(r, at, "filter 'tojson'", names, nargs, kw)) return TY_EINVAL;
  json_t *ind = arg(args, names, nargs, 0, "indent");
  if (ind && !json_is_null(ind) && !json_is_integer(ind))
    return tmpl_fail(r, at, TY_EINVAL, "tojson's indent must be an integer");
  long long indent = ind && json_is_integer(ind) ? json_integer_value(ind) : 0;
  if (indent < 0 || indent > 16)
    return tmpl_fail(r, at, TY_EINVAL, "tojson's indent must be 0 to 16");
  tmpl_buf_t b = {0};
  tmpl_value_json(&b, v, (int)indent, 0);
  int rc = tmpl_charge(r, at, b.len);
  if (rc) {
    free(b.p);
    return rc;
  }
  *out = tmpl_string_take(&b);
  return 0;
}

static int f_string(FILTER_ARGS) {
  tmpl_buf_t b = {0};
  tmpl_value_str(&b, v);
  int rc = tmpl_charge(r, at, b.len);
  if (rc) {
    free(b.p);
    return rc;
  }
  *out = tmpl_string_take(&b);
  return 0;
}

static int f_default(FILTER_ARGS) {
  static const char *const kw[] = {"default_value", "boolean", NULL};
  if (check_kw(r, at, "filter 'default'", names, nargs, kw)) return TY_EINVAL;
  json_t *d = arg(args, names, nargs, 0, "default_value");
  json_t *b = arg(args, names, nargs, 1, "boolean");
  if (b && !json_is_boolean(b))
    return tmpl_fail(r, at, TY_EINVAL, "default's boolean flag must be true or false");
  if (!v || (b && json_is_true(b) && !tmpl_truthy(v)))
    *out = d ? json_incref(d) : json_string("");
  else
    *out = json_incref(v);
  return 0;
}

static int f_first_last(FILTER_ARGS, int last) {
  if (json_is_array(v)) {
    size_t n = json_array_size(v);
    *out = n ? json_incref(json_array_get(v, last ? n - 1 : 0)) : NULL;
    return 0;
  }
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (!n) return 0;
    size_t l = last ? last_cp_len(s, n) : 1;
    if (!last)
      while (l < n && ((unsigned char)s[l] & 0xC0) == 0x80) l++;
    *out = str_of(last ? s + n - l : s, l);
    return 0;
  }
  return need(r, at, last ? "filter 'last'" : "filter 'first'", v, 0, "a list or string");
}
static int f_first(FILTER_ARGS) {
  return f_first_last(r, at, v, args, names, nargs, out, 0);
}
static int f_last(FILTER_ARGS) {
  return f_first_last(r, at, v, args, names, nargs, out, 1);
}

static int f_join(FILTER_ARGS) {
  static const char *const kw[] = {"d", "attribute", NULL};
  if (check_kw(r, at, "filter 'join'", names, nargs, kw)) return TY_EINVAL;
  json_t *sep = arg(args, names, nargs, 0, "d");
  json_t *attr = arg(args, names, nargs, 1, "attribute");
  if (sep && !json_is_string(sep))
    return tmpl_fail(r, at, TY_EINVAL, "join's separator must be a string");
  if (attr && !json_is_string(attr))
    return tmpl_fail(r, at, TY_EINVAL, "join's attribute must be a string");
  if (json_is_string(v)) { /* a string joins its characters */
    *out = json_incref(v);
    if (!sep || !json_string_length(sep)) return 0;
  }
  if (!json_is_array(v) && !json_is_string(v)) return need(r, at, "filter 'join'", v, 0, "a list");
  tmpl_buf_t b = {0};
  if (json_is_string(v)) {
    json_decref(*out);
    *out = NULL;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    for (size_t i = 0; i < n;) {
      size_t l = 1;
      while (i + l < n && ((unsigned char)s[i + l] & 0xC0) == 0x80) l++;
      if (i) tmpl_buf_add(&b, json_string_value(sep), json_string_length(sep));
      tmpl_buf_add(&b, s + i, l);
      i += l;
    }
  } else {
    for (size_t i = 0; i < json_array_size(v); i++) {
      json_t *item = json_array_get(v, i);
      if (attr) item = json_object_get(item, json_string_value(attr));
      if (i && sep) tmpl_buf_add(&b, json_string_value(sep), json_string_length(sep));
      tmpl_value_str(&b, item);
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

static int f_replace(FILTER_ARGS) {
  if (need(r, at, "filter 'replace'", v, json_is_string(v), "a string")) return TY_EINVAL;
  return replace(r, at, v, arg(args, names, nargs, 0, "old"), arg(args, names, nargs, 1, "new"),
                 arg(args, names, nargs, 2, "count"), out);
}

static json_t *items_of(json_t *v) {
  const char *key;
  json_t *val, *list = json_array();
  json_object_foreach(v, key, val) json_array_append_new(list, json_pack("[sO]", key, val));
  return list;
}

static int f_items(FILTER_ARGS) {
  if (!v) { /* Jinja: items of undefined are none */
    *out = json_array();
    return 0;
  }
  if (need(r, at, "filter 'items'", v, json_is_object(v), "a dict")) return TY_EINVAL;
  if (tmpl_charge(r, at, json_object_size(v) * 3 * TMPL_ITEM_COST)) return TY_EEXHAUSTED;
  *out = items_of(v);
  return 0;
}

static int f_list(FILTER_ARGS) {
  if (json_is_array(v)) {
    *out = json_copy(v);
  } else if (json_is_object(v)) {
    const char *key;
    json_t *val;
    *out = json_array();
    json_object_foreach(v, key, val) json_array_append_new(*out, json_string(key));
  } else if (json_is_string(v)) {
    *out = tmpl_chars(v);
  } else {
    return need(r, at, "filter 'list'", v, 0, "a list, dict or string");
  }
  return tmpl_charge(r, at, json_array_size(*out) * TMPL_ITEM_COST);
}

static int f_int(FILTER_ARGS) {
  json_t *d = arg(args, names, nargs, 0, "default");
  if (json_is_integer(v))
    *out = json_incref(v);
  else if (json_is_real(v) && json_real_value(v) > -9.2e18 && json_real_value(v) < 9.2e18)
    *out = json_integer((json_int_t)json_real_value(v));
  else if (json_is_boolean(v))
    *out = json_integer(json_is_true(v));
  else if (json_is_string(v)) {
    char *end;
    errno = 0;
    long long x = strtoll(json_string_value(v), &end, 10);
    if (end == json_string_value(v) || errno)
      *out = d ? json_incref(d) : json_integer(0);
    else
      *out = json_integer(x);
  } else {
    *out = d ? json_incref(d) : json_integer(0);
  }
  return 0;
}

static int f_float(FILTER_ARGS) {
  json_t *d = arg(args, names, nargs, 0, "default");
  if (json_is_number(v))
    *out = json_real(json_number_value(v));
  else if (json_is_boolean(v))
    *out = json_real(json_is_true(v));
  else if (json_is_string(v)) {
    char *end;
    double x = strtod(json_string_value(v), &end);
    *out = end == json_string_value(v) ? (d ? json_incref(d) : json_real(0)) : json_real(x);
  } else {
    *out = d ? json_incref(d) : json_real(0);
  }
  return 0;
}

static int f_abs(FILTER_ARGS) {
  if (json_is_integer(v)) {
    long long x = json_integer_value(v);
    if (x == LLONG_MIN) return tmpl_fail(r, at, TY_EINVAL, "integer overflow");
    *out = json_integer(x < 0 ? -x : x);
  } else if (json_is_real(v)) {
    *out = json_real(fabs(json_real_value(v)));
  } else {
    return need(r, at, "filter 'abs'", v, 0, "a number");
  }
  return 0;
}

static int f_reverse(FILTER_ARGS) {
  if (json_is_array(v)) {
    size_t n = json_array_size(v);
    *out = json_array();
    for (size_t i = n; i-- > 0;) json_array_append(*out, json_array_get(v, i));
    return tmpl_charge(r, at, n * TMPL_ITEM_COST);
  }
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    tmpl_buf_t b = {0};
    for (size_t e = n; e > 0;) {
      size_t l = last_cp_len(s, e);
      tmpl_buf_add(&b, s + e - l, l);
      e -= l;
    }
    *out = tmpl_string_take(&b);
    return tmpl_charge(r, at, n);
  }
  return need(r, at, "filter 'reverse'", v, 0, "a list or string");
}

static int f_safe(FILTER_ARGS) {
  *out = json_incref(v);
  return 0;
}

/* select/reject/selectattr/rejectattr: items whose test (args[first] names
 * it; truth when absent) passes (keep 1) or fails (keep 0). */
static int filter_items(FILTER_ARGS, int keep, int by_attr, const char *what) {
  if (!json_is_array(v)) return need(r, at, what, v, 0, "a list");
  size_t first = by_attr ? 1 : 0;
  if (names)
    for (size_t i = 0; i < nargs; i++)
      if (names[i]) return tmpl_fail(r, at, TY_EINVAL, "%s takes no keyword arguments", what);
  if (by_attr && (nargs < 1 || !json_is_string(args[0])))
    return tmpl_fail(r, at, TY_EINVAL, "%s needs an attribute name", what);
  const tmpl_test_t *t = NULL;
  if (nargs > first) {
    if (!json_is_string(args[first]))
      return tmpl_fail(r, at, TY_EINVAL, "%s needs a test name", what);
    const char *tn = json_string_value(args[first]);
    if (!(t = tmpl_find_test(tn)))
      return tmpl_fail(r, at, TY_EINVAL, "test '%s' is not supported", tn);
    size_t given = nargs - first - 1;
    if (given < t->min_args || given > t->max_args)
      return tmpl_fail(r, at, TY_EINVAL, "test '%s' takes %zu to %zu arguments, given %zu", tn,
                       t->min_args, t->max_args, given);
  }
  if (tmpl_charge(r, at, json_array_size(v) * TMPL_ITEM_COST)) return TY_EEXHAUSTED;
  json_t *list = json_array();
  for (size_t i = 0; i < json_array_size(v); i++) {
    json_t *item = json_array_get(v, i), *x = item;
    if (by_attr) x = json_object_get(item, json_string_value(args[0]));
    int res = t ? t->fn(r, at, x, args + first + 1, nargs - first - 1) : tmpl_truthy(x);
    if (res < 0) {
      json_decref(list);
      return res;
    }
    if (!!res == keep) json_array_append(list, item);
  }
  *out = list;
  return tmpl_charge(r, at, json_array_size(list) * TMPL_ITEM_COST);
}
static int f_select(FILTER_ARGS) {
  return filter_items(r, at, v, args, names, nargs, out, 1, 0, "filter 'select'");
}
static int f_reject(FILTER_ARGS) {
  return filter_items(r, at, v, args, names, nargs, out, 0, 0, "filter 'reject'");
}
static int f_selectattr(FILTER_ARGS) {
  return filter_items(r, at, v, args, names, nargs, out, 1, 1, "filter 'selectattr'");
}
static int f_rejectattr(FILTER_ARGS) {
  return filter_items(r, at, v, args, names, nargs, out, 0, 1, "filter 'rejectattr'");
}

static int f_map(FILTER_ARGS) {
  static const char *const kw[] = {"attribute", "default", NULL};
  if (check_kw(r, at, "filter 'map'", names, nargs, kw)) return TY_EINVAL;
  if (!json_is_array(v)) return need(r, at, "filter 'map'", v, 0, "a list");
  json_t *attr = arg(args, names, nargs, 99, "attribute");
  json_t *def = arg(args, names, nargs, 99, "default");
  const tmpl_filter_t *f = NULL;
  if (!attr) {
    if (nargs < 1 || (names && names[0]) || !json_is_string(args[0]))
      return tmpl_fail(r, at, TY_EINVAL, "filter 'map' needs attribute= or a filter name");
    const char *fn = json_string_value(args[0]);
    if (!(f = tmpl_find_filter(fn)) || !strcmp(fn, "map"))
      return tmpl_fail(r, at, TY_EINVAL, "filter '%s' is not supported", fn);
    if (nargs - 1 < f->min_args || nargs - 1 > f->max_args)
      return tmpl_fail(r, at, TY_EINVAL, "filter '%s' takes %zu to %zu arguments, given %zu", fn,
                       f->min_args, f->max_args, nargs - 1);
  } else if (!json_is_string(attr)) {
    return tmpl_fail(r, at, TY_EINVAL, "map's attribute must be a string");
  }
  if (tmpl_charge(r, at, json_array_size(v) * TMPL_ITEM_COST)) return TY_EEXHAUSTED;
  json_t *list = json_array();
  for (size_t i = 0; i < json_array_size(v); i++) {
    json_t *item = json_array_get(v, i), *x = NULL;
    if (attr) {
      x = json_incref(json_object_get(item, json_string_value(attr)));
      if (!x && def) x = json_incref(def);
    } else {
      int rc = f->fn(r, at, item, args + 1, names ? names + 1 : NULL, nargs - 1, &x);
      if (rc) {
        json_decref(list);
        return rc;
      }
    }
    json_array_append_new(list, x ? x : json_null());
  }
  *out = list;
  return tmpl_charge(r, at, json_array_size(list) * TMPL_ITEM_COST);
}

static const tmpl_filter_t kFilters[] = {
    {"abs", f_abs, 0, 0},
    {"capitalize", f_capitalize, 0, 0},
    {"count", f_length, 0, 0},
    {"d", f_default, 0, 2},
    {"default", f_default, 0, 2},
    {"first", f_first, 0, 0},
    {"float", f_float, 0, 1},
    {"int", f_int, 0, 1},
    {"items", f_items, 0, 0},
    {"join", f_join, 0, 2},
    {"last", f_last, 0, 0},
    {"length", f_length, 0, 0},
    {"list", f_list, 0, 0},
    {"lower", f_lower, 0, 0},
    {"map", f_map, 0, 8},
    {"reject", f_reject, 0, 8},
    {"rejectattr", f_rejectattr, 1, 8},
    {"replace", f_replace, 2, 3},
    {"reverse", f_reverse, 0, 0},
    {"safe", f_safe, 0, 0},
    {"select", f_select, 0, 8},
    {"selectattr", f_selectattr, 1, 8},
    {"string", f_string, 0, 0},
    {"title", f_title, 0, 0},
    {"tojson", f_tojson, 0, 1},
    {"trim", f_trim, 0, 1},
    {"upper", f_upper, 0, 0},
};

/* ---- tests ---- */

static int t_defined(TEST_ARGS) {
  return v != NULL;
}
static int t_undefined(TEST_ARGS) {
  return v == NULL;
}
static int t_none(TEST_ARGS) {
  return json_is_null(v);
}
static int t_string(TEST_ARGS) {
  return json_is_string(v);
}
static int t_number(TEST_ARGS) {
  return json_is_integer(v) || json_is_real(v);
}
static int t_integer(TEST_ARGS) {
  return json_is_integer(v);
}
static int t_float(TEST_ARGS) {
  return json_is_real(v);
}
static int t_boolean(TEST_ARGS) {
  return json_is_boolean(v);
}
static int t_mapping(TEST_ARGS) {
  return json_is_object(v);
}
static int t_iterable(TEST_ARGS) {
  return json_is_array(v) || json_is_object(v) || json_is_string(v);
}
static int t_sequence(TEST_ARGS) {
  return json_is_array(v) || json_is_object(v) || json_is_string(v);
}
static int t_true(TEST_ARGS) {
  return json_is_true(v);
}
static int t_false(TEST_ARGS) {
  return json_is_false(v);
}
static int t_odd_even(tmpl_render_t *r, const node_t *at, json_t *v, int odd) {
  if (!json_is_integer(v))
    return need(r, at, odd ? "test 'odd'" : "test 'even'", v, 0, "an integer");
  return (json_integer_value(v) % 2 != 0) == odd;
}
static int t_odd(TEST_ARGS) {
  return t_odd_even(r, at, v, 1);
}
static int t_even(TEST_ARGS) {
  return t_odd_even(r, at, v, 0);
}
static int t_eq(TEST_ARGS) {
  return tmpl_equal(r, at, v, args[0]);
}
static int t_ne(TEST_ARGS) {
  int eq = tmpl_equal(r, at, v, args[0]);
  return eq < 0 ? eq : !eq;
}
static int t_divisibleby(TEST_ARGS) {
  if (!json_is_integer(v) || !json_is_integer(args[0]) || json_integer_value(args[0]) == 0)
    return tmpl_fail(r, at, TY_EINVAL, "test 'divisibleby' needs integers, the divisor not 0");
  if (json_integer_value(args[0]) == -1) return 1;
  return json_integer_value(v) % json_integer_value(args[0]) == 0;
}
static int t_case(TEST_ARGS, int upper) {
  if (!json_is_string(v)) return 0;
  const char *s = json_string_value(v);
  for (size_t i = 0; i < json_string_length(v); i++)
    if (upper ? (s[i] >= 'a' && s[i] <= 'z') : (s[i] >= 'A' && s[i] <= 'Z')) return 0;
  return 1;
}
static int t_lower(TEST_ARGS) {
  return t_case(r, at, v, args, nargs, 0);
}
static int t_upper(TEST_ARGS) {
  return t_case(r, at, v, args, nargs, 1);
}
static int t_in(TEST_ARGS) {
  json_t *seq = args[0];
  int eq;
  if (json_is_array(seq)) {
    for (size_t i = 0; i < json_array_size(seq); i++)
      if ((eq = tmpl_equal(r, at, v, json_array_get(seq, i)))) return eq;
    return 0;
  }
  if (json_is_object(seq) && json_is_string(v))
    return json_object_get(seq, json_string_value(v)) != NULL;
  if (json_is_string(seq) && json_is_string(v))
    return memmem(json_string_value(seq), json_string_length(seq), json_string_value(v),
                  json_string_length(v)) != NULL;
  return tmpl_fail(r, at, TY_EINVAL, "test 'in' needs a list, dict or string");
}

static const tmpl_test_t kTests[] = {
    {"boolean", t_boolean, 0, 0},
    {"defined", t_defined, 0, 0},
    {"divisibleby", t_divisibleby, 1, 1},
    {"eq", t_eq, 1, 1},
    {"equalto", t_eq, 1, 1},
    {"even", t_even, 0, 0},
    {"false", t_false, 0, 0},
    {"float", t_float, 0, 0},
    {"in", t_in, 1, 1},
    {"integer", t_integer, 0, 0},
    {"iterable", t_iterable, 0, 0},
    {"lower", t_lower, 0, 0},
    {"mapping", t_mapping, 0, 0},
    {"ne", t_ne, 1, 1},
    {"none", t_none, 0, 0},
    {"number", t_number, 0, 0},
    {"odd", t_odd, 0, 0},
    {"sameas", t_eq, 1, 1},
    {"sequence", t_sequence, 0, 0},
    {"string", t_string, 0, 0},
    {"true", t_true, 0, 0},
    {"undefined", t_undefined, 0, 0},
    {"upper", t_upper, 0, 0},
};

/* ---- methods ---- */

static int recv_string(tmpl_render_t *r, const node_t *at, json_t *v) {
  return need(r, at, at->a->str, v, json_is_string(v), "a string") ? TY_EINVAL : 0;
}
static int recv_dict(tmpl_render_t *r, const node_t *at, json_t *v) {
  return need(r, at, at->a->str, v, json_is_object(v), "a dict") ? TY_EINVAL : 0;
}

static int m_strip_any(FILTER_ARGS, int left, int right) {
  if (recv_string(r, at, v)) return TY_EINVAL;
  json_t *c = nargs ? args[0] : NULL;
  if (c && !json_is_null(c) && !json_is_string(c))
    return tmpl_fail(r, at, TY_EINVAL, "%s's characters must be a string", at->a->str);
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = strip(v, json_is_string(c) ? c : NULL, left, right);
  return 0;
}
static int m_strip(FILTER_ARGS) {
  return m_strip_any(r, at, v, args, names, nargs, out, 1, 1);
}
static int m_lstrip(FILTER_ARGS) {
  return m_strip_any(r, at, v, args, names, nargs, out, 1, 0);
}
static int m_rstrip(FILTER_ARGS) {
  return m_strip_any(r, at, v, args, names, nargs, out, 0, 1);
}

static int m_affix(FILTER_ARGS, int end) {
  int res;
  if (recv_string(r, at, v)) return TY_EINVAL;
  int rc = affix(r, at, v, args[0], end, &res);
  if (!rc) *out = json_boolean(res);
  return rc;
}
static int m_startswith(FILTER_ARGS) {
  return m_affix(r, at, v, args, names, nargs, out, 0);
}
static int m_endswith(FILTER_ARGS) {
  return m_affix(r, at, v, args, names, nargs, out, 1);
}

static int m_split(FILTER_ARGS) {
  if (recv_string(r, at, v)) return TY_EINVAL;
  return split(r, at, v, arg(args, names, nargs, 0, "sep"), arg(args, names, nargs, 1, "maxsplit"),
               out);
}

static int m_case(FILTER_ARGS, int mode) {
  if (recv_string(r, at, v)) return TY_EINVAL;
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = recase(v, mode);
  return 0;
}
static int m_upper(FILTER_ARGS) {
  return m_case(r, at, v, args, names, nargs, out, 'u');
}
static int m_lower(FILTER_ARGS) {
  return m_case(r, at, v, args, names, nargs, out, 'l');
}
static int m_title(FILTER_ARGS) {
  return m_case(r, at, v, args, names, nargs, out, 't');
}
static int m_capitalize(FILTER_ARGS) {
  return m_case(r, at, v, args, names, nargs, out, 'c');
}

static int m_replace(FILTER_ARGS) {
  if (recv_string(r, at, v)) return TY_EINVAL;
  return replace(r, at, v, args[0], args[1], nargs > 2 ? args[2] : NULL, out);
}

static int m_items(FILTER_ARGS) {
  if (recv_dict(r, at, v)) return TY_EINVAL;
  if (tmpl_charge(r, at, json_object_size(v) * 3 * TMPL_ITEM_COST)) return TY_EEXHAUSTED;
  *out = items_of(v);
  return 0;
}

static int m_keys_values(FILTER_ARGS, int values) {
  if (recv_dict(r, at, v)) return TY_EINVAL;
  const char *key;
  json_t *val;
  *out = json_array();
  json_object_foreach(v, key, val) {
    json_array_append_new(*out, values ? json_incref(val) : json_string(key));
  }
  return tmpl_charge(r, at, json_object_size(v) * TMPL_ITEM_COST);
}
static int m_keys(FILTER_ARGS) {
  return m_keys_values(r, at, v, args, names, nargs, out, 0);
}
static int m_values(FILTER_ARGS) {
  return m_keys_values(r, at, v, args, names, nargs, out, 1);
}

static int m_get(FILTER_ARGS) {
  if (recv_dict(r, at, v)) return TY_EINVAL;
  if (!json_is_string(args[0])) return tmpl_fail(r, at, TY_EINVAL, "get needs a string key");
  json_t *x = json_object_get(v, json_string_value(args[0]));
  *out = json_incref(x ? x : nargs > 1 ? args[1] : json_null());
  return 0;
}

static const tmpl_method_t kMethods[] = {
    {"capitalize", m_capitalize, 0, 0},
    {"endswith", m_endswith, 1, 1},
    {"get", m_get, 1, 2},
    {"items", m_items, 0, 0},
    {"keys", m_keys, 0, 0},
    {"lower", m_lower, 0, 0},
    {"lstrip", m_lstrip, 0, 1},
    {"replace", m_replace, 2, 3},
    {"rstrip", m_rstrip, 0, 1},
    {"split", m_split, 0, 2},
    {"startswith", m_startswith, 1, 1},
    {"strip", m_strip, 0, 1},
    {"title", m_title, 0, 0},
    {"upper", m_upper, 0, 0},
    {"values", m_values, 0, 0},
};

/* ---- functions ---- */

static int fn_raise_exception(FILTER_ARGS) {
  tmpl_buf_t b = {0};
  tmpl_value_str(&b, args[0]);
  int rc = tmpl_fail(r, at, TY_EINVAL, "%s", b.p ? b.p : "");
  free(b.p);
  return rc;
}

static int fn_range(FILTER_ARGS) {
  long long a[3] = {0, 0, 1};
  for (size_t i = 0; i < nargs; i++) {
    if (!json_is_integer(args[i]) || (names && names[i]))
      return tmpl_fail(r, at, TY_EINVAL, "range takes integers");
  }
  if (nargs == 1) {
    a[1] = json_integer_value(args[0]);
  } else {
    a[0] = json_integer_value(args[0]);
    a[1] = json_integer_value(args[1]);
    if (nargs == 3) a[2] = json_integer_value(args[2]);
  }
  if (a[2] == 0) return tmpl_fail(r, at, TY_EINVAL, "range's step cannot be zero");
  /* count first, in unsigned arithmetic: a hostile range cannot overflow */
  unsigned long long count = 0;
  if (a[2] > 0 && a[1] > a[0])
    count =
        ((unsigned long long)a[1] - (unsigned long long)a[0] - 1) / (unsigned long long)a[2] + 1;
  if (a[2] < 0 && a[1] < a[0])
    count = ((unsigned long long)a[0] - (unsigned long long)a[1] - 1) /
                (0ull - (unsigned long long)a[2]) +
            1;
  if (count > TMPL_MAX_ITERATIONS)
    return tmpl_fail(r, at, TY_EEXHAUSTED, "range of %llu numbers, more than the %d allowed", count,
                     TMPL_MAX_ITERATIONS);
  int rc = tmpl_charge(r, at, count * TMPL_ITEM_COST);
  if (rc) return rc;
  *out = json_array();
  long long x = a[0];
  for (unsigned long long i = 0; i < count; i++, x += a[2])
    json_array_append_new(*out, json_integer(x));
  return 0;
}

static int fn_namespace(FILTER_ARGS) {
  json_t *ns = json_object();
  for (size_t i = 0; i < nargs; i++) {
    if (!names || !names[i]) {
      if (i == 0 && json_is_object(args[0])) { /* namespace({...}) */
        json_object_update(ns, args[0]);
        continue;
      }
      json_decref(ns);
      return tmpl_fail(r, at, TY_EINVAL, "namespace takes keyword arguments (a=1) or a dict");
    }
    json_object_set(ns, names[i], args[i] ? args[i] : json_null());
  }
  int rc = tmpl_namespace_add(r, at, ns);
  if (rc) {
    json_decref(ns);
    return rc;
  }
  *out = ns;
  return 0;
}

static int fn_strftime_now(FILTER_ARGS) {
  if (!json_is_string(args[0]))
    return tmpl_fail(r, at, TY_EINVAL, "strftime_now needs a format string");
  char buf[256];
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  size_t n = strftime(buf, sizeof buf, json_string_value(args[0]), &tm);
#pragma GCC diagnostic pop
  if (n == 0 && json_string_length(args[0]) > 0)
    return tmpl_fail(r, at, TY_EINVAL,
                     "strftime_now's format gives no text or more than 255 bytes");
  *out = str_of(buf, n);
  return 0;
}

static const tmpl_func_t kFuncs[] = {
    {"namespace", fn_namespace, 0, 64},
    {"raise_exception", fn_raise_exception, 1, 1},
    {"range", fn_range, 1, 3},
    {"strftime_now", fn_strftime_now, 1, 1},
};

#define FIND(table, key)                                             \
  do {                                                               \
    for (size_t i_ = 0; i_ < sizeof(table) / sizeof(*(table)); i_++) \
      if (!strcmp((table)[i_].name, (key))) return &(table)[i_];     \
    return NULL;                                                     \
  } while (0)

const tmpl_filter_t *tmpl_find_filter(const char *name) {
  FIND(kFilters, name);
}
const tmpl_test_t *tmpl_find_test(const char *name) {
  FIND(kTests, name);
}
const tmpl_method_t *tmpl_find_method(const char *name) {
  FIND(kMethods, name);
}
const tmpl_func_t *tmpl_find_func(const char *name) {
  FIND(kFuncs, name);
}
