/* model_step.c - the forward and backward passes of the Llama decoder over
 * the buffers model.c allocated. Backward runs the forward's ops in exact
 * reverse order; LoRA adapters add their low-rank term to a projection's
 * output in the forward pass and take their share of its gradient in the
 * backward pass (worker/model/lora.c). */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/rankenv.h"
#include "api/jobspec.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/model_internal.h"

/* out (n, OUT) = beta * out + x (n, IN) @ W^T, plus the adapter on target. */
static void proj_forward(lora_t *lora, int l, int target, float *out, const float *x,
                         const float *W, int n, int IN, int OUT, float beta) {
  cpu_matmul_forward(out, x, W, n, IN, OUT, beta);
  if (lora && lora_has_target(lora, target)) lora_proj_forward(lora, l, target, out, x, n);
}

/* dx (n, IN) = dx_beta * dx + dout @ W (+ the adapter's part); dW += ... */
static void proj_backward(lora_t *lora, int l, int target, float *dx, float *dW, const float *dout,
                          const float *x, const float *W, int n, int IN, int OUT, float dx_beta) {
  cpu_matmul_backward(dx, dW, dout, x, W, n, IN, OUT, dx_beta);
  if (lora && lora_has_target(lora, target)) lora_proj_backward(lora, l, target, dx, dout, x, n);
}

static int check_ids(const int *ids, int n, int V, const char *what, int t, char *err,
                     size_t errlen) {
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V) {
      if (err && errlen)
        snprintf(err, errlen,
                 "%s id %d at batch row %d, position %d is outside the vocabulary [0, %d)", what,
                 ids[i], i / t, i % t, V);
      return TY_EINVAL;
    }
  return 0;
}

int model_batch_check(const model_batch_t *bt, int B, int T, int V, char *err, size_t errlen) {
  const int b = bt->b, t = bt->t;
  if (b < 1 || t < 1 || b > B || t > T)
    return ty_errf(err, errlen, TY_EINVAL,
                   "micro-batch %d x %d does not fit the model's buffers (%d x %d)", b, t, B, T);
  int rc = check_ids(bt->tokens, b * t, V, "token", t, err, errlen);
  if (!rc && bt->targets) rc = check_ids(bt->targets, b * t, V, "target", t, err, errlen);
  if (rc) return rc;
  for (int i = 0; bt->weights && i < b * t; i++)
    if (bt->weights[i] != 0.0f && bt->weights[i] != 1.0f)
      return ty_errf(err, errlen, TY_EINVAL,
                     "loss weight %g at batch row %d, position %d; weights are 0 or 1",
                     (double)bt->weights[i], i / t, i % t);
  for (int i = 0; bt->pos && i < b * t; i++)
    if (bt->pos[i] != 0 && (i % t == 0 || bt->pos[i] != bt->pos[i - 1] + 1))
      return ty_errf(err, errlen, TY_EINVAL,
                     "position %d at batch row %d, token %d; a position is 0 (a document's first "
                     "token) or the previous token's + 1",
                     bt->pos[i], i / t, i % t);
  return 0;
}

int64_t model_batch_count(const model_batch_t *bt) {
  if (!bt->weights) return (int64_t)bt->b * bt->t;
  int64_t n = 0;
  for (int i = 0; i < bt->b * bt->t; i++) n += bt->weights[i] != 0.0f;
  return n;
}

