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

/* Splits windows [b, T+1] into inputs and targets [b, T]. */
static void split_windows(const int32_t *win, int b, int T, int *inputs, int *targets) {
  for (int i = 0; i < b; i++)
    for (int t = 0; t < T; t++) {
      inputs[i * T + t] = win[i * (T + 1) + t];
      targets[i * T + t] = win[i * (T + 1) + t + 1];
    }
}

/* Where the passes run: the model's own weights, the shards, or a device. */
typedef struct {
  model_t *m;
  fsdp_t *f;
  lora_t *lora;
  const train_device_t *dev;
} passes_t;

static int forward(const passes_t *p, const model_batch_t *bt, double *loss, char *err,
                   size_t errlen) {
  if (p->dev) return p->dev->forward(p->dev->ctx, bt, loss, err, errlen);
  if (p->f) return fsdp_forward(p->f, bt, p->lora, loss, err, errlen);
  return model_forward_batch(p->m, bt, p->lora, loss, err, errlen);
}

static int backward(const passes_t *p, float loss_scale, char *err, size_t errlen) {
  if (p->dev) return p->dev->backward(p->dev->ctx, loss_scale, err, errlen);
  if (p->f) return fsdp_backward(p->f, p->lora, loss_scale, err, errlen);
  model_backward(p->m, p->lora, loss_scale);
  return 0;
}

/* One row of an evaluation: tokens [T+1], and with masked, weights and pos
 * [T] (else NULL). */
typedef int (*eval_row_fn)(void *ctx, int64_t i, int32_t *tokens, float *weights, int32_t *pos,
                           char *err, size_t errlen);

/* The mean loss over the counted targets of n rows, B at a time. */
static int eval_loop(const passes_t *p, int T, int64_t n, eval_row_fn row, void *ctx, bool masked,
                     double *loss, int64_t *tokens_out, char *err, size_t errlen) {
  model_t *model = p->m;
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
    split_windows(win, b, T, inputs, targets);
    const model_batch_t bt = {inputs, targets, weights, pos, b, T};
    const int64_t c = model_batch_count(&bt);
    double l = 0;
    rc = forward(p, &bt, &l, err, errlen);
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
  passes_t p = {model, NULL, lora, NULL};
  window_rows_t w = {window, ctx};
  return eval_loop(&p, T, n, window_row, &w, false, loss, tokens_out, err, errlen);
}

static int eval_row(void *ctx, int64_t i, int32_t *tokens, float *weights, int32_t *pos, char *err,
                    size_t errlen);

int train_eval_data(model_t *model, lora_t *lora, data_t *d, int64_t n, double *loss,
                    int64_t *tokens_out, char *err, size_t errlen) {
  passes_t p = {model, NULL, lora, NULL};
  return eval_loop(&p, data_seq_len(d), n, eval_row, d, data_masked(d), loss, tokens_out, err,
                   errlen);
}

/* The trained span: the model's buffer or the adapters'. */
static void trained_span(const train_args_t *a, float **params, float **grads, size_t *n) {
  if (a->lora) {
    *params = a->lora->params;
    *grads = a->lora->grads;
    *n = a->lora->n_params;
  } else if (a->fsdp) {
    *params = fsdp_params(a->fsdp);
    *grads = fsdp_grads(a->fsdp);
    *n = fsdp_span(a->fsdp);
  } else {
    *params = a->model->params;
    *grads = a->model->grads;
    *n = a->model->n_params;
  }
}

