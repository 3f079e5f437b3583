/* pt_pickle.c - the restricted unpickler's machine: a stack machine over
 * plain values (None, bool, int, float, str, tuple, list, dict) that runs
 * only the opcodes a state dict uses, and hands GLOBAL, BINPERSID, REDUCE
 * and BUILD to pt_torch.c, which allows only torch's state-dict names.
 * Every other opcode is refused by name; nothing is ever called. Every
 * value lives in one list owned by the machine and is freed with it, so
 * shared references (the memo) need no counting; nothing recurses. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "worker/ckpt/pt_pickle_internal.h"

pv_t *pv_new(um_t *u, pv_kind_t kind) {
  pv_t *v = xcalloc(1, sizeof *v);
  v->kind = kind;
  v->next_alloc = u->all;
  u->all = v;
  return v;
}

static void pv_append(pv_t *c, pv_t *v) {
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 8;
    c->items = xrealloc(c->items, c->cap * sizeof *c->items);
  }
  c->items[c->n++] = v;
}

const char *pv_kind_name(const pv_t *v) {
  static const char *names[] = {"None", "bool", "int",    "float",   "str",   "tuple",
                                "list", "dict", "global", "storage", "tensor"};
  return names[v->kind];
}

int um_fail(um_t *u, int code, const char *fmt, ...) {
  char what[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return ty_errf(u->err, u->errlen, code, "data.pkl byte %zu: %s", u->op_at, what);
}

int um_push(um_t *u, pv_t *v) {
  if (u->sp == u->scap) {
    u->scap = u->scap ? u->scap * 2 : 64;
    u->stack = xrealloc(u->stack, u->scap * sizeof *u->stack);
  }
  u->stack[u->sp++] = v;
  return 0;
}

/* Pops one value above the last mark into *v. */
int um_pop(um_t *u, pv_t **v) {
  size_t floor = u->nmarks ? u->marks[u->nmarks - 1] : 0;
  if (u->sp <= floor) return um_fail(u, TY_EINVAL, "stack underflow: damaged pickle");
  *v = u->stack[--u->sp];
  return 0;
}

/* The values since the last mark: [*first, sp), and pops the mark. */
static int pop_mark(um_t *u, size_t *first) {
  if (!u->nmarks) return um_fail(u, TY_EINVAL, "no MARK to pop: damaged pickle");
  *first = u->marks[--u->nmarks];
  if (*first > u->sp) return um_fail(u, TY_EINVAL, "a MARK above the stack: damaged pickle");
  return 0;
}

/* Whether k values lie above the last mark. */
static bool above_mark(const um_t *u, size_t k) {
  size_t floor = u->nmarks ? u->marks[u->nmarks - 1] : 0;
  return u->sp >= floor + k;
}

static int need(um_t *u, size_t k) {
  if (u->n - u->at < k) return um_fail(u, TY_EINVAL, "truncated pickle");
  return 0;
}

static uint64_t rd_le(const uint8_t *p, int k) {
  uint64_t x = 0;
  for (int i = k - 1; i >= 0; i--) x = x << 8 | p[i];
  return x;
}

static int memo_put(um_t *u, size_t idx) {
  if (!u->sp) return um_fail(u, TY_EINVAL, "memo put on an empty stack");
  /* A pickler numbers its memo from 0, one entry per PUT: an index past the
   * pickle's length is a lie that would only cost memory. */
  if (idx > u->n) return um_fail(u, TY_EINVAL, "memo index out of range: damaged pickle");
  if (idx >= u->nmemo) {
    u->memo = xrealloc(u->memo, (idx + 1) * sizeof *u->memo);
    memset(u->memo + u->nmemo, 0, (idx + 1 - u->nmemo) * sizeof *u->memo);
    u->nmemo = idx + 1;
  }
  u->memo[idx] = u->stack[u->sp - 1];
  return 0;
}

static int memo_get(um_t *u, size_t idx) {
  if (idx >= u->nmemo || !u->memo[idx])
    return um_fail(u, TY_EINVAL, "memo get of an unset entry: damaged pickle");
  return um_push(u, u->memo[idx]);
}

static int push_str(um_t *u, size_t len) {
  if (need(u, len)) return TY_EINVAL;
  if (memchr(u->p + u->at, 0, len)) return um_fail(u, TY_EINVAL, "a string holds a NUL byte");
  pv_t *v = pv_new(u, PV_STR);
  v->s = xmalloc(len + 1);
  memcpy(v->s, u->p + u->at, len);
  v->s[len] = 0;
  u->at += len;
  return um_push(u, v);
}

static int setitems(um_t *u, size_t first) {
  if (first == 0 || (u->sp - first) % 2)
    return um_fail(u, TY_EINVAL, "SETITEMS without a dict or with an odd count");
  pv_t *d = u->stack[first - 1];
  if (d->kind != PV_DICT) return um_fail(u, TY_EINVAL, "SETITEM(S) on a %s", pv_kind_name(d));
  for (size_t i = first; i < u->sp; i++) pv_append(d, u->stack[i]);
  u->sp = first;
  return 0;
}