int model_embed_forward_batch(model_t *m, const float *embed_tokens, const model_batch_t *bt,
                              char *err, size_t errlen) {
  model_acts_t *a = m->acts;
  int rc = model_batch_check(bt, m->B, m->T, m->d.V, err, errlen);
  if (rc) return rc;
  const int b = bt->b, t = bt->t;
  if (!bt->targets && (int64_t)b * t > a->head_rows)
    return ty_errf(err, errlen, TY_EINVAL,
                   "model: logits of %d x %d tokens at once, but the output head holds %d rows "
                   "of %d (%s); pass targets (the loss needs no whole logits) or fewer tokens",
                   b, t, a->head_rows, m->d.V, rankenv_name(RANKENV_HEAD_ROWS));
  m->b = b;
  m->t = t;
  memcpy(a->tokens, bt->tokens, sizeof(int) * b * t);
  a->has_targets = bt->targets != NULL;
  if (bt->targets) memcpy(a->targets, bt->targets, sizeof(int) * b * t);
  a->has_weights = bt->targets && bt->weights;
  if (a->has_weights) memcpy(a->weights, bt->weights, sizeof(float) * b * t);
  a->has_pos = bt->pos != NULL;
  if (bt->pos) memcpy(a->pos, bt->pos, sizeof(int) * b * t);
  a->count = bt->targets ? model_batch_count(bt) : 0;
  a->row_scales = NULL;
  cpu_embedding_forward(a->res, a->tokens, embed_tokens, b * t, m->d.C);
  return 0;
}

int model_embed_forward(model_t *m, const float *embed_tokens, const int *tokens,
                        const int *targets, int b, int t, char *err, size_t errlen) {
  const model_batch_t bt = {.tokens = tokens, .targets = targets, .b = b, .t = t};
  return model_embed_forward_batch(m, embed_tokens, &bt, err, errlen);
}

/* Layer l's slices of the per-layer buffers (slot stride = allocated rows
 * NA times the width), and residual slot r. */
#define LAYER(buf, width) (a->buf + (size_t)(l % a->layer_slots) * NA * (width))
#define RES(r) (a->res + (size_t)((r) % a->res_slots) * NA * d->C)

void model_layer_forward(model_t *m, int l, const model_layer_t *w, lora_t *lora) {
  const model_dims_t *d = &m->d;
  model_acts_t *a = m->acts;
  const int n = m->b * m->t, C = d->C, QD = d->NH * d->HS, KVD = d->NKV * d->HS, FF = d->FF;
  const size_t NA = (size_t)m->B * m->T;
  const float *res = RES(l);
  float *res_next = RES(l + 1);
  float *ln1 = LAYER(ln1, C), *q = LAYER(q, QD), *k = LAYER(k, KVD), *v = LAYER(v, KVD);
  float *atty = LAYER(atty, QD), *mid = LAYER(mid, C), *ln2 = LAYER(ln2, C);
  float *gate = LAYER(gate, FF), *up = LAYER(up, FF), *h = LAYER(h, FF);
  float *lse = LAYER(lse, d->NH);

  cpu_rmsnorm_forward(ln1, LAYER(rstd1, 1), res, w->input_layernorm, n, C, d->eps);
  proj_forward(lora, l, JOBSPEC_TARGET_BIT_Q, q, ln1, w->q_proj, n, C, QD, 0.0f);
  proj_forward(lora, l, JOBSPEC_TARGET_BIT_K, k, ln1, w->k_proj, n, C, KVD, 0.0f);
  proj_forward(lora, l, JOBSPEC_TARGET_BIT_V, v, ln1, w->v_proj, n, C, KVD, 0.0f);
  if (w->q_bias) { /* Qwen2: before the rotation, as nn.Linear's bias */
    cpu_bias_forward(q, w->q_bias, n, QD);
    cpu_bias_forward(k, w->k_bias, n, KVD);
    cpu_bias_forward(v, w->v_bias, n, KVD);
  }
  const int *pos = a->has_pos ? a->pos : NULL;
  cpu_rope_forward(q, a->rope_cos, a->rope_sin, pos, m->b, m->t, d->NH, d->HS);
  cpu_rope_forward(k, a->rope_cos, a->rope_sin, pos, m->b, m->t, d->NKV, d->HS);
  cpu_attention_forward(atty, lse, a->scores, q, k, v, pos, m->b, m->t, d->NH, d->NKV, d->HS);
  /* mid = res + atty @ o^T: the residual is copied first, the product added. */
  memcpy(mid, res, sizeof(float) * n * C);
  proj_forward(lora, l, JOBSPEC_TARGET_BIT_O, mid, atty, w->o_proj, n, QD, C, 1.0f);

  cpu_rmsnorm_forward(ln2, LAYER(rstd2, 1), mid, w->post_attention_layernorm, n, C, d->eps);
  proj_forward(lora, l, JOBSPEC_TARGET_BIT_GATE, gate, ln2, w->gate_proj, n, C, FF, 0.0f);
  proj_forward(lora, l, JOBSPEC_TARGET_BIT_UP, up, ln2, w->up_proj, n, C, FF, 0.0f);
  cpu_swiglu_forward(h, gate, up, (size_t)n * FF);
  memcpy(res_next, mid, sizeof(float) * n * C);
  proj_forward(lora, l, JOBSPEC_TARGET_BIT_DOWN, res_next, h, w->down_proj, n, FF, C, 1.0f);
}

