/* fsdp.c - sharded forward and backward over gathered units; see fsdp.h. */
#include "worker/dist/fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "worker/ckpt/outputs.h"
#include "worker/ckpt/quant4.h"
#include "worker/ckpt/safetensors.h"
#include "worker/ckpt/train_state.h"

/* Tensors per layer, in the table order of MODEL_LAYER_TENSORS (the
 * present ones: Qwen2's biases come last). */
#define MODEL_PER_LAYER model_layer_tensors(&f->m->d)

/* One tensor: its shard in the span, its place in the unit buffer. */
typedef struct {
  const model_tensor_t *t; /* the model's table entry (name, shape) */
  float *shard;            /* this rank's rows, in the span */
  float *gshard;           /* their gradients, or NULL */
  size_t *counts;          /* [world] elements of each rank's rows; 4-bit: floats of each
                              rank's record */
  size_t unit_off;         /* floats from the start of its unit's buffer */
  const loader_view_t *v;  /* its view; v->q4: gathered as records and dequantized */
} fsdp_tensor_t;

struct fsdp {
  model_t *m;
  comm_t *comm;
  loader_shard_t *shard; /* owned */
  int world, rank;
  fsdp_tensor_t *ts;     /* [m->n_tensors], the model's table order */
  int embed, norm, head; /* indices in ts; head = embed when tied */
  int *layer0;           /* [L] index of each layer's first tensor */
  float *span, *gspan;   /* shard span (the loader's block) and its gradients */
  size_t n;              /* floats in the span */
  float *unit, *gunit;   /* one gathered unit and its full gradients */
  size_t unit_n;
  model_layer_t lw, dlw; /* views of a gathered layer into unit / gunit */
  float *qbuf;           /* 4-bit: every rank's record of one tensor, gathered */
  float *qabs;           /* 4-bit, double quantization: one rank's absmax, recovered */
};

static int fail_comm(fsdp_t *f, int rc, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: %s", what, comm_error(f->comm));
  return rc;
}

