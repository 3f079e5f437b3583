/* chat_template_eval.c - the chat template evaluator of expressions:
 * literals, names, attributes, subscripts, slices, operators, calls of
 * filters, tests, methods and functions. Values are jansson references;
 * NULL is undefined. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

static int index_value(tmpl_render_t *r, const node_t *n, json_t *obj, json_t *key, json_t **out) {
  *out = NULL;
  if (json_is_object(obj)) {
    if (!json_is_string(key))
      return tmpl_fail(r, n, TY_EINVAL, "a dict is indexed by strings, not by %s", tmpl_kind(key));
    *out = json_incref(json_object_get(obj, json_string_value(key)));
    return 0;
  }
  if (json_is_array(obj) || json_is_string(obj)) {
    if (!json_is_integer(key)) {
      if (json_is_string(key)) return 0; /* a method name without a call: undefined */
      return tmpl_fail(r, n, TY_EINVAL, "%s is indexed by integers, not by %s", tmpl_kind(obj),
                       tmpl_kind(key));
    }
    long long i = json_integer_value(key);
    if (json_is_array(obj)) {
      long long len = (long long)json_array_size(obj);
      if (i < 0) i += len;
      if (i >= 0 && i < len) *out = json_incref(json_array_get(obj, (size_t)i));
      return 0;
    }
    const char *s = json_string_value(obj);
    size_t bytes = json_string_length(obj);
    if (tmpl_charge(r, n, bytes)) return TY_EEXHAUSTED;
    long long len = (long long)tmpl_utf8_len(s, bytes);
    if (i < 0) i += len;
    if (i < 0 || i >= len) return 0;
    size_t b = 0;
    for (long long c = 0; c < i; c++) {
      b++;
      while (b < bytes && ((unsigned char)s[b] & 0xC0) == 0x80) b++;
    }
    size_t e = b + 1;
    while (e < bytes && ((unsigned char)s[e] & 0xC0) == 0x80) e++;
    *out = json_stringn_nocheck(s + b, e - b);
    return 0;
  }
  return 0; /* anything else has no attributes: undefined */
}

/* Python's slice bounds for len items. */
static int slice_bounds(tmpl_render_t *r, const node_t *n, json_t *vs[3], long long len,
                        long long *start, long long *stop, long long *step) {
  for (int i = 0; i < 3; i++) {
    if (vs[i] && !json_is_null(vs[i]) && !json_is_integer(vs[i]))
      return tmpl_fail(r, n, TY_EINVAL, "slice bounds must be integers, not %s", tmpl_kind(vs[i]));
  }
  *step = vs[2] && json_is_integer(vs[2]) ? json_integer_value(vs[2]) : 1;
  if (*step == 0) return tmpl_fail(r, n, TY_EINVAL, "slice step cannot be zero");
  long long *dst[2] = {start, stop};
  for (int i = 0; i < 2; i++) {
    if (!vs[i] || !json_is_integer(vs[i])) {
      *dst[i] = *step > 0 ? (i == 0 ? 0 : len) : (i == 0 ? len - 1 : -1);
      continue;
    }
    long long v = json_integer_value(vs[i]);
    if (v < 0) v += len;
    if (*step > 0)
      v = v < 0 ? 0 : v > len ? len : v;
    else
      v = v < 0 ? -1 : v >= len ? len - 1 : v;
    *dst[i] = v;
  }
  return 0;
}

