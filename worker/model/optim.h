/* optim.h - AdamW over one flat span of parameters, the learning-rate
 * schedule (linear warmup, then cosine decay) and global-norm gradient
 * clipping.
 *
 * Parameters, gradients and the two moment buffers share one layout: element
 * i of each describes the same scalar, so a step is one loop over n floats.
 * Under FSDP a rank calls these on its own shard only; the global gradient
 * norm is the square root of the all-reduced optim_sumsq of every shard. */
#ifndef TY_WORKER_OPTIM_H
#define TY_WORKER_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  double lr;           /* peak learning rate, > 0 */
  double beta1;        /* first-moment decay, default 0.9 */
  double beta2;        /* second-moment decay, default 0.999 */
  double eps;          /* added to sqrt(v_hat), default 1e-8 */
  double weight_decay; /* decoupled: p -= lr * weight_decay * p */
  int warmup_steps;    /* linear ramp length, >= 0 */
  int total_steps;     /* schedule length, >= 1 */
} optim_config_t;

/* Fills beta1, beta2 and eps with torch.optim.AdamW's defaults; lr,
 * weight_decay, warmup_steps and total_steps are left to the caller. */
void optim_config_defaults(optim_config_t *c);

/* The learning rate of step (0-based): lr * (step + 1) / warmup_steps while
 * step < warmup_steps, then lr * 0.5 * (1 + cos(pi * p)) with
 * p = (step - warmup_steps) / (total_steps - warmup_steps), so the first
 * step trains (no zero-lr step) and the rate reaches 0 one step after the
 * last. Steps at or past total_steps get 0. */
double optim_lr_at(const optim_config_t *c, int64_t step);

/* Sum of squares of x[0..n), accumulated in double. */
double optim_sumsq(const float *x, size_t n);

/* The factor that clips a gradient of global norm `norm` to `max_norm`:
 * max_norm / (norm + 1e-6) when norm exceeds max_norm, else 1 (as
 * torch.nn.utils.clip_grad_norm_ does). max_norm <= 0 disables clipping. */
double optim_clip_factor(double norm, double max_norm);

typedef struct {
  optim_config_t cfg;
  size_t n;  /* elements in the span */
  float *m;  /* [n] first moments, owned */
  float *v;  /* [n] second moments, owned */
  int64_t t; /* steps taken so far; bias correction uses t after increment */
  /* Ranges [start, start + len) of the span that get no weight decay
   * (norm gains, by convention); owned array of nodecay_len pairs. */
  size_t (*nodecay)[2];
  size_t nodecay_len;
} optim_t;

/* A new optimizer for a span of n elements, moments zeroed. Returns NULL
 * (and writes why into msg) when the moments cannot be allocated or cfg is
 * out of range. The caller frees it with optim_free. */
optim_t *optim_new(const optim_config_t *cfg, size_t n, char *msg, size_t msglen);
/* Accepts NULL. */
void optim_free(optim_t *o);

/* Excludes [start, start + len) from weight decay. */
void optim_exclude_decay(optim_t *o, size_t start, size_t len);

/* One AdamW step at learning rate lr over the span: every gradient is first
 * multiplied by grad_scale (which folds in a loss-mean divisor and the clip
 * factor, sparing the caller a pass over the gradients). Increments o->t.
 * params and grads have n elements; grads is read only. */
void optim_step(optim_t *o, float *params, const float *grads, double lr, double grad_scale);

#endif
