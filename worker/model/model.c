/* model.c - the model's buffers: shape checks, the tensor table, one
 * parameter allocation (and one gradient allocation of the same layout),
 * the activations, filling from a tensor source and random initialisation.
 * The forward and backward passes are in model_step.c. */
#include "worker/model/model.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/rankenv.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/model_internal.h"
#include "worker/model/weightinit.h"

int model_dims_from_config(model_dims_t *d, const llama_config_t *cfg, char *err, size_t errlen) {
  const int64_t lim = 1 << 24; /* keeps every product below in size_t and each size in an int */
  struct {
    const char *name;
    int64_t v;
  } sizes[] = {{"hidden_size", cfg->hidden_size},
               {"intermediate_size", cfg->intermediate_size},
               {"num_hidden_layers", cfg->num_hidden_layers},
               {"num_attention_heads", cfg->num_attention_heads},
               {"num_key_value_heads", cfg->num_key_value_heads},
               {"head_dim", cfg->head_dim},
               {"vocab_size", cfg->vocab_size}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].v < 1 || sizes[i].v > lim)
      return ty_errf(err, errlen, TY_EINVAL, "model: %s is %lld; it must be between 1 and %lld",
                     sizes[i].name, (long long)sizes[i].v, (long long)lim);
  if (cfg->num_attention_heads % cfg->num_key_value_heads)
    return ty_errf(err, errlen, TY_EINVAL,
                   "model: num_attention_heads (%lld) must be a multiple of num_key_value_heads "
                   "(%lld)",
                   (long long)cfg->num_attention_heads, (long long)cfg->num_key_value_heads);
  if (cfg->head_dim % 2)
    return ty_errf(err, errlen, TY_EINVAL,
                   "model: head_dim is %lld; rotary embeddings need an even head size",
                   (long long)cfg->head_dim);
  if (!(cfg->rms_norm_eps > 0) || !(cfg->rope_theta > 0))
    return ty_errf(err, errlen, TY_EINVAL, "model: rms_norm_eps and rope_theta must be positive");
  const llama_rope_scaling_t *rs = &cfg->rope_scaling;
  if (rs->type != LLAMA_ROPE_DEFAULT &&
      (!(rs->factor > 0) ||
       (rs->type == LLAMA_ROPE_LLAMA3 &&
        !(rs->low_freq_factor > 0 && rs->high_freq_factor > rs->low_freq_factor &&
          rs->original_max_position_embeddings >= 1))))
    return ty_errf(err, errlen, TY_EINVAL,
                   "model: rope_scaling needs factor > 0 (and, for llama3, 0 < low_freq_factor "
                   "< high_freq_factor and original_max_position_embeddings >= 1)");
  d->C = (int)cfg->hidden_size;
  d->FF = (int)cfg->intermediate_size;
  d->L = (int)cfg->num_hidden_layers;
  d->NH = (int)cfg->num_attention_heads;
  d->NKV = (int)cfg->num_key_value_heads;
  d->HS = (int)cfg->head_dim;
  d->V = (int)cfg->vocab_size;
  d->eps = (float)cfg->rms_norm_eps;
  d->rope_theta = cfg->rope_theta;
  d->rope_scaling = cfg->rope_scaling;
  d->tied = cfg->tie_word_embeddings;
  d->qkv_bias = cfg->qkv_bias;
  return 0;
}

static void table_add(model_t *m, const char *name, int64_t rows, int64_t cols, int layer,
                      size_t *offset) {
  model_tensor_t *t = &m->tensors[m->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = cols ? 2 : 1;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
  t->offset = *offset;
  t->layer = layer;
  *offset += t->numel;
}

/* The table in storage order; offsets only (data pointers come later). */
static void table_build(model_t *m) {
  const model_dims_t *d = &m->d;
  size_t off = 0;
  char name[96];
  table_add(m, "model.embed_tokens.weight", d->V, d->C, -1, &off);
  for (int l = 0; l < d->L; l++) {
#define TY_X(field, suffix, rows, cols)                           \
  if ((rows) > 0) {                                               \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix); \
    table_add(m, name, rows, cols, l, &off);                      \
  }
    MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  }
  table_add(m, "model.norm.weight", d->C, 0, -1, &off);
  if (!d->tied) table_add(m, "lm_head.weight", d->V, d->C, -1, &off);
  m->n_params = off;
}

/* Points w at base + each tensor's offset, in table order. */
static void views_set(const model_t *m, model_weights_t *w, float *base) {
  if (!base) {
    for (int l = 0; l < m->d.L; l++) memset(&w->layers[l], 0, sizeof w->layers[l]);
    w->embed_tokens = w->norm = w->lm_head = NULL;
    return;
  }
  const model_dims_t *d = &m->d;
  const model_tensor_t *t = m->tensors;
  w->embed_tokens = base + (t++)->offset;
  for (int l = 0; l < m->d.L; l++) {
#define TY_X(field, suffix, rows, cols) \
  w->layers[l].field = (rows) > 0 ? base + (t++)->offset : NULL;
    MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  }
  w->norm = base + (t++)->offset;
  w->lm_head = m->d.tied ? w->embed_tokens : base + (t++)->offset;
  assert(t == m->tensors + m->n_tensors);
}

