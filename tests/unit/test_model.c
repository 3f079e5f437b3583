/* test_model.c - the model's gradients against central finite differences
 * (full training, tied and untied heads, and LoRA adapters), gradient
 * accumulation, the tensor table, filling, the errors for bad input, and
 * activation checkpointing against keeping every layer, and the output head
 * in chunks against the whole head. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "api/model_acts.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/rng.h"

enum { TB = 2, TT = 5 };

static llama_config_t tiny_config(bool tied, int nkv) {
  llama_config_t c = {0};
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = nkv;
  c.head_dim = 6; /* not hidden / heads */
  c.vocab_size = 19;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  return c;
}

static void make_batch(int *tokens, int *targets, uint64_t seed, int V) {
  rng_t r;
  rng_seed(&r, seed);
  for (int i = 0; i < TB * TT; i++) {
    tokens[i] = (int)(rng_u64(&r) % (uint64_t)V);
    targets[i] = (int)(rng_u64(&r) % (uint64_t)V);
  }
}

/* Random weights with norm weights away from 1, so every tensor matters. */
static model_t *tiny_model(bool tied, int nkv, model_mode_t mode) {
  llama_config_t c = tiny_config(tied, nkv);
  model_t *m;
  char err[256];
  assert_int_equal(model_create(&m, &c, TB, TT, mode, err, sizeof err), 0);
  model_init_random(m, 42, 0.3f);
  rng_t r;
  rng_seed(&r, 7);
  for (int i = 0; i < m->n_tensors; i++)
    if (m->tensors[i].ndim == 1)
      for (size_t j = 0; j < m->tensors[i].numel; j++)
        m->tensors[i].data[j] += (float)(0.3 * rng_normal(&r));
  return m;
}

static double loss_of(model_t *m, lora_t *lo, const int *tok, const int *tgt) {
  double loss;
  assert_int_equal(model_forward(m, tok, tgt, TB, TT, lo, &loss, NULL, 0), 0);
  return loss;
}

/* Checks the analytic gradient g of the n values x against central
 * differences: once along a random direction over the whole tensor (the
 * sharpest check, many entries' signal adds up) and at the entry with the
 * largest |g|. Tolerance: fp32 losses carry ~1e-7 relative noise, which
 * over 2*eps = 2e-3 is ~1e-4 absolute; 2% relative covers the O(eps^2)
 * truncation. */
static void check_fd(const char *name, float *x, const float *g, size_t n, model_t *m, lora_t *lo,
                     const int *tok, const int *tgt, uint64_t seed) {
  const float eps = 1e-3f;
  rng_t r;
  rng_seed(&r, seed);
  float *x0 = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n);
  memcpy(x0, x, sizeof(float) * n);
  double un = 0.0, dot = 0.0;
  for (size_t i = 0; i < n; i++) {
    u[i] = (float)rng_normal(&r);
    un += (double)u[i] * u[i];
  }
  un = sqrt(un);
  for (size_t i = 0; i < n; i++) {
    u[i] = (float)(u[i] / un);
    dot += (double)u[i] * g[i];
  }
  for (size_t i = 0; i < n; i++) x[i] = x0[i] + eps * u[i];
  double lp = loss_of(m, lo, tok, tgt);
  for (size_t i = 0; i < n; i++) x[i] = x0[i] - eps * u[i];
  double lm = loss_of(m, lo, tok, tgt);
  memcpy(x, x0, sizeof(float) * n);
  double fd = (lp - lm) / (2.0 * eps);
  if (!(fabs(fd - dot) <= 0.02 * fabs(dot) + 2e-4))
    fail_msg("%s: directional derivative %.6g, finite difference %.6g", name, dot, fd);

  size_t imax = 0;
  for (size_t i = 1; i < n; i++)
    if (fabsf(g[i]) > fabsf(g[imax])) imax = i;
  x[imax] = x0[imax] + eps;
  lp = loss_of(m, lo, tok, tgt);
  x[imax] = x0[imax] - eps;
  lm = loss_of(m, lo, tok, tgt);
  x[imax] = x0[imax];
  fd = (lp - lm) / (2.0 * eps);
  if (!(fabs(fd - g[imax]) <= 0.02 * fabs(g[imax]) + 2e-4))
    fail_msg("%s[%zu]: gradient %.6g, finite difference %.6g", name, imax, g[imax], fd);
  free(x0);
  free(u);
}