int fsdp_create(fsdp_t **out, model_t *m, comm_t *comm, loader_shard_t *shard, fsdp_mode_t mode,
                char *err, size_t errlen) {
  const bool full = mode != FSDP_FROZEN;
  *out = NULL;
  if (shard->dtype != TY_DTYPE_F32 || shard->world_size != comm_world_size(comm) ||
      shard->rank != comm_rank(comm) || shard->layout.ntensors != (size_t)m->n_tensors) {
    snprintf(err, errlen,
             "fsdp: the shard (rank %d of %d, %zu tensors) does not fit rank %d of "
             "%d of a model of %d tensors in float32",
             shard->rank, shard->world_size, shard->layout.ntensors, comm_rank(comm),
             comm_world_size(comm), m->n_tensors);
    return TY_EINTERNAL;
  }
  fsdp_t *f = xcalloc(1, sizeof *f);
  f->m = m;
  f->comm = comm;
  f->shard = shard;
  f->world = comm_world_size(comm);
  f->rank = comm_rank(comm);
  f->span = shard->base;
  f->n = shard->bytes / sizeof(float);
  f->ts = xcalloc((size_t)m->n_tensors, sizeof *f->ts);
  f->layer0 = xcalloc((size_t)m->d.L, sizeof *f->layer0);
  f->embed = f->norm = f->head = -1;
  int rc = 0;
  if (full) {
    f->gspan = calloc(f->n ? f->n : 1, sizeof(float));
    if (!f->gspan) {
      snprintf(err, errlen, "fsdp: cannot allocate %zu gradient floats", f->n);
      rc = TY_EEXHAUSTED;
    }
  }
  /* Units: the embedding, each layer, norm + head; each laid out in table
   * order inside the unit buffer. */
  size_t unit_len = 0, head_len = 0;
  int prev_layer = -2;
  size_t qrecords = 0, qblocks = 0; /* the largest 4-bit tensor's records and a rank's blocks */
  if (shard->has_q4 && full) {
    snprintf(err, errlen, "fsdp: a 4-bit base is frozen: it trains adapters only");
    rc = TY_EINTERNAL;
  }
  for (int i = 0; i < m->n_tensors && !rc; i++) {
    const model_tensor_t *t = &m->tensors[i];
    const loader_view_t *v = loader_view_by_name(shard, t->name);
    if (!v || (size_t)(v->t->rows * (v->t->ndim == 2 ? v->t->cols : 1)) != t->numel) {
      snprintf(err, errlen, "fsdp: tensor %s has no shard of its shape", t->name);
      rc = TY_EINTERNAL;
      break;
    }
    fsdp_tensor_t *ft = &f->ts[i];
    ft->t = t;
    ft->v = v;
    ft->shard = (float *)shard->base + v->offset / sizeof(float); /* 64-byte aligned */
    ft->gshard = f->gspan ? f->gspan + v->offset / sizeof(float) : NULL;
    ft->counts = xcalloc((size_t)f->world, sizeof *ft->counts);
    size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    comm_shard_counts((size_t)t->shape[0], cols, f->world, ft->counts);
    if (v->q4) { /* a record a rank, in floats */
      size_t all = 0;
      for (int r = 0; r < f->world; r++) {
        loader_q4_piece_t p;
        loader_q4_piece((int64_t)t->numel, r, f->world, shard->q4.double_quant, &p);
        ft->counts[r] = p.record_bytes / sizeof(float);
        all += ft->counts[r];
        if (p.nblocks > qblocks) qblocks = p.nblocks;
      }
      if (all > qrecords) qrecords = all;
    } else if (ft->counts[f->rank] != (size_t)v->rows * cols) {
      snprintf(err, errlen, "fsdp: %s: the loader's rows and the collectives' split differ",
               t->name);
      rc = TY_EINTERNAL;
      break;
    }
    if (t->layer >= 0) {
      if (t->layer != prev_layer) f->layer0[t->layer] = i, unit_len = 0;
      ft->unit_off = unit_len;
      unit_len += t->numel;
    } else if (!strcmp(t->name, "model.embed_tokens.weight")) {
      f->embed = i;
      unit_len = t->numel;
    } else {
      if (!strcmp(t->name, "model.norm.weight"))
        f->norm = i;
      else
        f->head = i;
      ft->unit_off = head_len;
      head_len += t->numel;
      unit_len = head_len;
    }
    prev_layer = t->layer;
    if (unit_len > f->unit_n) f->unit_n = unit_len;
  }
  if (!rc && m->d.tied) {
    /* The head unit is norm + the embedding as lm_head. */
    f->head = f->embed;
    size_t len = f->ts[f->norm].t->numel + f->ts[f->embed].t->numel;
    if (len > f->unit_n) f->unit_n = len;
  }
  if (!rc && qrecords) {
    f->qbuf = malloc(qrecords * sizeof(float));
    f->qabs = malloc((qblocks ? qblocks : 1) * sizeof(float));
    if (!f->qbuf || !f->qabs) {
      snprintf(err, errlen, "fsdp: cannot allocate %zu floats to gather 4-bit records into",
               qrecords + qblocks);
      rc = TY_EEXHAUSTED;
    }
  }
  if (!rc && mode != FSDP_SPAN) {
    f->unit = malloc(f->unit_n * sizeof(float));
    f->gunit = full ? malloc(f->unit_n * sizeof(float)) : NULL;
    if (!f->unit || (full && !f->gunit)) {
      snprintf(err, errlen, "fsdp: cannot allocate two unit buffers of %zu floats", f->unit_n);
      rc = TY_EEXHAUSTED;
    }
  }
  if (rc) {
    fsdp_free(f);
    return rc;
  }
  *out = f;
  return 0;
}

void fsdp_free(fsdp_t *f) {
  if (!f) return;
  for (int i = 0; f->ts && i < f->m->n_tensors; i++) free(f->ts[i].counts);
  free(f->ts);
  free(f->layer0);
  free(f->gspan);
  free(f->unit);
  free(f->gunit);
  free(f->qbuf);
  free(f->qabs);
  loader_shard_free(f->shard);
  free(f);
}

float *fsdp_params(fsdp_t *f) {
  return f->span;
}
float *fsdp_grads(fsdp_t *f) {
  return f->gspan;
}
size_t fsdp_span(const fsdp_t *f) {
  return f->n;
}
const loader_shard_t *fsdp_shard(const fsdp_t *f) {
  return f->shard;
}