static int appends(um_t *u, size_t first) {
  if (first == 0) return um_fail(u, TY_EINVAL, "APPEND(S) without a list");
  pv_t *l = u->stack[first - 1];
  if (l->kind != PV_LIST) return um_fail(u, TY_EINVAL, "APPEND(S) on a %s", pv_kind_name(l));
  for (size_t i = first; i < u->sp; i++) pv_append(l, u->stack[i]);
  u->sp = first;
  return 0;
}

/* Collects [first, sp) into a new container of kind k. */
static int collect(um_t *u, size_t first, pv_kind_t k) {
  pv_t *c = pv_new(u, k);
  for (size_t i = first; i < u->sp; i++) pv_append(c, u->stack[i]);
  u->sp = first;
  if (k == PV_DICT && c->n % 2) return um_fail(u, TY_EINVAL, "DICT with an odd count");
  return um_push(u, c);
}

static int push_mark(um_t *u) {
  if (u->nmarks == u->mcap) {
    u->mcap = u->mcap ? u->mcap * 2 : 16;
    u->marks = xrealloc(u->marks, u->mcap * sizeof *u->marks);
  }
  u->marks[u->nmarks++] = u->sp;
  return 0;
}

static const char *refused_name(uint8_t op) {
  static const struct {
    uint8_t op;
    const char *name;
  } names[] = {{'i', "INST"},         {'o', "OBJ"},
               {0x81, "NEWOBJ"},      {0x92, "NEWOBJ_EX"},
               {0x82, "EXT1"},        {0x83, "EXT2"},
               {0x84, "EXT4"},        {'P', "PERSID"},
               {'I', "INT"},          {'L', "LONG"},
               {0x8b, "LONG4"},       {'S', "STRING"},
               {'V', "UNICODE"},      {'F', "FLOAT"},
               {'g', "GET"},          {'p', "PUT"},
               {'T', "BINSTRING"},    {'U', "SHORT_BINSTRING"},
               {'B', "BINBYTES"},     {'C', "SHORT_BINBYTES"},
               {0x8e, "BINBYTES8"},   {0x96, "BYTEARRAY8"},
               {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"},
               {0x8f, "EMPTY_SET"},   {0x90, "ADDITEMS"},
               {0x91, "FROZENSET"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].op == op) return names[i].name;
  return "unknown";
}

/* One opcode at u->at. Returns 0, 1 at STOP, or an error. */
static int step(um_t *u) {
  u->op_at = u->at;
  if (need(u, 1)) return TY_EINVAL;
  uint8_t op = u->p[u->at++];
  pv_t *v, *w;
  size_t first;
  int rc = 0;
  switch (op) {
    case 0x80: /* PROTO */
      if (need(u, 1)) return TY_EINVAL;
      if (u->p[u->at] > 5) return um_fail(u, TY_EINVAL, "pickle protocol above 5");
      u->at++;
      return 0;
    case 0x95: /* FRAME: a length hint, the opcodes follow inline */
      if (need(u, 8)) return TY_EINVAL;
      u->at += 8;
      return 0;
    case '.':
      return 1;
    case '(':
      return push_mark(u);
    case '0':
      return um_pop(u, &v);
    case '1':
      if ((rc = pop_mark(u, &first))) return rc;
      u->sp = first;
      return 0;
    case '2':
      if (!u->sp) return um_fail(u, TY_EINVAL, "DUP on an empty stack");
      return um_push(u, u->stack[u->sp - 1]);
    case 'N':
      return um_push(u, pv_new(u, PV_NONE));
    case 0x88:
    case 0x89:
      v = pv_new(u, PV_BOOL);
      v->i = op == 0x88;
      return um_push(u, v);
    case 'J':
    case 'K':
    case 'M': {
      int k = op == 'J' ? 4 : op == 'K' ? 1 : 2;
      if (need(u, (size_t)k)) return TY_EINVAL;
      v = pv_new(u, PV_INT);
      uint64_t x = rd_le(u->p + u->at, k);
      v->i = k == 4 ? (int64_t)(int32_t)(uint32_t)x : (int64_t)x;
      u->at += (size_t)k;
      return um_push(u, v);
    }
    case 0x8a: { /* LONG1: little-endian two's complement, up to 8 bytes */
      if (need(u, 1)) return TY_EINVAL;
      size_t k = u->p[u->at++];
      if (k > 8) return um_fail(u, TY_EINVAL, "an integer wider than 64 bits");
      if (need(u, k)) return TY_EINVAL;
      uint64_t x = k ? rd_le(u->p + u->at, (int)k) : 0;
      if (k && k < 8 && (u->p[u->at + k - 1] & 0x80)) x |= ~0ull << (8 * k);
      v = pv_new(u, PV_INT);
      v->i = (int64_t)x;
      u->at += k;
      return um_push(u, v);
    }
    case 'G':
      if (need(u, 8)) return TY_EINVAL;
      u->at += 8; /* a float's value is never needed */
      return um_push(u, pv_new(u, PV_FLOAT));
    case 'X':
    case 0x8c:
    case 0x8d: {
      int k = op == 'X' ? 4 : op == 0x8c ? 1 : 8;
      if (need(u, (size_t)k)) return TY_EINVAL;
      uint64_t len = rd_le(u->p + u->at, k);
      u->at += (size_t)k;
      if (len > u->n - u->at) return um_fail(u, TY_EINVAL, "truncated pickle");
      return push_str(u, (size_t)len);
    }
    case ')':
      return um_push(u, pv_new(u, PV_TUPLE));
    case 't':
      if ((rc = pop_mark(u, &first))) return rc;
      return collect(u, first, PV_TUPLE);
    case 0x85:
    case 0x86:
    case 0x87: {
      size_t k = (size_t)(op - 0x84);
      if (!above_mark(u, k)) return um_fail(u, TY_EINVAL, "stack underflow: damaged pickle");
      return collect(u, u->sp - k, PV_TUPLE);
    }
    case ']':
      return um_push(u, pv_new(u, PV_LIST));
    case 'l':
      if ((rc = pop_mark(u, &first))) return rc;
      return collect(u, first, PV_LIST);
    case 'a':
      if (!above_mark(u, 2)) return um_fail(u, TY_EINVAL, "APPEND on a short stack");
      return appends(u, u->sp - 1);
    case 'e':
      if ((rc = pop_mark(u, &first))) return rc;
      return appends(u, first);
    case '}':
      return um_push(u, pv_new(u, PV_DICT));
    case 'd':
      if ((rc = pop_mark(u, &first))) return rc;
      return collect(u, first, PV_DICT);
    case 's':
      if (!above_mark(u, 3)) return um_fail(u, TY_EINVAL, "SETITEM on a short stack");
      return setitems(u, u->sp - 2);
    case 'u':
      if ((rc = pop_mark(u, &first))) return rc;
      return setitems(u, first);
    case 'h':
    case 'j': {
      size_t k = op == 'h' ? 1 : 4;
      if (need(u, k)) return TY_EINVAL;
      size_t idx = (size_t)rd_le(u->p + u->at, (int)k);
      u->at += k;
      return memo_get(u, idx);
    }
    case 'q':
    case 'r': {
      size_t k = op == 'q' ? 1 : 4;
      if (need(u, k)) return TY_EINVAL;
      size_t idx = (size_t)rd_le(u->p + u->at, (int)k);
      u->at += k;
      return memo_put(u, idx);
    }
    case 0x94:
      return memo_put(u, u->nmemo);
    case 'c': {
      const uint8_t *a = u->p + u->at, *end = u->p + u->n;
      const uint8_t *nl1 = memchr(a, '\n', (size_t)(end - a));
      const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
      if (!nl2 || nl1 - a > 256 || nl2 - nl1 > 257)
        return um_fail(u, TY_EINVAL, "a GLOBAL without two short lines");
      char module[260], name[260];
      snprintf(module, sizeof module, "%.*s", (int)(nl1 - a), (const char *)a);
      snprintf(name, sizeof name, "%.*s", (int)(nl2 - nl1 - 1), (const char *)nl1 + 1);
      u->at = (size_t)(nl2 + 1 - u->p);
      return pt_torch_global(u, module, name);
    }
    case 0x93: /* STACK_GLOBAL */
      if ((rc = um_pop(u, &w)) || (rc = um_pop(u, &v))) return rc;
      if (v->kind != PV_STR || w->kind != PV_STR)
        return um_fail(u, TY_EINVAL, "STACK_GLOBAL of non-strings");
      return pt_torch_global(u, v->s, w->s);
    case 'Q':
      if ((rc = um_pop(u, &v))) return rc;
      return pt_torch_persistent(u, v);
    case 'R':
      return pt_torch_reduce(u);
    case 'b':
      return pt_torch_build(u);
    default: {
      char what[64];
      snprintf(what, sizeof what, "%s (0x%02x)", refused_name(op), op);
      return um_fail(u, TY_EPERM, "opcode %s is not one a state dict uses: refused", what);
    }
  }
}

int pt_pickle_load(const uint8_t *p, size_t n, pt_dict_t *d, char *err, size_t errlen) {
  d->tensors = NULL;
  d->n = 0;
  um_t u = {.p = p, .n = n, .err = err, .errlen = errlen};
  int rc = 0;
  while (!rc) rc = step(&u);
  if (rc == 1) {
    pv_t *root = NULL;
    rc = u.sp == 1 && !u.nmarks ? 0
                                : ty_errf(err, errlen, TY_EINVAL,
                                          "data.pkl: STOP with %zu values on the stack (one is "
                                          "a state dict): damaged pickle",
                                          u.sp);
    if (!rc) root = u.stack[0];
    if (!rc) rc = pt_torch_result(&u, root, d);
  }
  for (pv_t *v = u.all, *next; v; v = next) {
    next = v->next_alloc;
    free(v->s);
    free(v->items);
    free(v);
  }
  free(u.stack);
  free(u.marks);
  free(u.memo);
  free(u.storages);
  if (rc) pt_dict_free(d);
  return rc;
}