static void fd_full(bool tied, int nkv) {
  model_t *m = tiny_model(tied, nkv, MODEL_TRAIN_FULL);
  int tok[TB * TT], tgt[TB * TT];
  make_batch(tok, tgt, 3, m->d.V);
  loss_of(m, NULL, tok, tgt);
  model_zero_grad(m);
  model_backward(m, NULL, 1.0f);
  /* The finite differences rerun the forward pass, so keep a copy. */
  float *g = malloc(sizeof(float) * m->n_params);
  memcpy(g, m->grads, sizeof(float) * m->n_params);
  for (int i = 0; i < m->n_tensors; i++) {
    model_tensor_t *t = &m->tensors[i];
    double gn = 0.0;
    for (size_t j = 0; j < t->numel; j++) gn += fabs(g[t->offset + j]);
    if (!(gn > 0.0)) fail_msg("%s: gradient is all zero", t->name);
    check_fd(t->name, t->data, g + t->offset, t->numel, m, NULL, tok, tgt, 100 + i);
  }
  free(g);
  model_free(m);
}

static void test_fd_untied_gqa(void **state) {
  (void)state;
  fd_full(false, 2);
}
static void test_fd_tied_mqa(void **state) {
  (void)state;
  fd_full(true, 1);
}
/* The output head in chunks of 3 rows (10 tokens: 3 + 3 + 3 + 1), each
 * chunk's logits computed again in the backward pass: the gradients still
 * match central differences, tied head and untied. */
static void test_fd_head_chunks(void **state) {
  (void)state;
  setenv("TRAINYARD_HEAD_ROWS", "3", 1);
  fd_full(false, 2);
  fd_full(true, 1);
  unsetenv("TRAINYARD_HEAD_ROWS");
}

static lora_t *tiny_lora(model_t *m, unsigned targets) {
  lora_t *lo;
  char err[256];
  assert_int_equal(lora_create(&lo, m, 3, 6.0, targets, err, sizeof err), 0);
  lora_init(lo, 9);
  /* PEFT starts B at zero; a nonzero B makes every A gradient nonzero. */
  rng_t r;
  rng_seed(&r, 11);
  for (int i = 0; i < lo->n_tensors; i++)
    if (lo->tensors[i].is_b)
      for (size_t j = 0; j < lo->tensors[i].numel; j++)
        lo->tensors[i].data[j] = (float)(0.2 * rng_normal(&r));
  return lo;
}

static void test_fd_lora(void **state) {
  (void)state;
  model_t *m = tiny_model(false, 2, MODEL_TRAIN_LORA);
  assert_null(m->grads);
  lora_t *lo = tiny_lora(m, JOBSPEC_TARGET_ALL_LINEAR);
  int tok[TB * TT], tgt[TB * TT];
  make_batch(tok, tgt, 5, m->d.V);
  loss_of(m, lo, tok, tgt);
  lora_zero_grad(lo);
  model_backward(m, lo, 1.0f);
  float *g = malloc(sizeof(float) * lo->n_params);
  memcpy(g, lo->grads, sizeof(float) * lo->n_params);
  for (int i = 0; i < lo->n_tensors; i++) {
    lora_tensor_t *t = &lo->tensors[i];
    check_fd(t->name, t->data, g + t->offset, t->numel, m, lo, tok, tgt, 200 + i);
  }
  free(g);
  lora_free(lo);
  model_free(m);
}

static void test_lora_equals_merged(void **state) {
  (void)state;
  unsigned masks[] = {JOBSPEC_TARGET_ALL_LINEAR,
                      (1u << JOBSPEC_TARGET_BIT_Q) | (1u << JOBSPEC_TARGET_BIT_V),
                      1u << JOBSPEC_TARGET_BIT_DOWN};
  for (size_t k = 0; k < sizeof masks / sizeof masks[0]; k++) {
    model_t *m = tiny_model(false, 2, MODEL_EVAL);
    lora_t *lo = tiny_lora(m, masks[k]);
    int tok[TB * TT], tgt[TB * TT];
    make_batch(tok, tgt, 8, m->d.V);
    size_t nl = (size_t)TB * TT * m->d.V;
    float *with = malloc(sizeof(float) * nl);
    double l_with = loss_of(m, lo, tok, tgt);
    memcpy(with, m->logits, sizeof(float) * nl);
    double l_base = loss_of(m, NULL, tok, tgt);
    lora_merge(lo, &m->d, &m->w);
    double l_merged = loss_of(m, NULL, tok, tgt);
    double diff = 0.0, mag = 0.0;
    for (size_t i = 0; i < nl; i++) {
      diff = fmax(diff, fabs(with[i] - m->logits[i]));
      mag = fmax(mag, fabs(with[i]));
    }
    /* The adapters change the output, and merging reproduces the change. */
    assert_true(fabs(l_with - l_base) > 1e-3);
    if (!(diff <= 1e-5 * mag))
      fail_msg("mask 0x%x: logits differ by %g (max %g)", masks[k], diff, mag);
    assert_true(fabs(l_with - l_merged) < 1e-5);
    free(with);
    lora_free(lo);
    model_free(m);
  }
}

