/* lora.c - LoRA adapters: one allocation, PEFT's initialisation and
 * naming, the low-rank forward and backward, and merging into the base. */
#include "worker/model/lora.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/errors.h"
#include "worker/model/rng.h"

#define NT JOBSPEC_TARGET_COUNT

static const char *const target_names[NT] = {
#define TY_X(id, name) name,
    JOBSPEC_TARGETS(TY_X)
#undef TY_X
};

/* The base weight an adapter sits beside, in a layer view. */
static float *base_weight(const model_layer_t *w, int target) {
  switch (target) {
    case JOBSPEC_TARGET_BIT_Q:
      return w->q_proj;
    case JOBSPEC_TARGET_BIT_K:
      return w->k_proj;
    case JOBSPEC_TARGET_BIT_V:
      return w->v_proj;
    case JOBSPEC_TARGET_BIT_O:
      return w->o_proj;
    case JOBSPEC_TARGET_BIT_GATE:
      return w->gate_proj;
    case JOBSPEC_TARGET_BIT_UP:
      return w->up_proj;
    default:
      return w->down_proj;
  }
}

static float *xa_slot(const lora_t *lo, int l, int target) {
  return lo->xa + ((size_t)l * NT + target) * lo->N * lo->R;
}

int lora_create(lora_t **out, const model_t *m, int R, double alpha, unsigned targets, char *err,
                size_t errlen) {
  const model_dims_t *d = &m->d;
  *out = NULL;
  if (R < 1 || R > JOBSPEC_LORA_RANK_MAX)
    return ty_errf(err, errlen, TY_EINVAL, "lora_rank is %d; it must be between 1 and %d", R,
                   JOBSPEC_LORA_RANK_MAX);
  if (!(alpha > 0) || !isfinite(alpha))
    return ty_errf(err, errlen, TY_EINVAL, "lora_alpha is %g; it must be a positive number", alpha);
  if (!targets || (targets & ~JOBSPEC_TARGET_ALL_LINEAR))
    return ty_errf(err, errlen, TY_EINVAL,
                   "target_modules mask 0x%x: name at least one of q_proj, k_proj, v_proj, o_proj, "
                   "gate_proj, up_proj, down_proj (or \"all-linear\")",
                   targets);
  lora_t *lo = calloc(1, sizeof *lo);
  if (!lo) return ty_errf(err, errlen, TY_EEXHAUSTED, "lora: out of memory");
  const int QD = d->NH * d->HS, KVD = d->NKV * d->HS;
  const int in[NT] = {d->C, d->C, d->C, QD, d->C, d->C, d->FF};
  const int outd[NT] = {QD, KVD, KVD, d->C, d->FF, d->FF, d->C};
  lo->R = R;
  lo->L = d->L;
  lo->N = m->B * m->T;
  lo->alpha = alpha;
  lo->scale = (float)(alpha / R);
  lo->targets = targets;
  memcpy(lo->in, in, sizeof in);
  memcpy(lo->out, outd, sizeof outd);
  int per_layer = 0;
  for (int t = 0; t < NT; t++) per_layer += (targets >> t) & 1u;
  lo->tensors = calloc((size_t)d->L * per_layer * 2, sizeof *lo->tensors);
  lo->w = calloc((size_t)d->L * NT, sizeof *lo->w);
  lo->dw = calloc((size_t)d->L * NT, sizeof *lo->dw);
  if (!lo->tensors || !lo->w || !lo->dw) goto oom;
  size_t off = 0;
  for (int l = 0; l < d->L; l++)
    for (int t = 0; t < NT; t++) {
      if (!lora_has_target(lo, t)) continue;
      for (int isb = 0; isb < 2; isb++) {
        lora_tensor_t *x = &lo->tensors[lo->n_tensors++];
        snprintf(x->name, sizeof x->name, "base_model.model.model.layers.%d.%s%s.lora_%c.weight", l,
                 t <= JOBSPEC_TARGET_BIT_O ? "self_attn." : "mlp.", target_names[t],
                 isb ? 'B' : 'A');
        x->shape[0] = isb ? outd[t] : R;
        x->shape[1] = isb ? R : in[t];
        x->numel = (size_t)x->shape[0] * x->shape[1];
        x->offset = off;
        x->layer = l;
        x->target = t;
        x->is_b = isb;
        off += x->numel;
      }
    }
  lo->n_params = off;
  lo->params = calloc(off, sizeof(float));
  lo->grads = calloc(off, sizeof(float));
  lo->xa = malloc(sizeof(float) * (size_t)d->L * NT * lo->N * R);
  lo->dxa = malloc(sizeof(float) * (size_t)lo->N * R);
  if (!lo->params || !lo->grads || !lo->xa || !lo->dxa) goto oom;
  for (int i = 0; i < lo->n_tensors; i++) {
    lora_tensor_t *x = &lo->tensors[i];
    x->data = lo->params + x->offset;
    x->grad = lo->grads + x->offset;
    lora_pair_t *p = &lo->w[x->layer * NT + x->target], *dp = &lo->dw[x->layer * NT + x->target];
    if (x->is_b) {
      p->B = x->data;
      dp->B = x->grad;
    } else {
      p->A = x->data;
      dp->A = x->grad;
    }
  }
  *out = lo;
  return 0;
oom:
  lora_free(lo);
  return ty_errf(err, errlen, TY_EEXHAUSTED, "lora: out of memory for rank-%d adapters", R);
}

