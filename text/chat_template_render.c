/* chat_template_render.c - rendering a parsed chat template: statements
 * over a stack of variable frames above the caller's context, the render's
 * error and the limits of chat_template.h (see tmpl_render_s). */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

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
json_t *tmpl_var_get(const tmpl_render_t *r, const char *name) {
  for (size_t k = r->nframes; k-- > 0;) {
    const frame_t *f = &r->frames[k];
    for (size_t i = 0; i < f->n; i++)
      if (!strcmp(f->v[i].name, name)) return json_incref(f->v[i].value);
  }
  return json_incref(json_object_get(r->ctx, name));
}

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
  int rc = tmpl_eval(r, n->a, &seq);
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
      if (!rc && !(rc = tmpl_eval(r, n->d, &c)) && tmpl_truthy(c))
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
    rc = tmpl_eval(r, n->b, &v);
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
  json_t *obj = tmpl_var_get(r, n->a->a->str);
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
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
      tmpl_buf_t b = {0};
      tmpl_value_str(&b, v);
      json_decref(v);
      rc = emit(r, n, b.p ? b.p : "", b.len);
      free(b.p);
      return rc;
    }
    case N_IF:
      if ((rc = tmpl_eval(r, n->a, &v))) return rc;
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
