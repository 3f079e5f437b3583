/* model_internal.h - the activation buffers shared by model.c (allocation)
 * and model_step.c (forward and backward); not for other modules. */
#ifndef TY_WORKER_MODEL_INTERNAL_H
#define TY_WORKER_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/model_acts.h"
#include "worker/model/model.h"

/* The buffers: api/model_acts.h's MODEL_ACTS table, shared with the memory
 * rules at submit. */
struct model_acts {
  int *tokens;  /* (B, T) of the last forward */
  int *targets; /* (B, T) */
  bool has_targets;
  float *weights; /* (B, T) of the last forward's batch, when has_weights */
  bool has_weights;
  float *row_w; /* (B, T): each target's weight times its row's scale, when row_scales */
  const float *row_scales; /* (b): model_set_row_scales', for the next backward; or NULL */
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
