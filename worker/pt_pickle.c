/* pt_pickle.c - the restricted unpickler of a PyTorch state dict. It is a
 * stack machine over plain values (None, bool, int, float, str, tuple,
 * list, dict) plus three kinds of its own: an allowed global, a storage
 * (from a persistent id) and a tensor (from _rebuild_tensor_v2). Every
 * opcode and global it does not know is refused by name; nothing is ever
 * called. Every value lives in one list owned by the machine and is freed
 * with it, so shared references (the memo) need no counting. */
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"
#include "common/xalloc.h"
#include "worker/pytorch.h"

typedef enum {
  PV_NONE,
  PV_BOOL,
  PV_INT,
  PV_FLOAT,
  PV_STR,
  PV_TUPLE,
  PV_LIST,
  PV_DICT, /* items hold key, value, key, value, ... */
  PV_GLOBAL,
  PV_STORAGE,
  PV_TENSOR,
} pv_kind_t;

/* The globals a state dict may name: everything else is refused. */
typedef enum { G_ODICT, G_REBUILD_TENSOR, G_REBUILD_PARAM, G_STORAGE, G_DTYPE } global_t;

static const struct {
  const char *module, *name;
  global_t kind;
  ty_dtype_t dtype;
} k_globals[] = {
    {"collections", "OrderedDict", G_ODICT, TY_DTYPE_F32},
    {"torch._utils", "_rebuild_tensor_v2", G_REBUILD_TENSOR, TY_DTYPE_F32},
    {"torch._utils", "_rebuild_parameter", G_REBUILD_PARAM, TY_DTYPE_F32},
    {"torch", "FloatStorage", G_STORAGE, TY_DTYPE_F32},
    {"torch", "HalfStorage", G_STORAGE, TY_DTYPE_F16},
    {"torch", "BFloat16Storage", G_STORAGE, TY_DTYPE_BF16},
    {"torch", "float32", G_DTYPE, TY_DTYPE_F32},
    {"torch", "float16", G_DTYPE, TY_DTYPE_F16},
    {"torch", "bfloat16", G_DTYPE, TY_DTYPE_BF16},
};

typedef struct pv pv_t;
struct pv {
  pv_kind_t kind;
  pv_t *next_alloc; /* the machine's list of every value */
  int64_t i;        /* BOOL, INT; GLOBAL: index into k_globals */
  char *s;          /* STR (NUL-terminated; strings with NUL are refused) */
  pv_t **items;     /* TUPLE, LIST, DICT */
  size_t n, cap;
  /* STORAGE: dtype, key (s), numel (i). TENSOR: */
  ty_dtype_t dtype;
  pv_t *storage;
  int64_t offset;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
};

typedef struct {
  const uint8_t *p;
  size_t n, at, op_at;
  pv_t *all;
  pv_t **stack;
  size_t sp, scap;
  size_t *marks;
  size_t nmarks, mcap;
  pv_t **memo;
  size_t nmemo;
  pv_t **storages;         /* open-addressed by key: one value per storage */
  size_t nstorages, stcap; /* stcap: a power of two, or 0 */
  char *err;
  size_t errlen;
} um_t;

