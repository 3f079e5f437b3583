/* chat_template_parse.c - the chat template parser: statements and the
 * helpers of chat_template_expr.c; tokens to a syntax tree, refusing by
 * name each statement outside the supported subset. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/chat_template_internal.h"

node_t *tmpl_pfail(parser_t *p, int line, const char *fmt, ...) {
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

const tk_t *tmpl_peek(parser_t *p) {
  return &p->tk->v[p->pos];
}
const tk_t *tmpl_peek2(parser_t *p) {
  return p->pos + 1 < p->tk->n ? &p->tk->v[p->pos + 1] : &p->tk->v[p->tk->n - 1];
}
const tk_t *tmpl_next(parser_t *p) {
  const tk_t *t = &p->tk->v[p->pos];
  if (t->kind != TK_EOF) p->pos++;
  return t;
}
int tmpl_is_op(const tk_t *t, const char *op) {
  return t->kind == TK_OP && !strcmp(t->str, op);
}
int tmpl_is_name(const tk_t *t, const char *name) {
  return t->kind == TK_NAME && !strcmp(t->str, name);
}

const char *tmpl_tk_desc(const tk_t *t) {
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

int tmpl_expect_op(parser_t *p, const char *op) {
  const tk_t *t = tmpl_peek(p);
  if (!tmpl_is_op(t, op)) {
    tmpl_pfail(p, t->line, "expected '%s', found %s", op, tmpl_tk_desc(t));
    return -1;
  }
  tmpl_next(p);
  return 0;
}

static int expect_kind(parser_t *p, tk_kind_t kind, const char *what) {
  const tk_t *t = tmpl_peek(p);
  if (t->kind != kind) {
    tmpl_pfail(p, t->line, "expected %s, found %s", what, tmpl_tk_desc(t));
    return -1;
  }
  tmpl_next(p);
  return 0;
}

node_t *tmpl_mk(node_kind_t kind, int line) {
  node_t *n = xcalloc(1, sizeof *n);
  n->kind = kind;
  n->line = line;
  return n;
}

void tmpl_add_kid(node_t *n, node_t *kid, char *name) {
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

int tmpl_enter(parser_t *p) {
  if (++p->depth > TMPL_MAX_DEPTH) {
    tmpl_pfail(p, tmpl_peek(p)->line, "nesting deeper than %d", TMPL_MAX_DEPTH);
    return -1;
  }
  return 0;
}

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
    tmpl_pfail(p, line, "%s is never closed (expected {%% %s %%})", what, want);
    return -1;
  }
  tmpl_next(p);
  return close_stmt(p);
}

static node_t *parse_if_rest(parser_t *p, int line) {
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  node_t *n = tmpl_mk(N_IF, line);
  const char *found;
  if (!(n->a = tmpl_parse_expr(p)) || close_stmt(p)) return tmpl_node_free(n), NULL;
  if (!(n->b = parse_body(p, ends, &found))) return tmpl_node_free(n), NULL;
  if (!found)
    return tmpl_pfail(p, line, "{%% if %%} is never closed (expected {%% endif %%})"),
           tmpl_node_free(n), NULL;
  int at = tmpl_next(p)->line;
  if (!strcmp(found, "elif")) {
    if (tmpl_enter(p)) return tmpl_node_free(n), NULL;
    node_t *blk = tmpl_mk(N_BLOCK, at);
    node_t *sub = parse_if_rest(p, at);
    p->depth--;
    if (!sub) return tmpl_node_free(blk), tmpl_node_free(n), NULL;
    tmpl_add_kid(blk, sub, NULL);
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
  node_t *n = tmpl_mk(N_FOR, line);
  const char *found;
  for (;;) {
    const tk_t *t = tmpl_next(p);
    if (t->kind != TK_NAME) {
      tmpl_pfail(p, t->line, "expected a loop variable, found %s", tmpl_tk_desc(t));
      return tmpl_node_free(n), NULL;
    }
    node_t *v = tmpl_mk(N_NAME, t->line);
    v->str = xstrdup(t->str);
    tmpl_add_kid(n, v, NULL);
    if (!tmpl_is_op(tmpl_peek(p), ",")) break;
    tmpl_next(p);
  }
  if (!tmpl_is_name(tmpl_peek(p), "in")) {
    tmpl_pfail(p, tmpl_peek(p)->line, "expected 'in' in {%% for %%}, found %s",
               tmpl_tk_desc(tmpl_peek(p)));
    return tmpl_node_free(n), NULL;
  }
  tmpl_next(p);
  if (!(n->a = tmpl_parse_or(p))) return tmpl_node_free(n), NULL;
  if (tmpl_is_name(tmpl_peek(p), "if")) {
    tmpl_next(p);
    if (!(n->d = tmpl_parse_or(p))) return tmpl_node_free(n), NULL;
  }
  if (tmpl_is_name(tmpl_peek(p), "recursive")) {
    tmpl_pfail(p, tmpl_peek(p)->line, "recursive loops are not supported");
    return tmpl_node_free(n), NULL;
  }
  if (close_stmt(p)) return tmpl_node_free(n), NULL;
  p->loops++;
  n->b = parse_body(p, ends, &found);
  p->loops--;
  if (!n->b) return tmpl_node_free(n), NULL;
  if (found && !strcmp(found, "else")) {
    tmpl_next(p);
    if (close_stmt(p) || !(n->c = parse_body(p, endfor, &found))) return tmpl_node_free(n), NULL;
  }
  if (end_tag(p, found, "endfor", line, "{% for %}")) return tmpl_node_free(n), NULL;
  return n;
}

static node_t *parse_set(parser_t *p, int line) {
  node_t *n = tmpl_mk(N_SET, line);
  const tk_t *t = tmpl_next(p);
  if (t->kind != TK_NAME) {
    tmpl_pfail(p, t->line, "expected a name after 'set', found %s", tmpl_tk_desc(t));
    return tmpl_node_free(n), NULL;
  }
  n->a = tmpl_mk(N_NAME, t->line);
  n->a->str = xstrdup(t->str);
  if (tmpl_is_op(tmpl_peek(p), ".")) {
    tmpl_next(p);
    const tk_t *attr = tmpl_next(p);
    if (attr->kind != TK_NAME) {
      tmpl_pfail(p, attr->line, "expected an attribute name, found %s", tmpl_tk_desc(attr));
      return tmpl_node_free(n), NULL;
    }
    node_t *at = tmpl_mk(N_ATTR, attr->line);
    at->a = n->a;
    at->str = xstrdup(attr->str);
    n->a = at;
  }
  if (tmpl_is_op(tmpl_peek(p), ",")) {
    tmpl_pfail(p, tmpl_peek(p)->line, "{%% set %%} of several names is not supported");
    return tmpl_node_free(n), NULL;
  }
  if (tmpl_is_op(tmpl_peek(p), "=")) {
    tmpl_next(p);
    if (!(n->b = tmpl_parse_expr(p)) || close_stmt(p)) return tmpl_node_free(n), NULL;
    return n;
  }
  if (tmpl_peek(p)->kind != TK_CLOSE_STMT) {
    tmpl_pfail(p, tmpl_peek(p)->line, "expected '=' in {%% set %%}, found %s",
               tmpl_tk_desc(tmpl_peek(p)));
    return tmpl_node_free(n), NULL;
  }
  tmpl_next(p);
  static const char *const endset[] = {"endset", NULL};
  const char *found;
  if (!(n->c = parse_body(p, endset, &found))) return tmpl_node_free(n), NULL;
  if (end_tag(p, found, "endset", line, "{% set %}")) return tmpl_node_free(n), NULL;
  return n;
}

static node_t *parse_statement(parser_t *p) {
  const tk_t *t = tmpl_next(p);
  if (t->kind != TK_NAME)
    return tmpl_pfail(p, t->line, "expected a statement, found %s", tmpl_tk_desc(t));
  if (tmpl_enter(p)) return NULL;
  node_t *n = NULL;
  if (!strcmp(t->str, "if")) {
    n = parse_if_rest(p, t->line);
  } else if (!strcmp(t->str, "for")) {
    n = parse_for(p, t->line);
  } else if (!strcmp(t->str, "set")) {
    n = parse_set(p, t->line);
  } else if (!strcmp(t->str, "break") || !strcmp(t->str, "continue")) {
    n = tmpl_mk(t->str[0] == 'b' ? N_BREAK : N_CONTINUE, t->line);
    if (!p->loops) {
      tmpl_pfail(p, t->line, "{%% %s %%} outside a loop", t->str);
      tmpl_node_free(n), n = NULL;
    } else if (close_stmt(p)) {
      tmpl_node_free(n), n = NULL;
    }
  } else if (!strcmp(t->str, "elif") || !strcmp(t->str, "else") || !strncmp(t->str, "end", 3)) {
    tmpl_pfail(p, t->line, "{%% %s %%} without its opening statement", t->str);
  } else {
    tmpl_pfail(p, t->line, "statement '%s' is not supported", t->str);
  }
  p->depth--;
  return n;
}

static node_t *parse_body(parser_t *p, const char *const *ends, const char **found) {
  node_t *blk = tmpl_mk(N_BLOCK, tmpl_peek(p)->line);
  *found = NULL;
  for (;;) {
    const tk_t *t = tmpl_peek(p);
    node_t *s = NULL;
    switch (t->kind) {
      case TK_EOF:
        return blk;
      case TK_COMMENT:
        tmpl_next(p);
        continue;
      case TK_TEXT:
        tmpl_next(p);
        s = tmpl_mk(N_TEXT, t->line);
        s->str = xmalloc(t->len + 1);
        memcpy(s->str, t->str, t->len + 1);
        break;
      case TK_OPEN_EXPR:
        tmpl_next(p);
        s = tmpl_mk(N_OUTPUT, t->line);
        if (!(s->a = tmpl_parse_expr(p)) || expect_kind(p, TK_CLOSE_EXPR, "'}}'")) {
          tmpl_node_free(s);
          s = NULL;
        }
        break;
      case TK_OPEN_STMT: {
        const tk_t *kw = tmpl_peek2(p);
        for (size_t i = 0; ends && ends[i]; i++) {
          if (tmpl_is_name(kw, ends[i])) {
            tmpl_next(p);
            *found = ends[i];
            return blk;
          }
        }
        tmpl_next(p);
        s = parse_statement(p);
        break;
      }
      default:
        tmpl_pfail(p, t->line, "unexpected %s", tmpl_tk_desc(t));
        break;
    }
    if (!s) return tmpl_node_free(blk), NULL;
    tmpl_add_kid(blk, s, NULL);
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
