/* train.c - the training loop of one rank; see train.h. */
#include "worker/rank/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/xalloc.h"
#include "common/fsutil.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/rank/preempt.h"
#include "worker/ckpt/model_io.h"
#include "worker/model/optim.h"
#include "worker/ckpt/train_state.h"
#include "worker/rank/train_dpo.h"


/* The forward passes an evaluation runs: a backend's, or a model's own. */
typedef struct {
  int (*forward)(void *ctx, const model_batch_t *batch, double *loss, char *err, size_t errlen);
  void *ctx;
  const model_t *shape; /* micro-batches of up to shape->B rows */
} passes_t;

typedef struct {
  model_t *m;
  lora_t *lora;
} model_lora_t;

static int model_lora_forward(void *ctx, const model_batch_t *bt, double *loss, char *err,
                              size_t errlen) {
  const model_lora_t *ml = ctx;
  return model_forward_batch(ml->m, bt, ml->lora, loss, err, errlen);
}

/* One row of an evaluation: tokens [T+1], and with masked, weights and pos
 * [T] (else NULL). */
typedef int (*eval_row_fn)(void *ctx, int64_t i, int32_t *tokens, float *weights, int32_t *pos,
                           char *err, size_t errlen);

/* The mean loss over the counted targets of n rows, B at a time. */
static int eval_loop(const passes_t *p, int T, int64_t n, eval_row_fn row, void *ctx, bool masked,
                     double *loss, int64_t *tokens_out, char *err, size_t errlen) {
  const model_t *model = p->shape;
  const int B = model->B;
  if (T > model->T || n < 1) {
    snprintf(err, errlen, "evaluation of %lld windows of %d tokens on a model built for %d",
             (long long)n, T, model->T);
    return TY_EINVAL;
  }
  int32_t *win = xmalloc((size_t)B * (T + 1) * sizeof *win);
  int *inputs = xmalloc((size_t)B * T * sizeof *inputs);
  int *targets = xmalloc((size_t)B * T * sizeof *targets);
  float *weights = masked ? xmalloc((size_t)B * T * sizeof *weights) : NULL;
  int32_t *pos = masked ? xmalloc((size_t)B * T * sizeof *pos) : NULL;
  double sum = 0; /* sum of per-token losses */
  int64_t count = 0;
  int rc = 0;
  for (int64_t i = 0; i < n && !rc; i += B) {
    int b = (int)(n - i < B ? n - i : B);
    for (int j = 0; j < b && !rc; j++)
      rc = row(ctx, i + j, win + (size_t)j * (T + 1), masked ? weights + (size_t)j * T : NULL,
               masked ? pos + (size_t)j * T : NULL, err, errlen);
    if (rc) break;
    data_split_rows(win, b, T, inputs, targets);
    const model_batch_t bt = {inputs, targets, weights, pos, b, T};
    const int64_t c = model_batch_count(&bt);
    double l = 0;
    rc = p->forward(p->ctx, &bt, &l, err, errlen);
    sum += l * (double)c;
    count += c;
  }
  free(win);
  free(inputs);
  free(targets);
  free(weights);
  free(pos);
  if (rc) return rc;
  *loss = count > 0 ? sum / (double)count : 0.0;
  if (tokens_out) *tokens_out = count;
  return 0;
}

typedef struct {
  train_window_fn window;
  void *ctx;
} window_rows_t;

static int window_row(void *ctx, int64_t i, int32_t *tokens, float *weights, int32_t *pos,
                      char *err, size_t errlen) {
  (void)weights, (void)pos;
  const window_rows_t *w = ctx;
  return w->window(w->ctx, i, tokens, err, errlen);
}

int train_eval(model_t *model, lora_t *lora, int T, int64_t n, train_window_fn window, void *ctx,
               double *loss, int64_t *tokens_out, char *err, size_t errlen) {
  model_lora_t ml = {model, lora};
  const passes_t p = {model_lora_forward, &ml, model};
  window_rows_t w = {window, ctx};
  return eval_loop(&p, T, n, window_row, &w, false, loss, tokens_out, err, errlen);
}

