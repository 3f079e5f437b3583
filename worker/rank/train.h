/* train.h - the training loop of one rank: steps of grad_accum micro-batches
 * per rank, the loss as the mean over the whole global batch, gradients
 * summed across ranks, the warmup + cosine learning rate, global-norm
 * clipping, AdamW, progress reports, held-out evaluation and periodic
 * checkpoints from which a later run resumes with the same losses.
 *
 * What is trained is one backend (worker/model/train_backend.h): a flat
 * span of floats, the model's own parameter buffer or this rank's shards
 * of it (full training), or the adapters' (LoRA), and the passes over it,
 * on the host or a device. A replicated span (adapters, or a whole model on
 * every rank) has its gradients all-reduced (summed) and every rank applies
 * the same update; a sharded span (fsdp) had them reduce-scattered inside
 * the backward pass and each rank updates its own shards. The caller
 * builds the backend; the loop never allocates inside a step. */
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
#include "worker/model/lora.h"
#include "worker/model/dpo.h"
#include "worker/model/model.h"
#include "worker/model/optim.h"
#include "worker/model/train_backend.h"
#include "worker/rank/data_check.h"

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
  /* train.objective dpo, phase TRAINING: the step's metrics over the global
   * batch's pairs (means; dpo.h); else NULL. */
  const dpo_sums_t *dpo;
  /* Phase REFERENCE: pairs scored of all, over the ranks. */
  int64_t done, total;
} train_progress_t;

/* Returns 0 to go on; anything else stops the run (train_run then
 * returns TY_ECANCELLED), as when the server ends the attempt. */
typedef int (*train_progress_fn)(void *ctx, const train_progress_t *p);

typedef struct {
  const jobspec_t *spec; /* validated; borrowed */
  comm_t *comm;          /* this rank's communicator; borrowed */
  /* What is trained and where the passes run, for micro-batches of
   * (micro_batch_size, seq_len); borrowed. */
  const train_backend_t *backend;
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