static int eval_slice(tmpl_render_t *r, const node_t *n, json_t *obj, json_t **out) {
  json_t *vs[3] = {NULL, NULL, NULL};
  const node_t *parts[3] = {n->b, n->c, n->d};
  int rc = 0;
  *out = NULL;
  for (int i = 0; i < 3 && !rc; i++)
    if (parts[i]) rc = tmpl_eval(r, parts[i], &vs[i]);
  if (rc) goto done;
  if (!json_is_array(obj) && !json_is_string(obj)) {
    rc = tmpl_fail(r, n, TY_EINVAL, "cannot slice %s", tmpl_kind(obj));
    goto done;
  }
  /* strings slice by code point: index their starts */
  size_t *cp = NULL, ncp = 0;
  const char *s = NULL;
  size_t bytes = 0;
  long long len;
  if (json_is_array(obj)) {
    len = (long long)json_array_size(obj);
  } else {
    s = json_string_value(obj);
    bytes = json_string_length(obj);
    cp = xmalloc((bytes + 1) * sizeof *cp);
    for (size_t i = 0; i < bytes; i++)
      if (((unsigned char)s[i] & 0xC0) != 0x80) cp[ncp++] = i;
    cp[ncp] = bytes;
    len = (long long)ncp;
  }
  long long start, stop, step;
  if ((rc = tmpl_charge(r, n, json_is_array(obj) ? (size_t)len * TMPL_ITEM_COST : bytes)) ||
      (rc = slice_bounds(r, n, vs, len, &start, &stop, &step))) {
    free(cp);
    goto done;
  }
  if (json_is_array(obj)) {
    json_t *list = json_array();
    for (long long i = start; step > 0 ? i < stop : i > stop; i += step)
      json_array_append(list, json_array_get(obj, (size_t)i));
    *out = list;
  } else {
    tmpl_buf_t b = {0};
    for (long long i = start; step > 0 ? i < stop : i > stop; i += step)
      tmpl_buf_add(&b, s + cp[i], cp[i + 1] - cp[i]);
    *out = tmpl_string_take(&b);
  }
  free(cp);
done:
  for (int i = 0; i < 3; i++) json_decref(vs[i]);
  return rc;
}

static int is_num(const json_t *v) {
  return json_is_integer(v) || json_is_real(v);
}

static int arith(tmpl_render_t *r, const node_t *n, int op, json_t *a, json_t *b, json_t **out) {
  if (json_is_integer(a) && json_is_integer(b) && op != OP_DIV && op != OP_POW) {
    long long x = json_integer_value(a), y = json_integer_value(b), z;
    int ovf = 0;
    switch (op) {
      case OP_ADD:
        ovf = __builtin_add_overflow(x, y, &z);
        break;
      case OP_SUB:
        ovf = __builtin_sub_overflow(x, y, &z);
        break;
      case OP_MUL:
        ovf = __builtin_mul_overflow(x, y, &z);
        break;
      default: /* // and %: floored, as Python */
        if (y == 0) return tmpl_fail(r, n, TY_EINVAL, "division by zero");
        if (x == LLONG_MIN && y == -1) {
          ovf = 1;
          break;
        }
        z = op == OP_FLOORDIV ? x / y : x % y;
        if (op == OP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0))) z--;
        if (op == OP_MOD && z != 0 && ((z < 0) != (y < 0))) z += y;
    }
    if (ovf) return tmpl_fail(r, n, TY_EINVAL, "integer overflow");
    *out = json_integer(z);
    return 0;
  }
  double x = json_number_value(a), y = json_number_value(b), z;
  switch (op) {
    case OP_ADD:
      z = x + y;
      break;
    case OP_SUB:
      z = x - y;
      break;
    case OP_MUL:
      z = x * y;
      break;
    case OP_DIV:
      if (y == 0) return tmpl_fail(r, n, TY_EINVAL, "division by zero");
      z = x / y;
      break;
    case OP_FLOORDIV:
      if (y == 0) return tmpl_fail(r, n, TY_EINVAL, "division by zero");
      z = floor(x / y);
      break;
    case OP_MOD:
      if (y == 0) return tmpl_fail(r, n, TY_EINVAL, "division by zero");
      z = fmod(x, y);
      if (z != 0 && ((z < 0) != (y < 0))) z += y;
      break;
    default: /* OP_POW */
      if (x == 0 && y < 0)
        return tmpl_fail(r, n, TY_EINVAL, "0 cannot be raised to a negative power");
      z = pow(x, y);
      if (!isfinite(z)) return tmpl_fail(r, n, TY_EINVAL, "a power that is not a finite number");
      if (json_is_integer(a) && json_is_integer(b) && y >= 0) {
        if (fabs(z) >= 9.2e18) return tmpl_fail(r, n, TY_EINVAL, "integer overflow");
        *out = json_integer((json_int_t)z);
        return 0;
      }
  }
  *out = json_real(z);
  return 0;
}

