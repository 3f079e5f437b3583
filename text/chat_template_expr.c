/* chat_template_expr.c - the chat template parser's expressions, by
 * precedence from the ternary down to literals; filters, tests, methods and
 * functions are looked up in their tables here, and refused by name when
 * missing. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

static node_t *parse_unary(parser_t *p);

/* Arguments of a call, a filter or a test after '(' up to ')', into n. */
static int parse_args(parser_t *p, node_t *n) {
  if (tmpl_expect_op(p, "(")) return -1;
  int kw_seen = 0;
  while (!tmpl_is_op(tmpl_peek(p), ")")) {
    char *kw = NULL;
    if (tmpl_peek(p)->kind == TK_NAME && tmpl_is_op(tmpl_peek2(p), "=")) {
      kw = xstrdup(tmpl_next(p)->str);
      tmpl_next(p);
      kw_seen = 1;
    } else if (kw_seen) {
      tmpl_pfail(p, tmpl_peek(p)->line, "a positional argument after a keyword argument");
      return -1;
    }
    node_t *v = tmpl_parse_expr(p);
    if (!v) {
      free(kw);
      return -1;
    }
    tmpl_add_kid(n, v, kw);
    if (!tmpl_is_op(tmpl_peek(p), ",")) break;
    tmpl_next(p);
  }
  return tmpl_expect_op(p, ")");
}

static node_t *parse_primary(parser_t *p) {
  const tk_t *t = tmpl_next(p);
  node_t *n;
  switch (t->kind) {
    case TK_STRING: {
      n = tmpl_mk(N_LITERAL, t->line);
      /* adjacent literals join, as in Jinja: 'a' 'b' */
      tmpl_buf_t b = {0};
      tmpl_buf_add(&b, t->str, t->len);
      while (tmpl_peek(p)->kind == TK_STRING) {
        t = tmpl_next(p);
        tmpl_buf_add(&b, t->str, t->len);
      }
      n->lit = tmpl_string_take(&b);
      return n;
    }
    case TK_INT:
      n = tmpl_mk(N_LITERAL, t->line);
      n->lit = json_integer(t->ival);
      return n;
    case TK_FLOAT:
      n = tmpl_mk(N_LITERAL, t->line);
      n->lit = json_real(t->fval);
      return n;
    case TK_NAME:
      if (!strcmp(t->str, "true") || !strcmp(t->str, "True") || !strcmp(t->str, "false") ||
          !strcmp(t->str, "False")) {
        n = tmpl_mk(N_LITERAL, t->line);
        n->lit = json_boolean(t->str[0] == 't' || t->str[0] == 'T');
        return n;
      }
      if (!strcmp(t->str, "none") || !strcmp(t->str, "None")) {
        n = tmpl_mk(N_LITERAL, t->line);
        n->lit = json_null();
        return n;
      }
      n = tmpl_mk(N_NAME, t->line);
      n->str = xstrdup(t->str);
      return n;
    case TK_OP:
      if (!strcmp(t->str, "(")) {
        node_t *e = tmpl_parse_expr(p);
        if (!e) return NULL;
        if (tmpl_is_op(tmpl_peek(p), ",")) { /* a tuple: a list here */
          n = tmpl_mk(N_LIST, t->line);
          tmpl_add_kid(n, e, NULL);
          while (tmpl_is_op(tmpl_peek(p), ",")) {
            tmpl_next(p);
            if (tmpl_is_op(tmpl_peek(p), ")")) break;
            node_t *k = tmpl_parse_expr(p);
            if (!k) return tmpl_node_free(n), NULL;
            tmpl_add_kid(n, k, NULL);
          }
          e = n;
        }
        if (tmpl_expect_op(p, ")")) return tmpl_node_free(e), NULL;
        return e;
      }
      if (!strcmp(t->str, "[")) {
        n = tmpl_mk(N_LIST, t->line);
        while (!tmpl_is_op(tmpl_peek(p), "]")) {
          node_t *k = tmpl_parse_expr(p);
          if (!k) return tmpl_node_free(n), NULL;
          tmpl_add_kid(n, k, NULL);
          if (!tmpl_is_op(tmpl_peek(p), ",")) break;
          tmpl_next(p);
        }
        if (tmpl_expect_op(p, "]")) return tmpl_node_free(n), NULL;
        return n;
      }
      if (!strcmp(t->str, "{")) {
        n = tmpl_mk(N_DICT, t->line);
        while (!tmpl_is_op(tmpl_peek(p), "}")) {
          node_t *k = tmpl_parse_expr(p);
          if (!k) return tmpl_node_free(n), NULL;
          tmpl_add_kid(n, k, NULL);
          if (tmpl_expect_op(p, ":")) return tmpl_node_free(n), NULL;
          node_t *v = tmpl_parse_expr(p);
          if (!v) return tmpl_node_free(n), NULL;
          tmpl_add_kid(n, v, NULL);
          if (!tmpl_is_op(tmpl_peek(p), ",")) break;
          tmpl_next(p);
        }
        if (tmpl_expect_op(p, "}")) return tmpl_node_free(n), NULL;
        return n;
      }
      /* fallthrough */
    default:
      return tmpl_pfail(p, t->line, "unexpected %s in an expression", tmpl_tk_desc(t));
  }
}

