/* dpo.c - DPO's loss over one pair, its gradient and metrics; see dpo.h. */
#include "worker/model/dpo.h"

#include <math.h>
#include <stdbool.h>

dpo_config_t dpo_config(const jobspec_t *s) {
  return (dpo_config_t){.beta = s->dpo.beta,
                        .loss_type = s->dpo.loss_type,
                        .label_smoothing = s->dpo.label_smoothing};
}

/* log(sigmoid(x)), stable for either sign. */
static double log_sigmoid(double x) {
  return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}
static double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

double dpo_pair(const dpo_config_t *c, const dpo_pair_t *p, double *d_pc, double *d_pr,
                dpo_sums_t *sums) {
  const bool ipo = c->loss_type == JOBSPEC_DPO_IPO;
  /* ipo compares each response's mean log-probability per token. */
  const double kc = ipo ? 1.0 / (double)p->nc : 1.0, kr = ipo ? 1.0 / (double)p->nr : 1.0;
  const double pc = p->pc * kc, pr = p->pr * kr, refc = p->refc * kc, refr = p->refr * kr;
  const double logits = (pc - refc) - (pr - refr), z = c->beta * logits;
  double loss, dlogits;
  switch (c->loss_type) {
    case JOBSPEC_DPO_HINGE:
      loss = z < 1.0 ? 1.0 - z : 0.0;
      dlogits = z < 1.0 ? -c->beta : 0.0;
      break;
    case JOBSPEC_DPO_IPO: {
      const double u = logits - 1.0 / (2.0 * c->beta);
      loss = u * u;
      dlogits = 2.0 * u;
      break;
    }
    default: {
      const double ls = c->label_smoothing;
      loss = -(1.0 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z);
      dlogits = c->beta * (-(1.0 - ls) * sigmoid(-z) + ls * sigmoid(z));
      break;
    }
  }
  *d_pc = dlogits * kc;
  *d_pr = -dlogits * kr;
  if (sums) {
    const double rc = c->beta * (pc - refc), rr = c->beta * (pr - refr);
    sums->loss += loss;
    sums->chosen += rc;
    sums->rejected += rr;
    sums->accuracy += rc > rr ? 1.0 : 0.0;
    sums->margin += rc - rr;
    sums->logp_chosen += pc;
    sums->logp_rejected += pr;
    sums->pairs += 1.0;
  }
  return loss;
}

dpo_sums_t dpo_mean(const dpo_sums_t *sums) {
  dpo_sums_t m = *sums;
  const double n = sums->pairs > 0 ? sums->pairs : NAN;
#define TY_X(field) m.field = sums->field / n;
  DPO_METRICS(TY_X)
#undef TY_X
  return m;
}

void dpo_sums_pack(const dpo_sums_t *sums, float *out) {
  int i = 0;
#define TY_X(field) out[i++] = (float)sums->field;
  DPO_METRICS(TY_X)
#undef TY_X
  out[i] = (float)sums->pairs;
}

void dpo_sums_unpack(dpo_sums_t *sums, const float *in) {
  int i = 0;
#define TY_X(field) sums->field = in[i++];
  DPO_METRICS(TY_X)
#undef TY_X
  sums->pairs = in[i];
}

void dpo_report(const dpo_sums_t *m, double *out) {
  out[REPORT_DPO_rewards_chosen] = m->chosen;
  out[REPORT_DPO_rewards_rejected] = m->rejected;
  out[REPORT_DPO_rewards_accuracies] = m->accuracy;
  out[REPORT_DPO_rewards_margins] = m->margin;
  out[REPORT_DPO_logps_chosen] = m->logp_chosen;
  out[REPORT_DPO_logps_rejected] = m->logp_rejected;
}
