/* chat_template_filters.c - the filters chat templates may apply (x|name),
 * one table entry each: name, implementation, argument counts; the parser
 * refuses any other name. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

json_t *tmpl_arg(json_t **args, char **names, size_t nargs, size_t pos, const char *kw) {
  if (pos < nargs && !(names && names[pos])) return args[pos];
  for (size_t i = 0; names && i < nargs; i++)
    if (names[i] && kw && !strcmp(names[i], kw)) return args[i];
  return NULL;
}

int tmpl_check_kw(tmpl_render_t *r, const node_t *at, const char *what, char **names, size_t nargs,
                  const char *const *ok) {
  for (size_t i = 0; names && i < nargs; i++) {
    if (!names[i]) continue;
    int known = 0;
    for (size_t k = 0; ok && ok[k]; k++) known |= !strcmp(ok[k], names[i]);
    if (!known) return tmpl_fail(r, at, TY_EINVAL, "%s takes no argument '%s'", what, names[i]);
  }
  return 0;
}

int tmpl_need(tmpl_render_t *r, const node_t *at, const char *what, json_t *v, int ok,
              const char *kind) {
  if (ok) return 0;
  return tmpl_fail(r, at, TY_EINVAL, "%s needs %s, not %s", what, kind, tmpl_kind(v));
}

static int f_trim(FILTER_ARGS) {
  if (tmpl_need(r, at, "filter 'trim'", v, json_is_string(v), "a string")) return TY_EINVAL;
  json_t *c = tmpl_arg(args, names, nargs, 0, "chars");
  if (c && !json_is_string(c)) return tmpl_fail(r, at, TY_EINVAL, "trim's chars must be a string");
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = tmpl_str_strip(v, c, 1, 1);
  return 0;
}

static int f_case(FILTER_ARGS, int mode, const char *what) {
  if (tmpl_need(r, at, what, v, json_is_string(v), "a string")) return TY_EINVAL;
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = tmpl_str_recase(v, mode);
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
    return tmpl_need(r, at, "filter 'length'", v, 0, "a string, list or dict");
  }
  return 0;
}

static int f_tojson(FILTER_ARGS) {
  static const char *const kw[] = {"indent", NULL};
  if (tmpl_check_kw(r, at, "filter 'tojson'", names, nargs, kw)) return TY_EINVAL;
  json_t *ind = tmpl_arg(args, names, nargs, 0, "indent");
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
  if (tmpl_check_kw(r, at, "filter 'default'", names, nargs, kw)) return TY_EINVAL;
  json_t *d = tmpl_arg(args, names, nargs, 0, "default_value");
  json_t *b = tmpl_arg(args, names, nargs, 1, "boolean");
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
    size_t l = last ? tmpl_last_cp_len(s, n) : 1;
    if (!last)
      while (l < n && ((unsigned char)s[l] & 0xC0) == 0x80) l++;
    *out = tmpl_str_of(last ? s + n - l : s, l);
    return 0;
  }
  return tmpl_need(r, at, last ? "filter 'last'" : "filter 'first'", v, 0, "a list or string");
}
static int f_first(FILTER_ARGS) {
  return f_first_last(r, at, v, args, names, nargs, out, 0);
}
static int f_last(FILTER_ARGS) {
  return f_first_last(r, at, v, args, names, nargs, out, 1);
}

static int f_join(FILTER_ARGS) {
  static const char *const kw[] = {"d", "attribute", NULL};
  if (tmpl_check_kw(r, at, "filter 'join'", names, nargs, kw)) return TY_EINVAL;
  json_t *sep = tmpl_arg(args, names, nargs, 0, "d");
  json_t *attr = tmpl_arg(args, names, nargs, 1, "attribute");
  if (sep && !json_is_string(sep))
    return tmpl_fail(r, at, TY_EINVAL, "join's separator must be a string");
  if (attr && !json_is_string(attr))
    return tmpl_fail(r, at, TY_EINVAL, "join's attribute must be a string");
  if (json_is_string(v)) { /* a string joins its characters */
    *out = json_incref(v);
    if (!sep || !json_string_length(sep)) return 0;
  }
  if (!json_is_array(v) && !json_is_string(v))
    return tmpl_need(r, at, "filter 'join'", v, 0, "a list");
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
  if (tmpl_need(r, at, "filter 'replace'", v, json_is_string(v), "a string")) return TY_EINVAL;
  return tmpl_str_replace(r, at, v, tmpl_arg(args, names, nargs, 0, "old"),
                          tmpl_arg(args, names, nargs, 1, "new"),
                          tmpl_arg(args, names, nargs, 2, "count"), out);
}

static int f_items(FILTER_ARGS) {
  if (!v) { /* Jinja: items of undefined are none */
    *out = json_array();
    return 0;
  }
  if (tmpl_need(r, at, "filter 'items'", v, json_is_object(v), "a dict")) return TY_EINVAL;
  if (tmpl_charge(r, at, json_object_size(v) * 3 * TMPL_ITEM_COST)) return TY_EEXHAUSTED;
  *out = tmpl_items_of(v);
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
    return tmpl_need(r, at, "filter 'list'", v, 0, "a list, dict or string");
  }
  return tmpl_charge(r, at, json_array_size(*out) * TMPL_ITEM_COST);
}

static int f_int(FILTER_ARGS) {
  json_t *d = tmpl_arg(args, names, nargs, 0, "default");
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
  json_t *d = tmpl_arg(args, names, nargs, 0, "default");
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
    return tmpl_need(r, at, "filter 'abs'", v, 0, "a number");
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
      size_t l = tmpl_last_cp_len(s, e);
      tmpl_buf_add(&b, s + e - l, l);
      e -= l;
    }
    *out = tmpl_string_take(&b);
    return tmpl_charge(r, at, n);
  }
  return tmpl_need(r, at, "filter 'reverse'", v, 0, "a list or string");
}

static int f_safe(FILTER_ARGS) {
  *out = json_incref(v);
  return 0;
}

/* select/reject/selectattr/rejectattr: items whose test (args[first] names
 * it; truth when absent) passes (keep 1) or fails (keep 0). */
static int filter_items(FILTER_ARGS, int keep, int by_attr, const char *what) {
  if (!json_is_array(v)) return tmpl_need(r, at, what, v, 0, "a list");
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
  if (tmpl_check_kw(r, at, "filter 'map'", names, nargs, kw)) return TY_EINVAL;
  if (!json_is_array(v)) return tmpl_need(r, at, "filter 'map'", v, 0, "a list");
  json_t *attr = tmpl_arg(args, names, nargs, 99, "attribute");
  json_t *def = tmpl_arg(args, names, nargs, 99, "default");
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

const tmpl_filter_t *tmpl_find_filter(const char *name) {
  TMPL_FIND(kFilters, name);
}