/* Training LoRA over a head in chunks, the head's backward runs in the
 * forward pass, chunk by chunk while the chunk's logits are at hand: the
 * head's weights are frozen, so all it leaves is the gradient of its input
 * for a loss scale of 1 (a->dlnf), which model_head_backward scales. No
 * chunk's logits are computed twice. Training every weight, lm_head's
 * gradient goes into a buffer the backward pass is handed, so there the
 * backward pass computes each chunk's logits again. */
static bool head_fused(const model_t *m) {
  const model_acts_t *a = m->acts;
  return a->has_targets && m->mode == MODEL_TRAIN_LORA && m->b * m->t > a->head_rows;
}

double model_head_forward(model_t *m, const float *norm, const float *lm_head) {
  const model_dims_t *d = &m->d;
  model_acts_t *a = m->acts;
  const int n = m->b * m->t, hc = a->head_rows;
  const size_t NA = (size_t)m->B * m->T;
  const float *res = RES(d->L);
  const bool fused = head_fused(m);
  cpu_rmsnorm_forward(a->lnf, a->rstdf, res, norm, n, d->C, d->eps);
  /* Chunk by chunk of rows: a chunk's logits, then its losses. Without
   * targets all rows fit one chunk (model_embed_forward_batch checks). */
  for (int r0 = 0; r0 < n; r0 += hc) {
    const int rows = n - r0 < hc ? n - r0 : hc;
    const float *lnf = a->lnf + (size_t)r0 * d->C;
    cpu_matmul_forward(a->logits, lnf, lm_head, rows, d->C, d->V, 0.0f);
    if (!a->has_targets) continue;
    cpu_crossentropy_forward(a->losses + r0, a->logits, a->targets + r0, rows, d->V);
    if (!fused) continue;
    cpu_crossentropy_backward(a->logits, a->targets + r0, a->has_weights ? a->weights + r0 : NULL,
                              rows, d->V, 1.0f);
    cpu_matmul_backward(a->dlnf + (size_t)r0 * d->C, NULL, a->logits, lnf, lm_head, rows, d->C,
                        d->V, 0.0f);
  }
  m->loss = 0.0;
  if (!a->has_targets) return m->loss;
  double sum = 0.0; /* in row order, whatever the chunks */
  for (int r = 0; r < n; r++)
    if (!a->has_weights || a->weights[r] != 0.0f) sum += a->losses[r];
  if (!a->has_weights)
    m->loss = sum / n;
  else
    m->loss = a->count > 0 ? sum / (double)a->count : 0.0;
  return m->loss;
}

