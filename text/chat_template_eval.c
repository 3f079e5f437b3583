/* chat_template_eval.c - the chat template evaluator: walks the syntax
 * tree with a stack of variable frames over the caller's context, under the
 * limits of chat_template.h. Values are jansson references; NULL is
 * undefined. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

typedef struct {
  char *name;
  json_t *value; /* owned; NULL: set to undefined */
} var_t;

typedef struct {
  var_t *v;
  size_t n, cap;
} frame_t;

struct tmpl_render_s {
  const json_t *ctx;
  frame_t *frames; /* frames[0] holds the template's top-level {% set %}s */
  size_t nframes, capframes;
  json_t **ns; /* objects made by namespace(), a reference each */
  size_t nns, capns;
  tmpl_buf_t *out; /* where text goes: the result, or a {% set %} block's */
  unsigned long long iterations;
  unsigned long long made; /* bytes of strings and list items made */
  int depth;
  char *err;
  size_t errlen;
  int failed;
};

/* Statement results besides 0 and negative codes. */
enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

int tmpl_fail(tmpl_render_t *r, const node_t *at, int code, const char *fmt, ...) {
  if (!r->failed && r->err && r->errlen) {
    int n = snprintf(r->err, r->errlen, "chat template line %d: ", at ? at->line : 0);
    if (n >= 0 && (size_t)n < r->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  r->failed = 1;
  return code;
}

int tmpl_namespace_add(tmpl_render_t *r, const node_t *at, json_t *obj) {
  if (r->nns >= TMPL_MAX_NAMESPACES)
    return tmpl_fail(r, at, TY_EEXHAUSTED, "more than %d namespace() objects in one render",
                     TMPL_MAX_NAMESPACES);
  if (r->nns == r->capns) {
    r->capns = r->capns ? 2 * r->capns : 8;
    r->ns = xrealloc(r->ns, r->capns * sizeof *r->ns);
  }
  r->ns[r->nns++] = json_incref(obj);
  return 0;
}

static int is_namespace(const tmpl_render_t *r, const json_t *v) {
  for (size_t i = r->nns; i-- > 0;) /* the newest first: usually the one set */
    if (r->ns[i] == v) return 1;
  return 0;
}

/* Item by item, 16 units a comparison; stops early once past the limit
 * (tmpl_charge then reports it). */
static int equal_rec(tmpl_render_t *r, const json_t *a, const json_t *b) {
  r->made += 16;
  if (r->made > TMPL_MAX_MADE) return 0;
  if (!a || !b) return !a && !b;
  if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
  if (json_typeof(a) != json_typeof(b)) return 0;
  if (json_is_string(a))
    return json_string_length(a) == json_string_length(b) &&
           !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
  if (json_is_array(a)) {
    if (json_array_size(a) != json_array_size(b)) return 0;
    for (size_t i = 0; i < json_array_size(a); i++)
      if (!equal_rec(r, json_array_get(a, i), json_array_get(b, i))) return 0;
    return 1;
  }
  if (json_is_object(a)) {
    const char *key;
    json_t *val;
    if (json_object_size(a) != json_object_size(b)) return 0;
    json_object_foreach((json_t *)a, key, val) {
      if (!equal_rec(r, val, json_object_get(b, key))) return 0;
    }
    return 1;
  }
  return 1; /* null, true, false: the same type */
}

int tmpl_equal(tmpl_render_t *r, const node_t *at, const json_t *a, const json_t *b) {
  int eq = equal_rec(r, a, b);
  int rc = tmpl_charge(r, at, 0);
  return rc ? rc : eq;
}

int tmpl_charge(tmpl_render_t *r, const node_t *at, size_t bytes) {
  r->made += bytes;
  if (r->made > TMPL_MAX_MADE)
    return tmpl_fail(r, at, TY_EEXHAUSTED,
                     "the template made or scanned more than %u MiB of strings and lists in "
                     "one render",
                     TMPL_MAX_MADE >> 20);
  return 0;
}

/* ---- variables ---- */

static void frame_push(tmpl_render_t *r) {
  if (r->nframes == r->capframes) {
    r->capframes = r->capframes ? 2 * r->capframes : 8;
    r->frames = xrealloc(r->frames, r->capframes * sizeof *r->frames);
  }
  memset(&r->frames[r->nframes++], 0, sizeof(frame_t));
}

static void frame_pop(tmpl_render_t *r) {
  frame_t *f = &r->frames[--r->nframes];
  for (size_t i = 0; i < f->n; i++) {
    free(f->v[i].name);
    json_decref(f->v[i].value);
  }
  free(f->v);
}

/* Binds name to value (a reference the frame takes) in the innermost frame. */
static void var_set(tmpl_render_t *r, const char *name, json_t *value) {
  frame_t *f = &r->frames[r->nframes - 1];
  for (size_t i = 0; i < f->n; i++) {
    if (!strcmp(f->v[i].name, name)) {
      json_decref(f->v[i].value);
      f->v[i].value = value;
      return;
    }
  }
  if (f->n == f->cap) {
    f->cap = f->cap ? 2 * f->cap : 8;
    f->v = xrealloc(f->v, f->cap * sizeof *f->v);
  }
  f->v[f->n].name = xstrdup(name);
  f->v[f->n++].value = value;
}

/* A new reference to the value of name, or NULL (undefined). */
static json_t *var_get(const tmpl_render_t *r, const char *name) {
  for (size_t k = r->nframes; k-- > 0;) {
    const frame_t *f = &r->frames[k];
    for (size_t i = 0; i < f->n; i++)
      if (!strcmp(f->v[i].name, name)) return json_incref(f->v[i].value);
  }
  return json_incref(json_object_get(r->ctx, name));
}

/* ---- expressions ---- */

static int eval(tmpl_render_t *r, const node_t *n, json_t **out);

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
    if (parts[i]) rc = eval(r, parts[i], &vs[i]);
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
  int rc = eval(r, n->a, &a), res;
  if (rc) return rc;
  if (n->op == OP_AND || n->op == OP_OR) {
    if (tmpl_truthy(a) == (n->op == OP_OR)) {
      *out = a;
      return 0;
    }
    json_decref(a);
    return eval(r, n->b, out);
  }
  if ((rc = eval(r, n->b, &b))) goto done;
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
    int rc = eval(r, n->kids[i], &(*args)[i]);
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
      *out = var_get(r, n->str);
      return 0;
    case N_LIST: {
      json_t *list = json_array();
      for (size_t i = 0; i < n->nkids; i++) {
        if ((rc = eval(r, n->kids[i], &v))) break;
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
        if ((rc = eval(r, n->kids[i], &k))) break;
        if (!json_is_string(k)) {
          rc = tmpl_fail(r, n->kids[i], TY_EINVAL, "dict keys must be strings, not %s",
                         tmpl_kind(k));
          json_decref(k);
          break;
        }
        if ((rc = eval(r, n->kids[i + 1], &v))) {
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
      if ((rc = eval(r, n->a, &v))) return rc;
      json_t *key = json_string(n->str);
      rc = index_value(r, n, v, key, out);
      json_decref(key);
      json_decref(v);
      return rc;
    }
    case N_INDEX: {
      json_t *k = NULL;
      if ((rc = eval(r, n->a, &v)) || (rc = eval(r, n->b, &k))) {
        json_decref(v);
        return rc;
      }
      rc = index_value(r, n, v, k, out);
      json_decref(k);
      json_decref(v);
      return rc;
    }
    case N_SLICE:
      if ((rc = eval(r, n->a, &v))) return rc;
      rc = eval_slice(r, n, v, out);
      json_decref(v);
      return rc;
    case N_CALL: {
      const tmpl_filter_t *f = n->fn;
      if (n->a->kind == N_ATTR && (rc = eval(r, n->a->a, &v))) return rc;
      if (!(rc = eval_args(r, n, &args))) rc = f->fn(r, n, v, args, n->names, n->nkids, out);
      break;
    }
    case N_FILTER: {
      const tmpl_filter_t *f = n->fn;
      if ((rc = eval(r, n->a, &v))) return rc;
      if (!(rc = eval_args(r, n, &args))) rc = f->fn(r, n, v, args, n->names, n->nkids, out);
      break;
    }
    case N_TEST: {
      const tmpl_test_t *t = n->fn;
      if ((rc = eval(r, n->a, &v))) return rc;
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
      if ((rc = eval(r, n->a, &v))) return rc;
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
      if ((rc = eval(r, n->a, &v))) return rc;
      if (tmpl_truthy(v))
        rc = eval(r, n->b, out);
      else if (n->c)
        rc = eval(r, n->c, out);
      break;
    default:
      return tmpl_fail(r, n, TY_EINTERNAL, "not an expression"); /* cannot happen */
  }
  json_decref(v);
  free_args(args, n->nkids);
  return rc;
}

static int eval(tmpl_render_t *r, const node_t *n, json_t **out) {
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

/* ---- statements ---- */

static int exec_block(tmpl_render_t *r, const node_t *blk);

static int emit(tmpl_render_t *r, const node_t *at, const char *s, size_t n) {
  if (r->out->len + n > TMPL_MAX_OUTPUT)
    return tmpl_fail(r, at, TY_EEXHAUSTED, "the rendered text passed %u MiB",
                     TMPL_MAX_OUTPUT >> 20);
  tmpl_buf_add(r->out, s, n);
  return 0;
}

static int exec_for(tmpl_render_t *r, const node_t *n) {
  json_t *seq = NULL, *items = NULL;
  int rc = eval(r, n->a, &seq);
  if (rc) return rc;
  if (json_is_array(seq)) {
    items = json_incref(seq);
  } else if (json_is_object(seq)) {
    if ((rc = tmpl_charge(r, n, json_object_size(seq) * TMPL_ITEM_COST))) {
      json_decref(seq);
      return rc;
    }
    const char *key;
    json_t *val;
    items = json_array();
    json_object_foreach(seq, key, val) json_array_append_new(items, json_string(key));
  } else if (json_is_string(seq)) {
    if ((rc = tmpl_charge(r, n, json_string_length(seq) * TMPL_ITEM_COST))) {
      json_decref(seq);
      return rc;
    }
    items = tmpl_chars(seq);
  } else {
    json_decref(seq);
    return tmpl_fail(r, n->a, TY_EINVAL, "cannot loop over %s", tmpl_kind(seq));
  }
  json_decref(seq);
  frame_push(r);
  /* bind the loop variables of one item */
#define BIND(item)                                                                                \
  do {                                                                                            \
    json_t *it_ = (item);                                                                         \
    if (n->nkids == 1) {                                                                          \
      var_set(r, n->kids[0]->str, json_incref(it_));                                              \
    } else if (!json_is_array(it_) || json_array_size(it_) != n->nkids) {                         \
      rc = tmpl_fail(r, n, TY_EINVAL, "cannot unpack %s into %zu loop variables",                 \
                     json_is_array(it_) ? "a list of another length" : tmpl_kind(it_), n->nkids); \
    } else {                                                                                      \
      for (size_t k_ = 0; k_ < n->nkids; k_++)                                                    \
        var_set(r, n->kids[k_]->str, json_incref(json_array_get(it_, k_)));                       \
    }                                                                                             \
  } while (0)
  if (n->d) { /* for x in xs if cond: keep the items that pass */
    json_t *kept = json_array();
    for (size_t i = 0; i < json_array_size(items) && !rc; i++) {
      json_t *c = NULL;
      if (++r->iterations > TMPL_MAX_ITERATIONS) {
        rc = tmpl_fail(r, n, TY_EEXHAUSTED, "more than %d loop iterations in one render",
                       TMPL_MAX_ITERATIONS);
        break;
      }
      BIND(json_array_get(items, i));
      if (!rc && !(rc = eval(r, n->d, &c)) && tmpl_truthy(c))
        json_array_append(kept, json_array_get(items, i));
      json_decref(c);
    }
    json_decref(items);
    items = kept;
  }
  size_t len = json_array_size(items);
  for (size_t i = 0; i < len && !rc; i++) {
    if (++r->iterations > TMPL_MAX_ITERATIONS) {
      rc = tmpl_fail(r, n, TY_EEXHAUSTED, "more than %d loop iterations in one render",
                     TMPL_MAX_ITERATIONS);
      break;
    }
    json_t *loop = json_pack("{s:I, s:I, s:I, s:I, s:b, s:b, s:I}", "index", (json_int_t)i + 1,
                             "index0", (json_int_t)i, "revindex", (json_int_t)(len - i),
                             "revindex0", (json_int_t)(len - i - 1), "first", i == 0, "last",
                             i + 1 == len, "length", (json_int_t)len);
    if (i > 0) json_object_set(loop, "previtem", json_array_get(items, i - 1));
    if (i + 1 < len) json_object_set(loop, "nextitem", json_array_get(items, i + 1));
    var_set(r, "loop", loop);
    BIND(json_array_get(items, i));
    if (rc) break;
    rc = exec_block(r, n->b);
    if (rc == FLOW_CONTINUE) rc = 0;
    if (rc == FLOW_BREAK) {
      rc = 0;
      break;
    }
  }
#undef BIND
  if (!rc && len == 0 && n->c) rc = exec_block(r, n->c);
  json_decref(items);
  frame_pop(r);
  return rc;
}

static int exec_set(tmpl_render_t *r, const node_t *n) {
  json_t *v = NULL;
  int rc;
  if (n->b) {
    rc = eval(r, n->b, &v);
  } else { /* {% set x %}...{% endset %}: the block's text */
    tmpl_buf_t b = {0}, *saved = r->out;
    r->out = &b;
    rc = exec_block(r, n->c);
    r->out = saved;
    if (rc > 0) rc = tmpl_fail(r, n, TY_EINVAL, "break or continue inside {%% set %%}");
    if (rc)
      free(b.p);
    else
      v = tmpl_string_take(&b);
  }
  if (rc) return rc;
  if (n->a->kind == N_NAME) {
    var_set(r, n->a->str, v);
    return 0;
  }
  json_t *obj = var_get(r, n->a->a->str);
  if (!obj || !is_namespace(r, obj)) {
    rc = tmpl_fail(r, n, TY_EINVAL,
                   "cannot set attribute '%s' of %s '%s': only namespace() objects take "
                   "{%% set a.b = ... %%}",
                   n->a->str, tmpl_kind(obj), n->a->a->str);
    json_decref(v);
  } else {
    /* a namespace may come to hold itself (ns.me = [ns]): tmpl_render
     * empties every namespace at the end, which breaks such cycles */
    json_object_set_new(obj, n->a->str, v ? v : json_null());
  }
  json_decref(obj);
  return rc;
}

static int exec_stmt(tmpl_render_t *r, const node_t *n) {
  json_t *v = NULL;
  int rc = 0;
  switch (n->kind) {
    case N_TEXT:
      return emit(r, n, n->str, strlen(n->str));
    case N_OUTPUT: {
      if ((rc = eval(r, n->a, &v))) return rc;
      tmpl_buf_t b = {0};
      tmpl_value_str(&b, v);
      json_decref(v);
      rc = emit(r, n, b.p ? b.p : "", b.len);
      free(b.p);
      return rc;
    }
    case N_IF:
      if ((rc = eval(r, n->a, &v))) return rc;
      rc = tmpl_truthy(v) ? exec_block(r, n->b) : n->c ? exec_block(r, n->c) : 0;
      json_decref(v);
      return rc;
    case N_FOR:
      return exec_for(r, n);
    case N_SET:
      return exec_set(r, n);
    case N_BREAK:
      return FLOW_BREAK;
    case N_CONTINUE:
      return FLOW_CONTINUE;
    case N_BLOCK:
      return exec_block(r, n);
    default:
      return tmpl_fail(r, n, TY_EINTERNAL, "not a statement"); /* cannot happen */
  }
}

static int exec_block(tmpl_render_t *r, const node_t *blk) {
  if (++r->depth > 4 * TMPL_MAX_DEPTH) {
    r->depth--;
    return tmpl_fail(r, blk, TY_EEXHAUSTED, "blocks nested deeper than %d", 4 * TMPL_MAX_DEPTH);
  }
  int rc = 0;
  for (size_t i = 0; i < blk->nkids && !rc; i++) rc = exec_stmt(r, blk->kids[i]);
  r->depth--;
  return rc;
}

int tmpl_render(const tmpl_t *t, const json_t *context, char **out, char *err, size_t errlen) {
  *out = NULL;
  if (err && errlen) err[0] = 0;
  if (!json_is_object(context))
    return ty_errf(err, errlen, TY_EINVAL, "chat template context must be a JSON object, not %s",
                   context ? "another value" : "missing");
  tmpl_buf_t result = {0};
  tmpl_render_t r = {.ctx = context, .out = &result, .err = err, .errlen = errlen};
  frame_push(&r);
  int rc = exec_block(&r, t->root);
  if (rc > 0) rc = tmpl_fail(&r, NULL, TY_EINVAL, "break or continue outside a loop");
  while (r.nframes) frame_pop(&r);
  free(r.frames);
  for (size_t i = 0; i < r.nns; i++) {
    json_object_clear(r.ns[i]);
    json_decref(r.ns[i]);
  }
  free(r.ns);
  if (rc) {
    free(result.p);
    return rc;
  }
  *out = result.p ? result.p : xstrdup("");
  return 0;
}