void fsdp_each_norm(const fsdp_t *f, void (*fn)(void *ctx, size_t off, size_t n), void *ctx) {
  for (int i = 0; i < f->m->n_tensors; i++)
    if (f->ts[i].t->ndim == 1)
      fn(ctx, (size_t)(f->ts[i].shard - f->span), f->ts[i].counts[f->rank]);
}

/* A 4-bit tensor: every rank's record gathered, each piece dequantized
 * into its elements of dst (bitsandbytes' dequantize_4bit). */
static void dequantize_records(fsdp_t *f, const fsdp_tensor_t *ft, float *dst) {
  const loader_q4_t *q = &f->shard->q4;
  const char *rec = (const char *)f->qbuf;
  for (int r = 0; r < f->world; r++) {
    loader_q4_piece_t p;
    loader_q4_piece((int64_t)ft->t->numel, r, f->world, q->double_quant, &p);
    const float *absmax = (const float *)(const void *)(rec + p.stats_off);
    if (q->double_quant) {
      q4_unnest_with(
          ft->v->q4_map ? ft->v->q4_map : q4_dynamic_code(), (const uint8_t *)rec + p.stats_off,
          (const float *)(const void *)(rec + p.nested_off), p.nblocks, ft->v->q4_offset, f->qabs);
      absmax = f->qabs;
    }
    q4_dequantize((q4_type_t)q->type, (const uint8_t *)rec, absmax, (size_t)p.nelem, dst + p.elem0);
    rec += p.record_bytes;
  }
  ty_dtype_round(q->compute, dst, ft->t->numel);
}

/* All-gathers tensor i into dst (its full numel floats). */
static int gather(fsdp_t *f, int i, float *dst, char *err, size_t errlen) {
  const fsdp_tensor_t *ft = &f->ts[i];
  int rc = comm_all_gather(f->comm, ft->shard, ft->v->q4 ? f->qbuf : dst, ft->counts);
  if (rc) return fail_comm(f, rc, ft->t->name, err, errlen);
  if (ft->v->q4) dequantize_records(f, ft, dst);
  return 0;
}

/* Reduce-scatters the full gradient src of tensor i (in place: this rank's
 * block of src receives the sum) and adds it into the gradient shard. */
static int scatter_add(fsdp_t *f, int i, float *src, char *err, size_t errlen) {
  const fsdp_tensor_t *ft = &f->ts[i];
  float *mine = src + comm_displ(ft->counts, f->rank);
  int rc = comm_reduce_scatter(f->comm, src, mine, ft->counts);
  if (rc) return fail_comm(f, rc, ft->t->name, err, errlen);
  for (size_t k = 0; k < ft->counts[f->rank]; k++) ft->gshard[k] += mine[k];
  return 0;
}

/* Points w at layer tensors laid out from base by their unit offsets
 * (NULL pointers when base is NULL); ts is the layer's first tensor. */
static void layer_views(const model_dims_t *d, model_layer_t *w, float *base,
                        const fsdp_tensor_t *ts) {
  int k = 0;
#define TY_X(field, name, rows, cols)                           \
  w->field = base && (rows) > 0 ? base + ts[k].unit_off : NULL; \
  k += (rows) > 0;
  MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
}