static void test_lora_init_and_table(void **state) {
  (void)state;
  model_t *m = tiny_model(false, 2, MODEL_TRAIN_LORA);
  lora_t *lo;
  char err[256];
  unsigned mask = (1u << JOBSPEC_TARGET_BIT_K) | (1u << JOBSPEC_TARGET_BIT_UP);
  assert_int_equal(lora_create(&lo, m, 4, 16.0, mask, err, sizeof err), 0);
  lora_init(lo, 1);
  assert_float_equal(lo->scale, 4.0f, 0.0f);
  assert_int_equal(lo->n_tensors, 2 * 2 * 2); /* layers x targets x (A, B) */
  const lora_tensor_t *a =
      lora_find_tensor(lo, "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight");
  const lora_tensor_t *b =
      lora_find_tensor(lo, "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight");
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a->shape[0], 4);
  assert_int_equal(a->shape[1], 16); /* (R, IN = C) */
  assert_int_equal(b->shape[0], 24);
  assert_int_equal(b->shape[1], 4); /* (OUT = FF, R) */
  double bound = 1.0 / sqrt(16.0), amax = 0.0;
  for (size_t j = 0; j < a->numel; j++) amax = fmax(amax, fabs(a->data[j]));
  assert_true(amax <= bound && amax > 0.5 * bound);
  for (size_t j = 0; j < b->numel; j++) assert_true(b->data[j] == 0.0f);
  /* One flat span: offsets tile params exactly. */
  size_t off = 0;
  for (int i = 0; i < lo->n_tensors; i++) {
    assert_int_equal(lo->tensors[i].offset, off);
    off += lo->tensors[i].numel;
  }
  assert_int_equal(off, lo->n_params);
  lora_free(lo);
  lora_t *bad = NULL;
  assert_int_equal(lora_create(&bad, m, 0, 16.0, mask, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "lora_rank"));
  /* The job spec's bound, the same number. */
  assert_int_equal(lora_create(&bad, m, JOBSPEC_LORA_RANK_MAX + 1, 16.0, mask, err, sizeof err),
                   TY_EINVAL);
  assert_non_null(strstr(err, "between 1 and 4096"));
  jobspec_t s;
  jobspec_init(&s);
  ty_errlist_t e = TY_ERRLIST_INIT;
  char body[96];
  snprintf(body, sizeof body, "{\"model_path\": \"m\", \"lora_rank\": %d}",
           JOBSPEC_LORA_RANK_MAX + 1);
  if (jobspec_parse_json(&s, body, strlen(body), &e) == 0) jobspec_validate(&s, false, &e);
  assert_true(e.len >= 1);
  assert_string_equal(e.items[0].field, "lora_rank");
  ty_errlist_clear(&e);
  assert_int_equal(lora_create(&bad, m, 4, 16.0, 0, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "target_modules"));
  assert_null(bad);
  lora_free(NULL);
  model_free(m);
}

/* Parameter gradients accumulate (+=); loss_scale scales them. */
static void test_grad_accumulates(void **state) {
  (void)state;
  model_t *m = tiny_model(false, 2, MODEL_TRAIN_FULL);
  int tok[TB * TT], tgt[TB * TT];
  make_batch(tok, tgt, 4, m->d.V);
  float *g1 = malloc(sizeof(float) * m->n_params);
  model_zero_grad(m);
  loss_of(m, NULL, tok, tgt);
  model_backward(m, NULL, 0.5f);
  memcpy(g1, m->grads, sizeof(float) * m->n_params);
  loss_of(m, NULL, tok, tgt);
  model_backward(m, NULL, 1.5f);
  double worst = 0.0, mag = 0.0;
  for (size_t i = 0; i < m->n_params; i++) {
    worst = fmax(worst, fabs(m->grads[i] - 4.0 * g1[i]));
    mag = fmax(mag, fabs(4.0 * g1[i]));
  }
  assert_true(mag > 0.0);
  assert_true(worst <= 1e-5 * mag);
  free(g1);
  model_free(m);
}