void model_head_backward(model_t *m, const float *norm, const float *lm_head, float *dnorm,
                         float *dlm_head, float loss_scale) {
  const model_dims_t *d = &m->d;
  model_acts_t *a = m->acts;
  const int n = m->b * m->t, hc = a->head_rows;
  assert(a->has_targets && m->mode != MODEL_EVAL);
  const size_t NA = (size_t)m->B * m->T;
  const float *res = RES(d->L);
  /* Each counted target's share of the mean; none counted: no gradient.
   * With row scales, each counted target of row i weighs scales[i]. */
  const float *rs = a->row_scales;
  const float dloss =
      rs ? 1.0f
         : a->has_weights ? (a->count > 0 ? loss_scale / (float)a->count : 0.0f) : loss_scale / n;
  const float *w = a->has_weights ? a->weights : NULL;
  if (rs) {
    for (int r = 0; r < n; r++) a->row_w[r] = (w ? w[r] : 1.0f) * rs[r / m->t];
    w = a->row_w;
  }
  if (head_fused(m)) {
    assert(!dlm_head);
    /* a->dlnf is the gradient for weights w and a scale of 1: a row's scale
     * multiplies its rows of it. */
    for (int r = 0; r < n; r++) {
      const float s = rs ? rs[r / m->t] : dloss;
      for (int c = 0; c < d->C; c++) a->dln[(size_t)r * d->C + c] = a->dlnf[(size_t)r * d->C + c] * s;
    }
  } else {
    /* Chunk by chunk (its logits computed again unless the forward's are
     * all still there): logits become dlogits, then the head's input
     * gradient for the chunk's rows and the chunk's share of lm_head's. */
    for (int r0 = 0; r0 < n; r0 += hc) {
      const int rows = n - r0 < hc ? n - r0 : hc;
      const float *lnf = a->lnf + (size_t)r0 * d->C;
      if (n > hc) cpu_matmul_forward(a->logits, lnf, lm_head, rows, d->C, d->V, 0.0f);
      cpu_crossentropy_backward(a->logits, a->targets + r0, w ? w + r0 : NULL, rows, d->V, dloss);
      cpu_matmul_backward(a->dln + (size_t)r0 * d->C, dlm_head, a->logits, lnf, lm_head, rows, d->C,
                          d->V, 0.0f);
    }
  }
  cpu_rmsnorm_backward(a->dres, dnorm, a->dln, NULL, res, norm, a->rstdf, n, d->C);
}

void model_layer_backward(model_t *m, int l, const model_layer_t *w, const model_layer_t *dw,
                          lora_t *lora) {
  static const model_layer_t frozen; /* every gradient pointer NULL */
  const model_dims_t *d = &m->d;
  model_acts_t *a = m->acts;
  const int n = m->b * m->t, C = d->C, QD = d->NH * d->HS, KVD = d->NKV * d->HS, FF = d->FF;
  const size_t NA = (size_t)m->B * m->T;
  if (!dw) dw = &frozen;
  /* One layer slot (model_recompute_layers): the slot holds the layer
   * after l, so layer l's activations are computed again from its input,
   * residual slot l, which every layer keeps (the last layer's are still
   * there from the forward pass). */
  if (a->layer_slots == 1 && l < d->L - 1) model_layer_forward(m, l, w, lora);
  const float *res = RES(l);
  const float *ln1 = LAYER(ln1, C), *q = LAYER(q, QD), *k = LAYER(k, KVD), *v = LAYER(v, KVD);
  const float *atty = LAYER(atty, QD), *mid = LAYER(mid, C), *ln2 = LAYER(ln2, C);
  const float *gate = LAYER(gate, FF), *up = LAYER(up, FF), *h = LAYER(h, FF);
  const float *lse = LAYER(lse, d->NH);
  /* a->dres holds d(loss)/d(res[l+1]) on entry and d(loss)/d(res[l]) on exit. */

  proj_backward(lora, l, JOBSPEC_TARGET_BIT_DOWN, a->dh, dw->down_proj, a->dres, h, w->down_proj, n,
                FF, C, 0.0f);
  cpu_swiglu_backward(a->dgate, a->dup, a->dh, gate, up, (size_t)n * FF);
  proj_backward(lora, l, JOBSPEC_TARGET_BIT_GATE, a->dln, dw->gate_proj, a->dgate, ln2,
                w->gate_proj, n, C, FF, 0.0f);
  proj_backward(lora, l, JOBSPEC_TARGET_BIT_UP, a->dln, dw->up_proj, a->dup, ln2, w->up_proj, n, C,
                FF, 1.0f);
  cpu_rmsnorm_backward(a->dmid, dw->post_attention_layernorm, a->dln, a->dres, mid,
                       w->post_attention_layernorm, LAYER(rstd2, 1), n, C);

  proj_backward(lora, l, JOBSPEC_TARGET_BIT_O, a->datty, dw->o_proj, a->dmid, atty, w->o_proj, n,
                QD, C, 0.0f);
  const int *pos = a->has_pos ? a->pos : NULL;
  cpu_attention_backward(a->dq, a->dk, a->dv, a->dscores, a->datty, lse, q, k, v, pos, m->b, m->t,
                         d->NH, d->NKV, d->HS);
  cpu_rope_backward(a->dq, a->rope_cos, a->rope_sin, pos, m->b, m->t, d->NH, d->HS);
  cpu_rope_backward(a->dk, a->rope_cos, a->rope_sin, pos, m->b, m->t, d->NKV, d->HS);
  /* dq, dk, dv are now the projections' output gradients: the biases'. */
  if (dw->q_bias) cpu_bias_backward(dw->q_bias, a->dq, n, QD);
  if (dw->k_bias) cpu_bias_backward(dw->k_bias, a->dk, n, KVD);
  if (dw->v_bias) cpu_bias_backward(dw->v_bias, a->dv, n, KVD);
  proj_backward(lora, l, JOBSPEC_TARGET_BIT_Q, a->dln, dw->q_proj, a->dq, ln1, w->q_proj, n, C, QD,
                0.0f);
  proj_backward(lora, l, JOBSPEC_TARGET_BIT_K, a->dln, dw->k_proj, a->dk, ln1, w->k_proj, n, C, KVD,
                1.0f);
  proj_backward(lora, l, JOBSPEC_TARGET_BIT_V, a->dln, dw->v_proj, a->dv, ln1, w->v_proj, n, C, KVD,
                1.0f);
  cpu_rmsnorm_backward(a->dres, dw->input_layernorm, a->dln, a->dmid, res, w->input_layernorm,
                       LAYER(rstd1, 1), n, C);
}

