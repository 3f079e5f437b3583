/* chat_template_internal.h - the chat template module's parts: the lexer
 * (chat_template_lex.c), the parser (chat_template_parse.c statements,
 * chat_template_expr.c expressions), the render (chat_template_render.c
 * statements and limits, chat_template_eval.c expressions), values
 * (chat_template_value.c), and the tables of filters
 * (chat_template_filters.c), tests, methods and functions
 * (chat_template_lib.c) with their string operations
 * (chat_template_strings.c). Not for use outside text/. */
#ifndef TY_TEXT_CHAT_TEMPLATE_INTERNAL_H
#define TY_TEXT_CHAT_TEMPLATE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <jansson.h>

#include "text/chat_template.h"

/* ---- lexer ---- */

typedef enum {
  TK_TEXT,    /* text between tags; str holds it */
  TK_COMMENT, /* {# #}: kept so that a later {%- strips nothing before it */
  TK_OPEN_STMT,
  TK_CLOSE_STMT,
  TK_OPEN_EXPR,
  TK_CLOSE_EXPR,
  TK_NAME,   /* identifier or keyword; str */
  TK_STRING, /* str, escapes resolved (may hold NUL: len) */
  TK_INT,    /* ival */
  TK_FLOAT,  /* fval */
  TK_OP,     /* str: ( ) [ ] { } , . : | = + - ~ * / // % ** == != < > <= >= */
  TK_EOF
} tk_kind_t;

typedef struct {
  tk_kind_t kind;
  int line; /* 1-based line of the template as written */
  char *str;
  size_t len;
  long long ival;
  double fval;
} tk_t;

typedef struct {
  tk_t *v;
  size_t n, cap;
} tk_list_t;

/* Tokens of source (len bytes) into *out after Hugging Face's preprocessing
 * (trailing newline, lstrip_blocks, trim_blocks, generation tags). 0, or
 * TY_EINVAL with the message in err. The caller frees out with
 * tmpl_tokens_free, on failure too. */
int tmpl_lex(const char *source, size_t len, tk_list_t *out, char *err, size_t errlen);
void tmpl_tokens_free(tk_list_t *l);

/* Bytes of the whitespace character (JavaScript's \s: ASCII and the Unicode
 * spaces) at s[0..n), or 0. */
size_t tmpl_ws_at(const char *s, size_t n);
/* Bytes of the whitespace character that ends s[0..n), or 0. */
size_t tmpl_ws_before(const char *s, size_t n);

/* ---- syntax tree ---- */

typedef enum {
  /* statements */
  N_BLOCK,  /* kids: statements */
  N_TEXT,   /* str */
  N_OUTPUT, /* a: expression */
  N_IF,     /* a: condition, b: then-block, c: else-block (or NULL) */
  N_FOR,    /* kids: target names (N_NAME), a: iterable, d: filter or NULL,
               b: body, c: else-block or NULL */
  N_SET,    /* a: target (N_NAME, or N_ATTR of a name), b: value, or c: block */
  N_BREAK,
  N_CONTINUE,
  /* expressions */
  N_LITERAL, /* lit */
  N_NAME,    /* str */
  N_LIST,    /* kids */
  N_DICT,    /* kids: key, value, key, value ... */
  N_ATTR,    /* a.str */
  N_INDEX,   /* a[b] */
  N_SLICE,   /* a[b:c:d], each of b c d may be NULL */
  N_CALL,    /* a: callee (N_NAME function or N_ATTR method); kids: args,
                names[i] the keyword of kids[i] or NULL */
  N_FILTER,  /* a | str(kids) */
  N_TEST,    /* a is [not] str(kids); op 1 for `is not` */
  N_UNARY,   /* op: '-', '+' or 'n' (not); a */
  N_BINARY,  /* op (OP_*); a, b */
  N_COND,    /* b if a else c (c may be NULL) */
} node_kind_t;

enum {
  OP_ADD = 1,
  OP_SUB,
  OP_MUL,
  OP_DIV,
  OP_FLOORDIV,
  OP_MOD,
  OP_POW,
  OP_CONCAT,
  OP_EQ,
  OP_NE,
  OP_LT,
  OP_GT,
  OP_LE,
  OP_GE,
  OP_IN,
  OP_NOTIN,
  OP_AND,
  OP_OR
};

typedef struct node_s node_t;
struct node_s {
  node_kind_t kind;
  int line;
  int op;
  char *str;
  json_t *lit;
  node_t *a, *b, *c, *d;
  node_t **kids;
  char **names; /* N_CALL: keyword of each argument, or NULL */
  size_t nkids;
  const void *fn; /* N_FILTER, N_TEST, N_CALL: the table entry */
};

