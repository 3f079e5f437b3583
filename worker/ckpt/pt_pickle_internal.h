/* pt_pickle_internal.h - what the unpickler's machine (pt_pickle.c) and
 * the torch semantics it allows (pt_torch.c) share: the value model, the
 * machine's state and its stack operations. Not for other modules. */
#ifndef TY_WORKER_PT_PICKLE_INTERNAL_H
#define TY_WORKER_PT_PICKLE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/ckpt/pytorch.h"

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

typedef struct pv pv_t;
struct pv {
  pv_kind_t kind;
  pv_t *next_alloc; /* the machine's list of every value */
  int64_t i;        /* BOOL, INT; GLOBAL: index into pt_torch.c's table */
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

/* A new value of kind k, owned by the machine (freed with it). */
pv_t *pv_new(um_t *u, pv_kind_t kind);
/* "None", "int", "dict", ... for messages. */
const char *pv_kind_name(const pv_t *v);
/* Pushes v; pops the top value above the last mark into *v. */
int um_push(um_t *u, pv_t *v);
int um_pop(um_t *u, pv_t **v);
/* Writes "data.pkl byte N: <message>" into the machine's err; returns code. */
__attribute__((format(printf, 3, 4))) int um_fail(um_t *u, int code, const char *fmt, ...);

/* The torch side (pt_torch.c): GLOBAL and STACK_GLOBAL, BINPERSID, REDUCE
 * and BUILD, each refusing what a state dict does not use; and the state
 * dict from the value STOP leaves. */
int pt_torch_global(um_t *u, const char *module, const char *name);
int pt_torch_persistent(um_t *u, pv_t *pid);
int pt_torch_reduce(um_t *u);
int pt_torch_build(um_t *u);
int pt_torch_result(um_t *u, const pv_t *root, pt_dict_t *d);

#endif