static pv_t *pv_new(um_t *u, pv_kind_t kind) {
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

static const char *kind_name(const pv_t *v) {
  static const char *names[] = {"None", "bool", "int",    "float",   "str",   "tuple",
                                "list", "dict", "global", "storage", "tensor"};
  return names[v->kind];
}

__attribute__((format(printf, 3, 4))) static int fail(um_t *u, int code, const char *fmt, ...) {
  char what[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return ty_errf(u->err, u->errlen, code, "data.pkl byte %zu: %s", u->op_at, what);
}

static int push(um_t *u, pv_t *v) {
  if (u->sp == u->scap) {
    u->scap = u->scap ? u->scap * 2 : 64;
    u->stack = xrealloc(u->stack, u->scap * sizeof *u->stack);
  }
  u->stack[u->sp++] = v;
  return 0;
}

/* Pops one value above the last mark into *v. */
static int pop(um_t *u, pv_t **v) {
  size_t floor = u->nmarks ? u->marks[u->nmarks - 1] : 0;
  if (u->sp <= floor) return fail(u, TY_EINVAL, "stack underflow: damaged pickle");
  *v = u->stack[--u->sp];
  return 0;
}

/* The values since the last mark: [*first, sp), and pops the mark. */
static int pop_mark(um_t *u, size_t *first) {
  if (!u->nmarks) return fail(u, TY_EINVAL, "no MARK to pop: damaged pickle");
  *first = u->marks[--u->nmarks];
  if (*first > u->sp) return fail(u, TY_EINVAL, "a MARK above the stack: damaged pickle");
  return 0;
}

/* Whether k values lie above the last mark. */
static bool above_mark(const um_t *u, size_t k) {
  size_t floor = u->nmarks ? u->marks[u->nmarks - 1] : 0;
  return u->sp >= floor + k;
}

static int need(um_t *u, size_t k) {
  if (u->n - u->at < k) return fail(u, TY_EINVAL, "truncated pickle");
  return 0;
}

static uint64_t rd_le(const uint8_t *p, int k) {
  uint64_t x = 0;
  for (int i = k - 1; i >= 0; i--) x = x << 8 | p[i];
  return x;
}

static int memo_put(um_t *u, size_t idx) {
  if (!u->sp) return fail(u, TY_EINVAL, "memo put on an empty stack");
  /* A pickler numbers its memo from 0, one entry per PUT: an index past the
   * pickle's length is a lie that would only cost memory. */
  if (idx > u->n) return fail(u, TY_EINVAL, "memo index out of range: damaged pickle");
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
    return fail(u, TY_EINVAL, "memo get of an unset entry: damaged pickle");
  return push(u, u->memo[idx]);
}

static int push_str(um_t *u, size_t len) {
  if (need(u, len)) return TY_EINVAL;
  if (memchr(u->p + u->at, 0, len)) return fail(u, TY_EINVAL, "a string holds a NUL byte");
  pv_t *v = pv_new(u, PV_STR);
  v->s = xmalloc(len + 1);
  memcpy(v->s, u->p + u->at, len);
  v->s[len] = 0;
  u->at += len;
  return push(u, v);
}

/* GLOBAL / STACK_GLOBAL: only the table's names; the message says why. */
static int push_global(um_t *u, const char *module, const char *name) {
  for (size_t g = 0; g < sizeof k_globals / sizeof k_globals[0]; g++)
    if (!strcmp(module, k_globals[g].module) && !strcmp(name, k_globals[g].name)) {
      pv_t *v = pv_new(u, PV_GLOBAL);
      v->i = (int64_t)g;
      return push(u, v);
    }
  size_t nl = strlen(name);
  if (!strcmp(module, "torch") && nl > 7 && !strcmp(name + nl - 7, "Storage"))
    return fail(u, TY_EUNIMPLEMENTED,
                "storage type torch.%s is not read: trainyard reads float32, float16 and "
                "bfloat16 tensors; save the state dict after model.to(torch.float32)",
                name);
  char full[300];
  snprintf(full, sizeof full, "%.140s.%.140s", module, name);
  return fail(u, TY_EPERM,
              "global %s is refused: a state dict's pickle names only collections.OrderedDict, "
              "torch._utils._rebuild_tensor_v2 and _rebuild_parameter, torch storage types and "
              "dtypes (this file would run code under torch.load; nothing of it was run)",
              full);
}

static bool is_global(const pv_t *v, global_t g) {
  return v->kind == PV_GLOBAL && k_globals[v->i].kind == g;
}

static bool empty_dict(const pv_t *v) {
  return v->kind == PV_DICT && v->n == 0;
}

static size_t str_hash(const char *s) {
  uint64_t h = 14695981039346656037ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)h;
}

/* BINPERSID: ('storage', <Storage type>, key, location, numel). */
static int persistent_load(um_t *u, pv_t *pid) {
  if (pid->kind != PV_TUPLE || pid->n != 5 || pid->items[0]->kind != PV_STR ||
      strcmp(pid->items[0]->s, "storage") || !is_global(pid->items[1], G_STORAGE) ||
      pid->items[2]->kind != PV_STR || pid->items[3]->kind != PV_STR ||
      pid->items[4]->kind != PV_INT || pid->items[4]->i < 0)
    return fail(u, TY_EINVAL,
                "a persistent id that is not ('storage', torch.<T>Storage, key, location, numel)");
  ty_dtype_t dt = k_globals[pid->items[1]->i].dtype;
  const char *key = pid->items[2]->s;
  if (2 * (u->nstorages + 1) > u->stcap) { /* grow, keeping the table half empty */
    size_t cap = u->stcap ? u->stcap * 2 : 64;
    pv_t **t = xcalloc(cap, sizeof *t);
    for (size_t i = 0; i < u->stcap; i++) {
      if (!u->storages[i]) continue;
      size_t h = str_hash(u->storages[i]->s) & (cap - 1);
      while (t[h]) h = (h + 1) & (cap - 1);
      t[h] = u->storages[i];
    }
    free(u->storages);
    u->storages = t;
    u->stcap = cap;
  }
  size_t h = str_hash(key) & (u->stcap - 1);
  for (; u->storages[h]; h = (h + 1) & (u->stcap - 1)) {
    pv_t *s = u->storages[h];
    if (strcmp(s->s, key)) continue;
    if (s->dtype != dt || s->i != pid->items[4]->i)
      return fail(u, TY_EINVAL, "storage '%s' is named twice with different types or sizes", key);
    return push(u, s);
  }
  pv_t *s = pv_new(u, PV_STORAGE);
  s->s = xstrdup(key);
  s->dtype = dt;
  s->i = pid->items[4]->i;
  u->storages[h] = s;
  u->nstorages++;
  return push(u, s);
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
 * backward_hooks[, metadata]): a contiguous view inside its storage. */
static int rebuild_tensor(um_t *u, pv_t *a, pv_t **out) {
  if (a->n < 6 || a->n > 7 || a->items[0]->kind != PV_STORAGE || a->items[1]->kind != PV_INT ||
      a->items[2]->kind != PV_TUPLE || a->items[3]->kind != PV_TUPLE ||
      a->items[4]->kind != PV_BOOL || !empty_dict(a->items[5]) ||
      (a->n == 7 && !empty_dict(a->items[6])))
    return fail(u, TY_EINVAL,
                "_rebuild_tensor_v2 with arguments other than (storage, offset, size, stride, "
                "requires_grad, {} [, {}]): tensor hooks and metadata are not read");
  pv_t *size = a->items[2], *stride = a->items[3], *st = a->items[0];
  if (size->n > ST_MAX_DIMS || stride->n != size->n)
    return fail(u, TY_EINVAL, "a tensor with more than 8 dimensions, or strides not matching them");
  pv_t *t = pv_new(u, PV_TENSOR);
  t->storage = st;
  t->dtype = st->dtype;
  t->offset = a->items[1]->i;
  t->ndim = (int)size->n;
  uint64_t nelem = 1;
  for (int d = 0; d < t->ndim; d++) {
    pv_t *s = size->items[d];
    if (s->kind != PV_INT || s->i < 0 || s->i > (1ll << 50) || stride->items[d]->kind != PV_INT)
      return fail(u, TY_EINVAL, "a tensor size or stride is not a whole number in [0, 2^50]");
    t->shape[d] = s->i;
    if (s->i && nelem > (1ull << 50) / (uint64_t)s->i)
      return fail(u, TY_EINVAL, "a tensor with more than 2^50 elements");
    nelem *= (uint64_t)s->i;
  }
  /* Contiguous: each stride is the product of the later sizes (a dimension
   * of size 1 may have any stride, as torch allows). */
  int64_t want = 1;
  for (int d = t->ndim - 1; d >= 0 && nelem; d--) {
    if (t->shape[d] != 1 && stride->items[d]->i != want)
      return fail(u, TY_EUNIMPLEMENTED,
                  "a tensor of storage '%s' is not contiguous (a transposed or strided view); "
                  "save it with .contiguous() or .clone() first",
                  st->s);
    want *= t->shape[d];
  }
  if (t->offset < 0 || (uint64_t)t->offset > (uint64_t)st->i ||
      nelem > (uint64_t)st->i - (uint64_t)t->offset)
    return fail(u, TY_EINVAL, "a tensor of storage '%s' lies outside it (offset + size > numel)",
                st->s);
  t->i = (int64_t)nelem;
  *out = t;
  return 0;
}

/* REDUCE: the three callables a state dict uses, on the arguments they
 * take; anything else is refused by name. */
static int reduce(um_t *u) {
  pv_t *args = NULL, *fn = NULL, *res = NULL;
  int rc = pop(u, &args);
  if (!rc) rc = pop(u, &fn);
  if (rc) return rc;
  if (args->kind != PV_TUPLE) return fail(u, TY_EINVAL, "REDUCE with non-tuple arguments");
  if (is_global(fn, G_ODICT) && args->n == 0) {
    res = pv_new(u, PV_DICT);
  } else if (is_global(fn, G_REBUILD_TENSOR)) {
    if ((rc = rebuild_tensor(u, args, &res))) return rc;
  } else if (is_global(fn, G_REBUILD_PARAM) && args->n == 3 && args->items[0]->kind == PV_TENSOR &&
             args->items[1]->kind == PV_BOOL && empty_dict(args->items[2])) {
    res = args->items[0];
  } else {
    char what[300];
    if (fn->kind == PV_GLOBAL)
      snprintf(what, sizeof what, "%s.%s", k_globals[fn->i].module, k_globals[fn->i].name);
    else
      snprintf(what, sizeof what, "a %s", kind_name(fn));
    return fail(u, TY_EPERM,
                "REDUCE of %s (with these arguments) is refused: a state dict only calls "
                "collections.OrderedDict(), torch._utils._rebuild_tensor_v2 and "
                "_rebuild_parameter (nothing was run)",
                what);
  }
  return push(u, res);
}

static int build(um_t *u) {
  pv_t *state, *obj;
  int rc = pop(u, &state);
  if (!rc && !u->sp) rc = fail(u, TY_EINVAL, "BUILD on an empty stack");
  if (rc) return rc;
  obj = u->stack[u->sp - 1];
  /* An OrderedDict's instance attributes (a state dict's _metadata) are
   * set by BUILD; they carry no tensor and are dropped. */
  if (obj->kind == PV_DICT && (state->kind == PV_DICT || state->kind == PV_NONE)) return 0;
  return fail(u, TY_EPERM, "BUILD on a %s is refused: a state dict only sets a dict's attributes",
              kind_name(obj));
}

static int setitems(um_t *u, size_t first) {
  if (first == 0 || (u->sp - first) % 2)
    return fail(u, TY_EINVAL, "SETITEMS without a dict or with an odd count");
  pv_t *d = u->stack[first - 1];
  if (d->kind != PV_DICT) return fail(u, TY_EINVAL, "SETITEM(S) on a %s", kind_name(d));
  for (size_t i = first; i < u->sp; i++) pv_append(d, u->stack[i]);
  u->sp = first;
  return 0;
}

static int appends(um_t *u, size_t first) {
  if (first == 0) return fail(u, TY_EINVAL, "APPEND(S) without a list");
  pv_t *l = u->stack[first - 1];
  if (l->kind != PV_LIST) return fail(u, TY_EINVAL, "APPEND(S) on a %s", kind_name(l));
  for (size_t i = first; i < u->sp; i++) pv_append(l, u->stack[i]);
  u->sp = first;
  return 0;
}

/* Collects [first, sp) into a new container of kind k. */
static int collect(um_t *u, size_t first, pv_kind_t k) {
  pv_t *c = pv_new(u, k);
  for (size_t i = first; i < u->sp; i++) pv_append(c, u->stack[i]);
  u->sp = first;
  if (k == PV_DICT && c->n % 2) return fail(u, TY_EINVAL, "DICT with an odd count");
  return push(u, c);
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
      if (u->p[u->at] > 5) return fail(u, TY_EINVAL, "pickle protocol above 5");
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
      return pop(u, &v);
    case '1':
      if ((rc = pop_mark(u, &first))) return rc;
      u->sp = first;
      return 0;
    case '2':
      if (!u->sp) return fail(u, TY_EINVAL, "DUP on an empty stack");
      return push(u, u->stack[u->sp - 1]);
    case 'N':
      return push(u, pv_new(u, PV_NONE));
    case 0x88:
    case 0x89:
      v = pv_new(u, PV_BOOL);
      v->i = op == 0x88;
      return push(u, v);
    case 'J':
    case 'K':
    case 'M': {
      int k = op == 'J' ? 4 : op == 'K' ? 1 : 2;
      if (need(u, (size_t)k)) return TY_EINVAL;
      v = pv_new(u, PV_INT);
      uint64_t x = rd_le(u->p + u->at, k);
      v->i = k == 4 ? (int64_t)(int32_t)(uint32_t)x : (int64_t)x;
      u->at += (size_t)k;
      return push(u, v);
    }
    case 0x8a: { /* LONG1: little-endian two's complement, up to 8 bytes */
      if (need(u, 1)) return TY_EINVAL;
      size_t k = u->p[u->at++];
      if (k > 8) return fail(u, TY_EINVAL, "an integer wider than 64 bits");
      if (need(u, k)) return TY_EINVAL;
      uint64_t x = k ? rd_le(u->p + u->at, (int)k) : 0;
      if (k && k < 8 && (u->p[u->at + k - 1] & 0x80)) x |= ~0ull << (8 * k);
      v = pv_new(u, PV_INT);
      v->i = (int64_t)x;
      u->at += k;
      return push(u, v);
    }
    case 'G':
      if (need(u, 8)) return TY_EINVAL;
      u->at += 8; /* a float's value is never needed */
      return push(u, pv_new(u, PV_FLOAT));
    case 'X':
    case 0x8c:
    case 0x8d: {
      int k = op == 'X' ? 4 : op == 0x8c ? 1 : 8;
      if (need(u, (size_t)k)) return TY_EINVAL;
      uint64_t len = rd_le(u->p + u->at, k);
      u->at += (size_t)k;
      if (len > u->n - u->at) return fail(u, TY_EINVAL, "truncated pickle");
      return push_str(u, (size_t)len);
    }
    case ')':
      return push(u, pv_new(u, PV_TUPLE));
    case 't':
      if ((rc = pop_mark(u, &first))) return rc;
      return collect(u, first, PV_TUPLE);
    case 0x85:
    case 0x86:
    case 0x87: {
      size_t k = (size_t)(op - 0x84);
      if (!above_mark(u, k)) return fail(u, TY_EINVAL, "stack underflow: damaged pickle");
      return collect(u, u->sp - k, PV_TUPLE);
    }
    case ']':
      return push(u, pv_new(u, PV_LIST));
    case 'l':
      if ((rc = pop_mark(u, &first))) return rc;
      return collect(u, first, PV_LIST);
    case 'a':
      if (!above_mark(u, 2)) return fail(u, TY_EINVAL, "APPEND on a short stack");
      return appends(u, u->sp - 1);
    case 'e':
      if ((rc = pop_mark(u, &first))) return rc;
      return appends(u, first);
    case '}':
      return push(u, pv_new(u, PV_DICT));
    case 'd':
      if ((rc = pop_mark(u, &first))) return rc;
      return collect(u, first, PV_DICT);
    case 's':
      if (!above_mark(u, 3)) return fail(u, TY_EINVAL, "SETITEM on a short stack");
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
        return fail(u, TY_EINVAL, "a GLOBAL without two short lines");
      char module[260], name[260];
      snprintf(module, sizeof module, "%.*s", (int)(nl1 - a), (const char *)a);
      snprintf(name, sizeof name, "%.*s", (int)(nl2 - nl1 - 1), (const char *)nl1 + 1);
      u->at = (size_t)(nl2 + 1 - u->p);
      return push_global(u, module, name);
    }
    case 0x93: /* STACK_GLOBAL */
      if ((rc = pop(u, &w)) || (rc = pop(u, &v))) return rc;
      if (v->kind != PV_STR || w->kind != PV_STR)
        return fail(u, TY_EINVAL, "STACK_GLOBAL of non-strings");
      return push_global(u, v->s, w->s);
    case 'Q':
      if ((rc = pop(u, &v))) return rc;
      return persistent_load(u, v);
    case 'R':
      return reduce(u);
    case 'b':
      return build(u);
    default: {
      char what[64];
      snprintf(what, sizeof what, "%s (0x%02x)", refused_name(op), op);
      return fail(u, TY_EPERM, "opcode %s is not one a state dict uses: refused", what);
    }
  }
}

