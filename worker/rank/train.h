/* train.h - the training loop of one rank: steps of grad_accum micro-batches
 * per rank, the loss as the mean over the whole global batch, gradients
 * summed across ranks, the warmup + cosine learning rate, global-norm
 * clipping, AdamW, progress reports, held-out evaluation and periodic
 * checkpoints from which a later run resumes with the same losses.
 *
 * What is trained is one flat span of floats: the model's own parameter
 * buffer or this rank's shards of it (full training), or the adapters'
 * (LoRA). A replicated span (adapters, or a whole model on every rank) has
 * its gradients all-reduced (summed) and every rank applies the same
 * update; sharded full training (fsdp) reduce-scatters them inside the
 * backward pass and each rank updates its own shards. The caller builds
 * the model, shards and adapters; the loop never allocates inside a step. */
#ifndef TY_WORKER_TRAIN_H
#define TY_WORKER_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/jobspec.h"
#include "api/report_wire.h"
#include "worker/dist/comm.h"
#include "worker/data/data.h"
#include "worker/data/data_prepare.h"
#include "worker/dist/fsdp.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/optim.h"

/* One report of the loop (the caller turns it into DESIGN.md's progress
 * report and log line). */
typedef struct {
  report_phase_t phase; /* LOADING (a checkpoint resumed), TRAINING, SAVING */
  int64_t step;      /* steps completed */
  int64_t total_steps;
  double loss;         /* mean loss of the last step over the global batch */
  double tokens_per_s; /* this rank's training tokens per second, last step */
  double lr;           /* learning rate the last step used */
  double grad_norm;    /* global gradient norm before clipping */
  double eval_loss;    /* held-out loss, NAN when not measured this report */
  const char *message; /* "" or what happened (resumed, checkpoint written) */
} train_progress_t;

/* Returns 0 to go on; anything else stops the run (train_run then
 * returns TY_ECANCELLED), as when the server ends the attempt. */
typedef int (*train_progress_fn)(void *ctx, const train_progress_t *p);

/* A model on an accelerator (worker/cuda/train_cuda.h). The loop runs the
 * forward and backward passes there and keeps the trained span (the
 * adapters, or for full training the host model's own weights or this
 * rank's shards), clipping and checkpoints on the host. Without the
 * optional AdamW hooks below the optimizer runs on the host too: gradients
 * come down and parameters go up once a step (LoRA: a few MiB). With them
 * (full training on GPUs) the span and the moments stay on the device and
 * move only for checkpoints, the outputs and a resume. Each call returns 0
 * or a TY_E* code with the reason in err. */
typedef struct {
  void *ctx;
  /* The loss of model_forward_batch: the mean over the counted targets. */
  int (*forward)(void *ctx, const model_batch_t *batch, double *loss, char *err, size_t errlen);
  /* Adds the gradients of loss_scale * (mean loss) of the last forward. */
  int (*backward)(void *ctx, float loss_scale, char *err, size_t errlen);
  int (*zero_grads)(void *ctx, char *err, size_t errlen);
  /* Not called (and may be NULL) when AdamW runs on the device. */
  int (*grads_to_host)(void *ctx, float *grads, size_t n, char *err, size_t errlen);
  int (*params_from_host)(void *ctx, const float *params, size_t n, char *err, size_t errlen);
  /* Optional (all four or none), for full training: AdamW on the device,
   * over its own copy of the span and moments. The gradients then stay
   * there: the loop takes their squared norm (summed over ranks for a
   * sharded span), has the device step with the host optimizer's config,
   * no-decay ranges and step count (o->t + 1; the loop then advances
   * o->t), and moves the span and the moments only to write a checkpoint
   * or the outputs (state_to_host) and after a resume (state_from_host,
   * which replaces params_from_host). */
  int (*grad_sumsq)(void *ctx, double *sumsq, char *err, size_t errlen);
  int (*adamw)(void *ctx, const optim_t *o, double lr, double grad_scale, char *err, size_t errlen);
  int (*state_to_host)(void *ctx, float *params, float *m, float *v, size_t n, char *err,
                       size_t errlen);
  int (*state_from_host)(void *ctx, const float *params, const float *m, const float *v, size_t n,
                         char *err, size_t errlen);
} train_device_t;