static void exclude_decay(void *ctx, size_t off, size_t len) {
  optim_exclude_decay(ctx, off, len);
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

/* Held-out loss over up to eval_windows windows; NAN when there are none. */
static int held_out(const train_args_t *a, data_t *d, double *loss, char *err, size_t errlen) {
  *loss = NAN;
  int64_t n = data_num_eval_windows(d);
  if (a->eval_windows < n) n = a->eval_windows;
  if (n < 1) return 0;
  passes_t p = {a->model, a->fsdp, a->lora, a->device};
  return eval_loop(&p, a->spec->data.seq_len, n, eval_row, d, data_masked(d), loss, NULL, err,
                   errlen);
}

/* The data layout of spec s for rank of world over a vocabulary of V. */
static data_config_t data_config(const jobspec_t *s, const data_prepared_t *prep, int64_t V,
                                 int rank, int world) {
  return (data_config_t){.path = s->data.path,
                         .examples_path = prep && prep->path[0] ? prep->path : NULL,
                         .examples_key = prep ? prep->key : 0,
                         .pad_id = prep ? prep->pad_id : 0,
                         .packing = s->data.packing,
                         .format = s->data.format,
                         .vocab_size = V,
                         .seq_len = s->data.seq_len,
                         .eval_fraction = s->data.eval_fraction,
                         .seed = s->train.seed,
                         .world_size = world,
                         .rank = rank,
                         .micro_batch_size = s->train.micro_batch_size,
                         .grad_accum = s->train.grad_accum};
}

int train_data_prepare(const jobspec_t *s, int64_t vocab_size, const char *cache_dir,
                       data_prepare_progress_fn progress, void *ctx, data_prepared_t *out,
                       char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (s->data.format != JOBSPEC_DATA_JSONL) return 0;
  const char *tokenizer = s->data.tokenizer[0] ? s->data.tokenizer : s->model_path;
  if (!tokenizer[0])
    return ty_errf(err, errlen, TY_EINVAL,
                   "data.format jsonl needs a tokenizer: set data.tokenizer (a folder with "
                   "tokenizer.json, or the file) or model_path");
  char dir[JOBSPEC_PATH_MAX + 16];
  if (!cache_dir) snprintf(dir, sizeof dir, "%s/tokenized", s->output_dir);
  const data_prepare_t p = {.path = s->data.path,
                            .tokenizer = tokenizer,
                            .kind = s->data.kind,
                            .chat_template = s->data.chat_template,
                            .loss_on = s->data.loss_on,
                            .vocab_size = vocab_size};
  return data_prepare(&p, cache_dir ? cache_dir : dir, progress, ctx, out, err, errlen);
}

void train_jsonl_check(const jobspec_t *s, ty_errlist_t *errs) {
  llama_config_t cfg;
  char err[2048];
  if (s->init_from_scratch)
    cfg = s->model;
  else if (llama_config_init(&cfg), model_io_read_config(s->model_path, &cfg, err, sizeof err))
    return; /* the checkpoint's own rules name what is wrong with it */
  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/trainyard-check-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    ty_errlist_add(errs, "data.path", "cannot make a scratch folder to tokenize %s in: %s",
                   s->data.path, strerror(errno));
    return;
  }
  data_prepared_t prep;
  int rc = train_data_prepare(s, cfg.vocab_size, dir, NULL, NULL, &prep, err, sizeof err);
  if (!rc)
    rc = train_data_check(s, &prep, cfg.vocab_size, 0, s->world_size, NULL, 0, err, sizeof err);
  if (rc) ty_errlist_add(errs, "data.path", "%s", err);
  ty_rmtree(dir, NULL, 0);
}

int train_data_check(const jobspec_t *s, const data_prepared_t *prep, int64_t vocab_size, int rank,
                     int world, char *note, size_t notelen, char *err, size_t errlen) {
  const data_config_t dc = data_config(s, prep, vocab_size, rank, world);
  data_t *d = NULL;
  int rc = data_open(&d, &dc, err, errlen);
  if (note && notelen) note[0] = '\0';
  if (!rc && note && data_masked(d))
    snprintf(note, notelen,
             "%s: %lld examples (%lld tokens) in %lld training and %lld held-out rows of %d "
             "tokens%s; %lld cut to seq_len+1, %lld with no counted token left out",
             s->data.path, (long long)data_num_examples(d), (long long)data_num_tokens(d),
             (long long)data_num_train_windows(d), (long long)data_num_eval_windows(d),
             s->data.seq_len + 1, s->data.packing ? ", packed" : "",
             (long long)data_num_truncated(d), (long long)data_num_skipped(d));
  data_free(d);
  return rc;
}