void lora_free(lora_t *lo) {
  if (!lo) return;
  free(lo->params);
  free(lo->grads);
  free(lo->w);
  free(lo->dw);
  free(lo->tensors);
  free(lo->xa);
  free(lo->dxa);
  free(lo);
}

void lora_init(lora_t *lo, uint64_t seed) {
  rng_t r;
  rng_seed(&r, seed);
  for (int i = 0; i < lo->n_tensors; i++) {
    lora_tensor_t *x = &lo->tensors[i];
    /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+a^2)) times sqrt(3/fan_in)
     * is 1/sqrt(fan_in), fan_in = IN = shape[1] of A. */
    double bound = x->is_b ? 0.0 : 1.0 / sqrt((double)x->shape[1]);
    for (size_t j = 0; j < x->numel; j++)
      x->data[j] = (float)(bound * (2.0 * rng_uniform(&r) - 1.0));
  }
}

void lora_zero_grad(lora_t *lo) {
  memset(lo->grads, 0, sizeof(float) * lo->n_params);
}

const lora_tensor_t *lora_find_tensor(const lora_t *lo, const char *name) {
  for (int i = 0; i < lo->n_tensors; i++)
    if (!strcmp(lo->tensors[i].name, name)) return &lo->tensors[i];
  return NULL;
}

void lora_merge(const lora_t *lo, const model_dims_t *d, const model_weights_t *w) {
  for (int l = 0; l < d->L; l++)
    for (int t = 0; t < NT; t++) {
      if (!lora_has_target(lo, t)) continue;
      const lora_pair_t *p = &lo->w[l * NT + t];
      /* W (OUT, IN) += scale * B (OUT, R) @ A (R, IN) */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, lo->out[t], lo->in[t], lo->R,
                  lo->scale, p->B, lo->R, p->A, lo->in[t], 1.0f, base_weight(&w->layers[l], t),
                  lo->in[t]);
    }
}

void lora_proj_forward(lora_t *lo, int l, int target, float *out, const float *x, int n) {
  const lora_pair_t *p = &lo->w[l * NT + target];
  const int IN = lo->in[target], OUT = lo->out[target], R = lo->R;
  float *xa = xa_slot(lo, l, target);
  /* xa (n, R) = x (n, IN) @ A^T; out (n, OUT) += scale * xa @ B^T */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, R, IN, 1.0f, x, IN, p->A, IN, 0.0f, xa,
              R);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, OUT, R, lo->scale, xa, R, p->B, R, 1.0f,
              out, OUT);
}

void lora_proj_backward(lora_t *lo, int l, int target, float *dx, const float *dout, const float *x,
                        int n) {
  const lora_pair_t *p = &lo->w[l * NT + target], *dp = &lo->dw[l * NT + target];
  const int IN = lo->in[target], OUT = lo->out[target], R = lo->R;
  const float *xa = xa_slot(lo, l, target);
  /* dB (OUT, R) += scale * dout^T (OUT, n) @ xa (n, R) */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, R, n, lo->scale, dout, OUT, xa, R, 1.0f,
              dp->B, R);
  /* dxa (n, R) = scale * dout (n, OUT) @ B (OUT, R) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, R, OUT, lo->scale, dout, OUT, p->B, R,
              0.0f, lo->dxa, R);
  /* dA (R, IN) += dxa^T @ x; dx (n, IN) += dxa @ A */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, R, IN, n, 1.0f, lo->dxa, R, x, IN, 1.0f,
              dp->A, IN);
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, IN, R, 1.0f, lo->dxa, R, p->A, IN,
                1.0f, dx, IN);
}
