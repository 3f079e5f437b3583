/* lora.h - LoRA adapters on the projections of a model (PEFT's
 * definition): a targeted projection W (OUT, IN) computes
 *   y = x W^T + scale * (x A^T) B^T,   scale = lora_alpha / R,
 * with A (R, IN) initialised Kaiming-uniform (a = sqrt(5), so the bound is
 * 1/sqrt(IN)) and B (OUT, R) zero. Only A and B train; the base stays
 * frozen. All adapters live in one allocation (params) with their gradients
 * in a second of the same layout (grads), so AdamW, an all-reduce or a
 * checkpoint is one flat loop; adapters are replicated on every rank.
 *
 * Storage order: layer-major; within a layer the targeted projections in
 * JOBSPEC_TARGETS order (q, k, v, o, gate, up, down), A then B. */
#ifndef TY_WORKER_LORA_H
#define TY_WORKER_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/jobspec.h"
#include "worker/model/model.h"

/* One adapter's weights (or gradients); NULL for an untargeted projection. */
typedef struct {
  float *A; /* (R, IN) */
  float *B; /* (OUT, R) */
} lora_pair_t;

/* One tensor of the adapter table. */
typedef struct {
  char name[128]; /* PEFT name: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" */
  int64_t shape[2];
  size_t numel;
  size_t offset;     /* in floats, from the start of params (and of grads) */
  int layer, target; /* target: a JOBSPEC_TARGET_BIT_* */
  bool is_b;         /* lora_B (else lora_A) */
  float *data, *grad;
} lora_tensor_t;

struct lora {
  int R, L, N;      /* rank, layers, token rows the saved buffers hold (B*T) */
  double alpha;     /* lora_alpha */
  float scale;      /* alpha / R */
  unsigned targets; /* JOBSPEC_TARGET_* bitmask */
  int in[JOBSPEC_TARGET_COUNT], out[JOBSPEC_TARGET_COUNT]; /* IN, OUT of each projection */
  float *params, *grads; /* n_params floats each, the same layout */
  size_t n_params;
  lora_pair_t *w, *dw; /* [L * JOBSPEC_TARGET_COUNT], views into params / grads */
  lora_tensor_t *tensors;
  int n_tensors;
  float *xa;  /* (L, JOBSPEC_TARGET_COUNT, N, R) saved x @ A^T, targeted slots only */
  float *dxa; /* (N, R) backward scratch */
};

/* Creates adapters of rank R on the projections in targets (a non-empty
 * JOBSPEC_TARGET_* mask) for model m (its shape and micro-batch size).
 * Parameters and gradients start at zero; call lora_init for PEFT's
 * initialisation. The caller owns *out (lora_free). Returns 0, TY_EINVAL
 * (R < 1, no or unknown targets, alpha not positive) or TY_EEXHAUSTED,
 * with the reason in err. */
int lora_create(lora_t **out, const model_t *m, int R, double alpha, unsigned targets, char *err,
                size_t errlen);
void lora_free(lora_t *lo);

/* PEFT's initialisation: A ~ U(-1/sqrt(IN), 1/sqrt(IN)), B = 0;
 * deterministic for a given seed. */
void lora_init(lora_t *lo, uint64_t seed);
void lora_zero_grad(lora_t *lo);

/* The adapter tensor called name (PEFT naming), or NULL. */
const lora_tensor_t *lora_find_tensor(const lora_t *lo, const char *name);

/* W += scale * B @ A for every adapter, into the base weights w (a model's
 * own buffer, or any view of the same shapes). The adapters stay as they
 * are; a forward pass with the merged weights and no adapters equals one
 * with the adapters, up to rounding. */
void lora_merge(const lora_t *lo, const model_dims_t *d, const model_weights_t *w);

/* --- Called by the model's layers. --- */

static inline bool lora_has_target(const lora_t *lo, int target) {
  return (lo->targets >> target) & 1u;
}
/* out (n, OUT) += scale * (x (n, IN) @ A^T) @ B^T; saves x @ A^T. */
void lora_proj_forward(lora_t *lo, int l, int target, float *out, const float *x, int n);
/* dB += scale * dout^T @ xa; dA += (scale * dout @ B)^T @ x;
 * dx (n, IN) += scale * (dout @ B) @ A. */
void lora_proj_backward(lora_t *lo, int l, int target, float *dx, const float *dout, const float *x,
                        int n);

#endif
