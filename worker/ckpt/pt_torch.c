/* pt_torch.c - what the unpickler allows of torch: the globals of a state
 * dict, storages from persistent ids, tensors from _rebuild_tensor_v2 (and
 * _rebuild_parameter), OrderedDict() and its attributes; then the state
 * dict itself out of the value STOP leaves. Everything else is refused by
 * name, and nothing is called: each allowed callable is interpreted. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "worker/ckpt/pt_pickle_internal.h"

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

/* GLOBAL / STACK_GLOBAL: only the table's names; the message says why. */
int pt_torch_global(um_t *u, const char *module, const char *name) {
  for (size_t g = 0; g < sizeof k_globals / sizeof k_globals[0]; g++)
    if (!strcmp(module, k_globals[g].module) && !strcmp(name, k_globals[g].name)) {
      pv_t *v = pv_new(u, PV_GLOBAL);
      v->i = (int64_t)g;
      return um_push(u, v);
    }
  size_t nl = strlen(name);
  if (!strcmp(module, "torch") && nl > 7 && !strcmp(name + nl - 7, "Storage"))
    return um_fail(u, TY_EUNIMPLEMENTED,
                   "storage type torch.%s is not read: trainyard reads float32, float16 and "
                   "bfloat16 tensors; save the state dict after model.to(torch.float32)",
                   name);
  char full[300];
  snprintf(full, sizeof full, "%.140s.%.140s", module, name);
  return um_fail(u, TY_EPERM,
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
int pt_torch_persistent(um_t *u, pv_t *pid) {
  if (pid->kind != PV_TUPLE || pid->n != 5 || pid->items[0]->kind != PV_STR ||
      strcmp(pid->items[0]->s, "storage") || !is_global(pid->items[1], G_STORAGE) ||
      pid->items[2]->kind != PV_STR || pid->items[3]->kind != PV_STR ||
      pid->items[4]->kind != PV_INT || pid->items[4]->i < 0)
    return um_fail(
        u, TY_EINVAL,
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
      return um_fail(u, TY_EINVAL, "storage '%s' is named twice with different types or sizes",
                     key);
    return um_push(u, s);
  }
  pv_t *s = pv_new(u, PV_STORAGE);
  s->s = xstrdup(key);
  s->dtype = dt;
  s->i = pid->items[4]->i;
  u->storages[h] = s;
  u->nstorages++;
  return um_push(u, s);
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
 * backward_hooks[, metadata]): a contiguous view inside its storage. */
static int rebuild_tensor(um_t *u, pv_t *a, pv_t **out) {
  if (a->n < 6 || a->n > 7 || a->items[0]->kind != PV_STORAGE || a->items[1]->kind != PV_INT ||
      a->items[2]->kind != PV_TUPLE || a->items[3]->kind != PV_TUPLE ||
      a->items[4]->kind != PV_BOOL || !empty_dict(a->items[5]) ||
      (a->n == 7 && !empty_dict(a->items[6])))
    return um_fail(u, TY_EINVAL,
                   "_rebuild_tensor_v2 with arguments other than (storage, offset, size, stride, "
                   "requires_grad, {} [, {}]): tensor hooks and metadata are not read");
  pv_t *size = a->items[2], *stride = a->items[3], *st = a->items[0];
  if (size->n > ST_MAX_DIMS || stride->n != size->n)
    return um_fail(u, TY_EINVAL,
                   "a tensor with more than 8 dimensions, or strides not matching them");
  pv_t *t = pv_new(u, PV_TENSOR);
  t->storage = st;
  t->dtype = st->dtype;
  t->offset = a->items[1]->i;
  t->ndim = (int)size->n;
  uint64_t nelem = 1;
  for (int d = 0; d < t->ndim; d++) {
    pv_t *s = size->items[d];
    if (s->kind != PV_INT || s->i < 0 || s->i > (1ll << 50) || stride->items[d]->kind != PV_INT)
      return um_fail(u, TY_EINVAL, "a tensor size or stride is not a whole number in [0, 2^50]");
    t->shape[d] = s->i;
    if (s->i && nelem > (1ull << 50) / (uint64_t)s->i)
      return um_fail(u, TY_EINVAL, "a tensor with more than 2^50 elements");
    nelem *= (uint64_t)s->i;
  }
  /* Contiguous: each stride is the product of the later sizes (a dimension
   * of size 1 may have any stride, as torch allows). */
  int64_t want = 1;
  for (int d = t->ndim - 1; d >= 0 && nelem; d--) {
    if (t->shape[d] != 1 && stride->items[d]->i != want)
      return um_fail(u, TY_EUNIMPLEMENTED,
                     "a tensor of storage '%s' is not contiguous (a transposed or strided view); "
                     "save it with .contiguous() or .clone() first",
                     st->s);
    want *= t->shape[d];
  }
  if (t->offset < 0 || (uint64_t)t->offset > (uint64_t)st->i ||
      nelem > (uint64_t)st->i - (uint64_t)t->offset)
    return um_fail(u, TY_EINVAL, "a tensor of storage '%s' lies outside it (offset + size > numel)",
                   st->s);
  t->i = (int64_t)nelem;
  *out = t;
  return 0;
}

/* REDUCE: the three callables a state dict uses, on the arguments they
 * take; anything else is refused by name. */
int pt_torch_reduce(um_t *u) {
  pv_t *args = NULL, *fn = NULL, *res = NULL;
  int rc = um_pop(u, &args);
  if (!rc) rc = um_pop(u, &fn);
  if (rc) return rc;
  if (args->kind != PV_TUPLE) return um_fail(u, TY_EINVAL, "REDUCE with non-tuple arguments");
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
      snprintf(what, sizeof what, "a %s", pv_kind_name(fn));
    return um_fail(u, TY_EPERM,
                   "REDUCE of %s (with these arguments) is refused: a state dict only calls "
                   "collections.OrderedDict(), torch._utils._rebuild_tensor_v2 and "
                   "_rebuild_parameter (nothing was run)",
                   what);
  }
  return um_push(u, res);
}

int pt_torch_build(um_t *u) {
  pv_t *state, *obj;
  int rc = um_pop(u, &state);
  if (!rc && !u->sp) rc = um_fail(u, TY_EINVAL, "BUILD on an empty stack");
  if (rc) return rc;
  obj = u->stack[u->sp - 1];
  /* An OrderedDict's instance attributes (a state dict's _metadata) are
   * set by BUILD; they carry no tensor and are dropped. */
  if (obj->kind == PV_DICT && (state->kind == PV_DICT || state->kind == PV_NONE)) return 0;
  return um_fail(u, TY_EPERM,
                 "BUILD on a %s is refused: a state dict only sets a dict's attributes",
                 pv_kind_name(obj));
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

int pt_torch_result(um_t *u, const pv_t *root, pt_dict_t *d) {
  if (root->kind != PV_DICT)
    return ty_errf(u->err, u->errlen, TY_EINVAL,
                   "data.pkl holds a %s, not a state dict (save model.state_dict())",
                   pv_kind_name(root));
  root = unwrap(root);
  d->tensors = xcalloc(root->n / 2 + 1, sizeof *d->tensors);
  for (size_t i = 0; i < root->n; i += 2) {
    const pv_t *k = root->items[i], *v = root->items[i + 1];
    if (k->kind != PV_STR || !k->s[0])
      return ty_errf(u->err, u->errlen, TY_EINVAL,
                     "the state dict has a key that is a %s, not a tensor name", pv_kind_name(k));
    if (v->kind != PV_TENSOR)
      return ty_errf(u->err, u->errlen, TY_EINVAL,
                     "state dict entry '%.200s' is a %s, not a tensor: a checkpoint to load holds "
                     "tensors only (save model.state_dict(), not a training checkpoint with "
                     "other entries)",
                     k->s, pv_kind_name(v));
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