void pt_dict_free(pt_dict_t *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n; i++) free(d->tensors[i].name), free(d->tensors[i].storage);
  free(d->tensors);
  d->tensors = NULL;
  d->n = 0;
}

/* The state dict inside root: root itself, or the value of a sole
 * "state_dict" / "model" key, unwrapped as often as it is wrapped. */
static const pv_t *unwrap(const pv_t *root) {
  for (int depth = 0;
       depth < 8 && root->n == 2 && root->items[0]->kind == PV_STR &&
       root->items[1]->kind == PV_DICT &&
       (!strcmp(root->items[0]->s, "state_dict") || !strcmp(root->items[0]->s, "model"));
       depth++)
    root = root->items[1];
  return root;
}

static int to_dict(um_t *u, const pv_t *root, pt_dict_t *d) {
  if (root->kind != PV_DICT)
    return ty_errf(u->err, u->errlen, TY_EINVAL,
                   "data.pkl holds a %s, not a state dict (save model.state_dict())",
                   kind_name(root));
  root = unwrap(root);
  d->tensors = xcalloc(root->n / 2 + 1, sizeof *d->tensors);
  for (size_t i = 0; i < root->n; i += 2) {
    const pv_t *k = root->items[i], *v = root->items[i + 1];
    if (k->kind != PV_STR || !k->s[0])
      return ty_errf(u->err, u->errlen, TY_EINVAL,
                     "the state dict has a key that is a %s, not a tensor name", kind_name(k));
    if (v->kind != PV_TENSOR)
      return ty_errf(u->err, u->errlen, TY_EINVAL,
                     "state dict entry '%.200s' is a %s, not a tensor: a checkpoint to load holds "
                     "tensors only (save model.state_dict(), not a training checkpoint with "
                     "other entries)",
                     k->s, kind_name(v));
    pt_tensor_t *t = &d->tensors[d->n++];
    t->name = xstrdup(k->s);
    t->storage = xstrdup(v->storage->s);
    t->dtype = v->dtype;
    t->ndim = v->ndim;
    memcpy(t->shape, v->shape, sizeof t->shape);
    t->nelem = (uint64_t)v->i;
    t->storage_numel = (uint64_t)v->storage->i;
    t->offset = (uint64_t)v->offset;
  }
  return 0;
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
    if (!rc) rc = to_dict(&u, root, d);
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