static size_t acts_floats(const model_dims_t *d, size_t N, size_t T, size_t LS, size_t RS,
                          size_t HC, bool backward) {
  const size_t C = (size_t)d->C, NH = (size_t)d->NH, NKV = (size_t)d->NKV, HS = (size_t)d->HS;
  const size_t FF = (size_t)d->FF, V = (size_t)d->V;
  size_t total = 0;
#define TY_X(field, n, bw) \
  if (!(bw) || backward) total += (n);
  MODEL_ACTS(TY_X)
#undef TY_X
  return total;
}

static void acts_free(model_acts_t *a) {
  if (!a) return;
  free(a->tokens);
  free(a->targets);
  free(a->weights);
  free(a->row_w);
  free(a->pos);
  free(a->block);
  free(a);
}

/* recompute: one layer slot for training too (model_recompute_layers). */
static int acts_create(model_t *m, bool recompute) {
  const model_dims_t *d = &m->d;
  size_t N = (size_t)m->B * m->T, T = (size_t)m->T;
  bool backward = m->mode != MODEL_EVAL;
  size_t LS = backward && !recompute ? (size_t)d->L : 1, RS = backward ? (size_t)d->L + 1 : 2;
  model_acts_t *a = calloc(1, sizeof *a);
  if (!a) return TY_EEXHAUSTED;
  m->acts = a;
  a->layer_slots = (int)LS;
  a->res_slots = (int)RS;
  a->head_rows = m->head_rows;
  const size_t HC = (size_t)a->head_rows;
  a->tokens = malloc(sizeof(int) * N);
  a->targets = malloc(sizeof(int) * N);
  a->weights = malloc(sizeof(float) * N);
  a->row_w = malloc(sizeof(float) * N);
  a->pos = malloc(sizeof(int) * N);
  const size_t floats = acts_floats(d, N, T, LS, RS, HC, backward);
  a->bytes = sizeof(float) * floats + MODEL_ACTS_ROW_BYTES * N;
  a->block = malloc(sizeof(float) * floats);
  if (!a->tokens || !a->targets || !a->weights || !a->row_w || !a->pos || !a->block)
    return TY_EEXHAUSTED;
  const size_t C = (size_t)d->C, NH = (size_t)d->NH, NKV = (size_t)d->NKV, HS = (size_t)d->HS;
  const size_t FF = (size_t)d->FF, V = (size_t)d->V;
  float *p = a->block;
#define TY_X(field, n, bw) \
  if (!(bw) || backward) { \
    a->field = p;          \
    p += (n);              \
  }
  MODEL_ACTS(TY_X)
#undef TY_X
  assert(p == a->block + floats);
  cpu_rope_tables(a->rope_cos, a->rope_sin, m->T, d->HS, d->rope_theta, &d->rope_scaling);
  m->logits = a->logits;
  return 0;
}

int model_head_rows(size_t rows, int V, int *out, char *err, size_t errlen) {
  long hc = (long)llama_head_rows((int64_t)rows, V);
  int rc = rankenv_long(RANKENV_HEAD_ROWS, &hc, err, errlen);
  if ((size_t)hc > rows) hc = (long)rows;
  *out = hc < 1 ? 1 : (int)hc;
  return rc;
}

int model_init_shape(model_t *m, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                     char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int rc = model_dims_from_config(&m->d, cfg, err, errlen);
  if (rc) return rc;
  if (B < 1 || T < 1 || (int64_t)B * T > (1 << 24))
    return ty_errf(err, errlen, TY_EINVAL,
                   "model: micro-batch %d x %d tokens; both must be at least 1 and their product "
                   "at most %d",
                   B, T, 1 << 24);
  if (cfg->sliding_window > 0 && T > cfg->sliding_window)
    return ty_errf(err, errlen, TY_EINVAL,
                   "model: data.seq_len %d is longer than config.json's sliding_window (%lld); "
                   "trainyard has no sliding-window attention (within the window the model is "
                   "Llama's): set data.seq_len to at most %lld",
                   T, (long long)cfg->sliding_window, (long long)cfg->sliding_window);
  m->B = B;
  m->T = T;
  m->mode = mode;
  return model_head_rows((size_t)B * T, m->d.V, &m->head_rows, err, errlen);
}

/* own: allocate the parameter (and gradient) buffers; else the caller
 * supplies every weight to the stage functions. acts: the activations. */