static int eval_row(void *ctx, int64_t i, int32_t *tokens, float *weights, int32_t *pos, char *err,
                    size_t errlen);

int train_eval_data(model_t *model, lora_t *lora, data_t *d, int64_t n, double *loss,
                    int64_t *tokens_out, char *err, size_t errlen) {
  model_lora_t ml = {model, lora};
  const passes_t p = {model_lora_forward, &ml, model};
  return eval_loop(&p, data_seq_len(d), n, eval_row, d, data_masked(d), loss, tokens_out, err,
                   errlen);
}

static int report(const train_args_t *a, const train_progress_t *p, char *err, size_t errlen) {
  if (!a->progress || a->progress(a->progress_ctx, p) == 0) return 0;
  snprintf(err, errlen, "stopped at step %lld: the attempt was ended from outside",
           (long long)p->step);
  return TY_ECANCELLED;
}

static int eval_row(void *ctx, int64_t i, int32_t *tokens, float *weights, int32_t *pos, char *err,
                    size_t errlen) {
  return data_eval_row(ctx, i, tokens, weights, pos, err, errlen);
}

/* Held-out loss over up to eval_windows windows (dpo: pairs, through t);
 * NAN when there are none. */
static int held_out(const train_args_t *a, data_t *d, train_dpo_t *t, double *loss, char *err,
                    size_t errlen) {
  *loss = NAN;
  int64_t n = data_num_eval_windows(d);
  if (a->eval_windows < n) n = a->eval_windows;
  if (n < 1) return 0;
  if (t) {
    dpo_sums_t sums = {0};
    int rc = train_dpo_eval(t, n, &sums, err, errlen);
    if (!rc) *loss = dpo_mean(&sums).loss;
    return rc;
  }
  const train_backend_t *b = a->backend;
  const passes_t p = {b->forward, b->ctx, b->shape};
  return eval_loop(&p, a->spec->data.seq_len, n, eval_row, d, data_masked(d), loss, NULL, err,
                   errlen);
}