/* [start:stop:step] or [index], after the '['. */
static node_t *parse_subscript(parser_t *p, node_t *obj, int line) {
  node_t *parts[3] = {NULL, NULL, NULL};
  int colons = 0;
  for (;;) {
    if (tmpl_is_op(tmpl_peek(p), "]")) break;
    if (tmpl_is_op(tmpl_peek(p), ":")) {
      if (++colons > 2) break;
      tmpl_next(p);
      continue;
    }
    if (parts[colons]) break;
    if (!(parts[colons] = tmpl_parse_expr(p))) goto bad;
  }
  if (tmpl_expect_op(p, "]")) goto bad;
  if (!colons && !parts[0]) {
    tmpl_pfail(p, line, "an empty subscript []");
    goto bad;
  }
  node_t *n = tmpl_mk(colons ? N_SLICE : N_INDEX, line);
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
    if (n && tmpl_enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = tmpl_peek(p);
    if (tmpl_is_op(t, ".")) {
      tmpl_next(p);
      const tk_t *name = tmpl_next(p);
      if (name->kind == TK_INT) { /* x.0: an index, as Jinja reads it */
        node_t *ix = tmpl_mk(N_INDEX, name->line);
        ix->a = n;
        ix->b = tmpl_mk(N_LITERAL, name->line);
        ix->b->lit = json_integer(name->ival);
        n = ix;
        continue;
      }
      if (name->kind != TK_NAME) {
        tmpl_pfail(p, name->line, "expected a name after '.', found %s", tmpl_tk_desc(name));
        return tmpl_node_free(n), NULL;
      }
      node_t *at = tmpl_mk(N_ATTR, name->line);
      at->a = n;
      at->str = xstrdup(name->str);
      n = at;
    } else if (tmpl_is_op(t, "[")) {
      tmpl_next(p);
      n = parse_subscript(p, n, t->line);
    } else if (tmpl_is_op(t, "(")) {
      node_t *call = tmpl_mk(N_CALL, t->line);
      call->a = n;
      if (n->kind == N_NAME) {
        if (!(call->fn = tmpl_find_func(n->str))) {
          tmpl_pfail(p, t->line, "function '%s' is not supported", n->str);
          return tmpl_node_free(call), NULL;
        }
      } else if (n->kind == N_ATTR) {
        if (!(call->fn = tmpl_find_method(n->str))) {
          tmpl_pfail(p, t->line, "method '%s' is not supported", n->str);
          return tmpl_node_free(call), NULL;
        }
      } else {
        tmpl_pfail(p, t->line, "only named functions and methods can be called");
        return tmpl_node_free(call), NULL;
      }
      if (parse_args(p, call)) return tmpl_node_free(call), NULL;
      const tmpl_filter_t *f = call->fn;
      if (call->nkids < f->min_args || call->nkids > f->max_args) {
        tmpl_pfail(p, t->line, "%s '%s' takes %zu to %zu arguments, given %zu",
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
  const tk_t *t = tmpl_peek(p);
  if (!tmpl_is_op(t, "-") && !tmpl_is_op(t, "+")) return parse_postfix(p);
  tmpl_next(p);
  if (tmpl_enter(p)) return NULL;
  node_t *a = parse_prefix(p);
  p->depth--;
  if (!a) return NULL;
  node_t *n = tmpl_mk(N_UNARY, t->line);
  n->op = t->str[0];
  n->a = a;
  return n;
}

static node_t *parse_filtered_chain(parser_t *p) {
  node_t *n = parse_prefix(p);
  while (n) {
    if (n && tmpl_enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = tmpl_peek(p);
    if (tmpl_is_op(t, "|")) {
      tmpl_next(p);
      const tk_t *name = tmpl_next(p);
      if (name->kind != TK_NAME) {
        tmpl_pfail(p, name->line, "expected a filter name after '|', found %s", tmpl_tk_desc(name));
        return tmpl_node_free(n), NULL;
      }
      const tmpl_filter_t *f = tmpl_find_filter(name->str);
      if (!f) {
        tmpl_pfail(p, name->line, "filter '%s' is not supported", name->str);
        return tmpl_node_free(n), NULL;
      }
      node_t *fn = tmpl_mk(N_FILTER, name->line);
      fn->a = n;
      fn->str = xstrdup(name->str);
      fn->fn = f;
      n = fn;
      if (tmpl_is_op(tmpl_peek(p), "(") && parse_args(p, fn)) return tmpl_node_free(n), NULL;
      if (fn->nkids < f->min_args || fn->nkids > f->max_args) {
        tmpl_pfail(p, name->line, "filter '%s' takes %zu to %zu arguments, given %zu", f->name,
                   f->min_args, f->max_args, fn->nkids);
        return tmpl_node_free(n), NULL;
      }
    } else if (tmpl_is_name(t, "is")) {
      tmpl_next(p);
      int negate = 0;
      if (tmpl_is_name(tmpl_peek(p), "not")) negate = 1, tmpl_next(p);
      const tk_t *name = tmpl_next(p);
      const char *tname = name->kind == TK_NAME ? name->str : NULL;
      /* none/true/false are names of tests too */
      if (!tname) {
        tmpl_pfail(p, name->line, "expected a test name after 'is', found %s", tmpl_tk_desc(name));
        return tmpl_node_free(n), NULL;
      }
      const tmpl_test_t *tt = tmpl_find_test(tname);
      if (!tt) {
        tmpl_pfail(p, name->line, "test '%s' is not supported", tname);
        return tmpl_node_free(n), NULL;
      }
      node_t *tn = tmpl_mk(N_TEST, name->line);
      tn->a = n;
      tn->str = xstrdup(tname);
      tn->op = negate;
      tn->fn = tt;
      n = tn;
      if (tmpl_is_op(tmpl_peek(p), "(")) {
        if (parse_args(p, tn)) return tmpl_node_free(n), NULL;
      } else if (tt->max_args > 0 && starts_test_arg(tmpl_peek(p))) {
        node_t *arg = parse_postfix(p);
        if (!arg) return tmpl_node_free(n), NULL;
        tmpl_add_kid(tn, arg, NULL);
      }
      if (tn->nkids < tt->min_args || tn->nkids > tt->max_args) {
        tmpl_pfail(p, name->line, "test '%s' takes %zu to %zu arguments, given %zu", tt->name,
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
  node_t *n = tmpl_mk(N_BINARY, line);
  n->op = op;
  n->a = a;
  n->b = b;
  return n;
}

static node_t *parse_unary(parser_t *p) {
  node_t *n = parse_filtered(p);
  if (n && tmpl_is_op(tmpl_peek(p), "**")) {
    int line = tmpl_next(p)->line;
    if (tmpl_enter(p)) return tmpl_node_free(n), NULL;
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
    if (n && tmpl_enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = tmpl_peek(p);
    int op = tmpl_is_op(t, "*")    ? OP_MUL
             : tmpl_is_op(t, "/")  ? OP_DIV
             : tmpl_is_op(t, "//") ? OP_FLOORDIV
             : tmpl_is_op(t, "%")  ? OP_MOD
                                   : 0;
    if (!n || !op) return n;
    tmpl_next(p);
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
    if (n && tmpl_enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = tmpl_peek(p);
    int op = tmpl_is_op(t, "+")   ? OP_ADD
             : tmpl_is_op(t, "-") ? OP_SUB
             : tmpl_is_op(t, "~") ? OP_CONCAT
                                  : 0;
    if (!n || !op) return n;
    tmpl_next(p);
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
    if (n && tmpl_enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    const tk_t *t = tmpl_peek(p);
    int op = tmpl_is_op(t, "==")                                           ? OP_EQ
             : tmpl_is_op(t, "!=")                                         ? OP_NE
             : tmpl_is_op(t, "<")                                          ? OP_LT
             : tmpl_is_op(t, ">")                                          ? OP_GT
             : tmpl_is_op(t, "<=")                                         ? OP_LE
             : tmpl_is_op(t, ">=")                                         ? OP_GE
             : tmpl_is_name(t, "in")                                       ? OP_IN
             : tmpl_is_name(t, "not") && tmpl_is_name(tmpl_peek2(p), "in") ? OP_NOTIN
                                                                           : 0;
    if (!n || !op) return n;
    tmpl_next(p);
    if (op == OP_NOTIN) tmpl_next(p);
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
  const tk_t *t = tmpl_peek(p);
  if (tmpl_is_name(t, "not")) {
    tmpl_next(p);
    if (tmpl_enter(p)) return NULL;
    node_t *a = parse_not(p);
    p->depth--;
    if (!a) return NULL;
    node_t *n = tmpl_mk(N_UNARY, t->line);
    n->op = 'n';
    n->a = a;
    return n;
  }
  return parse_compare(p);
}

static node_t *parse_and_chain(parser_t *p) {
  node_t *n = parse_not(p);
  while (n && tmpl_is_name(tmpl_peek(p), "and")) {
    if (n && tmpl_enter(p)) return tmpl_node_free(n), NULL; /* a long chain nests as deep */
    int line = tmpl_next(p)->line;
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

node_t *tmpl_parse_or(parser_t *p) {
  int depth = p->depth;
  if (tmpl_enter(p)) return NULL;
  node_t *n = parse_and(p);
  while (n && tmpl_is_name(tmpl_peek(p), "or")) {
    if (tmpl_enter(p)) {
      tmpl_node_free(n);
      n = NULL;
      break;
    }
    int line = tmpl_next(p)->line;
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

node_t *tmpl_parse_expr(parser_t *p) {
  node_t *n = tmpl_parse_or(p);
  if (n && tmpl_is_name(tmpl_peek(p), "if")) {
    int line = tmpl_next(p)->line;
    node_t *c = tmpl_mk(N_COND, line);
    c->b = n;
    if (!(c->a = tmpl_parse_or(p))) return tmpl_node_free(c), NULL;
    if (tmpl_is_name(tmpl_peek(p), "else")) {
      tmpl_next(p);
      if (tmpl_enter(p)) return tmpl_node_free(c), NULL;
      c->c = tmpl_parse_expr(p);
      p->depth--;
      if (!c->c) return tmpl_node_free(c), NULL;
    }
    n = c;
  }
  return n;
}
