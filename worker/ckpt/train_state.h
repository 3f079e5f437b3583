/* train_state.h - periodic training checkpoints: the trained span, AdamW's
 * moments and step count, and the data position, so that a resumed run
 * continues with exactly the losses an uninterrupted one would have had.
 *
 * Layout under OUTPUT_DIR/checkpoints/:
 *   step-00000050/state.safetensors   F32 tensors "params", "exp_avg",
 *                                     "exp_avg_sq", each [n] (a replicated
 *                                     span: LoRA, or one rank)
 *   step-00000050/state-rank<r>.safetensors  the same for rank r's shard
 *                                     (sharded full training)
 *   step-00000050/state.json          {"step", "optimizer_step", "n",
 *                                     "world_size", "sharded", "data": {seed, num_tokens,
 *                                     num_train_windows, global_batch, seq_len},
 *                                     "base": {"model_path", "fingerprint"} for adapters
 *                                     over a frozen base}
 * A checkpoint is written into step-N.tmp and renamed when complete, so a
 * directory named step-N is always whole; older ones are then removed. */
#ifndef TY_WORKER_TRAIN_STATE_H
#define TY_WORKER_TRAIN_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/dist/comm.h"
#include "worker/data/data.h"
#include "worker/model/optim.h"

/* The frozen base a trained span belongs to (LoRA adapters): its
 * model_path and ckpt_fingerprint, known on rank 0 (NULL, or an empty
 * fingerprint, elsewhere and when no frozen base is trained over). */
typedef struct {
  const char *model_path;
  const char *fingerprint;
} train_base_t;

/* Writes the checkpoint of `step` (steps completed). Every rank calls it;
 * with sharded every rank writes its own span, else rank 0 writes the
 * replicated one (and base, when given, into state.json). Each stage ends
 * with every rank learning whether any failed, so no rank runs ahead of a
 * checkpoint that might fail. */
int train_state_save(const char *output_dir, comm_t *comm, const data_t *d, const optim_t *o,
                     const float *params, size_t n, int64_t step, bool sharded,
                     const train_base_t *base, char *err, size_t errlen);

/* Finds the newest complete checkpoint under output_dir/checkpoints and, if
 * there is one, loads params[n] and the optimizer's moments and step from
 * it after checking that it was written for this span size, data layout
 * and (where both say) the same frozen base, which rank 0 checks for every
 * rank; *step is then the step to continue at (else 0, nothing loaded). */
int train_state_resume(const char *output_dir, comm_t *comm, const data_t *d, optim_t *o,
                       float *params, size_t n, bool sharded, const train_base_t *base,
                       int64_t *step, char *err, size_t errlen);

#endif