struct tmpl_s {
  node_t *root; /* N_BLOCK */
};

void tmpl_node_free(node_t *n);

/* ---- the parser (chat_template_parse.c, chat_template_expr.c) ---- */

typedef struct {
  const tk_list_t *tk;
  size_t pos;
  int depth;
  int loops; /* {% for %} bodies the parser is inside */
  char *err;
  size_t errlen;
  int failed;
} parser_t;

/* Records the parse's first error, "chat template line N: ...", and returns
 * NULL. */
node_t *tmpl_pfail(parser_t *p, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The current token, the one after it, and the current one consumed (the
 * end-of-input token is never passed). */
const tk_t *tmpl_peek(parser_t *p);
const tk_t *tmpl_peek2(parser_t *p);
const tk_t *tmpl_next(parser_t *p);
int tmpl_is_op(const tk_t *t, const char *op);
int tmpl_is_name(const tk_t *t, const char *name);
/* "'%}'", "a string", "the end of the template", ... for messages. */
const char *tmpl_tk_desc(const tk_t *t);
/* Consumes the operator op, or fails naming what was found: 0 or -1. */
int tmpl_expect_op(parser_t *p, const char *op);
node_t *tmpl_mk(node_kind_t kind, int line);
/* Appends kid (and for calls, filters and tests its keyword name, owned) to
 * n's kids. */
void tmpl_add_kid(node_t *n, node_t *kid, char *name);
/* One level deeper: 0, or -1 past TMPL_MAX_DEPTH (failed). The caller
 * lowers p->depth again. */
int tmpl_enter(parser_t *p);
/* An expression, with or without the ternary (a for loop's iterable and
 * filter take none). NULL on failure. */
node_t *tmpl_parse_expr(parser_t *p);
node_t *tmpl_parse_or(parser_t *p);

/* ---- the library: filters, tests, methods, functions ---- */

typedef struct tmpl_render_s tmpl_render_t;

/* A filter: v (borrowed; NULL is undefined) and args (borrowed) give a new
 * reference in *out (NULL for undefined). 0 or a TY_E* code with the
 * message set through tmpl_fail. */
typedef int (*tmpl_filter_fn)(tmpl_render_t *r, const node_t *at, json_t *v, json_t **args,
                              char **names, size_t nargs, json_t **out);
typedef struct {
  const char *name;
  tmpl_filter_fn fn;
  size_t min_args, max_args;
} tmpl_filter_t;

/* A test: 1 true, 0 false, or a negative code. */
typedef int (*tmpl_test_fn)(tmpl_render_t *r, const node_t *at, json_t *v, json_t **args,
                            size_t nargs);
typedef struct {
  const char *name;
  tmpl_test_fn fn;
  size_t min_args, max_args;
} tmpl_test_t;

/* The parameters of a tmpl_filter_fn and a tmpl_test_fn, for their
 * implementations. */
#define FILTER_ARGS                                                                         \
  tmpl_render_t *r, const node_t *at, json_t *v, json_t **args, char **names, size_t nargs, \
      json_t **out
#define TEST_ARGS tmpl_render_t *r, const node_t *at, json_t *v, json_t **args, size_t nargs

/* The entry of table named key, or NULL: the body of the tmpl_find_*. */
#define TMPL_FIND(table, key)                                        \
  do {                                                               \
    for (size_t i_ = 0; i_ < sizeof(table) / sizeof(*(table)); i_++) \
      if (!strcmp((table)[i_].name, (key))) return &(table)[i_];     \
    return NULL;                                                     \
  } while (0)

/* A method, a filter whose receiver is the object before the dot. */
typedef tmpl_filter_t tmpl_method_t;

/* A function called by name: range, namespace, raise_exception, ... */
typedef tmpl_filter_t tmpl_func_t;

const tmpl_filter_t *tmpl_find_filter(const char *name);
const tmpl_test_t *tmpl_find_test(const char *name);
const tmpl_method_t *tmpl_find_method(const char *name);
const tmpl_func_t *tmpl_find_func(const char *name);

/* Helpers of the filters, methods and functions (chat_template_filters.c):
 * argument pos (positional) or keyword kw, or NULL; a refusal of keywords
 * not in ok (NULL-terminated), 0 or TY_EINVAL; a refusal, unless ok, of v
 * as "what needs kind, not <v's kind>", 0 or TY_EINVAL. */
json_t *tmpl_arg(json_t **args, char **names, size_t nargs, size_t pos, const char *kw);
int tmpl_check_kw(tmpl_render_t *r, const node_t *at, const char *what, char **names, size_t nargs,
                  const char *const *ok);
int tmpl_need(tmpl_render_t *r, const node_t *at, const char *what, json_t *v, int ok,
              const char *kind);

/* String operations (chat_template_strings.c). v is a JSON string; results
 * are new references. tmpl_str_strip: chars (a string of code points, or
 * NULL for whitespace) off the left and/or right. tmpl_str_recase: mode 'u'
 * upper, 'l' lower, 'c' capitalize (the first letter), 't' title, on ASCII
 * letters. tmpl_str_replace: Python's str.replace (count may be NULL).
 * tmpl_str_split: Python's str.split (sep, maxsplit may be NULL).
 * tmpl_str_affix: *res = v starts (end 0) or ends (end 1) with x, or with one
 * of a list x. tmpl_items_of: a dict's [key, value] pairs. */
json_t *tmpl_str_of(const char *s, size_t n);
size_t tmpl_last_cp_len(const char *s, size_t n);
json_t *tmpl_str_strip(json_t *v, json_t *chars, int left, int right);
json_t *tmpl_str_recase(json_t *v, int mode);
int tmpl_str_replace(tmpl_render_t *r, const node_t *at, json_t *v, json_t *old, json_t *new_,
                     json_t *count, json_t **out);
int tmpl_str_split(tmpl_render_t *r, const node_t *at, json_t *v, json_t *sep, json_t *maxsplit,
                   json_t **out);
int tmpl_str_affix(tmpl_render_t *r, const node_t *at, json_t *v, json_t *x, int end, int *res);
json_t *tmpl_items_of(json_t *v);

/* Records the first error of the render, "chat template line N: ...", and
 * returns code. */
int tmpl_fail(tmpl_render_t *r, const node_t *at, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Marks obj (a JSON object made by namespace()) as one whose attributes
 * {% set ns.x = ... %} may assign; 0, or TY_EEXHAUSTED past
 * TMPL_MAX_NAMESPACES. */
int tmpl_namespace_add(tmpl_render_t *r, const node_t *at, json_t *obj);
#define TMPL_MAX_NAMESPACES 1000
/* Counts bytes against the render's value limit; 0 or TY_EEXHAUSTED. */
int tmpl_charge(tmpl_render_t *r, const node_t *at, size_t bytes);
/* What a list item costs against that limit: about a jansson value's size. */
#define TMPL_ITEM_COST 64
/* Jinja ==: numbers by value (1 == 1.0), strings by bytes, lists and dicts
 * item by item, each item compared charged. 1 equal, 0 not, or a negative
 * code when the limit is passed. */
int tmpl_equal(tmpl_render_t *r, const node_t *at, const json_t *a, const json_t *b);

/* ---- values (chat_template_value.c) ---- */

typedef struct {
  char *p;
  size_t len, cap;
} tmpl_buf_t;

void tmpl_buf_add(tmpl_buf_t *b, const char *s, size_t n);
void tmpl_buf_adds(tmpl_buf_t *b, const char *s);

/* Jinja truth: false for undefined, none, false, 0, 0.0, "", [] and {}. */
int tmpl_truthy(const json_t *v);
/* v as {{ v }} prints it, appended to b. */
void tmpl_value_str(tmpl_buf_t *b, const json_t *v);
/* v as JSON the way @huggingface/jinja's tojson writes it: ", " and ": "
 * separators without indent, "," and ": " and newlines with indent > 0. */
void tmpl_value_json(tmpl_buf_t *b, const json_t *v, int indent, int depth);
/* A JavaScript Number's text (shortest round trip, 1e+21, 1.5e-7). */
void tmpl_number_js(tmpl_buf_t *b, double d);
/* A JSON string of b's bytes. */
json_t *tmpl_string_take(tmpl_buf_t *b);
/* "undefined", "none", "a string", "an integer", ... for messages. */
const char *tmpl_kind(const json_t *v);
/* A new list of the characters (code points) of the string s. */
json_t *tmpl_chars(const json_t *s);
/* Code points of a UTF-8 string. */
size_t tmpl_utf8_len(const char *s, size_t n);

/* ---- the render (chat_template_render.c, chat_template_eval.c) ---- */

/* A variable binding of a frame. */
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
  unsigned long long made; /* work: bytes of strings and list items made, items compared */
  int depth;
  char *err;
  size_t errlen;
  int failed;
};

/* Evaluates expression n into *out (a new reference; NULL for undefined).
 * 0, or a TY_E* code with the error recorded (chat_template_eval.c). */
int tmpl_eval(tmpl_render_t *r, const node_t *n, json_t **out);
/* A new reference to the variable name: the innermost frame's binding, else
 * the context's, else NULL (chat_template_render.c). */
json_t *tmpl_var_get(const tmpl_render_t *r, const char *name);

#endif