static int compare(tmpl_render_t *r, const node_t *n, int op, json_t *a, json_t *b, int *res) {
  int c;
  if (is_num(a) && is_num(b)) {
    double x = json_number_value(a), y = json_number_value(b);
    c = x < y ? -1 : x > y ? 1 : 0;
  } else if (json_is_string(a) && json_is_string(b)) {
    size_t la = json_string_length(a), lb = json_string_length(b);
    c = memcmp(json_string_value(a), json_string_value(b), la < lb ? la : lb);
    if (!c) c = la < lb ? -1 : la > lb;
  } else {
    static const char *const names[] = {
        [OP_LT] = "<", [OP_GT] = ">", [OP_LE] = "<=", [OP_GE] = ">="};
    return tmpl_fail(r, n, TY_EINVAL, "cannot compare %s %s %s", tmpl_kind(a), names[op],
                     tmpl_kind(b));
  }
  *res = op == OP_LT ? c < 0 : op == OP_GT ? c > 0 : op == OP_LE ? c <= 0 : c >= 0;
  return 0;
}

static int contains(tmpl_render_t *r, const node_t *n, json_t *item, json_t *seq, int *res) {
  if (!seq) {
    *res = 0; /* anything in undefined: false, as @huggingface/jinja */
    return 0;
  }
  if (json_is_array(seq)) {
    *res = 0;
    for (size_t i = 0; i < json_array_size(seq) && !*res; i++) {
      *res = tmpl_equal(r, n, item, json_array_get(seq, i));
      if (*res < 0) return *res;
    }
    return 0;
  }
  if (json_is_string(seq) && json_is_string(item)) {
    if (tmpl_charge(r, n, json_string_length(seq))) return TY_EEXHAUSTED;
    *res = memmem(json_string_value(seq), json_string_length(seq), json_string_value(item),
                  json_string_length(item)) != NULL;
    return 0;
  }
  if (json_is_object(seq) && json_is_string(item)) {
    *res = json_object_get(seq, json_string_value(item)) != NULL;
    return 0;
  }
  return tmpl_fail(r, n, TY_EINVAL, "cannot test whether %s is in %s", tmpl_kind(item),
                   tmpl_kind(seq));
}

