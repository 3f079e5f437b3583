/* train_backend.c - the CPU model's backend and an accelerator's over a
 * host span; see train_backend.h. */
#include "worker/model/train_backend.h"

#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"

/* --- The CPU model. */

typedef struct {
  model_t *m;
  lora_t *lora;
  bool adapters_off; /* forwards over the frozen base alone */
  train_span_t span; /* the backend's, which never changes */
} host_t;

static int host_zero_grads(void *ctx, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const train_span_t *s = &((host_t *)ctx)->span;
  memset(s->grads, 0, s->n * sizeof *s->grads);
  return 0;
}
static int host_forward(void *ctx, const model_batch_t *bt, double *loss, char *err,
                        size_t errlen) {
  host_t *h = ctx;
  return model_forward_batch(h->m, bt, h->adapters_off ? NULL : h->lora, loss, err, errlen);
}
static int host_row_losses(void *ctx, double *sums, char *err, size_t errlen) {
  (void)err, (void)errlen;
  model_row_losses(((host_t *)ctx)->m, sums);
  return 0;
}
static int host_row_scales(void *ctx, const float *scales, char *err, size_t errlen) {
  (void)err, (void)errlen;
  model_set_row_scales(((host_t *)ctx)->m, scales);
  return 0;
}
static void host_adapters_on(void *ctx, bool on) {
  ((host_t *)ctx)->adapters_off = !on;
}
static int host_backward(void *ctx, float loss_scale, char *err, size_t errlen) {
  (void)err, (void)errlen;
  host_t *h = ctx;
  model_backward(h->m, h->lora, loss_scale);
  return 0;
}
static int host_sumsq(void *ctx, double *sumsq, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const train_span_t *s = &((host_t *)ctx)->span;
  *sumsq = optim_sumsq(s->grads, s->n);
  return 0;
}
static int host_step(void *ctx, optim_t *o, double lr, double grad_scale, char *err,
                     size_t errlen) {
  (void)err, (void)errlen;
  const train_span_t *s = &((host_t *)ctx)->span;
  optim_step(o, s->params, s->grads, lr, grad_scale);
  return 0;
}
/* Norm gains take no weight decay (the usual convention); the adapters'
 * matrices all do. */
static void host_no_decay(void *ctx, optim_t *o) {
  const host_t *h = ctx;
  if (h->lora) return;
  for (int i = 0; i < h->m->n_tensors; i++)
    if (h->m->tensors[i].ndim == 1)
      optim_exclude_decay(o, h->m->tensors[i].offset, h->m->tensors[i].numel);
}

int train_backend_host(train_backend_t *b, model_t *m, lora_t *lora, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  if (m->mode == MODEL_EVAL || (m->mode == MODEL_TRAIN_LORA) != !!lora)
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "the model was built in mode %d; training needs the mode of use_lora (%s)",
                   (int)m->mode, lora ? "adapters" : "every weight");
  if (!lora && (!m->params || !m->grads))
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "a host model trains its own weights only when it holds them and their "
                   "gradients (model_create or model_create_weights)");
  host_t *h = xcalloc(1, sizeof *h);
  h->m = m, h->lora = lora;
  h->span = (train_span_t){.params = lora ? lora->params : m->params,
                           .grads = lora ? lora->grads : m->grads,
                           .n = lora ? lora->n_params : m->n_params,
                           .adapters = lora != NULL};
  *b = (train_backend_t){.ctx = h,
                         .span = h->span,
                         .shape = m,
                         .zero_grads = host_zero_grads,
                         .forward = host_forward,
                         .backward = host_backward,
                         .grad_sumsq = host_sumsq,
                         .step = host_step,
                         .no_decay = host_no_decay,
                         .free = free,
                         .row_losses = host_row_losses,
                         .row_scales = host_row_scales,
                         .adapters_on = lora ? host_adapters_on : NULL};
  return 0;
}

int train_backend_passes(train_backend_t *b, model_t *m, lora_t *lora, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  if (!m->params)
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "evaluation passes need a model that holds its weights");
  host_t *h = xcalloc(1, sizeof *h);
  h->m = m, h->lora = lora;
  *b = (train_backend_t){.ctx = h,
                         .shape = m,
                         .forward = host_forward,
                         .free = free,
                         .row_losses = host_row_losses,
                         .row_scales = host_row_scales,
                         .adapters_on = lora ? host_adapters_on : NULL};
  return 0;
}

/* --- An accelerator's passes over a host span. */

typedef struct {
  train_backend_t host; /* the span's own backend: its layout and no-decay ranges */
  train_device_t dev;
} device_t;

