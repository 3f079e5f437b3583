/* train_dpo.h - the passes of train.objective dpo for the training loop
 * (worker/rank/train.c), over a backend's row hooks (train_backend.h).
 *
 * A micro-batch holds micro_batch_size pairs, pair b's chosen response in
 * row 2b and its rejected one in 2b+1 (data_config_t.pairs). Each row's
 * log-probability is minus its summed loss over its counted targets (the
 * response's own tokens). The reference's:
 *   under LoRA   a forward pass with the adapters off, over the same
 *                sharded base, just before the policy's
 *   otherwise    one pass over every pair before the first step (phase
 *                "reference"), each rank scoring every world-th pair and
 *                the ranks summing the table; kept in
 *                output_dir/tokenized/reference-<key>.bin, so that a
 *                resumed run (whose weights have moved) reads it back
 * Then the policy's forward, dpo_pair per pair (worker/model/dpo.h), and
 * the backward with each row weighted by its response's derivative over
 * the global batch's pairs. */
#ifndef TY_WORKER_TRAIN_DPO_H
#define TY_WORKER_TRAIN_DPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/rank/train.h"

typedef struct train_dpo train_dpo_t;

/* Set-up for a run of a (its backend has the row hooks, else
 * TY_EINTERNAL) over d: training every weight, the reference table, read
 * from its file or scored now (start 0 only: a resumed run whose table is
 * gone fails, saying so). A backend of passes only (train_backend_passes,
 * for an evaluation: no span) takes the base, its adapters off, as the
 * reference. *out is the caller's (train_dpo_free). */
int train_dpo_open(train_dpo_t **out, const train_args_t *a, data_t *d, int64_t start, char *err,
                   size_t errlen);
void train_dpo_free(train_dpo_t *t);

/* Micro-batch `micro` of `step`, already in bt (2 x micro_batch_size
 * rows): its pairs' losses and metrics added to sums, and the gradient of
 * their losses times pair_weight each added by the backward pass. */
int train_dpo_step(train_dpo_t *t, const model_batch_t *bt, int64_t step, int micro,
                   double pair_weight, dpo_sums_t *sums, char *err, size_t errlen);

/* The first n held-out pairs: their losses and metrics into sums. */
int train_dpo_eval(train_dpo_t *t, int64_t n, dpo_sums_t *sums, char *err, size_t errlen);

#endif
