/* dpo.h - direct preference optimization's loss over one pair of
 * responses, as TRL's DPOTrainer computes it, with its gradient with
 * respect to the policy's log-probabilities and the metrics TRL logs.
 *
 * Of a pair (a prompt, a chosen and a rejected response): the policy's
 * log-probabilities of the two responses (pc, pr: each the sum over the
 * response's own tokens) and the reference's (rc, rr), and
 *   logits = (pc - rc) - (pr - rr)
 *   sigmoid  -(1 - ls) log sigmoid(beta logits) - ls log sigmoid(-beta logits)
 *   hinge    max(0, 1 - beta logits)
 *   ipo      (logits - 1 / (2 beta))^2, over each response's MEAN
 *            log-probability (the sum over its token count), as TRL does
 * The implicit rewards are beta (pc - rc) and beta (pr - rr) (ipo: of the
 * means). A step's loss is the mean over the global batch's pairs. */
#ifndef TY_WORKER_DPO_H
#define TY_WORKER_DPO_H

#include <stdint.h>

#include "api/jobspec.h"
#include "api/report_wire.h"

typedef struct {
  double beta;
  jobspec_dpo_loss_t loss_type;
  double label_smoothing; /* sigmoid only */
} dpo_config_t;

/* The spec's dpo block. */
dpo_config_t dpo_config(const jobspec_t *s);

/* One pair: summed log-probabilities of the chosen (c) and rejected (r)
 * responses under the policy (p) and the reference (ref), and each
 * response's counted tokens (>= 1). */
typedef struct {
  double pc, pr, refc, refr;
  int64_t nc, nr;
} dpo_pair_t;

/* Sums over pairs of the loss and of TRL's metrics (rewards/chosen,
 * rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen,
 * logps/rejected): dpo_mean divides them by pairs. */
#define DPO_METRICS(X) \
  X(loss) X(chosen) X(rejected) X(accuracy) X(margin) X(logp_chosen) X(logp_rejected)
typedef struct {
#define TY_X(field) double field;
  DPO_METRICS(TY_X)
#undef TY_X
  double pairs;
} dpo_sums_t;
#define DPO_SUMS_N 8 /* the numbers of dpo_sums_t */

/* sums as DPO_SUMS_N floats (one all-reduce with the loss), and back. */
void dpo_sums_pack(const dpo_sums_t *sums, float *out);
void dpo_sums_unpack(dpo_sums_t *sums, const float *in);

/* The pair's loss, added with its metrics into *sums (may be NULL), and
 * the loss's derivatives with respect to pc and pr (the summed
 * log-probabilities; ipo's mean is taken inside). */
double dpo_pair(const dpo_config_t *c, const dpo_pair_t *p, double *d_pc, double *d_pr,
                dpo_sums_t *sums);

/* The means of sums over its pairs (all NAN when there are none). */
dpo_sums_t dpo_mean(const dpo_sums_t *sums);

/* The metrics of means (dpo_mean's) as a report carries them:
 * out [REPORT_DPO_N], api/report_wire.h's REPORT_DPO_METRICS order. */
void dpo_report(const dpo_sums_t *means, double *out);

#endif
