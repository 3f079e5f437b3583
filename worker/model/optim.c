/* optim.c - AdamW, the warmup + cosine schedule and gradient clipping; see
 * optim.h. */
#include "worker/model/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/xalloc.h"
#include "worker/model/cpu_pool.h"

void optim_config_defaults(optim_config_t *c) {
  c->beta1 = 0.9;
  c->beta2 = 0.999;
  c->eps = 1e-8;
}

double optim_lr_at(const optim_config_t *c, int64_t step) {
  if (step < 0 || step >= c->total_steps) return 0.0;
  if (step < c->warmup_steps) return c->lr * (double)(step + 1) / (double)c->warmup_steps;
  int64_t decay_len = (int64_t)c->total_steps - c->warmup_steps;
  double p = (double)(step - c->warmup_steps) / (double)decay_len;
  return c->lr * 0.5 * (1.0 + cos(M_PI * p));
}

double optim_sumsq(const float *x, size_t n) {
  /* Four partial sums: independent chains vectorise and lose less to
   * rounding than one running total. */
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += (double)x[i] * x[i];
    s1 += (double)x[i + 1] * x[i + 1];
    s2 += (double)x[i + 2] * x[i + 2];
    s3 += (double)x[i + 3] * x[i + 3];
  }
  for (; i < n; i++) s0 += (double)x[i] * x[i];
  return (s0 + s1) + (s2 + s3);
}

double optim_clip_factor(double norm, double max_norm) {
  if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

optim_t *optim_new(const optim_config_t *cfg, size_t n, char *msg, size_t msglen) {
  if (!(cfg->lr > 0) || !(cfg->beta1 >= 0 && cfg->beta1 < 1) ||
      !(cfg->beta2 >= 0 && cfg->beta2 < 1) || !(cfg->eps > 0) || !(cfg->weight_decay >= 0) ||
      cfg->warmup_steps < 0 || cfg->total_steps < 1) {
    if (msg)
      snprintf(msg, msglen,
               "optimizer settings out of range (lr %g > 0, betas in [0,1), eps > 0, "
               "weight_decay >= 0, warmup_steps >= 0, steps >= 1 are required)",
               cfg->lr);
    return NULL;
  }
  optim_t *o = xcalloc(1, sizeof *o);
  o->cfg = *cfg;
  o->n = n;
  /* The moments are as large as the parameters: a failure here is a
   * reportable out-of-memory, not an abort. */
  o->m = calloc(n ? n : 1, sizeof(float));
  o->v = calloc(n ? n : 1, sizeof(float));
  if (!o->m || !o->v) {
    if (msg)
      snprintf(msg, msglen, "cannot allocate AdamW moments for %zu parameters (%.1f MiB)", n,
               2.0 * n * sizeof(float) / 1048576.0);
    optim_free(o);
    return NULL;
  }
  return o;
}

void optim_free(optim_t *o) {
  if (!o) return;
  free(o->m);
  free(o->v);
  free(o->nodecay);
  free(o);
}

void optim_exclude_decay(optim_t *o, size_t start, size_t len) {
  o->nodecay = xrealloc(o->nodecay, (o->nodecay_len + 1) * sizeof *o->nodecay);
  o->nodecay[o->nodecay_len][0] = start;
  o->nodecay[o->nodecay_len][1] = len;
  o->nodecay_len++;
}

/* One AdamW update over a span of the flat parameters, split between the
 * pool's threads: every element is updated on its own, so the split does
 * not change the result. Memory-bound (it streams p, g, m and v), so two
 * threads move it at nearly twice the rate of one. */
typedef struct {
  float *p, *m, *v;
  const float *g;
  size_t lo;
  float decay, gs, step_size, bc2_sqrt, b1, b2, one_b1, one_b2, eps;
} adamw_args_t;

/* The AdamW update of elements [lo + i0, lo + i1) with decay factor
 * (1 - lr*wd). The arithmetic follows torch.optim.AdamW's single-tensor
 * path in fp32 so that the two agree to rounding. */
static void adamw_part(void *ctx, size_t i0, size_t i1) {
  const adamw_args_t *a = ctx;
  float *p = a->p, *m = a->m, *v = a->v;
  const float *g = a->g;
  for (size_t i = a->lo + i0; i < a->lo + i1; i++) {
    float gi = g[i] * a->gs;
    p[i] *= a->decay;
    m[i] = m[i] * a->b1 + a->one_b1 * gi;
    v[i] = v[i] * a->b2 + a->one_b2 * gi * gi;
    float denom = sqrtf(v[i]) / a->bc2_sqrt + a->eps;
    p[i] -= a->step_size * (m[i] / denom);
  }
}

static void adamw_range(optim_t *o, float *p, const float *g, size_t lo, size_t hi, float decay,
                        float gs, float step_size, float bc2_sqrt) {
  adamw_args_t a = {.p = p,
                    .m = o->m,
                    .v = o->v,
                    .g = g,
                    .lo = lo,
                    .decay = decay,
                    .gs = gs,
                    .step_size = step_size,
                    .bc2_sqrt = bc2_sqrt,
                    .b1 = (float)o->cfg.beta1,
                    .b2 = (float)o->cfg.beta2,
                    .one_b1 = (float)(1.0 - o->cfg.beta1),
                    .one_b2 = (float)(1.0 - o->cfg.beta2),
                    .eps = (float)o->cfg.eps};
  pool_for(hi - lo, 1 << 16, adamw_part, &a);
}

void optim_step(optim_t *o, float *params, const float *grads, double lr, double grad_scale) {
  o->t++;
  double bc1 = 1.0 - pow(o->cfg.beta1, (double)o->t);
  double bc2 = 1.0 - pow(o->cfg.beta2, (double)o->t);
  float step_size = (float)(lr / bc1);
  float bc2_sqrt = (float)sqrt(bc2);
  float gs = (float)grad_scale;
  float decay = (float)(1.0 - lr * o->cfg.weight_decay);
  /* Walk the span in order, switching the decay factor off inside the
   * excluded ranges (they are few: one per norm gain). */
  size_t pos = 0;
  while (pos < o->n) {
    size_t next = o->n, excl_end = 0;
    for (size_t r = 0; r < o->nodecay_len; r++) {
      size_t s = o->nodecay[r][0], e = s + o->nodecay[r][1];
      if (e > o->n) e = o->n;
      if (s <= pos && pos < e) {
        next = pos;
        excl_end = e > excl_end ? e : excl_end;
      } else if (s > pos && s < next) {
        next = s;
      }
    }
    if (next > pos) {
      adamw_range(o, params, grads, pos, next, decay, gs, step_size, bc2_sqrt);
      pos = next;
    } else {
      adamw_range(o, params, grads, pos, excl_end, 1.0f, gs, step_size, bc2_sqrt);
      pos = excl_end;
    }
  }
}
