/* chat_template_lib.c - the tests (x is name), methods (x.name()) and
 * functions (name()) chat templates may call, one table entry each: name,
 * implementation, argument counts. The parser refuses any other name. */
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
    return tmpl_need(r, at, odd ? "test 'odd'" : "test 'even'", v, 0, "an integer");
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
  return tmpl_need(r, at, at->a->str, v, json_is_string(v), "a string") ? TY_EINVAL : 0;
}
static int recv_dict(tmpl_render_t *r, const node_t *at, json_t *v) {
  return tmpl_need(r, at, at->a->str, v, json_is_object(v), "a dict") ? TY_EINVAL : 0;
}

static int m_strip_any(FILTER_ARGS, int left, int right) {
  if (recv_string(r, at, v)) return TY_EINVAL;
  json_t *c = nargs ? args[0] : NULL;
  if (c && !json_is_null(c) && !json_is_string(c))
    return tmpl_fail(r, at, TY_EINVAL, "%s's characters must be a string", at->a->str);
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = tmpl_str_strip(v, json_is_string(c) ? c : NULL, left, right);
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
  int rc = tmpl_str_affix(r, at, v, args[0], end, &res);
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
  return tmpl_str_split(r, at, v, tmpl_arg(args, names, nargs, 0, "sep"),
                        tmpl_arg(args, names, nargs, 1, "maxsplit"), out);
}

static int m_case(FILTER_ARGS, int mode) {
  if (recv_string(r, at, v)) return TY_EINVAL;
  if (tmpl_charge(r, at, json_string_length(v))) return TY_EEXHAUSTED;
  *out = tmpl_str_recase(v, mode);
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
  return tmpl_str_replace(r, at, v, args[0], args[1], nargs > 2 ? args[2] : NULL, out);
}

static int m_items(FILTER_ARGS) {
  if (recv_dict(r, at, v)) return TY_EINVAL;
  if (tmpl_charge(r, at, json_object_size(v) * 3 * TMPL_ITEM_COST)) return TY_EEXHAUSTED;
  *out = tmpl_items_of(v);
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
  *out = tmpl_str_of(buf, n);
  return 0;
}

static const tmpl_func_t kFuncs[] = {
    {"namespace", fn_namespace, 0, 64},
    {"raise_exception", fn_raise_exception, 1, 1},
    {"range", fn_range, 1, 3},
    {"strftime_now", fn_strftime_now, 1, 1},
};

const tmpl_test_t *tmpl_find_test(const char *name) {
  TMPL_FIND(kTests, name);
}
const tmpl_method_t *tmpl_find_method(const char *name) {
  TMPL_FIND(kMethods, name);
}
const tmpl_func_t *tmpl_find_func(const char *name) {
  TMPL_FIND(kFuncs, name);
}
