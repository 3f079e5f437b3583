/* chat_template_parse.c - the chat template parser: tokens to a syntax
 * tree, refusing by name each construct outside the supported subset. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

typedef struct {
  const tk_list_t *tk;
  size_t pos;
  int depth;
  int loops; /* {% for %} bodies the parser is inside */
  char *err;
  size_t errlen;
  int failed;
} parser_t;

static node_t *fail(parser_t *p, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static node_t *fail(parser_t *p, int line, const char *fmt, ...) {
  if (!p->failed && p->err && p->errlen) {
    int n = snprintf(p->err, p->errlen, "chat template line %d: ", line);
    if (n >= 0 && (size_t)n < p->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  p->failed = 1;
  return NULL;
}

static const tk_t *peek(parser_t *p) {
  return &p->tk->v[p->pos];
}
static const tk_t *peek2(parser_t *p) {
  return p->pos + 1 < p->tk->n ? &p->tk->v[p->pos + 1] : &p->tk->v[p->tk->n - 1];
}
static const tk_t *next(parser_t *p) {
  const tk_t *t = &p->tk->v[p->pos];
  if (t->kind != TK_EOF) p->pos++;
  return t;
}
static int is_op(const tk_t *t, const char *op) {
  return t->kind == TK_OP && !strcmp(t->str, op);
}
static int is_name(const tk_t *t, const char *name) {
  return t->kind == TK_NAME && !strcmp(t->str, name);
}

static const char *tk_desc(const tk_t *t) {
  switch (t->kind) {
    case TK_TEXT:
      return "text";
    case TK_COMMENT:
      return "a comment";
    case TK_OPEN_STMT:
      return "'{%'";
    case TK_CLOSE_STMT:
      return "'%}'";
    case TK_OPEN_EXPR:
      return "'{{'";
    case TK_CLOSE_EXPR:
      return "'}}'";
    case TK_STRING:
      return "a string";
    case TK_INT:
    case TK_FLOAT:
      return "a number";
    case TK_EOF:
      return "the end of the template";
    default:
      return t->str;
  }
}

static int expect_op(parser_t *p, const char *op) {
  const tk_t *t = peek(p);
  if (!is_op(t, op)) {
    fail(p, t->line, "expected '%s', found %s", op, tk_desc(t));
    return -1;
  }
  next(p);
  return 0;
}

static int expect_kind(parser_t *p, tk_kind_t kind, const char *what) {
  const tk_t *t = peek(p);
  if (t->kind != kind) {
    fail(p, t->line, "expected %s, found %s", what, tk_desc(t));
    return -1;
  }
  next(p);
  return 0;
}

static node_t *mk(node_kind_t kind, int line) {
  node_t *n = xcalloc(1, sizeof *n);
  n->kind = kind;
  n->line = line;
  return n;
}

static void add_kid(node_t *n, node_t *kid, char *name) {
  n->kids = xrealloc(n->kids, (n->nkids + 1) * sizeof *n->kids);
  if (n->kind == N_CALL || n->kind == N_FILTER || n->kind == N_TEST) {
    n->names = xrealloc(n->names, (n->nkids + 1) * sizeof *n->names);
    n->names[n->nkids] = name;
  }
  n->kids[n->nkids++] = kid;
}

void tmpl_node_free(node_t *n) {
  if (!n) return;
  tmpl_node_free(n->a);
  tmpl_node_free(n->b);
  tmpl_node_free(n->c);
  tmpl_node_free(n->d);
  for (size_t i = 0; i < n->nkids; i++) {
    tmpl_node_free(n->kids[i]);
    if (n->names) free(n->names[i]);
  }
  free(n->kids);
  free(n->names);
  free(n->str);
  json_decref(n->lit);
  free(n);
}

/* ---- expressions ---- */

static node_t *parse_expr(parser_t *p);
static node_t *parse_or(parser_t *p);
static node_t *parse_unary(parser_t *p);

static int enter(parser_t *p) {
  if (++p->depth > TMPL_MAX_DEPTH) {
    fail(p, peek(p)->line, "nesting deeper than %d", TMPL_MAX_DEPTH);
    return -1;
  }
  return 0;
}

/* Arguments of a call, a filter or a test after '(' up to ')', into n. */
static int parse_args(parser_t *p, node_t *n) {
  if (expect_op(p, "(")) return -1;
  int kw_seen = 0;
  while (!is_op(peek(p), ")")) {
    char *kw = NULL;
    if (peek(p)->kind == TK_NAME && is_op(peek2(p), "=")) {
      kw = xstrdup(next(p)->str);
      next(p);
      kw_seen = 1;
    } else if (kw_seen) {
      fail(p, peek(p)->line, "a positional argument after a keyword argument");
      return -1;
    }
    node_t *v = parse_expr(p);
    if (!v) {
      free(kw);
      return -1;
    }
    add_kid(n, v, kw);
    if (!is_op(peek(p), ",")) break;
    next(p);
  }
  return expect_op(p, ")");
}

static node_t *parse_primary(parser_t *p) {
  const tk_t *t = next(p);
  node_t *n;
  switch (t->kind) {
    case TK_STRING: {
      n = mk(N_LITERAL, t->line);
      /* adjacent literals join, as in Jinja: 'a' 'b' */
      tmpl_buf_t b = {0};
      tmpl_buf_add(&b, t->str, t->len);
      while (peek(p)->kind == TK_STRING) {
        t = next(p);
        tmpl_buf_add(&b, t->str, t->len);
      }
      n->lit = tmpl_string_take(&b);
      return n;
    }
    case TK_INT:
      n = mk(N_LITERAL, t->line);
      n->lit = json_integer(t->ival);
      return n;
    case TK_FLOAT:
      n = mk(N_LITERAL, t->line);
      n->lit = json_real(t->fval);
      return n;
    case TK_NAME:
      if (!strcmp(t->str, "true") || !strcmp(t->str, "True") || !strcmp(t->str, "false") ||
          !strcmp(t->str, "False")) {
        n = mk(N_LITERAL, t->line);
        n->lit = json_boolean(t->str[0] == 't' || t->str[0] == 'T');
        return n;
      }
      if (!strcmp(t->str, "none") || !strcmp(t->str, "None")) {
        n = mk(N_LITERAL, t->line);
        n->lit = json_null();
        return n;
      }
      n = mk(N_NAME, t->line);
      n->str = xstrdup(t->str);
      return n;
    case TK_OP:
      if (!strcmp(t->str, "(")) {
        node_t *e = parse_expr(p);
        if (!e) return NULL;
        if (is_op(peek(p), ",")) { /* a tuple: a list here */
          n = mk(N_LIST, t->line);
          add_kid(n, e, NULL);
          while (is_op(peek(p), ",")) {
            next(p);
            if (is_op(peek(p), ")")) break;
            node_t *k = parse_expr(p);
            if (!k) return tmpl_node_free(n), NULL;
            add_kid(n, k, NULL);
          }
          e = n;
        }
        if (expect_op(p, ")")) return tmpl_node_free(e), NULL;
        return e;
      }
      if (!strcmp(t->str, "[")) {
        n = mk(N_LIST, t->line);
        while (!is_op(peek(p), "]")) {
          node_t *k = parse_expr(p);
          if (!k) return tmpl_node_free(n), NULL;
          add_kid(n, k, NULL);
          if (!is_op(peek(p), ",")) break;
          next(p);
        }
        if (expect_op(p, "]")) return tmpl_node_free(n), NULL;
        return n;
      }
      if (!strcmp(t->str, "{")) {
        n = mk(N_DICT, t->line);
        while (!is_op(peek(p), "}")) {
          node_t *k = parse_expr(p);
          if (!k) return tmpl_node_free(n), NULL;
          add_kid(n, k, NULL);
          if (expect_op(p, ":")) return tmpl_node_free(n), NULL;
          node_t *v = parse_expr(p);
          if (!v) return tmpl_node_free(n), NULL;
          add_kid(n, v, NULL);
          if (!is_op(peek(p), ",")) break;
          next(p);
        }
        if (expect_op(p, "}")) return tmpl_node_free(n), NULL;
        return n;
      }
      /* fallthrough */
    default:
      return fail(p, t->line, "unexpected %s in an expression", tk_desc(t));
  }
}

/* [start:stop:step] or [index], after the '['. */
static node_t *parse_subscript(parser_t *p, node_t *obj, int line) {
  node_t *parts[3] = {NULL, NULL, NULL};
  int colons = 0;
  for (;;) {
    if (is_op(peek(p), "]")) break;
    if (is_op(peek(p), ":")) {
      if (++colons > 2) break;
      next(p);
      continue;
    }
    if (parts[colons]) break;
    if (!(parts[colons] = parse_expr(p))) goto bad;
  }
  if (expect_op(p, "]")) goto bad;
  if (!colons && !parts[0]) {
    fail(p, line, "an empty subscript []");
    goto bad;
  }
  node_t *n = mk(colons ? N_SLICE : N_INDEX, line);
  n->a = obj;
  n->b = parts[0];
  n->c = parts[1];
  n->d = parts[2];
  return n;
bad:
  for (int i = 0; i < 3; i++) tmpl_node_free(parts[i]);
  tmpl_node_free(obj);
  return NULL;
}

static node_t *parse_postfix_chain(parser_t *p) {
  node_t *n = parse_primary(p);
  while (n) {
    if (n && enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = peek(p);
    if (is_op(t, ".")) {
      next(p);
      const tk_t *name = next(p);
      if (name->kind == TK_INT) { /* x.0: an index, as Jinja reads it */
        node_t *ix = mk(N_INDEX, name->line);
        ix->a = n;
        ix->b = mk(N_LITERAL, name->line);
        ix->b->lit = json_integer(name->ival);
        n = ix;
        continue;
      }
      if (name->kind != TK_NAME) {
        fail(p, name->line, "expected a name after '.', found %s", tk_desc(name));
        return tmpl_node_free(n), NULL;
      }
      node_t *at = mk(N_ATTR, name->line);
      at->a = n;
      at->str = xstrdup(name->str);
      n = at;
    } else if (is_op(t, "[")) {
      next(p);
      n = parse_subscript(p, n, t->line);
    } else if (is_op(t, "(")) {
      node_t *call = mk(N_CALL, t->line);
      call->a = n;
      if (n->kind == N_NAME) {
        if (!(call->fn = tmpl_find_func(n->str))) {
          fail(p, t->line, "function '%s' is not supported", n->str);
          return tmpl_node_free(call), NULL;
        }
      } else if (n->kind == N_ATTR) {
        if (!(call->fn = tmpl_find_method(n->str))) {
          fail(p, t->line, "method '%s' is not supported", n->str);
          return tmpl_node_free(call), NULL;
        }
      } else {
        fail(p, t->line, "only named functions and methods can be called");
        return tmpl_node_free(call), NULL;
      }
      if (parse_args(p, call)) return tmpl_node_free(call), NULL;
      const tmpl_filter_t *f = call->fn;
      if (call->nkids < f->min_args || call->nkids > f->max_args) {
        fail(p, t->line, "%s '%s' takes %zu to %zu arguments, given %zu",
             n->kind == N_NAME ? "function" : "method", f->name, f->min_args, f->max_args,
             call->nkids);
        return tmpl_node_free(call), NULL;
      }
      n = call;
    } else {
      break;
    }
  }
  return n;
}

static node_t *parse_postfix(parser_t *p) {
  int depth = p->depth;
  node_t *n = parse_postfix_chain(p);
  p->depth = depth;
  return n;
}

/* Can t start the single unparenthesised argument of a test (`is sameas
 * false`, `is divisibleby 3`)? */
static int starts_test_arg(const tk_t *t) {
  static const char *const stop[] = {"and", "or", "if", "else", "not", "in", "is"};
  if (t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT) return 1;
  if (t->kind != TK_NAME) return 0;
  for (size_t i = 0; i < sizeof stop / sizeof *stop; i++)
    if (!strcmp(t->str, stop[i])) return 0;
  return 1;
}

/* Unary minus and plus bind tighter than filters and tests, as in Jinja:
 * -3|abs is (-3)|abs. */
static node_t *parse_prefix(parser_t *p) {
  const tk_t *t = peek(p);
  if (!is_op(t, "-") && !is_op(t, "+")) return parse_postfix(p);
  next(p);
  if (enter(p)) return NULL;
  node_t *a = parse_prefix(p);
  p->depth--;
  if (!a) return NULL;
  node_t *n = mk(N_UNARY, t->line);
  n->op = t->str[0];
  n->a = a;
  return n;
}

static node_t *parse_filtered_chain(parser_t *p) {
  node_t *n = parse_prefix(p);
  while (n) {
    if (n && enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = peek(p);
    if (is_op(t, "|")) {
      next(p);
      const tk_t *name = next(p);
      if (name->kind != TK_NAME) {
        fail(p, name->line, "expected a filter name after '|', found %s", tk_desc(name));
        return tmpl_node_free(n), NULL;
      }
      const tmpl_filter_t *f = tmpl_find_filter(name->str);
      if (!f) {
        fail(p, name->line, "filter '%s' is not supported", name->str);
        return tmpl_node_free(n), NULL;
      }
      node_t *fn = mk(N_FILTER, name->line);
      fn->a = n;
      fn->str = xstrdup(name->str);
      fn->fn = f;
      n = fn;
      if (is_op(peek(p), "(") && parse_args(p, fn)) return tmpl_node_free(n), NULL;
      if (fn->nkids < f->min_args || fn->nkids > f->max_args) {
        fail(p, name->line, "filter '%s' takes %zu to %zu arguments, given %zu", f->name,
             f->min_args, f->max_args, fn->nkids);
        return tmpl_node_free(n), NULL;
      }
    } else if (is_name(t, "is")) {
      next(p);
      int negate = 0;
      if (is_name(peek(p), "not")) negate = 1, next(p);
      const tk_t *name = next(p);
      const char *tname = name->kind == TK_NAME ? name->str : NULL;
      /* none/true/false are names of tests too */
      if (!tname) {
        fail(p, name->line, "expected a test name after 'is', found %s", tk_desc(name));
        return tmpl_node_free(n), NULL;
      }
      const tmpl_test_t *tt = tmpl_find_test(tname);
      if (!tt) {
        fail(p, name->line, "test '%s' is not supported", tname);
        return tmpl_node_free(n), NULL;
      }
      node_t *tn = mk(N_TEST, name->line);
      tn->a = n;
      tn->str = xstrdup(tname);
      tn->op = negate;
      tn->fn = tt;
      n = tn;
      if (is_op(peek(p), "(")) {
        if (parse_args(p, tn)) return tmpl_node_free(n), NULL;
      } else if (tt->max_args > 0 && starts_test_arg(peek(p))) {
        node_t *arg = parse_postfix(p);
        if (!arg) return tmpl_node_free(n), NULL;
        add_kid(tn, arg, NULL);
      }
      if (tn->nkids < tt->min_args || tn->nkids > tt->max_args) {
        fail(p, name->line, "test '%s' takes %zu to %zu arguments, given %zu", tt->name,
             tt->min_args, tt->max_args, tn->nkids);
        return tmpl_node_free(n), NULL;
      }
    } else {
      break;
    }
  }
  return n;
}

static node_t *parse_filtered(parser_t *p) {
  int depth = p->depth;
  node_t *n = parse_filtered_chain(p);
  p->depth = depth;
  return n;
}

static node_t *binary(int op, int line, node_t *a, node_t *b) {
  node_t *n = mk(N_BINARY, line);
  n->op = op;
  n->a = a;
  n->b = b;
  return n;
}

static node_t *parse_unary(parser_t *p) {
  node_t *n = parse_filtered(p);
  if (n && is_op(peek(p), "**")) {
    int line = next(p)->line;
    if (enter(p)) return tmpl_node_free(n), NULL;
    node_t *r = parse_unary(p);
    p->depth--;
    if (!r) return tmpl_node_free(n), NULL;
    n = binary(OP_POW, line, n, r);
  }
  return n;
}

static node_t *parse_mul_chain(parser_t *p) {
  node_t *n = parse_unary(p);
  for (;;) {
    if (n && enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = peek(p);
    int op = is_op(t, "*")    ? OP_MUL
             : is_op(t, "/")  ? OP_DIV
             : is_op(t, "//") ? OP_FLOORDIV
             : is_op(t, "%")  ? OP_MOD
                              : 0;
    if (!n || !op) return n;
    next(p);
    node_t *r = parse_unary(p);
    if (!r) return tmpl_node_free(n), NULL;
    n = binary(op, t->line, n, r);
  }
}

static node_t *parse_mul(parser_t *p) {
  int depth = p->depth;
  node_t *n = parse_mul_chain(p);
  p->depth = depth;
  return n;
}

static node_t *parse_add_chain(parser_t *p) {
  node_t *n = parse_mul(p);
  for (;;) {
    if (n && enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = peek(p);
    int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : is_op(t, "~") ? OP_CONCAT : 0;
    if (!n || !op) return n;
    next(p);
    node_t *r = parse_mul(p);
    if (!r) return tmpl_node_free(n), NULL;
    n = binary(op, t->line, n, r);
  }
}

static node_t *parse_add(parser_t *p) {
  int depth = p->depth;
  node_t *n = parse_add_chain(p);
  p->depth = depth;
  return n;
}

static node_t *parse_compare_chain(parser_t *p) {
  node_t *n = parse_add(p);
  for (;;) {
    if (n && enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = peek(p);
    int op = is_op(t, "==")                                 ? OP_EQ
             : is_op(t, "!=")                               ? OP_NE
             : is_op(t, "<")                                ? OP_LT
             : is_op(t, ">")                                ? OP_GT
             : is_op(t, "<=")                               ? OP_LE
             : is_op(t, ">=")                               ? OP_GE
             : is_name(t, "in")                             ? OP_IN
             : is_name(t, "not") && is_name(peek2(p), "in") ? OP_NOTIN
                                                            : 0;
    if (!n || !op) return n;
    next(p);
    if (op == OP_NOTIN) next(p);
    node_t *r = parse_add(p);
    if (!r) return tmpl_node_free(n), NULL;
    n = binary(op, t->line, n, r);
  }
}

static node_t *parse_compare(parser_t *p) {
  int depth = p->depth;
  node_t *n = parse_compare_chain(p);
  p->depth = depth;
  return n;
}

static node_t *parse_not(parser_t *p) {
  const tk_t *t = peek(p);
  if (is_name(t, "not")) {
    next(p);
    if (enter(p)) return NULL;
    node_t *a = parse_not(p);
    p->depth--;
    if (!a) return NULL;
    node_t *n = mk(N_UNARY, t->line);
    n->op = 'n';
    n->a = a;
    return n;
  }
  return parse_compare(p);
}

static node_t *parse_and_chain(parser_t *p) {
  node_t *n = parse_not(p);
  while (n && is_name(peek(p), "and")) {
    if (n && enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    int line = next(p)->line;
    node_t *r = parse_not(p);
    if (!r) return tmpl_node_free(n), NULL;
    n = binary(OP_AND, line, n, r);
  }
  return n;
}

static node_t *parse_and(parser_t *p) {
  int depth = p->depth;
  node_t *n = parse_and_chain(p);
  p->depth = depth;
  return n;
}

static node_t *parse_or(parser_t *p) {
  int depth = p->depth;
  if (enter(p)) return NULL;
  node_t *n = parse_and(p);
  while (n && is_name(peek(p), "or")) {
    if (enter(p)) {
      tmpl_node_free(n);
      n = NULL;
      break;
    }
    int line = next(p)->line;
    node_t *r = parse_and(p);
    if (!r) {
      tmpl_node_free(n);
      n = NULL;
      break;
    }
    n = binary(OP_OR, line, n, r);
  }
  p->depth = depth;
  return n;
}

static node_t *parse_expr(parser_t *p) {
  node_t *n = parse_or(p);
  if (n && is_name(peek(p), "if")) {
    int line = next(p)->line;
    node_t *c = mk(N_COND, line);
    c->b = n;
    if (!(c->a = parse_or(p))) return tmpl_node_free(c), NULL;
    if (is_name(peek(p), "else")) {
      next(p);
      if (enter(p)) return tmpl_node_free(c), NULL;
      c->c = parse_expr(p);
      p->depth--;
      if (!c->c) return tmpl_node_free(c), NULL;
    }
    n = c;
  }
  return n;
}

/* ---- statements ---- */

/* Statements until EOF or a {% name %} with name in ends (NULL-terminated).
 * Leaves pos on that name and sets *found to it (NULL at EOF). */
static node_t *parse_body(parser_t *p, const char *const *ends, const char **found);

static node_t *parse_if_rest(parser_t *p, int line);

static int close_stmt(parser_t *p) {
  return expect_kind(p, TK_CLOSE_STMT, "'%}'");
}

/* Consumes the end keyword the body stopped at, which must be `want`. */
static int end_tag(parser_t *p, const char *found, const char *want, int line, const char *what) {
  if (!found) {
    fail(p, line, "%s is never closed (expected {%% %s %%})", what, want);
    return -1;
  }
  next(p);
  return close_stmt(p);
}

static node_t *parse_if_rest(parser_t *p, int line) {
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  node_t *n = mk(N_IF, line);
  const char *found;
  if (!(n->a = parse_expr(p)) || close_stmt(p)) return tmpl_node_free(n), NULL;
  if (!(n->b = parse_body(p, ends, &found))) return tmpl_node_free(n), NULL;
  if (!found)
    return fail(p, line, "{%% if %%} is never closed (expected {%% endif %%})"), tmpl_node_free(n),
           NULL;
  int at = next(p)->line;
  if (!strcmp(found, "elif")) {
    if (enter(p)) return tmpl_node_free(n), NULL;
    node_t *blk = mk(N_BLOCK, at);
    node_t *sub = parse_if_rest(p, at);
    p->depth--;
    if (!sub) return tmpl_node_free(blk), tmpl_node_free(n), NULL;
    add_kid(blk, sub, NULL);
    n->c = blk;
    return n; /* the nested if consumed the endif */
  }
  if (!strcmp(found, "else")) {
    static const char *const endif[] = {"endif", NULL};
    if (close_stmt(p) || !(n->c = parse_body(p, endif, &found))) return tmpl_node_free(n), NULL;
    if (end_tag(p, found, "endif", line, "{% if %}")) return tmpl_node_free(n), NULL;
    return n;
  }
  if (close_stmt(p)) return tmpl_node_free(n), NULL;
  return n;
}

static node_t *parse_for(parser_t *p, int line) {
  static const char *const ends[] = {"else", "endfor", NULL};
  static const char *const endfor[] = {"endfor", NULL};
  node_t *n = mk(N_FOR, line);
  const char *found;
  for (;;) {
    const tk_t *t = next(p);
    if (t->kind != TK_NAME) {
      fail(p, t->line, "expected a loop variable, found %s", tk_desc(t));
      return tmpl_node_free(n), NULL;
    }
    node_t *v = mk(N_NAME, t->line);
    v->str = xstrdup(t->str);
    add_kid(n, v, NULL);
    if (!is_op(peek(p), ",")) break;
    next(p);
  }
  if (!is_name(peek(p), "in")) {
    fail(p, peek(p)->line, "expected 'in' in {%% for %%}, found %s", tk_desc(peek(p)));
    return tmpl_node_free(n), NULL;
  }
  next(p);
  if (!(n->a = parse_or(p))) return tmpl_node_free(n), NULL;
  if (is_name(peek(p), "if")) {
    next(p);
    if (!(n->d = parse_or(p))) return tmpl_node_free(n), NULL;
  }
  if (is_name(peek(p), "recursive")) {
    fail(p, peek(p)->line, "recursive loops are not supported");
    return tmpl_node_free(n), NULL;
  }
  if (close_stmt(p)) return tmpl_node_free(n), NULL;
  p->loops++;
  n->b = parse_body(p, ends, &found);
  p->loops--;
  if (!n->b) return tmpl_node_free(n), NULL;
  if (found && !strcmp(found, "else")) {
    next(p);
    if (close_stmt(p) || !(n->c = parse_body(p, endfor, &found))) return tmpl_node_free(n), NULL;
  }
  if (end_tag(p, found, "endfor", line, "{% for %}")) return tmpl_node_free(n), NULL;
  return n;
}

static node_t *parse_set(parser_t *p, int line) {
  node_t *n = mk(N_SET, line);
  const tk_t *t = next(p);
  if (t->kind != TK_NAME) {
    fail(p, t->line, "expected a name after 'set', found %s", tk_desc(t));
    return tmpl_node_free(n), NULL;
  }
  n->a = mk(N_NAME, t->line);
  n->a->str = xstrdup(t->str);
  if (is_op(peek(p), ".")) {
    next(p);
    const tk_t *attr = next(p);
    if (attr->kind != TK_NAME) {
      fail(p, attr->line, "expected an attribute name, found %s", tk_desc(attr));
      return tmpl_node_free(n), NULL;
    }
    node_t *at = mk(N_ATTR, attr->line);
    at->a = n->a;
    at->str = xstrdup(attr->str);
    n->a = at;
  }
  if (is_op(peek(p), ",")) {
    fail(p, peek(p)->line, "{%% set %%} of several names is not supported");
    return tmpl_node_free(n), NULL;
  }
  if (is_op(peek(p), "=")) {
    next(p);
    if (!(n->b = parse_expr(p)) || close_stmt(p)) return tmpl_node_free(n), NULL;
    return n;
  }
  if (peek(p)->kind != TK_CLOSE_STMT) {
    fail(p, peek(p)->line, "expected '=' in {%% set %%}, found %s", tk_desc(peek(p)));
    return tmpl_node_free(n), NULL;
  }
  next(p);
  static const char *const endset[] = {"endset", NULL};
  const char *found;
  if (!(n->c = parse_body(p, endset, &found))) return tmpl_node_free(n), NULL;
  if (end_tag(p, found, "endset", line, "{% set %}")) return tmpl_node_free(n), NULL;
  return n;
}

static node_t *parse_statement(parser_t *p) {
  const tk_t *t = next(p);
  if (t->kind != TK_NAME) return fail(p, t->line, "expected a statement, found %s", tk_desc(t));
  if (enter(p)) return NULL;
  node_t *n = NULL;
  if (!strcmp(t->str, "if")) {
    n = parse_if_rest(p, t->line);
  } else if (!strcmp(t->str, "for")) {
    n = parse_for(p, t->line);
  } else if (!strcmp(t->str, "set")) {
    n = parse_set(p, t->line);
  } else if (!strcmp(t->str, "break") || !strcmp(t->str, "continue")) {
    n = mk(t->str[0] == 'b' ? N_BREAK : N_CONTINUE, t->line);
    if (!p->loops) {
      fail(p, t->line, "{%% %s %%} outside a loop", t->str);
      tmpl_node_free(n), n = NULL;
    } else if (close_stmt(p)) {
      tmpl_node_free(n), n = NULL;
    }
  } else if (!strcmp(t->str, "elif") || !strcmp(t->str, "else") || !strncmp(t->str, "end", 3)) {
    fail(p, t->line, "{%% %s %%} without its opening statement", t->str);
  } else {
    fail(p, t->line, "statement '%s' is not supported", t->str);
  }
  p->depth--;
  return n;
}

static node_t *parse_body(parser_t *p, const char *const *ends, const char **found) {
  node_t *blk = mk(N_BLOCK, peek(p)->line);
  *found = NULL;
  for (;;) {
    const tk_t *t = peek(p);
    node_t *s = NULL;
    switch (t->kind) {
      case TK_EOF:
        return blk;
      case TK_COMMENT:
        next(p);
        continue;
      case TK_TEXT:
        next(p);
        s = mk(N_TEXT, t->line);
        s->str = xmalloc(t->len + 1);
        memcpy(s->str, t->str, t->len + 1);
        break;
      case TK_OPEN_EXPR:
        next(p);
        s = mk(N_OUTPUT, t->line);
        if (!(s->a = parse_expr(p)) || expect_kind(p, TK_CLOSE_EXPR, "'}}'")) {
          tmpl_node_free(s);
          s = NULL;
        }
        break;
      case TK_OPEN_STMT: {
        const tk_t *kw = peek2(p);
        for (size_t i = 0; ends && ends[i]; i++) {
          if (is_name(kw, ends[i])) {
            next(p);
            *found = ends[i];
            return blk;
          }
        }
        next(p);
        s = parse_statement(p);
        break;
      }
      default:
        fail(p, t->line, "unexpected %s", tk_desc(t));
        break;
    }
    if (!s) return tmpl_node_free(blk), NULL;
    add_kid(blk, s, NULL);
  }
}

int tmpl_parse(const char *source, tmpl_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (err && errlen) err[0] = 0;
  size_t len = strlen(source);
  if (len > TMPL_MAX_SOURCE)
    return ty_errf(err, errlen, TY_EINVAL, "chat template of %zu bytes, more than the %u allowed",
                   len, TMPL_MAX_SOURCE);
  tk_list_t tk = {0};
  int rc = tmpl_lex(source, len, &tk, err, errlen);
  if (rc) {
    tmpl_tokens_free(&tk);
    return rc;
  }
  parser_t p = {.tk = &tk, .err = err, .errlen = errlen};
  const char *found;
  node_t *root = parse_body(&p, NULL, &found);
  tmpl_tokens_free(&tk);
  if (!root) return TY_EINVAL;
  *out = xcalloc(1, sizeof **out);
  (*out)->root = root;
  return 0;
}

void tmpl_free(tmpl_t *t) {
  if (!t) return;
  tmpl_node_free(t->root);
  free(t);
}