int train_run(const train_args_t *a, train_result_t *res, char *err, size_t errlen) {
  const jobspec_t *s = a->spec;
  const train_backend_t *b = a->backend;
  const train_span_t *span = &b->span;
  const int T = s->data.seq_len, A = s->train.grad_accum;
  /* Rows a micro-batch feeds the model: dpo's pairs are two each. */
  const bool dpo = s->train.objective == JOBSPEC_OBJECTIVE_DPO;
  const int B = jobspec_micro_batch_rows(s);
  const int rank = comm_rank(a->comm), world = comm_world_size(a->comm);
  const int64_t steps = s->train.steps;
  int64_t stop = a->stop_at_step > 0 && a->stop_at_step < steps ? a->stop_at_step : steps;
  memset(res, 0, sizeof *res);
  res->eval_loss_start = res->eval_loss_end = NAN;
  if (b->shape->B < B || b->shape->T < T)
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "the model was built for %dx%d tokens; training needs %dx%d", b->shape->B,
                   b->shape->T, B, T);
  const data_config_t dc = train_data_config(s, a->data, b->shape->d.V, rank, world);
  data_t *d = NULL;
  optim_t *o = NULL;
  int32_t *win = NULL, *pos = NULL;
  int *inputs = NULL, *targets = NULL;
  float *weights = NULL;
  train_dpo_t *pref = NULL;
  int rc = data_open(&d, &dc, err, errlen);
  if (rc) goto out;

  /* --- Set-up: the optimizer over the span, a resumed checkpoint. */
  optim_config_t oc;
  optim_config_defaults(&oc);
  oc.lr = s->train.lr;
  oc.weight_decay = s->train.weight_decay;
  oc.warmup_steps = s->train.warmup_steps;
  oc.total_steps = (int)steps;
  o = optim_new(&oc, span->n, err, errlen);
  if (!o) {
    rc = TY_EEXHAUSTED;
    goto out;
  }
  b->no_decay(b->ctx, o);

  /* Adapters belong to their frozen base: rank 0 fingerprints it, so that
   * a checkpoint made over another base is not resumed. */
  char fp[CKPT_FINGERPRINT_LEN] = "";
  if (span->adapters && s->model_path[0] && rank == 0 &&
      (rc = ckpt_fingerprint(s->model_path, fp, err, errlen)))
    goto out;
  const train_base_t base = {s->model_path, fp};
  int64_t start = 0;
  rc = train_state_resume(s->output_dir, a->comm, d, o, span->params, span->n, span->sharded, &base,
                          &start, err, errlen);
  if (rc) goto out;
  res->start_step = start;
  /* A device's copy of the span (and the moments, where its optimizer
   * runs there) starts as the host's, resumed or not. */
  if (b->state_from_host && (rc = b->state_from_host(b->ctx, o, err, errlen))) goto out;
  if (start > 0) {
    char msg[96];
    snprintf(msg, sizeof msg, "resumed from the checkpoint of step %lld", (long long)start);
    train_progress_t p = {.phase = REPORT_PHASE_LOADING,
                          .step = start,
                          .total_steps = steps,
                          .loss = NAN,
                          .lr = NAN,
                          .grad_norm = NAN,
                          .eval_loss = NAN,
                          .message = msg};
    if ((rc = report(a, &p, err, errlen))) goto out;
  }

  /* DPO's reference, where it is scored before the first step. */
  if (dpo && (rc = train_dpo_open(&pref, a, d, start, err, errlen))) goto out;
  rc = held_out(a, d, pref, &res->eval_loss_start, err, errlen);
  if (rc) goto out;
  if (a->held_out_done && isfinite(res->eval_loss_start))
    a->held_out_done(a->progress_ctx, start, res->eval_loss_start);

  win = xmalloc((size_t)B * (T + 1) * sizeof *win);
  inputs = xmalloc((size_t)B * T * sizeof *inputs);
  targets = xmalloc((size_t)B * T * sizeof *targets);
  /* Loss weights and document positions, where the data has them. */
  const bool masked = data_masked(d);
  if (masked) {
    weights = xmalloc((size_t)B * T * sizeof *weights);
    pos = xmalloc((size_t)B * T * sizeof *pos);
  }

  /* --- The steps. */
  for (int64_t step = start; step < stop; step++) {
    double t0 = ty_mono_s();
    if ((rc = b->zero_grads(b->ctx, err, errlen))) goto out;
    /* The objective is the mean loss over the counted targets of the whole
     * global batch: every rank knows their number up front (the data's
     * weights), so micro-batch k of c_k counted targets weighs c_k / C.
     * Unmasked data counts every target: 1 / (A * world), as always. */
    const int64_t counted = masked && !dpo ? data_step_count(d, step) : 0;
    double loss_sum = 0; /* this rank's share of the step's loss */
    /* DPO: the mean over the global batch's pairs, each weighing 1 / G. */
    dpo_sums_t dsums = {0};
    const double pair_weight = 1.0 / (double)data_global_batch(d);
    for (int mb = 0; mb < A; mb++) {
      rc = data_train_batch(d, step, mb, win, weights, pos, err, errlen);
      if (rc) goto out;
      data_split_rows(win, B, T, inputs, targets);
      const model_batch_t bt = {inputs, targets, weights, pos, B, T};
      if (dpo) {
        if ((rc = train_dpo_step(pref, &bt, step, mb, pair_weight, &dsums, err, errlen))) goto out;
        continue;
      }
      const double part = masked && counted > 0 ? (double)model_batch_count(&bt) / counted : 0.0;
      const float loss_scale = masked ? (float)part : 1.0f / (float)(A * world);
      double l = 0;
      rc = b->forward(b->ctx, &bt, &l, err, errlen);
      if (!rc) rc = b->backward(b->ctx, loss_scale, err, errlen);
      if (rc) goto out;
      loss_sum += masked ? l * part : l;
    }
    double sumsq;
    if ((rc = b->grad_sumsq(b->ctx, &sumsq, err, errlen))) goto out;
    /* lossbuf: this rank's share of the mean loss, then the squared norm
     * of its gradient shard when the span is sharded. */
    const double share = dpo      ? dsums.loss * pair_weight
                         : masked ? loss_sum
                                  : loss_sum * (1.0f / (float)(A * world));
    /* With dpo, the sums of its metrics over this rank's pairs follow. */
    float lossbuf[2 + DPO_SUMS_N] = {(float)share, 0.0f};
    dpo_sums_pack(&dsums, &lossbuf[2]);
    const size_t nbuf = dpo ? 2 + DPO_SUMS_N : 2;
    if (world > 1) {
      /* A replicated span sums every rank's gradients of its loss share:
       * the gradient of the mean loss over the global batch. Shards were
       * summed by the backward pass's reduce-scatter already. */
      lossbuf[1] = (float)sumsq;
      if ((!span->sharded && (rc = comm_all_reduce(a->comm, span->grads, span->n))) ||
          (rc = comm_all_reduce(a->comm, lossbuf, nbuf))) {
        snprintf(err, errlen, "step %lld: %s", (long long)step + 1, comm_error(a->comm));
        goto out;
      }
      sumsq = span->sharded ? lossbuf[1] : optim_sumsq(span->grads, span->n);
    }
    double loss = world > 1 ? (double)lossbuf[0] : share;
    if (dpo && world > 1) dpo_sums_unpack(&dsums, &lossbuf[2]);
    const dpo_sums_t dmean = dpo_mean(&dsums);
    double norm = sqrt(sumsq);
    if (!isfinite(loss) || !isfinite(norm)) {
      snprintf(err, errlen,
               "step %lld: the %s is not finite (loss %g, gradient norm %g); lower "
               "train.lr or set train.grad_clip",
               (long long)step + 1, isfinite(loss) ? "gradient" : "loss", loss, norm);
      rc = TY_EABORTED;
      goto out;
    }
    double lr = optim_lr_at(&oc, step), clip = optim_clip_factor(norm, s->train.grad_clip);
    if ((rc = b->step(b->ctx, o, lr, clip, err, errlen))) goto out;
    double dt = ty_mono_s() - t0;
    if (step == start) res->first_loss = loss;
    res->last_loss = loss;
    res->steps_done = step + 1;
    train_progress_t p = {.phase = REPORT_PHASE_TRAINING,
                          .step = step + 1,
                          .total_steps = steps,
                          .loss = loss,
                          .tokens_per_s = dt > 0 ? (double)A * B * T / dt : 0,
                          .lr = lr,
                          .grad_norm = norm,
                          .eval_loss = NAN,
                          .message = "",
                          .dpo = dpo ? &dmean : NULL};
    if ((rc = report(a, &p, err, errlen))) goto out;
    /* SIGTERM to any rank: all stop after this step, with a checkpoint. */
    if ((rc = preempt_at_step(a->comm, &res->preempted, err, errlen))) goto out;
    if (res->preempted && (res->preempted = step + 1 < steps)) stop = step + 1;

    /* --- Checkpoints. */
    int every = s->train.checkpoint_every;
    bool periodic = every > 0 && (step + 1) % every == 0 && step + 1 < steps;
    if (periodic || (step + 1 == stop && stop < steps)) {
      if (b->state_to_host && (rc = b->state_to_host(b->ctx, o, err, errlen))) goto out;
      rc = train_state_save(s->output_dir, a->comm, d, o, span->params, span->n, step + 1,
                            span->sharded, &base, err, errlen);
      if (rc) goto out;
      char msg[96];
      snprintf(msg, sizeof msg, "checkpoint of step %lld written", (long long)step + 1);
      p.message = msg;
      p.phase = REPORT_PHASE_SAVING;
      if ((rc = report(a, &p, err, errlen))) goto out;
    }
  }
  rc = res->preempted ? 0 : held_out(a, d, pref, &res->eval_loss_end, err, errlen);
  if (!rc && a->held_out_done && isfinite(res->eval_loss_end))
    a->held_out_done(a->progress_ctx, res->steps_done > start ? res->steps_done : start,
                     res->eval_loss_end);
  /* The outputs are written from the host's span. */
  if (!rc && b->state_to_host) rc = b->state_to_host(b->ctx, o, err, errlen);

out:
  free(win);
  free(inputs);
  free(targets);
  free(weights);
  free(pos);
  optim_free(o);
  train_dpo_free(pref);
  data_free(d);
  return rc;
}
