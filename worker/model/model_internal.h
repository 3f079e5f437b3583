/* model_internal.h - the activation buffers shared by model.c (allocation)
 * and model_step.c (forward and backward); not for other modules. */
#ifndef TY_WORKER_MODEL_INTERNAL_H
#define TY_WORKER_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/model/model.h"

/* X(field, floats, needed_for): sizes are expressions over the dims d, the
 * allocated rows N = B*T, T, the layer slots LS, residual slots RS and the
 * head's chunk HC (rows of logits it computes at once, model_head_rows);
 * needed_for 0 = always, 1 = only with a backward pass. The shapes below
 * are for training (LS = L, RS = L + 1): the backward pass needs every
 * layer's activations. Forward only (MODEL_EVAL) keeps one layer's (LS = 1)
 * and two residual slots used in turn (RS = 2): layer l then reads slot
 * l % LS and writes residual slot (l + 1) % RS. */
/* clang-format off */
#define MODEL_ACTS(X)                                                      \
  X(res, RS * N * d->C, 0)           /* (L+1, B, T, C) residual stream */  \
  X(ln1, N * LS * d->C, 0)           /* (L, B, T, C) */                    \
  X(rstd1, N * LS, 0)                /* (L, B, T) */                       \
  X(q, N * LS * d->NH * d->HS, 0)    /* (L, B, T, QD) after rotary */      \
  X(k, N * LS * d->NKV * d->HS, 0)   /* (L, B, T, KVD) after rotary */     \
  X(v, N * LS * d->NKV * d->HS, 0)   /* (L, B, T, KVD) */                  \
  X(lse, N * LS * d->NH, 0)          /* (L, B, NH, T) score log-sum-exp */ \
  X(atty, N * LS * d->NH * d->HS, 0) /* (L, B, T, QD) */                   \
  X(mid, N * LS * d->C, 0)           /* (L, B, T, C) after attention */    \
  X(ln2, N * LS * d->C, 0)           /* (L, B, T, C) */                    \
  X(rstd2, N * LS, 0)                /* (L, B, T) */                       \
  X(gate, N * LS * d->FF, 0)         /* (L, B, T, FF) */                   \
  X(up, N * LS * d->FF, 0)           /* (L, B, T, FF) */                   \
  X(h, N * LS * d->FF, 0)            /* (L, B, T, FF) silu(gate)*up */     \
  X(lnf, N * d->C, 0)                /* (B, T, C) */                       \
  X(rstdf, N, 0)                     /* (B, T) */                          \
  X(logits, HC * d->V, 0)            /* (HC, V) one chunk of the head */   \
  X(losses, N, 0)                    /* (B, T) */                          \
  X(rope_cos, T * (d->HS / 2), 0)    /* (T, HS/2) */                       \
  X(rope_sin, T * (d->HS / 2), 0)    /* (T, HS/2) */                       \
  X(scores, T * T, 0)                /* (T, T) one head's scratch */       \
  X(dres, N * d->C, 1)               /* (B, T, C) */                       \
  X(dmid, N * d->C, 1)               /* (B, T, C) */                       \
  X(dln, N * d->C, 1)                /* (B, T, C) */                       \
  X(datty, N * d->NH * d->HS, 1)     /* (B, T, QD) */                      \
  X(dq, N * d->NH * d->HS, 1)        /* (B, T, QD) */                      \
  X(dk, N * d->NKV * d->HS, 1)       /* (B, T, KVD) */                     \
  X(dv, N * d->NKV * d->HS, 1)       /* (B, T, KVD) */                     \
  X(dh, N * d->FF, 1)                /* (B, T, FF) */                      \
  X(dgate, N * d->FF, 1)             /* (B, T, FF) */                      \
  X(dup, N * d->FF, 1)               /* (B, T, FF) */                      \
  X(dscores, 2 * T * T, 1)           /* (2, T, T) one head's scratch */
/* clang-format on */

struct model_acts {
  int *tokens;  /* (B, T) of the last forward */
  int *targets; /* (B, T) */
  bool has_targets;
  float *weights; /* (B, T) of the last forward's batch, when has_weights */
  bool has_weights;
  int *pos; /* (B, T) of the last forward's batch, when has_pos */
  bool has_pos;
  int64_t count;   /* the last forward's counted targets */
  int layer_slots; /* LS */
  int res_slots;   /* RS */
  int head_rows;   /* HC: the output head runs over at most this many rows at once */
  float *block;    /* the one allocation behind every buffer below */
  size_t bytes;
#define TY_X(field, n, bw) float *field;
  MODEL_ACTS(TY_X)
#undef TY_X
};

#endif