int train_run(const train_args_t *a, train_result_t *res, char *err, size_t errlen) {
  const jobspec_t *s = a->spec;
  model_t *m = a->model;
  const int T = s->data.seq_len, B = s->train.micro_batch_size, A = s->train.grad_accum;
  const int rank = comm_rank(a->comm), world = comm_world_size(a->comm);
  const int64_t steps = s->train.steps;
  /* Each rank holds different shards: sharded full training. */
  const bool sharded = a->fsdp && !a->lora && world > 1;
  int64_t stop = a->stop_at_step > 0 && a->stop_at_step < steps ? a->stop_at_step : steps;
  memset(res, 0, sizeof *res);
  res->eval_loss_start = res->eval_loss_end = NAN;
  if (m->B < B || m->T < T || m->mode == MODEL_EVAL || (m->mode == MODEL_TRAIN_LORA) != !!a->lora) {
    snprintf(err, errlen,
             "the model was built for %dx%d tokens in mode %d; training needs %dx%d "
             "in the mode of use_lora",
             m->B, m->T, (int)m->mode, B, T);
    return TY_EINTERNAL;
  }
  /* A device trains adapters, the weights of a host model that holds them
   * (model_create_weights), or this rank's shards held in an fsdp span. */
  if (a->device && (a->fsdp ? a->lora != NULL : !a->lora && !m->params))
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "a device model trains adapters, the weights of a host model that holds "
                   "them (model_create_weights), or the shards of an fsdp span (FSDP_SPAN)");
  const passes_t passes = {m, a->fsdp, a->lora, a->device};
  const train_device_t *dev = a->device;
  /* The optimizer on the device: full training whose gradients need no
   * all-reduce (one rank, or shards). */
  const bool dev_opt = dev && dev->adamw;
  if (dev_opt && (a->lora || (world > 1 && !sharded)))
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "the optimizer runs on the device for full training of one rank or of "
                   "shards, not for a replicated span");
  const data_config_t dc = data_config(s, a->data, m->d.V, rank, world);
  data_t *d = NULL;
  optim_t *o = NULL;
  int32_t *win = NULL, *pos = NULL;
  int *inputs = NULL, *targets = NULL;
  float *weights = NULL;
  int rc = data_open(&d, &dc, err, errlen);
  if (rc) goto out;

  float *params, *grads;
  size_t n;
  trained_span(a, &params, &grads, &n);
  optim_config_t oc;
  optim_config_defaults(&oc);
  oc.lr = s->train.lr;
  oc.weight_decay = s->train.weight_decay;
  oc.warmup_steps = s->train.warmup_steps;
  oc.total_steps = (int)steps;
  o = optim_new(&oc, n, err, errlen);
  if (!o) {
    rc = TY_EEXHAUSTED;
    goto out;
  }
  /* Norm gains take no weight decay (the usual convention); the adapters'
   * matrices all do. */
  if (!a->lora && a->fsdp)
    fsdp_each_norm(a->fsdp, exclude_decay, o);
  else if (!a->lora)
    for (int i = 0; i < m->n_tensors; i++)
      if (m->tensors[i].ndim == 1)
        optim_exclude_decay(o, m->tensors[i].offset, m->tensors[i].numel);

  /* Adapters belong to their frozen base: rank 0 fingerprints it, so that
   * a checkpoint made over another base is not resumed. */
  char fp[CKPT_FINGERPRINT_LEN] = "";
  if (a->lora && s->model_path[0] && comm_rank(a->comm) == 0 &&
      (rc = ckpt_fingerprint(s->model_path, fp, err, errlen)))
    goto out;
  const train_base_t base = {s->model_path, fp};
  int64_t start = 0;
  rc = train_state_resume(s->output_dir, a->comm, d, o, params, n, sharded, &base, &start, err,
                          errlen);
  if (rc) goto out;
  res->start_step = start;
  /* The device's copy of the span (and with the optimizer there, the
   * moments) starts as the host's, resumed or not. */
  if (dev)
    rc = dev_opt ? dev->state_from_host(dev->ctx, params, o->m, o->v, n, err, errlen)
                 : dev->params_from_host(dev->ctx, params, n, err, errlen);
  if (rc) goto out;
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

  rc = held_out(a, d, &res->eval_loss_start, err, errlen);
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
  for (int64_t step = start; step < stop; step++) {
    double t0 = ty_mono_s();
    if (!dev) memset(grads, 0, n * sizeof *grads); /* host passes add into them */
    if (dev && (rc = dev->zero_grads(dev->ctx, err, errlen))) goto out;
    /* The objective is the mean loss over the counted targets of the whole
     * global batch: every rank knows their number up front (the data's
     * weights), so micro-batch k of c_k counted targets weighs c_k / C.
     * Unmasked data counts every target: 1 / (A * world), as always. */
    const int64_t counted = masked ? data_step_count(d, step) : 0;
    double loss_sum = 0; /* this rank's share of the step's loss */
    for (int mb = 0; mb < A; mb++) {
      rc = data_train_batch(d, step, mb, win, weights, pos, err, errlen);
      if (rc) goto out;
      split_windows(win, B, T, inputs, targets);
      const model_batch_t bt = {inputs, targets, weights, pos, B, T};
      const double part = masked && counted > 0 ? (double)model_batch_count(&bt) / counted : 0.0;
      const float loss_scale = masked ? (float)part : 1.0f / (float)(A * world);
      double l = 0;
      rc = forward(&passes, &bt, &l, err, errlen);
      if (!rc) rc = backward(&passes, loss_scale, err, errlen);
      if (rc) goto out;
      loss_sum += masked ? l * part : l;
    }
    double sumsq;
    if (dev_opt)
      rc = dev->grad_sumsq(dev->ctx, &sumsq, err, errlen);
    else if (!(rc = dev ? dev->grads_to_host(dev->ctx, grads, n, err, errlen) : 0))
      sumsq = optim_sumsq(grads, n);
    if (rc) goto out;
    /* lossbuf: this rank's share of the mean loss, then the squared norm
     * of its gradient shard when the span is sharded. */
    const double share = masked ? loss_sum : loss_sum * (1.0f / (float)(A * world));
    float lossbuf[2] = {(float)share, 0.0f};
    if (world > 1) {
      /* A replicated span sums every rank's gradients of its loss share:
       * the gradient of the mean loss over the global batch. Shards were
       * summed by the backward pass's reduce-scatter already. */
      lossbuf[1] = (float)sumsq;
      if ((!sharded && (rc = comm_all_reduce(a->comm, grads, n))) ||
          (rc = comm_all_reduce(a->comm, lossbuf, 2))) {
        snprintf(err, errlen, "step %lld: %s", (long long)step + 1, comm_error(a->comm));
        goto out;
      }
      if (sharded)
        sumsq = lossbuf[1];
      else
        sumsq = optim_sumsq(grads, n);
    }
    double loss = world > 1 ? (double)lossbuf[0] : share;
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
    if (dev_opt) {
      if ((rc = dev->adamw(dev->ctx, o, lr, clip, err, errlen))) goto out;
      o->t++; /* the step the device took */
    } else {
      optim_step(o, params, grads, lr, clip);
      if (dev && (rc = dev->params_from_host(dev->ctx, params, n, err, errlen))) goto out;
    }
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
                          .message = ""};
    if ((rc = report(a, &p, err, errlen))) goto out;
    /* SIGTERM to any rank: all stop after this step, with a checkpoint. */
    if ((rc = preempt_at_step(a->comm, &res->preempted, err, errlen))) goto out;
    if (res->preempted && (res->preempted = step + 1 < steps)) stop = step + 1;
    int every = s->train.checkpoint_every;
    bool periodic = every > 0 && (step + 1) % every == 0 && step + 1 < steps;
    if (periodic || (step + 1 == stop && stop < steps)) {
      if (dev_opt && (rc = dev->state_to_host(dev->ctx, params, o->m, o->v, n, err, errlen)))
        goto out;
      rc = train_state_save(s->output_dir, a->comm, d, o, params, n, step + 1, sharded, &base, err,
                            errlen);
      if (rc) goto out;
      char msg[96];
      snprintf(msg, sizeof msg, "checkpoint of step %lld written", (long long)step + 1);
      p.message = msg;
      p.phase = REPORT_PHASE_SAVING;
      if ((rc = report(a, &p, err, errlen))) goto out;
    }
  }
  rc = res->preempted ? 0 : held_out(a, d, &res->eval_loss_end, err, errlen);
  if (!rc && a->held_out_done && isfinite(res->eval_loss_end))
    a->held_out_done(a->progress_ctx, res->steps_done > start ? res->steps_done : start,
                     res->eval_loss_end);
  /* The outputs are written from the host's span. */
  if (!rc && dev_opt) rc = dev->state_to_host(dev->ctx, params, o->m, o->v, n, err, errlen);

out:
  free(win);
  free(inputs);
  free(targets);
  free(weights);
  free(pos);
  optim_free(o);
  data_free(d);
  return rc;
}