static int create(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                  bool own, bool acts, char *err, size_t errlen) {
  *out = NULL;
  model_t shape;
  int rc = model_init_shape(&shape, cfg, B, T, mode, err, errlen);
  if (rc) return rc;
  model_t *m = malloc(sizeof *m);
  if (!m) return ty_errf(err, errlen, TY_EEXHAUSTED, "model: out of memory");
  *m = shape;
  m->tensors = calloc((size_t)m->d.L * (size_t)model_layer_tensors(&m->d) + 3, sizeof *m->tensors);
  m->w.layers = calloc((size_t)m->d.L, sizeof *m->w.layers);
  m->dw.layers = calloc((size_t)m->d.L, sizeof *m->dw.layers);
  rc = TY_EEXHAUSTED;
  if (!m->tensors || !m->w.layers || !m->dw.layers) goto fail_alloc;
  table_build(m);
  if (own && !(m->params = calloc(m->n_params, sizeof(float)))) goto fail_alloc;
  if (own && mode == MODEL_TRAIN_FULL) {
    m->grads = calloc(m->n_params, sizeof(float));
    if (!m->grads) goto fail_alloc;
  }
  for (int i = 0; i < m->n_tensors; i++) {
    m->tensors[i].data = m->params ? m->params + m->tensors[i].offset : NULL;
    m->tensors[i].grad = m->grads ? m->grads + m->tensors[i].offset : NULL;
  }
  views_set(m, &m->w, m->params);
  views_set(m, &m->dw, m->grads);
  if (acts && (rc = acts_create(m, false))) goto fail_alloc;
  *out = m;
  return 0;
fail_alloc:
  ty_errf(err, errlen, rc,
          "model: out of memory for %zu parameters and the activations of %d x %d tokens; "
          "use a smaller micro_batch_size or seq_len",
          m->n_params, B, T);
  model_free(m);
  return rc;
}

int model_create(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                 char *err, size_t errlen) {
  return create(out, cfg, B, T, mode, true, true, err, errlen);
}

int model_create_weights(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                         char *err, size_t errlen) {
  return create(out, cfg, B, T, mode, true, false, err, errlen);
}

int model_create_unowned(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                         char *err, size_t errlen) {
  return create(out, cfg, B, T, mode, false, true, err, errlen);
}

int model_create_table(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                       char *err, size_t errlen) {
  return create(out, cfg, B, T, mode, false, false, err, errlen);
}

size_t model_layer_floats(const model_dims_t *d) {
  size_t n = 0;
#define TY_X(field, suffix, rows, cols) n += (size_t)(rows) * (size_t)((cols) != 0 ? (cols) : 1);
  MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  return n;
}

void model_layer_views(const model_dims_t *d, float *base, model_layer_t *w) {
  float *p = base;
#define TY_X(field, suffix, rows, cols) \
  w->field = (rows) > 0 ? p : NULL;     \
  p += (size_t)(rows) * (size_t)((cols) != 0 ? (cols) : 1);
  MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  assert(p == base + model_layer_floats(d));
}

int model_layer_tensors(const model_dims_t *d) {
  int n = 0;
#define TY_X(field, suffix, rows, cols) n += (rows) > 0;
  MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  return n;
}

void model_free(model_t *m) {
  if (!m) return;
  acts_free(m->acts);
  free(m->params);
  free(m->grads);
  free(m->tensors);
  free(m->w.layers);
  free(m->dw.layers);
  free(m);
}

int model_recompute_layers(model_t *m, char *err, size_t errlen) {
  if (!m->acts || m->mode == MODEL_EVAL || m->acts->layer_slots == 1) return 0;
  model_acts_t *old = m->acts;
  m->acts = NULL;
  int rc = acts_create(m, true);
  if (rc) {
    acts_free(m->acts);
    m->acts = old; /* m->logits is set only when acts_create succeeds */
    return ty_errf(err, errlen, rc, "model: out of memory for one layer's activations");
  }
  acts_free(old);
  return 0;
}

size_t model_activation_bytes(const model_t *m) {
  return m->acts ? m->acts->bytes : 0;
}

const model_tensor_t *model_find_tensor(const model_t *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
  return NULL;
}

int model_fill(model_t *m, model_fill_fn fn, void *ctx, char *err, size_t errlen) {
  char why[256];
  if (!m->params)
    return ty_errf(err, errlen, TY_EPRECONDITION,
                   "model_fill: the model holds no parameter buffer");
  for (int i = 0; i < m->n_tensors; i++) {
    const model_tensor_t *t = &m->tensors[i];
    why[0] = '\0';
    int rc = fn(ctx, t, t->data, why, sizeof why);
    if (rc)
      return ty_errf(err, errlen, rc, "tensor %s: %s", t->name, why[0] ? why : ty_err_name(rc));
  }
  return 0;
}

void model_init_random(model_t *m, uint64_t seed, float std) {
  assert(m->params); /* an unowned model has no buffer to fill */
  for (int i = 0; i < m->n_tensors; i++) {
    model_tensor_t *t = &m->tensors[i];
    winit_fill(winit_stream(seed, t->name), winit_is_norm(t->name), 0, t->data, t->numel);
    if (!winit_is_norm(t->name) && std != WINIT_STD)
      for (size_t j = 0; j < t->numel; j++) t->data[j] *= std / WINIT_STD;
  }
}

void model_zero_grad(model_t *m) {
  if (m->grads) memset(m->grads, 0, sizeof(float) * m->n_params);
}