/* Gathers layer l into the unit buffer and points lw (and dlw) at it. */
static int gather_layer(fsdp_t *f, int l, char *err, size_t errlen) {
  const int i0 = f->layer0[l];
  layer_views(&f->m->d, &f->lw, f->unit, &f->ts[i0]);
  layer_views(&f->m->d, &f->dlw, f->gunit, &f->ts[i0]);
  for (int k = 0; k < MODEL_PER_LAYER; k++) {
    int rc = gather(f, i0 + k, f->unit + f->ts[i0 + k].unit_off, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* Gathers norm and head into the unit buffer; returns their pointers. */
static int gather_head(fsdp_t *f, float **norm, float **head, char *err, size_t errlen) {
  *norm = f->unit;
  *head = f->unit + f->ts[f->norm].t->numel;
  int rc = gather(f, f->norm, *norm, err, errlen);
  return rc ? rc : gather(f, f->head, *head, err, errlen);
}

/* An FSDP_SPAN runs no pass. */
static int no_passes(const fsdp_t *f, char *err, size_t errlen) {
  return f->unit ? 0
                 : ty_errf(err, errlen, TY_EINTERNAL,
                           "fsdp: this span's passes run on the device, not here");
}

int fsdp_forward(fsdp_t *f, const model_batch_t *batch, lora_t *lora, double *loss, char *err,
                 size_t errlen) {
  model_t *m = f->m;
  int rc = no_passes(f, err, errlen);
  if (!rc) rc = gather(f, f->embed, f->unit, err, errlen);
  if (!rc) rc = model_embed_forward_batch(m, f->unit, batch, err, errlen);
  for (int l = 0; l < m->d.L && !rc; l++) {
    rc = gather_layer(f, l, err, errlen);
    if (!rc) model_layer_forward(m, l, &f->lw, lora);
  }
  float *norm, *head;
  if (!rc) rc = gather_head(f, &norm, &head, err, errlen);
  if (rc) return rc;
  double mean = model_head_forward(m, norm, head);
  if (loss) *loss = mean;
  return 0;
}

int fsdp_backward(fsdp_t *f, lora_t *lora, float loss_scale, char *err, size_t errlen) {
  model_t *m = f->m;
  const bool full = f->gunit != NULL;
  int rc = no_passes(f, err, errlen);
  if (rc) return rc;
  /* The head unit is still gathered from the forward pass. */
  float *norm = f->unit, *head = f->unit + f->ts[f->norm].t->numel;
  float *dnorm = NULL, *dhead = NULL;
  if (full) {
    dnorm = f->gunit;
    dhead = f->gunit + f->ts[f->norm].t->numel;
    memset(f->gunit, 0, (f->ts[f->norm].t->numel + f->ts[f->head].t->numel) * sizeof(float));
  }
  model_head_backward(m, norm, head, dnorm, dhead, loss_scale);
  /* A tied head's gradient goes into the embedding's shard now; the
   * embedding's own part follows at the end (reduce-scatter is linear). */
  if (full && !(rc = scatter_add(f, f->norm, dnorm, err, errlen)))
    rc = scatter_add(f, f->head, dhead, err, errlen);
  for (int l = m->d.L - 1; l >= 0 && !rc; l--) {
    rc = gather_layer(f, l, err, errlen);
    if (rc) break;
    const int i0 = f->layer0[l];
    if (full) {
      size_t len = 0;
      for (int k = 0; k < MODEL_PER_LAYER; k++) len += f->ts[i0 + k].t->numel;
      memset(f->gunit, 0, len * sizeof(float));
    }
    model_layer_backward(m, l, &f->lw, full ? &f->dlw : NULL, lora);
    for (int k = 0; k < MODEL_PER_LAYER && full && !rc; k++)
      rc = scatter_add(f, i0 + k, f->gunit + f->ts[i0 + k].unit_off, err, errlen);
  }
  if (!rc && full) {
    memset(f->gunit, 0, f->ts[f->embed].t->numel * sizeof(float));
    model_embed_backward(m, f->gunit);
    rc = scatter_add(f, f->embed, f->gunit, err, errlen);
  }
  return rc;
}

int fsdp_write_model(fsdp_t *f, const char *dir, const llama_config_t *cfg, char *err,
                     size_t errlen) {
  const model_t *m = f->m;
  /* A span has no unit buffer: one of the largest tensor, for the writing. */
  float *buf = f->unit;
  if (!buf) {
    size_t most = 1;
    for (int i = 0; i < m->n_tensors; i++)
      if (m->tensors[i].numel > most) most = m->tensors[i].numel;
    if (!(buf = malloc(most * sizeof(float))))
      return ty_errf(err, errlen, TY_EEXHAUSTED,
                     "fsdp: cannot allocate %zu floats to gather a tensor into", most);
  }
  int rc = 0;
  st_writer_t *w = NULL;
  if (f->rank == 0) {
    rc = outputs_write_config(dir, cfg, err, errlen);
    st_desc_t *descs = xcalloc((size_t)m->n_tensors, sizeof *descs);
    for (int i = 0; i < m->n_tensors; i++) {
      descs[i].name = m->tensors[i].name;
      descs[i].dtype = TY_DTYPE_F32;
      descs[i].ndim = m->tensors[i].ndim;
      descs[i].shape[0] = m->tensors[i].shape[0];
      descs[i].shape[1] = m->tensors[i].shape[1];
    }
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/model.safetensors", dir);
    if (!rc) rc = st_writer_open(path, descs, (size_t)m->n_tensors, NULL, &w, err, errlen);
    free(descs);
  }
  /* Every rank takes part in every gather, whatever rank 0's state, so no
   * rank waits on a collective the others skipped. */
  int grc = 0;
  for (int i = 0; i < m->n_tensors && !grc; i++) {
    grc = gather(f, i, buf, err, errlen);
    if (!grc && w && !rc)
      rc = st_writer_write(w, buf, m->tensors[i].numel * sizeof(float), err, errlen);
  }
  if (buf != f->unit) free(buf);
  if (grc) {
    st_writer_close(w, NULL, 0);
    return grc;
  }
  if (w) {
    int rc2 = st_writer_close(w, rc ? NULL : err, rc ? 0 : errlen);
    if (!rc) rc = rc2;
  }
  return rc;
}

/* --- The loop's backend (worker/model/train_backend.h). */

typedef struct {
  fsdp_t *f;
  lora_t *lora;
  bool adapters_off; /* forwards over the frozen base alone */
  train_span_t span;
} fsdp_backend_t;

static int fb_zero_grads(void *ctx, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const train_span_t *s = &((fsdp_backend_t *)ctx)->span;
  memset(s->grads, 0, s->n * sizeof *s->grads);
  return 0;
}
static int fb_forward(void *ctx, const model_batch_t *bt, double *loss, char *err, size_t errlen) {
  fsdp_backend_t *b = ctx;
  return fsdp_forward(b->f, bt, b->adapters_off ? NULL : b->lora, loss, err, errlen);
}
static int fb_row_losses(void *ctx, double *sums, char *err, size_t errlen) {
  (void)err, (void)errlen;
  model_row_losses(((fsdp_backend_t *)ctx)->f->m, sums);
  return 0;
}
static int fb_row_scales(void *ctx, const float *scales, char *err, size_t errlen) {
  (void)err, (void)errlen;
  model_set_row_scales(((fsdp_backend_t *)ctx)->f->m, scales);
  return 0;
}
static void fb_adapters_on(void *ctx, bool on) {
  ((fsdp_backend_t *)ctx)->adapters_off = !on;
}
static int fb_backward(void *ctx, float loss_scale, char *err, size_t errlen) {
  fsdp_backend_t *b = ctx;
  return fsdp_backward(b->f, b->lora, loss_scale, err, errlen);
}
static int fb_sumsq(void *ctx, double *sumsq, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const train_span_t *s = &((fsdp_backend_t *)ctx)->span;
  *sumsq = optim_sumsq(s->grads, s->n);
  return 0;
}
static int fb_step(void *ctx, optim_t *o, double lr, double grad_scale, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const train_span_t *s = &((fsdp_backend_t *)ctx)->span;
  optim_step(o, s->params, s->grads, lr, grad_scale);
  return 0;
}
static void exclude_decay(void *ctx, size_t off, size_t len) {
  optim_exclude_decay(ctx, off, len);
}
static void fb_no_decay(void *ctx, optim_t *o) {
  const fsdp_backend_t *b = ctx;
  if (!b->lora) fsdp_each_norm(b->f, exclude_decay, o);
}

int fsdp_backend(train_backend_t *b, fsdp_t *f, lora_t *lora, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  if (!lora != !!f->gspan)
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "fsdp: adapters train over a frozen base (FSDP_FROZEN), every weight over "
                   "shards with gradients (FSDP_FULL, FSDP_SPAN)");
  fsdp_backend_t *fb = xcalloc(1, sizeof *fb);
  fb->f = f, fb->lora = lora;
  fb->span = lora ? (train_span_t){.params = lora->params,
                                   .grads = lora->grads,
                                   .n = lora->n_params,
                                   .adapters = true}
                  : (train_span_t){
                        .params = f->span, .grads = f->gspan, .n = f->n, .sharded = f->world > 1};
  *b = (train_backend_t){.ctx = fb,
                         .span = fb->span,
                         .shape = f->m,
                         .zero_grads = fb_zero_grads,
                         .forward = fb_forward,
                         .backward = fb_backward,
                         .grad_sumsq = fb_sumsq,
                         .step = fb_step,
                         .no_decay = fb_no_decay,
                         .free = free,
                         .row_losses = f->unit ? fb_row_losses : NULL,
                         .row_scales = f->unit ? fb_row_scales : NULL,
                         .adapters_on = lora ? fb_adapters_on : NULL};
  return 0;
}