static int dev_zero_grads(void *ctx, char *err, size_t errlen) {
  const device_t *d = ctx;
  return d->dev.zero_grads(d->dev.ctx, err, errlen);
}
static int dev_forward(void *ctx, const model_batch_t *bt, double *loss, char *err,
                       size_t errlen) {
  const device_t *d = ctx;
  return d->dev.forward(d->dev.ctx, bt, loss, err, errlen);
}
static int dev_backward(void *ctx, float loss_scale, char *err, size_t errlen) {
  const device_t *d = ctx;
  return d->dev.backward(d->dev.ctx, loss_scale, err, errlen);
}
static int dev_row_losses(void *ctx, double *sums, char *err, size_t errlen) {
  const device_t *d = ctx;
  return d->dev.row_losses(d->dev.ctx, sums, err, errlen);
}
static int dev_row_scales(void *ctx, const float *scales, char *err, size_t errlen) {
  const device_t *d = ctx;
  return d->dev.row_scales(d->dev.ctx, scales, err, errlen);
}
static void dev_adapters_on(void *ctx, bool on) {
  const device_t *d = ctx;
  d->dev.adapters_on(d->dev.ctx, on);
}
static void dev_no_decay(void *ctx, optim_t *o) {
  device_t *d = ctx;
  d->host.no_decay(d->host.ctx, o);
}
static void dev_free(void *ctx) {
  device_t *d = ctx;
  train_backend_free(&d->host);
  free(d);
}

/* The optimizer on the host: gradients down, parameters up. */
static int down_sumsq(void *ctx, double *sumsq, char *err, size_t errlen) {
  const device_t *d = ctx;
  const train_span_t *s = &d->host.span;
  int rc = d->dev.grads_to_host(d->dev.ctx, s->grads, s->n, err, errlen);
  if (!rc) *sumsq = optim_sumsq(s->grads, s->n);
  return rc;
}
static int up_step(void *ctx, optim_t *o, double lr, double grad_scale, char *err, size_t errlen) {
  const device_t *d = ctx;
  const train_span_t *s = &d->host.span;
  optim_step(o, s->params, s->grads, lr, grad_scale);
  return d->dev.params_from_host(d->dev.ctx, s->params, s->n, err, errlen);
}
static int up_state(void *ctx, const optim_t *o, char *err, size_t errlen) {
  (void)o;
  const device_t *d = ctx;
  return d->dev.params_from_host(d->dev.ctx, d->host.span.params, d->host.span.n, err, errlen);
}

/* The optimizer on the device: the span and the moments stay there. */
static int dev_sumsq(void *ctx, double *sumsq, char *err, size_t errlen) {
  const device_t *d = ctx;
  return d->dev.grad_sumsq(d->dev.ctx, sumsq, err, errlen);
}
static int dev_step(void *ctx, optim_t *o, double lr, double grad_scale, char *err,
                    size_t errlen) {
  const device_t *d = ctx;
  int rc = d->dev.adamw(d->dev.ctx, o, lr, grad_scale, err, errlen);
  if (!rc) o->t++; /* the step the device took */
  return rc;
}
static int dev_to_host(void *ctx, optim_t *o, char *err, size_t errlen) {
  const device_t *d = ctx;
  return d->dev.state_to_host(d->dev.ctx, d->host.span.params, o->m, o->v, d->host.span.n, err, errlen);
}
static int dev_from_host(void *ctx, const optim_t *o, char *err, size_t errlen) {
  const device_t *d = ctx;
  return d->dev.state_from_host(d->dev.ctx, d->host.span.params, o->m, o->v, d->host.span.n, err, errlen);
}

int train_backend_device(train_backend_t *b, train_backend_t *host, const train_device_t *dev,
                         int world, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  const bool adamw = dev->adamw != NULL;
  if (adamw && (host->span.adapters || (world > 1 && !host->span.sharded)))
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "the optimizer runs on the device for full training of one rank or of "
                   "shards, not for a replicated span");
  device_t *d = xcalloc(1, sizeof *d);
  d->host = *host, d->dev = *dev;
  memset(host, 0, sizeof *host);
  *b = (train_backend_t){.ctx = d,
                         .span = d->host.span,
                         .shape = d->host.shape,
                         .zero_grads = dev_zero_grads,
                         .forward = dev_forward,
                         .backward = dev_backward,
                         .grad_sumsq = adamw ? dev_sumsq : down_sumsq,
                         .step = adamw ? dev_step : up_step,
                         .no_decay = dev_no_decay,
                         .state_to_host = adamw ? dev_to_host : NULL,
                         .state_from_host = adamw ? dev_from_host : up_state,
                         .free = dev_free,
                         .row_losses = dev->row_losses ? dev_row_losses : NULL,
                         .row_scales = dev->row_scales ? dev_row_scales : NULL,
                         .adapters_on = dev->adapters_on ? dev_adapters_on : NULL};
  return 0;
}

void train_backend_free(train_backend_t *b) {
  if (b->free) b->free(b->ctx);
  memset(b, 0, sizeof *b);
}