typedef struct {
  const jobspec_t *spec; /* validated; borrowed */
  comm_t *comm;          /* this rank's communicator; borrowed */
  model_t *model;        /* created for (micro_batch_size, seq_len); borrowed */
  fsdp_t *fsdp;          /* the base weights' shards (then model's own buffers are unused),
                          * or NULL: model holds filled weights; borrowed */
  lora_t *lora;          /* the adapters for a LoRA job, else NULL; borrowed */
  /* The passes run here instead of on model (then only model's shape, B,
   * T and mode are read, plus its params and grads as the trained span
   * for full training without fsdp; with fsdp, an FSDP_SPAN, its shards
   * are the trained span). NULL: the host. */
  const train_device_t *device;
  train_progress_fn progress; /* may be NULL */
  void *progress_ctx;
  /* Optional: each held-out loss as it is measured (before the first step
   * and after the last), with the step it was measured at; progress_ctx. */
  void (*held_out_done)(void *ctx, int64_t step, double loss);
  /* Stop (after writing a checkpoint) once this many steps are done, as an
   * interrupted run would; 0 runs to spec->train.steps. For tests. */
  int64_t stop_at_step;
  /* Held-out windows evaluated at the start and the end (0: none). */
  int eval_windows;
  /* data.format jsonl: the examples train_data_prepare made; else NULL. */
  const data_prepared_t *data;
} train_args_t;

/* What a run measured. */
typedef struct {
  int64_t start_step; /* 0, or the step a checkpoint resumed at */
  int64_t steps_done; /* steps completed, counted from 0 */
  double first_loss;  /* loss of the first step this run made */
  double last_loss;
  double eval_loss_start; /* held-out loss before the first step (NAN if none) */
  double eval_loss_end;   /* after the last (NAN if none) */
  bool preempted;         /* stopped on SIGTERM after a checkpoint (preempt.h) */
} train_result_t;

/* For data.format jsonl: s's examples tokenized into cache_dir (NULL:
 * <output_dir>/tokenized) with the tokenizer of data.tokenizer, else of
 * model_path (data_prepare; progress while it runs, here or in another
 * rank). For a token file there is nothing to do: out->path is "". */
int train_data_prepare(const jobspec_t *s, int64_t vocab_size, const char *cache_dir,
                       data_prepare_progress_fn progress, void *ctx, data_prepared_t *out,
                       char *err, size_t errlen);

/* Rule data-holds-a-batch for a JSONL file (jobspec_jsonl_check's value in
 * the programs that validate with paths): the examples tokenized into a
 * scratch folder that is removed afterwards, with the model's vocabulary
 * (spec.model's, or model_path's config.json), and laid out as rank 0
 * would: each problem (a bad line, a template error, a tokenizer that does
 * not fit, too few rows for a global batch) is added to errs under
 * data.path. Nothing is left behind. */
void train_jsonl_check(const jobspec_t *s, ty_errlist_t *errs);

/* Whether spec s's data can train a model of vocab_size tokens as rank of
 * world: what train_run's data_open checks (the file, its format, a whole
 * global batch of windows or rows), without a model, so that a rank can
 * fail before it loads one. prep: train_data_prepare's result for jsonl
 * (else NULL). 0, or the reason in err. note (may be NULL) receives, for
 * JSONL examples, what the rows are made of: examples, rows, examples cut
 * to seq_len + 1 tokens, examples left out. */
int train_data_check(const jobspec_t *s, const data_prepared_t *prep, int64_t vocab_size, int rank,
                     int world, char *note, size_t notelen, char *err, size_t errlen);

/* Runs the loop from step 0, or from the newest complete checkpoint under
 * spec->output_dir/checkpoints when one exists (its data position must
 * match; see data_position_check). Writes a checkpoint every
 * train.checkpoint_every steps and at stop_at_step. Returns 0, or a
 * negative TY_E* code with the reason in err (a non-finite loss, a data
 * error, a failed collective naming the rank, a write error). */
int train_run(const train_args_t *args, train_result_t *res, char *err, size_t errlen);

/* The mean next-token loss of n windows read by `window` (i = 0..n-1), each
 * T+1 tokens, evaluated micro_batch_size at a time on the model (with the
 * adapters when lora is given). tokens_out (may be NULL) receives the number
 * of predicted tokens. */
typedef int (*train_window_fn)(void *ctx, int64_t i, int32_t *tokens, char *err, size_t errlen);
int train_eval(model_t *model, lora_t *lora, int T, int64_t n, train_window_fn window, void *ctx,
               double *loss, int64_t *tokens_out, char *err, size_t errlen);
/* The same over the first n evaluation rows of d (data_eval_row), with
 * their loss weights and document positions: the mean over the counted
 * targets, whose number tokens_out (may be NULL) receives. */
int train_eval_data(model_t *model, lora_t *lora, data_t *d, int64_t n, double *loss,
                    int64_t *tokens_out, char *err, size_t errlen);

#endif
