/* train_backend.h - what the training loop (worker/rank/train.h) trains
 * through: ONE table of the passes, the trained span and the optimizer's
 * step. Three backends fill it:
 *
 *   train_backend_host   the CPU model of this file's model.h: the model's
 *                        own weights (full training) or its adapters (LoRA)
 *   fsdp_backend         worker/dist/fsdp.h: this rank's shards (full
 *                        training, sharded) or the adapters over a sharded
 *                        frozen base (LoRA)
 *   train_backend_device an accelerator's passes (train_device_t, which
 *                        worker/cuda/train_cuda.h fills) over a span the
 *                        host keeps: one of the two above, whose passes
 *                        are then not used
 *
 * The backend owns the span's layout, its gradients and their sharding;
 * the loop owns the data, the optimizer's state (its moments, laid out as
 * the span), the collectives between steps and the checkpoints. Every
 * combination the job spec allows (CPU or CUDA, LoRA or full, one rank or
 * many) is one backend, chosen once by the rank program. */
#ifndef TY_WORKER_TRAIN_BACKEND_H
#define TY_WORKER_TRAIN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/optim.h"

/* The trained span as the host holds it: what the optimizer's moments are
 * laid out as, what a checkpoint saves and a resume fills. */
typedef struct {
  float *params; /* [n] */
  float *grads;  /* [n]: the gradients, where the optimizer runs on the host */
  size_t n;
  /* This rank's part of a span sharded over the ranks: the backward pass
   * summed its gradients over them already. Else replicated: every rank
   * holds the whole span, and the loop all-reduces the gradients. */
  bool sharded;
  /* LoRA adapters over a frozen base (a checkpoint records the base). */
  bool adapters;
} train_span_t;

typedef struct train_backend {
  void *ctx;
  train_span_t span;
  const model_t *shape; /* micro-batches of up to shape->B x shape->T tokens; d.V */
  /* Each returns 0 or a TY_E* code with the reason in err. */
  int (*zero_grads)(void *ctx, char *err, size_t errlen);
  /* The loss of model_forward_batch: the mean over the counted targets. */
  int (*forward)(void *ctx, const model_batch_t *batch, double *loss, char *err, size_t errlen);
  /* Adds the gradients of loss_scale * (mean loss) of the last forward. */
  int (*backward)(void *ctx, float loss_scale, char *err, size_t errlen);
  /* After a step's micro-batches: the squared norm of this rank's
   * gradients; a replicated span's are then in span.grads. */
  int (*grad_sumsq)(void *ctx, double *sumsq, char *err, size_t errlen);
  /* One AdamW step over the span with o's config, state and step count
   * (advanced by one): learning rate lr, gradients scaled by grad_scale. */
  int (*step)(void *ctx, optim_t *o, double lr, double grad_scale, char *err, size_t errlen);
  /* The span's norm gains, which take no weight decay, excluded in o. */
  void (*no_decay)(void *ctx, optim_t *o);
  /* The span and o's moments brought to the host (before a checkpoint and
   * at the end: what is written comes from the host), and sent from there
   * (after the span was set up or resumed). NULL: the host holds them. */
  int (*state_to_host)(void *ctx, optim_t *o, char *err, size_t errlen);
  int (*state_from_host)(void *ctx, const optim_t *o, char *err, size_t errlen);
  void (*free)(void *ctx); /* train_backend_free's */
  /* Objectives over whole rows (DPO: worker/rank/dpo.h); NULL where the
   * passes have none (the rule dpo refuses such jobs). row_losses: each
   * row's summed loss over its counted targets in the last forward (sums
   * [b]); row_scales: the next backward is the gradient of sum_i
   * scales[i] * row loss i (scales [b], borrowed until then; loss_scale
   * is then unused); adapters_on: false makes the forwards that follow
   * the frozen base's (the reference), true the adapters' again. */
  int (*row_losses)(void *ctx, double *sums, char *err, size_t errlen);
  int (*row_scales)(void *ctx, const float *scales, char *err, size_t errlen);
  void (*adapters_on)(void *ctx, bool on);
} train_backend_t;

/* The CPU model m: its adapters when lora is given (m built in
 * MODEL_TRAIN_LORA), else its own weights (MODEL_TRAIN_FULL, a model that
 * holds them: model_create, or model_create_weights for a span whose passes
 * run elsewhere). m and lora are borrowed. 0, or TY_EINTERNAL naming the
 * mismatch. */
int train_backend_host(train_backend_t *b, model_t *m, lora_t *lora, char *err, size_t errlen);

/* Forward passes only, for an evaluation over whole rows (DPO's): the CPU
 * model m in any mode, with lora's adapters when given (adapters_on
 * switches them); no span, no backward, no optimizer step. */
int train_backend_passes(train_backend_t *b, model_t *m, lora_t *lora, char *err, size_t errlen);

/* An accelerator's side of a backend: its passes and, optionally, AdamW
 * over its own copy of the span. Without the AdamW hooks the optimizer runs
 * on the host: gradients come down and parameters go up once a step (LoRA:
 * a few MiB). With them (all four) the span and the moments stay on the
 * device and move only for checkpoints, the outputs and a resume. */
typedef struct {
  void *ctx;
  int (*forward)(void *ctx, const model_batch_t *batch, double *loss, char *err, size_t errlen);
  int (*backward)(void *ctx, float loss_scale, char *err, size_t errlen);
  int (*zero_grads)(void *ctx, char *err, size_t errlen);
  /* Not called (and may be NULL) when AdamW runs on the device. */
  int (*grads_to_host)(void *ctx, float *grads, size_t n, char *err, size_t errlen);
  int (*params_from_host)(void *ctx, const float *params, size_t n, char *err, size_t errlen);
  /* AdamW on the device: the gradients' squared norm, a step with the host
   * optimizer's config, no-decay ranges and step count (o->t + 1; the
   * backend then advances o->t), and the span and moments moved. */
  int (*grad_sumsq)(void *ctx, double *sumsq, char *err, size_t errlen);
  int (*adamw)(void *ctx, const optim_t *o, double lr, double grad_scale, char *err, size_t errlen);
  int (*state_to_host)(void *ctx, float *params, float *m, float *v, size_t n, char *err,
                       size_t errlen);
  int (*state_from_host)(void *ctx, const float *params, const float *m, const float *v, size_t n,
                         char *err, size_t errlen);
  /* Optional: objectives over whole rows, as train_backend_t's hooks. */
  int (*row_losses)(void *ctx, double *sums, char *err, size_t errlen);
  int (*row_scales)(void *ctx, const float *scales, char *err, size_t errlen);
  void (*adapters_on)(void *ctx, bool on);
} train_device_t;

/* dev's passes over host's span (a host or fsdp backend, which b takes
 * over: train_backend_free(b) frees it; dev is copied, its ctx borrowed).
 * AdamW on the device needs gradients no rank sums after the passes: a
 * sharded span, or one rank's whole model (world is the number of ranks);
 * TY_EINTERNAL otherwise, and host is then left to the caller. */
int train_backend_device(train_backend_t *b, train_backend_t *host, const train_device_t *dev,
                         int world, char *err, size_t errlen);

/* Accepts a zeroed or freed b. */
void train_backend_free(train_backend_t *b);

#endif