static const char *op_name(int op) {
  static const char *const names[] = {
      [OP_ADD] = "+",       [OP_SUB] = "-", [OP_MUL] = "*",  [OP_DIV] = "/",
      [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**", [OP_CONCAT] = "~",
      [OP_EQ] = "==",       [OP_NE] = "!=", [OP_LT] = "<",   [OP_GT] = ">",
      [OP_LE] = "<=",       [OP_GE] = ">=", [OP_IN] = "in",  [OP_NOTIN] = "not in",
      [OP_AND] = "and",     [OP_OR] = "or"};
  return names[op];
}

static int eval_binary(tmpl_render_t *r, const node_t *n, json_t **out) {
  json_t *a = NULL, *b = NULL;
  int rc = tmpl_eval(r, n->a, &a), res;
  if (rc) return rc;
  if (n->op == OP_AND || n->op == OP_OR) {
    if (tmpl_truthy(a) == (n->op == OP_OR)) {
      *out = a;
      return 0;
    }
    json_decref(a);
    return tmpl_eval(r, n->b, out);
  }
  if ((rc = tmpl_eval(r, n->b, &b))) goto done;
  switch (n->op) {
    case OP_EQ:
    case OP_NE:
      res = tmpl_equal(r, n, a, b);
      if (res < 0)
        rc = res;
      else
        *out = json_boolean(res == (n->op == OP_EQ));
      goto done;
    case OP_IN:
    case OP_NOTIN:
      if (!(rc = contains(r, n, a, b, &res))) *out = json_boolean(res == (n->op == OP_IN));
      goto done;
    case OP_CONCAT: {
      if (json_is_null(a) || json_is_null(b)) break;
      tmpl_buf_t s = {0};
      tmpl_value_str(&s, a);
      tmpl_value_str(&s, b);
      if ((rc = tmpl_charge(r, n, s.len))) {
        free(s.p);
        goto done;
      }
      *out = tmpl_string_take(&s);
      goto done;
    }
    default:
      break;
  }
  if (!a || !b || json_is_null(a) || json_is_null(b)) {
    rc = tmpl_fail(r, n, TY_EINVAL, "cannot apply %s to %s and %s", op_name(n->op), tmpl_kind(a),
                   tmpl_kind(b));
    goto done;
  }
  if (is_num(a) && is_num(b)) {
    if (n->op >= OP_LT && n->op <= OP_GE) {
      if (!(rc = compare(r, n, n->op, a, b, &res))) *out = json_boolean(res);
    } else {
      rc = arith(r, n, n->op, a, b, out);
    }
    goto done;
  }
  if (n->op >= OP_LT && n->op <= OP_GE) {
    if (!(rc = compare(r, n, n->op, a, b, &res))) *out = json_boolean(res);
    goto done;
  }
  if (n->op == OP_ADD && json_is_array(a) && json_is_array(b)) {
    if ((rc = tmpl_charge(r, n, (json_array_size(a) + json_array_size(b)) * TMPL_ITEM_COST)))
      goto done;
    json_t *list = json_copy(a);
    json_array_extend(list, b);
    *out = list;
    goto done;
  }
  if (n->op == OP_ADD && (json_is_string(a) || json_is_string(b))) {
    /* string + anything concatenates, as @huggingface/jinja does */
    tmpl_buf_t s = {0};
    tmpl_value_str(&s, a);
    tmpl_value_str(&s, b);
    if ((rc = tmpl_charge(r, n, s.len))) {
      free(s.p);
      goto done;
    }
    *out = tmpl_string_take(&s);
    goto done;
  }
  if (n->op == OP_MUL && (json_is_string(a) || json_is_array(a)) && json_is_integer(b)) {
    long long k = json_integer_value(b);
    if (k < 0) k = 0;
    size_t unit = json_is_string(a) ? json_string_length(a) : json_array_size(a) * TMPL_ITEM_COST;
    if (unit && (unsigned long long)k > TMPL_MAX_MADE / unit) {
      rc = tmpl_charge(r, n, TMPL_MAX_MADE + 1ull);
      goto done;
    }
    if ((rc = tmpl_charge(r, n, unit * (size_t)k))) goto done;
    if (json_is_string(a)) {
      tmpl_buf_t s = {0};
      for (long long i = 0; i < k; i++)
        tmpl_buf_add(&s, json_string_value(a), json_string_length(a));
      *out = tmpl_string_take(&s);
    } else {
      json_t *list = json_array();
      for (long long i = 0; i < k; i++) json_array_extend(list, a);
      *out = list;
    }
    goto done;
  }
  rc = tmpl_fail(r, n, TY_EINVAL, "cannot apply %s to %s and %s", op_name(n->op), tmpl_kind(a),
                 tmpl_kind(b));
done:
  json_decref(a);
  json_decref(b);
  return rc;
}

/* Evaluates the arguments of a call, filter or test into args[] (new
 * references; the caller releases them with free_args). */
static int eval_args(tmpl_render_t *r, const node_t *n, json_t ***args) {
  *args = xcalloc(n->nkids + 1, sizeof **args);
  for (size_t i = 0; i < n->nkids; i++) {
    int rc = tmpl_eval(r, n->kids[i], &(*args)[i]);
    if (rc) return rc;
  }
  return 0;
}

static void free_args(json_t **args, size_t n) {
  if (!args) return;
  for (size_t i = 0; i < n; i++) json_decref(args[i]);
  free(args);
}

/* `x is defined` of a function name is true: strftime_now is defined. */
static int name_is_func(const node_t *n) {
  return n->kind == N_NAME && tmpl_find_func(n->str) != NULL;
}

static int eval_inner(tmpl_render_t *r, const node_t *n, json_t **out) {
  json_t *v = NULL, **args = NULL;
  int rc = 0;
  switch (n->kind) {
    case N_LITERAL:
      *out = json_incref(n->lit);
      return 0;
    case N_NAME:
      *out = tmpl_var_get(r, n->str);
      return 0;
    case N_LIST: {
      json_t *list = json_array();
      for (size_t i = 0; i < n->nkids; i++) {
        if ((rc = tmpl_eval(r, n->kids[i], &v))) break;
        json_array_append_new(list, v ? v : json_null());
      }
      if (rc)
        json_decref(list);
      else
        *out = list;
      return rc;
    }
    case N_DICT: {
      json_t *dict = json_object();
      for (size_t i = 0; i + 1 < n->nkids; i += 2) {
        json_t *k = NULL;
        if ((rc = tmpl_eval(r, n->kids[i], &k))) break;
        if (!json_is_string(k)) {
          rc = tmpl_fail(r, n->kids[i], TY_EINVAL, "dict keys must be strings, not %s",
                         tmpl_kind(k));
          json_decref(k);
          break;
        }
        if ((rc = tmpl_eval(r, n->kids[i + 1], &v))) {
          json_decref(k);
          break;
        }
        json_object_set_new(dict, json_string_value(k), v ? v : json_null());
        json_decref(k);
      }
      if (rc)
        json_decref(dict);
      else
        *out = dict;
      return rc;
    }
    case N_ATTR: {
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
      json_t *key = json_string(n->str);
      rc = index_value(r, n, v, key, out);
      json_decref(key);
      json_decref(v);
      return rc;
    }
    case N_INDEX: {
      json_t *k = NULL;
      if ((rc = tmpl_eval(r, n->a, &v)) || (rc = tmpl_eval(r, n->b, &k))) {
        json_decref(v);
        return rc;
      }
      rc = index_value(r, n, v, k, out);
      json_decref(k);
      json_decref(v);
      return rc;
    }
    case N_SLICE:
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
      rc = eval_slice(r, n, v, out);
      json_decref(v);
      return rc;
    case N_CALL: {
      const tmpl_filter_t *f = n->fn;
      if (n->a->kind == N_ATTR && (rc = tmpl_eval(r, n->a->a, &v))) return rc;
      if (!(rc = eval_args(r, n, &args))) rc = f->fn(r, n, v, args, n->names, n->nkids, out);
      break;
    }
    case N_FILTER: {
      const tmpl_filter_t *f = n->fn;
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
      if (!(rc = eval_args(r, n, &args))) rc = f->fn(r, n, v, args, n->names, n->nkids, out);
      break;
    }
    case N_TEST: {
      const tmpl_test_t *t = n->fn;
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
      if (!v && name_is_func(n->a) && !strcmp(t->name, "defined")) {
        *out = json_boolean(!n->op);
        return 0;
      }
      if (!(rc = eval_args(r, n, &args))) {
        rc = t->fn(r, n, v, args, n->nkids);
        if (rc >= 0) {
          *out = json_boolean(rc != n->op);
          rc = 0;
        }
      }
      break;
    }
    case N_UNARY:
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
      if (n->op == 'n') {
        *out = json_boolean(!tmpl_truthy(v));
      } else if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (n->op == '-' && x == LLONG_MIN)
          rc = tmpl_fail(r, n, TY_EINVAL, "integer overflow");
        else
          *out = json_integer(n->op == '-' ? -x : x);
      } else if (json_is_real(v)) {
        *out = json_real(n->op == '-' ? -json_real_value(v) : json_real_value(v));
      } else {
        rc = tmpl_fail(r, n, TY_EINVAL, "unary %c needs a number, not %s", n->op, tmpl_kind(v));
      }
      break;
    case N_BINARY:
      return eval_binary(r, n, out);
    case N_COND:
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
      if (tmpl_truthy(v))
        rc = tmpl_eval(r, n->b, out);
      else if (n->c)
        rc = tmpl_eval(r, n->c, out);
      break;
    default:
      return tmpl_fail(r, n, TY_EINTERNAL, "not an expression"); /* cannot happen */
  }
  json_decref(v);
  free_args(args, n->nkids);
  return rc;
}

int tmpl_eval(tmpl_render_t *r, const node_t *n, json_t **out) {
  *out = NULL;
  if (++r->depth > 4 * TMPL_MAX_DEPTH) {
    r->depth--;
    return tmpl_fail(r, n, TY_EEXHAUSTED, "expressions nested deeper than %d", 4 * TMPL_MAX_DEPTH);
  }
  int rc = eval_inner(r, n, out);
  r->depth--;
  if (rc) {
    json_decref(*out);
    *out = NULL;
  }
  return rc;
}