void model_embed_backward(model_t *m, float *dembed_tokens) {
  if (dembed_tokens)
    cpu_embedding_backward(dembed_tokens, m->acts->dres, m->acts->tokens, m->b * m->t, m->d.C);
}

int model_forward_batch(model_t *m, const model_batch_t *batch, lora_t *lora, double *loss,
                        char *err, size_t errlen) {
  if (!m->params) {
    if (err && errlen)
      snprintf(err, errlen, "model_forward: the model holds no parameters; use the stages");
    return TY_EPRECONDITION;
  }
  int rc = model_embed_forward_batch(m, m->w.embed_tokens, batch, err, errlen);
  if (rc) return rc;
  for (int l = 0; l < m->d.L; l++) model_layer_forward(m, l, &m->w.layers[l], lora);
  double mean = model_head_forward(m, m->w.norm, m->w.lm_head);
  if (loss) *loss = mean;
  return 0;
}

int model_forward(model_t *m, const int *tokens, const int *targets, int b, int t, lora_t *lora,
                  double *loss, char *err, size_t errlen) {
  const model_batch_t bt = {.tokens = tokens, .targets = targets, .b = b, .t = t};
  return model_forward_batch(m, &bt, lora, loss, err, errlen);
}

void model_backward(model_t *m, lora_t *lora, float loss_scale) {
  assert(m->mode != MODEL_EVAL && m->params);
  model_head_backward(m, m->w.norm, m->w.lm_head, m->dw.norm, m->dw.lm_head, loss_scale);
  for (int l = m->d.L - 1; l >= 0; l--)
    model_layer_backward(m, l, &m->w.layers[l], m->grads ? &m->dw.layers[l] : NULL, lora);
  model_embed_backward(m, m->dw.embed_tokens);
}

void model_row_losses(const model_t *m, double *sums) {
  const model_acts_t *a = m->acts;
  for (int i = 0; i < m->b; i++) {
    double sum = 0.0; /* in position order */
    for (int j = 0; j < m->t; j++) {
      const int r = i * m->t + j;
      if (!a->has_weights || a->weights[r] != 0.0f) sum += a->losses[r];
    }
    sums[i] = a->has_targets ? sum : 0.0;
  }
}

void model_set_row_scales(model_t *m, const float *scales) {
  m->acts->row_scales = scales;
}