static void test_tensor_table(void **state) {
  (void)state;
  for (int tied = 0; tied <= 1; tied++) {
    model_t *m = tiny_model(tied, 2, MODEL_EVAL);
    assert_null(m->grads);
    assert_int_equal(m->n_tensors, 1 + 9 * 2 + 1 + !tied);
    size_t off = 0;
    for (int i = 0; i < m->n_tensors; i++) {
      assert_int_equal(m->tensors[i].offset, off);
      off += m->tensors[i].numel;
    }
    assert_int_equal(off, m->n_params);
    const model_tensor_t *t = model_find_tensor(m, "model.layers.1.self_attn.k_proj.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 2 * 6); /* (NKV*HS, C) */
    assert_int_equal(t->shape[1], 16);
    assert_ptr_equal(t->data, m->w.layers[1].k_proj);
    assert_int_equal(model_find_tensor(m, "lm_head.weight") == NULL, tied);
    if (tied) assert_ptr_equal(m->w.lm_head, m->w.embed_tokens);
    model_free(m);
  }
}

static int fill_counting(void *ctx, const model_tensor_t *t, float *dst, char *err, size_t errlen) {
  int *calls = ctx;
  if (++*calls == 4) {
    snprintf(err, errlen, "shape mismatch");
    return TY_EINVAL;
  }
  for (size_t i = 0; i < t->numel; i++) dst[i] = (float)*calls;
  return 0;
}

static void test_fill_and_bad_input(void **state) {
  (void)state;
  model_t *m = tiny_model(false, 2, MODEL_TRAIN_FULL);
  char err[256];
  int calls = 0;
  assert_int_equal(model_fill(m, fill_counting, &calls, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, m->tensors[3].name));
  assert_non_null(strstr(err, "shape mismatch"));
  assert_true(m->w.embed_tokens[0] == 1.0f);

  int tok[TB * TT], tgt[TB * TT];
  make_batch(tok, tgt, 4, m->d.V);
  tgt[7] = m->d.V;
  assert_int_equal(model_forward(m, tok, tgt, TB, TT, NULL, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "target id 19 at batch row 1, position 2"));
  tok[0] = -1;
  assert_int_equal(model_forward(m, tok, NULL, TB, TT, NULL, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "token id -1"));
  tok[0] = 0;
  assert_int_equal(model_forward(m, tok, NULL, TB, TT + 1, NULL, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "does not fit"));
  /* A smaller micro-batch than allocated runs. */
  double loss;
  assert_int_equal(model_forward(m, tok, tok, 1, 3, NULL, &loss, err, sizeof err), 0);
  assert_true(loss > 0.0);
  model_free(m);

  llama_config_t c = tiny_config(false, 3);
  assert_int_equal(model_create(&m, &c, 1, 1, MODEL_EVAL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "multiple of num_key_value_heads"));
  c = tiny_config(false, 2);
  c.head_dim = 5;
  assert_int_equal(model_create(&m, &c, 1, 1, MODEL_EVAL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "even head size"));
  c = tiny_config(false, 2);
  c.vocab_size = 0;
  assert_int_equal(model_create(&m, &c, 1, 1, MODEL_EVAL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "vocab_size"));
  c = tiny_config(false, 2);
  assert_int_equal(model_create(&m, &c, 0, 4, MODEL_EVAL, err, sizeof err), TY_EINVAL);
  assert_null(m);
  /* Mistral's window: sequences up to it are Llama's; longer ones refused. */
  c = tiny_config(false, 2);
  c.sliding_window = 4;
  assert_int_equal(model_create(&m, &c, 1, 5, MODEL_EVAL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "sliding_window (4)"));
  assert_int_equal(model_create(&m, &c, 1, 4, MODEL_EVAL, err, sizeof err), 0);
  model_free(m);
}

/* Batches with loss weights and positions: all weights 1 and positions
 * 0..T-1 are exactly the plain batch; a document packed after another has
 * the logits it has alone at the start of a row (block-diagonal attention,
 * restarted positions); nothing counted gives loss 0 and no gradient; bad
 * weights and positions are refused by row and position. */
static void test_batch_mask_and_documents(void **state) {
  (void)state;
  model_t *m = tiny_model(false, 2, MODEL_TRAIN_FULL);
  char err[256];
  int tok[TB * TT], tgt[TB * TT], pos[TB * TT];
  float w[TB * TT];
  make_batch(tok, tgt, 9, m->d.V);
  for (int i = 0; i < TB * TT; i++) w[i] = 1.0f, pos[i] = i % TT;
  double plain, masked;
  assert_int_equal(model_forward(m, tok, tgt, TB, TT, NULL, &plain, err, sizeof err), 0);
  const model_batch_t all = {tok, tgt, w, pos, TB, TT};
  assert_int_equal(model_forward_batch(m, &all, NULL, &masked, err, sizeof err), 0);
  assert_true(plain == masked);
  /* Row 1 = [tokens 3..4 of row 0 as a document | row 0's tokens 0..2 as
   * another]: the second document's logits equal row 0's first three. */
  const int V = m->d.V;
  float *alone = malloc(sizeof(float) * 3 * V);
  for (int t = 0; t < 3; t++) tok[TT + 2 + t] = tok[t], pos[TT + 2 + t] = t;
  tok[TT] = tok[3], tok[TT + 1] = tok[4], pos[TT] = 0, pos[TT + 1] = 1;
  assert_int_equal(model_forward_batch(m, &all, NULL, NULL, err, sizeof err), 0);
  memcpy(alone, m->logits, sizeof(float) * 3 * V);
  for (int i = 0; i < 3 * V; i++)
    assert_float_equal(m->logits[(size_t)(TT + 2) * V + i], alone[i], 1e-5);
  /* Without the positions the second document would see the first. */
  const model_batch_t nopos = {tok, tgt, w, NULL, TB, TT};
  assert_int_equal(model_forward_batch(m, &nopos, NULL, NULL, err, sizeof err), 0);
  double diff = 0;
  for (int i = 0; i < 3 * V; i++) diff += fabs(m->logits[(size_t)(TT + 2) * V + i] - alone[i]);
  assert_true(diff > 1e-3);
  free(alone);
  /* Nothing counted: loss 0, no gradient. */
  for (int i = 0; i < TB * TT; i++) w[i] = 0.0f;
  model_zero_grad(m);
  assert_int_equal(model_forward_batch(m, &all, NULL, &masked, err, sizeof err), 0);
  assert_true(masked == 0.0);
  model_backward(m, NULL, 1.0f);
  for (size_t i = 0; i < m->n_params; i++) assert_true(m->grads[i] == 0.0f);
  /* Refusals. */
  w[3] = 0.5f;
  assert_int_equal(model_forward_batch(m, &all, NULL, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "loss weight 0.5 at batch row 0, position 3"));
  w[3] = 1.0f;
  pos[TT] = 2;
  assert_int_equal(model_forward_batch(m, &all, NULL, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "position 2 at batch row 1, token 0"));
  pos[TT] = 0, pos[TT + 1] = 3;
  assert_int_equal(model_forward_batch(m, &all, NULL, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "position 3 at batch row 1, token 1"));
  model_free(m);
}

/* The stages over one reused layer buffer (as FSDP feeds them, a layer
 * gathered at a time, its gradients in a reused buffer too) give exactly
 * what model_forward / model_backward give over the model's own buffer. */
static void test_stages_with_gathered_layers(void **state) {
  (void)state;
  model_t *m = tiny_model(false, 2, MODEL_TRAIN_FULL), *u;
  llama_config_t c = tiny_config(false, 2);
  char err[256];
  assert_int_equal(model_create_unowned(&u, &c, TB, TT, MODEL_TRAIN_FULL, err, sizeof err), 0);
  assert_null(u->params);
  assert_null(u->grads);
  assert_null(u->tensors[0].data);
  int tok[TB * TT], tgt[TB * TT];
  make_batch(tok, tgt, 6, m->d.V);
  assert_int_equal(model_forward(u, tok, tgt, TB, TT, NULL, NULL, err, sizeof err),
                   TY_EPRECONDITION);

  double loss_ref = loss_of(m, NULL, tok, tgt);
  model_zero_grad(m);
  model_backward(m, NULL, 1.0f);
  const size_t nl = (size_t)TB * TT * m->d.V, lf = model_layer_floats(&m->d);
  const size_t C = (size_t)m->d.C, V = (size_t)m->d.V;
  float *lb = malloc(sizeof(float) * lf), *lg = malloc(sizeof(float) * lf);
  float *logits = malloc(sizeof(float) * nl);
  float *dembed = calloc(V * C, sizeof(float)), *dnorm = calloc(C, sizeof(float));
  float *dhead = calloc(V * C, sizeof(float));
  model_layer_t w, dw;
  model_layer_views(&m->d, lb, &w);
  model_layer_views(&m->d, lg, &dw);
  /* Layer l occupies lf floats of params from its first tensor. */
  assert_int_equal(m->tensors[1 + 9].offset - m->tensors[1].offset, lf);

  assert_int_equal(model_embed_forward(u, m->w.embed_tokens, tok, tgt, TB, TT, err, sizeof err), 0);
  for (int l = 0; l < m->d.L; l++) {
    memcpy(lb, m->params + m->tensors[1 + 9 * l].offset, sizeof(float) * lf);
    model_layer_forward(u, l, &w, NULL);
  }
  double loss = model_head_forward(u, m->w.norm, m->w.lm_head);
  assert_true(loss == loss_ref);
  memcpy(logits, u->logits, sizeof(float) * nl);
  model_head_backward(u, m->w.norm, m->w.lm_head, dnorm, dhead, 1.0f);
  for (int l = m->d.L - 1; l >= 0; l--) {
    memcpy(lb, m->params + m->tensors[1 + 9 * l].offset, sizeof(float) * lf);
    memset(lg, 0, sizeof(float) * lf);
    model_layer_backward(u, l, &w, &dw, NULL);
    assert_memory_equal(lg, m->grads + m->tensors[1 + 9 * l].offset, sizeof(float) * lf);
  }
  model_embed_backward(u, dembed);
  assert_memory_equal(dembed, m->dw.embed_tokens, sizeof(float) * V * C);
  assert_memory_equal(dnorm, m->dw.norm, sizeof(float) * C);
  assert_memory_equal(dhead, m->dw.lm_head, sizeof(float) * V * C);
  free(lb);
  free(lg);
  free(logits);
  free(dembed);
  free(dnorm);
  free(dhead);
  model_free(u);
  model_free(m);
}

/* Forward only keeps one layer of activations, and computes the same. */
static void test_eval_matches_train(void **state) {
  (void)state;
  model_t *e = tiny_model(false, 2, MODEL_EVAL), *f = tiny_model(false, 2, MODEL_TRAIN_FULL);
  int tok[TB * TT], tgt[TB * TT];
  make_batch(tok, tgt, 12, e->d.V);
  double le = loss_of(e, NULL, tok, tgt), lf = loss_of(f, NULL, tok, tgt);
  assert_true(le == lf);
  assert_memory_equal(e->logits, f->logits, sizeof(float) * TB * TT * e->d.V);
  assert_true(model_activation_bytes(e) < model_activation_bytes(f) / 2);
  model_free(e);
  model_free(f);
}

/* Activation checkpointing: one layer slot, each layer run forward again
 * in the backward pass, gives the same gradients bit for bit (full
 * training and LoRA, over three layers so that two are recomputed) with
 * fewer activation bytes; a model already holding one slot is left so. */
static void test_recompute_matches(void **state) {
  (void)state;
  llama_config_t c = tiny_config(false, 2);
  c.num_hidden_layers = 3;
  char err[256];
  for (int lora = 0; lora < 2; lora++) {
    model_mode_t mode = lora ? MODEL_TRAIN_LORA : MODEL_TRAIN_FULL;
    model_t *m[2];
    lora_t *lo[2] = {NULL, NULL};
    double loss[2];
    int tok[TB * TT], tgt[TB * TT];
    for (int i = 0; i < 2; i++) {
      assert_int_equal(model_create(&m[i], &c, TB, TT, mode, err, sizeof err), 0);
      model_init_random(m[i], 42, 0.3f);
      if (lora) lo[i] = tiny_lora(m[i], JOBSPEC_TARGET_ALL_LINEAR);
    }
    size_t whole = model_activation_bytes(m[1]);
    assert_int_equal(model_recompute_layers(m[1], err, sizeof err), 0);
    assert_true(model_activation_bytes(m[1]) < whole);
    assert_int_equal(model_recompute_layers(m[1], err, sizeof err), 0);
    make_batch(tok, tgt, 21, m[0]->d.V);
    for (int i = 0; i < 2; i++) {
      if (lora)
        lora_zero_grad(lo[i]);
      else
        model_zero_grad(m[i]);
      loss[i] = loss_of(m[i], lo[i], tok, tgt);
      model_backward(m[i], lo[i], 1.0f);
    }
    assert_true(loss[0] == loss[1]);
    if (lora)
      assert_memory_equal(lo[0]->grads, lo[1]->grads, sizeof(float) * lo[0]->n_params);
    else
      assert_memory_equal(m[0]->grads, m[1]->grads, sizeof(float) * m[0]->n_params);
    for (int i = 0; i < 2; i++) {
      lora_free(lo[i]);
      model_free(m[i]);
    }
  }
}

/* The chunked head against the whole one on the same weights and batch
 * (full training, tied and untied, where the backward pass computes each
 * chunk's logits again, and LoRA, where the head's backward runs in the
 * forward pass; every target counted, and a loss mask): the same loss and
 * gradients, the logits of the last chunk
 * equal to the whole logits' last rows, fewer activation bytes; logits
 * alone (no targets) for more rows than a chunk are refused by name. */
static void test_head_chunks_match(void **state) {
  (void)state;
  char err[256];
  for (int k = 0; k < 4; k++) {
    const bool tied = k == 1, lora = k == 2, masked = k == 3;
    llama_config_t c = tiny_config(tied, 2);
    c.vocab_size = 101; /* the logits outweigh the fused head's (B, T, C) buffer */
    model_mode_t mode = lora ? MODEL_TRAIN_LORA : MODEL_TRAIN_FULL;
    model_t *m[2];
    lora_t *lo[2] = {NULL, NULL};
    double loss[2];
    int tok[TB * TT], tgt[TB * TT];
    float w[TB * TT];
    make_batch(tok, tgt, 33 + k, c.vocab_size);
    for (int i = 0; i < TB * TT; i++) w[i] = masked && i % 3 == 0 ? 0.0f : 1.0f;
    const model_batch_t bt = {
        .tokens = tok, .targets = tgt, .weights = masked ? w : NULL, .b = TB, .t = TT};
    for (int i = 0; i < 2; i++) {
      if (i) setenv("TRAINYARD_HEAD_ROWS", "4", 1);
      assert_int_equal(model_create(&m[i], &c, TB, TT, mode, err, sizeof err), 0);
      unsetenv("TRAINYARD_HEAD_ROWS");
      model_init_random(m[i], 42, 0.3f);
      if (lora) lo[i] = tiny_lora(m[i], JOBSPEC_TARGET_ALL_LINEAR);
      if (lora)
        lora_zero_grad(lo[i]);
      else
        model_zero_grad(m[i]);
      assert_int_equal(model_forward_batch(m[i], &bt, lo[i], &loss[i], err, sizeof err), 0);
    }
    assert_int_equal(m[0]->head_rows, TB * TT);
    assert_int_equal(m[1]->head_rows, 4);
    assert_true(model_activation_bytes(m[1]) < model_activation_bytes(m[0]));
    assert_float_equal(loss[0], loss[1], 1e-6 * fabs(loss[0]));
    /* rows 8, 9 are the last chunk's 0, 1 (LoRA: the head's backward ran
     * in the forward pass, turning them into their gradient) */
    for (int j = 0; j < 2 * c.vocab_size && !lora; j++)
      assert_float_equal(m[1]->logits[j], m[0]->logits[8 * c.vocab_size + j], 1e-5);
    for (int i = 0; i < 2; i++) model_backward(m[i], lo[i], 0.5f);
    const float *g0 = lora ? lo[0]->grads : m[0]->grads, *g1 = lora ? lo[1]->grads : m[1]->grads;
    const size_t n = lora ? lo[0]->n_params : m[0]->n_params;
    double gmax = 0.0, dmax = 0.0;
    for (size_t j = 0; j < n; j++) {
      gmax = fmax(gmax, fabs(g0[j]));
      dmax = fmax(dmax, fabs(g0[j] - g1[j]));
    }
    assert_true(gmax > 0.0);
    if (dmax > 1e-5 * gmax) fail_msg("case %d: gradients differ by %g (max %g)", k, dmax, gmax);
    const model_batch_t logits_only = {.tokens = tok, .b = TB, .t = TT};
    assert_int_equal(model_forward_batch(m[1], &logits_only, lo[1], NULL, err, sizeof err),
                     TY_EINVAL);
    assert_non_null(strstr(err, "TRAINYARD_HEAD_ROWS"));
    const model_batch_t one_chunk = {.tokens = tok, .b = 1, .t = 4};
    assert_int_equal(model_forward_batch(m[1], &one_chunk, lo[1], NULL, err, sizeof err), 0);
    for (int i = 0; i < 2; i++) {
      lora_free(lo[i]);
      model_free(m[i]);
    }
  }
  setenv("TRAINYARD_HEAD_ROWS", "0", 1);
  llama_config_t c = tiny_config(false, 2);
  model_t *bad = NULL;
  assert_int_equal(model_create(&bad, &c, TB, TT, MODEL_TRAIN_FULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "TRAINYARD_HEAD_ROWS"));
  unsetenv("TRAINYARD_HEAD_ROWS");
}

/* The activation bytes the memory rules count at submit
 * (llama_activation_bytes) are what the model allocates: training, with
 * activation checkpointing, forward only, and a chunked head. */
static void test_activation_bytes_counted(void **state) {
  (void)state;
  char err[256];
  llama_config_t c = tiny_config(false, 2);
  c.num_hidden_layers = 3;
  for (int k = 0; k < 4; k++) {
    const bool eval = k == 2, recompute = k == 1, chunked = k == 3;
    if (chunked) setenv("TRAINYARD_HEAD_ROWS", "3", 1);
    model_t *m;
    assert_int_equal(
        model_create(&m, &c, TB, TT, eval ? MODEL_EVAL : MODEL_TRAIN_FULL, err, sizeof err), 0);
    unsetenv("TRAINYARD_HEAD_ROWS");
    if (recompute) assert_int_equal(model_recompute_layers(m, err, sizeof err), 0);
    assert_int_equal(model_activation_bytes(m),
                     llama_activation_bytes(&c, TB, TT, !eval, recompute, chunked ? 3 : 0));
    model_free(m);
  }
}

/* The adapters' parameters the device rule counts (llama_lora_params) are
 * the adapters' own, for each target set, GQA and Qwen2's biases alike. */
static void test_lora_params_counted(void **state) {
  (void)state;
  char err[256];
  llama_config_t c = tiny_config(false, 2);
  c.num_hidden_layers = 3;
  const unsigned sets[] = {JOBSPEC_TARGET_ALL_LINEAR,
                           1u << JOBSPEC_TARGET_BIT_Q | 1u << JOBSPEC_TARGET_BIT_V,
                           1u << JOBSPEC_TARGET_BIT_DOWN};
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
    model_t *m;
    lora_t *lo;
    assert_int_equal(model_create(&m, &c, TB, TT, MODEL_TRAIN_LORA, err, sizeof err), 0);
    assert_int_equal(lora_create(&lo, m, 3, 6.0, sets[i], err, sizeof err), 0);
    assert_int_equal(llama_lora_params(&c, 3, sets[i]), lo->n_params);
    lora_free(lo);
    model_free(m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fd_untied_gqa),
      cmocka_unit_test(test_fd_tied_mqa),
      cmocka_unit_test(test_fd_head_chunks),
      cmocka_unit_test(test_head_chunks_match),
      cmocka_unit_test(test_fd_lora),
      cmocka_unit_test(test_lora_equals_merged),
      cmocka_unit_test(test_lora_init_and_table),
      cmocka_unit_test(test_lora_params_counted),
      cmocka_unit_test(test_grad_accumulates),
      cmocka_unit_test(test_tensor_table),
      cmocka_unit_test(test_fill_and_bad_input),
      cmocka_unit_test(test_batch_mask_and_documents),
      cmocka_unit_test(test_stages_with_gathered_layers),
      cmocka_unit_test(test_eval_matches_train),
      cmocka_unit_test(test_recompute_matches),
      cmocka_unit_test(test_activation_bytes_counted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
