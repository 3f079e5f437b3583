/* test_train.c - real training runs on a tiny model, in process: held-out
 * loss falls well below its start (full and LoRA), a PEFT adapter and a
 * full checkpoint survive save and reload bit for bit (the same eval loss),
 * and a run interrupted at a checkpoint and resumed gives the losses of an
 * uninterrupted one. */
#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "worker/dist/comm.h"
#include "worker/dist/fsdp.h"
#include "worker/ckpt/loader.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/ckpt/model_io.h"
#include "worker/ckpt/outputs.h"
#include "worker/ckpt/safetensors.h"
#include "worker/rank/train.h"

#include "ckpt_testutil.h"

static char g_dir[64];    /* a fresh temporary directory per test */
static char g_data[128];  /* its generated text file */
static char g_data2[128]; /* text of other words, for fine-tuning */

/* Pseudo-English: words drawn from a small list by a fixed LCG, so a
 * character-level model has spelling and word order to learn. */
static void write_text(const char *path, size_t bytes, int which) {
  static const char *const w0[] = {"the ", "cat ", "sat ", "on ",    "a ",    "mat ", "and ",
                                   "dog ", "ran ", "to ",  "house ", "with ", "red ", "door. "};
  static const char *const w1[] = {"Zebras ", "quickly ", "jump ",   "over ",  "lazy ",
                                   "foxes; ", "BIG ",     "yellow ", "kites ", "fly ",
                                   "by ",     "QUIET ",   "pools, ", "ok? "};
  const char *const *words = which ? w1 : w0;
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint32_t x = 12345;
  size_t n = 0;
  while (n < bytes) {
    x = x * 1103515245u + 12345u;
    const char *w = words[(x >> 16) % 14];
    n += fwrite(w, 1, strlen(w), f);
  }
  fclose(f);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}

static int setup(void **state) {
  (void)state;
  strcpy(g_dir, "/tmp/ty_test_train_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_data, sizeof g_data, "%s/data.txt", g_dir);
  write_text(g_data, 24000, 0);
  snprintf(g_data2, sizeof g_data2, "%s/data2.txt", g_dir);
  write_text(g_data2, 24000, 1);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

static llama_config_t tiny_config(void) {
  llama_config_t c = tu_tiny_config(64, 96, 2, 4, 2, 16, 256, false);
  c.max_position_embeddings = 64;
  return c;
}

static jobspec_t tiny_spec(bool lora, int steps, const char *out) {
  jobspec_t s;
  jobspec_init(&s);
  snprintf(s.data.path, sizeof s.data.path, "%s", g_data);
  s.data.format = JOBSPEC_DATA_TEXT;
  s.data.seq_len = 32;
  s.data.eval_fraction = 0.1;
  s.use_lora = lora;
  s.lora_rank = 8;
  s.lora_alpha = 16;
  s.target_modules = JOBSPEC_TARGET_ALL_LINEAR;
  s.train.steps = steps;
  s.train.micro_batch_size = 4;
  s.train.grad_accum = 2;
  s.train.lr = lora ? 1e-2 : 3e-3;
  s.train.warmup_steps = 5;
  s.train.weight_decay = 0.01;
  s.train.grad_clip = 1.0;
  s.train.seed = 7;
  s.train.checkpoint_every = 0;
  snprintf(s.output_dir, sizeof s.output_dir, "%s/%s", g_dir, out);
  return s;
}

/* A model (and adapters) as a job starts with them: seeded weights. */
static void make_model(const jobspec_t *s, model_t **m, lora_t **lo) {
  llama_config_t c = tiny_config();
  char err[512];
  int rc = model_create(m, &c, s->train.micro_batch_size, s->data.seq_len,
                        s->use_lora ? MODEL_TRAIN_LORA : MODEL_TRAIN_FULL, err, sizeof err);
  if (rc) fail_msg("model_create: %s", err);
  model_io_init_scratch(*m, 99);
  *lo = NULL;
  if (s->use_lora) {
    rc = lora_create(lo, *m, s->lora_rank, s->lora_alpha, s->target_modules, err, sizeof err);
    if (rc) fail_msg("lora_create: %s", err);
    lora_init(*lo, s->train.seed);
  }
}

typedef struct {
  double loss[256]; /* by step (1-based) */
  int reports;
} losses_t;

static int record(void *ctx, const train_progress_t *p) {
  losses_t *l = ctx;
  if (p->phase == REPORT_PHASE_TRAINING && isfinite(p->loss) && p->step < 256)
    l->loss[p->step] = p->loss;
  l->reports++;
  return 0;
}

/* One run of the loop over backend b (which it frees) until stop,
 * recording the losses into l. With dev, b is the host's side of a device
 * backend of dev's passes. */
static int run_loop(train_backend_t *b, const train_device_t *dev, int64_t stop, const jobspec_t *s,
                    comm_t *c, losses_t *l, train_result_t *res, char *err, size_t errlen) {
  train_backend_t db;
  int rc = 0;
  if (dev && !(rc = train_backend_device(&db, b, dev, comm_world_size(c), err, errlen)))
    *b = db;
  train_args_t a = {.spec = s,
                    .comm = c,
                    .backend = b,
                    .progress = record,
                    .progress_ctx = l,
                    .eval_windows = 16,
                    .stop_at_step = stop};
  if (!rc) rc = train_run(&a, res, err, errlen);
  train_backend_free(b);
  return rc;
}

static train_result_t run_on(const jobspec_t *s, model_t *m, lora_t *lo, const train_device_t *dev,
                             int64_t stop, losses_t *l) {
  comm_t *comm;
  char err[512];
  assert_int_equal(comm_open(&comm, "self", 0, 1, err, sizeof err), 0);
  train_result_t res;
  train_backend_t b;
  int rc = train_backend_host(&b, m, lo, err, sizeof err);
  if (!rc) rc = run_loop(&b, dev, stop, s, comm, l, &res, err, sizeof err);
  comm_close(comm);
  if (rc) fail_msg("train_run: %s", err);
  return res;
}

static train_result_t run(const jobspec_t *s, model_t *m, lora_t *lo, int64_t stop, losses_t *l) {
  return run_on(s, m, lo, NULL, stop, l);
}

static void test_full_training_lowers_heldout_loss(void **state) {
  (void)state;
  jobspec_t s = tiny_spec(false, 60, "full");
  model_t *m;
  lora_t *lo;
  make_model(&s, &m, &lo);
  losses_t l = {{0}, 0};
  train_result_t r = run(&s, m, lo, 0, &l);
  printf("# full: held-out loss %.4f -> %.4f over 60 steps (train loss %.4f -> %.4f)\n",
         r.eval_loss_start, r.eval_loss_end, r.first_loss, r.last_loss);
  assert_int_equal(r.steps_done, 60);
  assert_true(r.eval_loss_start > 5.0); /* about ln(256) = 5.55 from seeded weights */
  assert_true(r.eval_loss_end < r.eval_loss_start - 2.5);
  model_free(m);
}

/* LoRA adapts a pretrained model to new text: adapters over seeded random
 * weights cannot move logits whose head rows have norm ~0.16, so the base
 * is first trained (full) on one text, then frozen under adapters trained
 * on another of different words. */
static void test_lora_training_lowers_heldout_loss(void **state) {
  (void)state;
  jobspec_t pre = tiny_spec(false, 40, "lora-base");
  model_t *base, *m;
  lora_t *none, *lo;
  make_model(&pre, &base, &none);
  losses_t l = {{0}, 0};
  train_result_t r0 = run(&pre, base, NULL, 0, &l);
  jobspec_t s = tiny_spec(true, 60, "lora");
  snprintf(s.data.path, sizeof s.data.path, "%s", g_data2);
  make_model(&s, &m, &lo);
  assert_int_equal(m->n_params, base->n_params);
  memcpy(m->params, base->params, m->n_params * sizeof(float));
  model_free(base);
  train_result_t r = run(&s, m, lo, 0, &l);
  printf(
      "# LoRA: held-out loss %.4f -> %.4f over 60 steps (train loss %.4f -> %.4f; base "
      "pretrained on other text, %.4f -> %.4f)\n",
      r.eval_loss_start, r.eval_loss_end, r.first_loss, r.last_loss, r0.eval_loss_start,
      r0.eval_loss_end);
  assert_int_equal(r.steps_done, 60);
  assert_true(r.eval_loss_end < r.eval_loss_start - 1.0);
  lora_free(lo);
  model_free(m);
}

typedef struct {
  data_t *d;
} win_ctx_t;

static int eval_win(void *ctx, int64_t i, int32_t *tokens, char *err, size_t errlen) {
  return data_eval_window(((win_ctx_t *)ctx)->d, i, tokens, err, errlen);
}

static double heldout(const jobspec_t *s, model_t *m, lora_t *lo) {
  data_config_t dc = {.path = s->data.path,
                      .format = s->data.format,
                      .vocab_size = 256,
                      .seq_len = s->data.seq_len,
                      .eval_fraction = s->data.eval_fraction,
                      .seed = 1,
                      .world_size = 1,
                      .rank = 0,
                      .micro_batch_size = 1,
                      .grad_accum = 1};
  char err[512];
  win_ctx_t c;
  assert_int_equal(data_open(&c.d, &dc, err, sizeof err), 0);
  double loss;
  int64_t tokens;
  int rc = train_eval(m, lo, s->data.seq_len, 10, eval_win, &c, &loss, &tokens, err, sizeof err);
  if (rc) fail_msg("train_eval: %s", err);
  assert_int_equal(tokens, 10 * s->data.seq_len);
  data_free(c.d);
  return loss;
}

static void test_adapter_save_reload_same_loss(void **state) {
  (void)state;
  jobspec_t s = tiny_spec(true, 20, "adapter");
  model_t *m;
  lora_t *lo, *back;
  make_model(&s, &m, &lo);
  losses_t l = {{0}, 0};
  run(&s, m, lo, 0, &l);
  double before = heldout(&s, m, lo);
  char err[512];
  int rc = outputs_write_adapter(s.output_dir, lo, "models/tiny", err, sizeof err);
  if (rc) fail_msg("write: %s", err);
  rc = outputs_read_adapter(s.output_dir, m, &back, err, sizeof err);
  if (rc) fail_msg("read: %s", err);
  double after = heldout(&s, m, back);
  printf("# adapter: held-out loss %.9g trained, %.9g reloaded\n", before, after);
  assert_true(before == after);
  assert_memory_equal(lo->params, back->params, lo->n_params * sizeof(float));
  /* PEFT's names and shapes: A [r, in], B [out, r]. */
  char path[1200];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", s.output_dir);
  st_ckpt_t *c;
  assert_int_equal(st_open(path, &c, err, sizeof err), 0);
  const st_tensor_t *a =
      st_find(c, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  const st_tensor_t *b = st_find(c, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a->shape[0], 8);
  assert_int_equal(a->shape[1], 64);
  assert_int_equal(b->shape[0], 64);
  assert_int_equal(b->shape[1], 8);
  assert_int_equal(c->ntensors, 2 * 7 * 2);
  st_close(c);
  snprintf(path, sizeof path, "%s/adapter_config.json", s.output_dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "peft_type")), "LORA");
  assert_string_equal(json_string_value(json_object_get(j, "task_type")), "CAUSAL_LM");
  assert_int_equal(json_integer_value(json_object_get(j, "r")), 8);
  assert_float_equal(json_number_value(json_object_get(j, "lora_alpha")), 16.0, 0);
  assert_int_equal(json_array_size(json_object_get(j, "target_modules")), 7);
  assert_string_equal(json_string_value(json_object_get(j, "base_model_name_or_path")),
                      "models/tiny");
  json_decref(j);
  lora_free(back);
  lora_free(lo);
  model_free(m);
}

/* What model_io_load's progress calls said. */
typedef struct {
  int calls;
  uint64_t done, total;
  bool rising; /* each call's done above the last, total the same */
} progress_seen_t;

static void count_progress(void *ctx, uint64_t done, uint64_t total) {
  progress_seen_t *p = ctx;
  if (p->calls && (done <= p->done || total != p->total)) p->rising = false;
  p->calls++;
  p->done = done, p->total = total;
}

static void test_full_checkpoint_save_reload(void **state) {
  (void)state;
  jobspec_t s = tiny_spec(false, 10, "fullout");
  model_t *m, *back;
  lora_t *lo;
  make_model(&s, &m, &lo);
  losses_t l = {{0}, 0};
  run(&s, m, NULL, 0, &l);
  llama_config_t c = tiny_config();
  char err[512];
  int rc = outputs_write_model(s.output_dir, m, &c, err, sizeof err);
  if (rc) fail_msg("write: %s", err);
  llama_config_t c2;
  llama_config_init(&c2);
  assert_int_equal(model_io_read_config(s.output_dir, &c2, err, sizeof err), 0);
  assert_int_equal(c2.num_key_value_heads, 2);
  assert_int_equal(model_create(&back, &c2, 4, 32, MODEL_EVAL, err, sizeof err), 0);
  progress_seen_t seen = {0, 0, 0, true};
  loader_stats_t st;
  rc = model_io_load(back, s.output_dir, count_progress, &seen, &st, err, sizeof err);
  if (rc) fail_msg("load: %s", err);
  assert_int_equal(back->n_params, m->n_params);
  /* Its figures, as a rank's load reports them: the F32 file's bytes, one
   * progress call per tensor, rising to the total. */
  assert_int_equal(st.bytes_total, m->n_params * sizeof(float));
  assert_int_equal(st.bytes_read, st.bytes_total);
  assert_int_equal(st.shard_bytes, m->n_params * sizeof(float));
  assert_int_equal(st.device_peak_bytes, st.shard_bytes);
  assert_true(st.host_peak_bytes >= st.shard_bytes);
  assert_true(st.load_seconds > 0);
  assert_int_equal(seen.calls, back->n_tensors);
  assert_true(seen.rising);
  assert_int_equal(seen.done, st.bytes_total);
  assert_int_equal(seen.total, st.bytes_total);
  assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
  assert_true(heldout(&s, m, NULL) == heldout(&s, back, NULL));
  model_free(back);
  model_free(m);
}

/* 12 steps uninterrupted against 7 steps (checkpoints at 4 and at the stop,
 * 7) and a fresh process-like restart that resumes at 7. */
static void check_resume(bool lora) {
  jobspec_t s = tiny_spec(lora, 12, lora ? "resume-lora-a" : "resume-full-a");
  s.train.checkpoint_every = 4;
  model_t *m;
  lora_t *lo;
  losses_t whole = {{0}, 0}, part = {{0}, 0};
  make_model(&s, &m, &lo);
  train_result_t r = run(&s, m, lo, 0, &whole);
  assert_int_equal(r.steps_done, 12);
  lora_free(lo);
  model_free(m);

  snprintf(s.output_dir, sizeof s.output_dir, "%s/%s", g_dir,
           lora ? "resume-lora-b" : "resume-full-b");
  make_model(&s, &m, &lo);
  r = run(&s, m, lo, 7, &part);
  assert_int_equal(r.steps_done, 7);
  lora_free(lo);
  model_free(m);
  make_model(&s, &m, &lo);
  r = run(&s, m, lo, 0, &part);
  assert_int_equal(r.start_step, 7);
  assert_int_equal(r.steps_done, 12);
  for (int i = 1; i <= 12; i++) {
    if (whole.loss[i] != part.loss[i])
      fail_msg("%s step %d: loss %.9g uninterrupted, %.9g resumed", lora ? "LoRA" : "full", i,
               whole.loss[i], part.loss[i]);
  }
  printf("# %s resume: 12 step losses identical (last %.6f)\n", lora ? "LoRA" : "full",
         whole.loss[12]);
  lora_free(lo);
  model_free(m);
}

static void test_resume_matches_uninterrupted(void **state) {
  (void)state;
  check_resume(false);
  check_resume(true);
}

static void test_resume_rejects_other_batch(void **state) {
  (void)state;
  jobspec_t s = tiny_spec(true, 8, "resume-mismatch");
  s.train.checkpoint_every = 2;
  model_t *m;
  lora_t *lo;
  losses_t l = {{0}, 0};
  make_model(&s, &m, &lo);
  run(&s, m, lo, 3, &l);
  s.train.grad_accum = 1;
  comm_t *comm;
  char err[512];
  assert_int_equal(comm_open(&comm, "self", 0, 1, err, sizeof err), 0);
  train_backend_t b;
  assert_int_equal(train_backend_host(&b, m, lo, err, sizeof err), 0);
  train_args_t a = {.spec = &s, .comm = comm, .backend = &b};
  train_result_t res;
  assert_int_equal(train_run(&a, &res, err, sizeof err), TY_EPRECONDITION);
  assert_non_null(strstr(err, "global batch"));
  train_backend_free(&b);
  comm_close(comm);
  lora_free(lo);
  model_free(m);
}

/* What a stand-in device trains: its own copy of the span (p, g: n
 * floats), reached only through the hooks, as device memory would be; the
 * moves counted; and for AdamW on the device, moments of its own, stepped
 * by optim_step with the host optimizer's config, no-decay ranges and
 * step, as the CUDA AdamW kernel does. The first member of each stand-in
 * below, so the hooks share one ctx. */
typedef struct {
  float *p, *g;
  size_t n;
  float *m, *v;
  int ups, downs, to_host, from_host, steps;
} fake_span_t;

static int span_size(const fake_span_t *f, size_t n, char *err, size_t errlen) {
  return n == f->n ? 0
                   : ty_errf(err, errlen, TY_EINTERNAL,
                             "stand-in: the loop moves %zu floats, the span holds %zu", n, f->n);
}
static int span_zero(void *ctx, char *err, size_t errlen) {
  const fake_span_t *f = ctx;
  memset(f->g, 0, f->n * sizeof(float));
  return 0;
}
static int span_down(void *ctx, float *grads, size_t n, char *err, size_t errlen) {
  fake_span_t *f = ctx;
  int rc = span_size(f, n, err, errlen);
  if (!rc) memcpy(grads, f->g, n * sizeof(float)), f->downs++;
  return rc;
}
static int span_up(void *ctx, const float *params, size_t n, char *err, size_t errlen) {
  fake_span_t *f = ctx;
  int rc = span_size(f, n, err, errlen);
  if (!rc) memcpy(f->p, params, n * sizeof(float)), f->ups++;
  return rc;
}
static int span_sumsq(void *ctx, double *sumsq, char *err, size_t errlen) {
  const fake_span_t *f = ctx;
  *sumsq = optim_sumsq(f->g, f->n);
  return 0;
}
static int span_adamw(void *ctx, const optim_t *o, double lr, double scale, char *err,
                      size_t errlen) {
  fake_span_t *f = ctx;
  optim_t mine = *o; /* the host's config, ranges and step count */
  mine.m = f->m, mine.v = f->v;
  optim_step(&mine, f->p, f->g, lr, scale);
  f->steps++;
  return 0;
}
static int span_to_host(void *ctx, float *p, float *m, float *v, size_t n, char *err,
                        size_t errlen) {
  fake_span_t *f = ctx;
  int rc = span_size(f, n, err, errlen);
  if (rc) return rc;
  memcpy(p, f->p, n * sizeof(float)), memcpy(m, f->m, n * sizeof(float));
  memcpy(v, f->v, n * sizeof(float));
  f->to_host++;
  return 0;
}
static int span_from_host(void *ctx, const float *p, const float *m, const float *v, size_t n,
                          char *err, size_t errlen) {
  fake_span_t *f = ctx;
  int rc = span_size(f, n, err, errlen);
  if (rc) return rc;
  if (!f->m) f->m = malloc(n * sizeof(float)), f->v = malloc(n * sizeof(float));
  memcpy(f->p, p, n * sizeof(float)), memcpy(f->m, m, n * sizeof(float));
  memcpy(f->v, v, n * sizeof(float));
  f->from_host++;
  return 0;
}
static void span_free(fake_span_t *f) {
  free(f->m);
  free(f->v);
}

/* The hooks of a stand-in (ctx, its first member a fake_span_t) whose
 * passes are forward and backward. */
typedef int (*forward_fn)(void *, const model_batch_t *, double *, char *, size_t);
typedef int (*backward_fn)(void *, float, char *, size_t);
static train_device_t span_hooks(void *ctx, forward_fn forward, backward_fn backward) {
  return (train_device_t){.ctx = ctx,
                          .forward = forward,
                          .backward = backward,
                          .zero_grads = span_zero,
                          .grads_to_host = span_down,
                          .params_from_host = span_up};
}
/* dev's optimizer hooks: AdamW on the stand-in. */
static void with_device_adamw(train_device_t *dev) {
  dev->grad_sumsq = span_sumsq, dev->adamw = span_adamw;
  dev->state_to_host = span_to_host, dev->state_from_host = span_from_host;
}

/* A stand-in accelerator with a model and adapters of its own: it trains
 * the adapters, or without them the weights. */
typedef struct {
  fake_span_t span;
  model_t *m;
  lora_t *lo;
} fake_dev_t;

static int fd_forward(void *ctx, const model_batch_t *bt, double *loss, char *err, size_t errlen) {
  fake_dev_t *f = ctx;
  return model_forward_batch(f->m, bt, f->lo, loss, err, errlen);
}
static int fd_backward(void *ctx, float scale, char *err, size_t errlen) {
  fake_dev_t *f = ctx;
  model_backward(f->m, f->lo, scale);
  return 0;
}
static train_device_t fd_hooks(fake_dev_t *f) {
  f->span.p = f->lo ? f->lo->params : f->m->params;
  f->span.g = f->lo ? f->lo->grads : f->m->grads;
  f->span.n = f->lo ? f->lo->n_params : f->m->n_params;
  return span_hooks(f, fd_forward, fd_backward);
}

/* The loop's device path (passes on the device; adapters, optimizer and
 * clipping on the host, gradients down and parameters up each step) gives
 * the host path's losses and adapters exactly, and reads no host weights. */
static void test_device_path_matches_host(void **state) {
  jobspec_t s = tiny_spec(true, 10, "dev-host");
  model_t *m;
  lora_t *lo;
  losses_t host = {{0}, 0}, onDev = {{0}, 0};
  make_model(&s, &m, &lo);
  train_result_t rh = run(&s, m, lo, 0, &host);

  /* The device copy starts as garbage: only the first upload fixes it. */
  fake_dev_t f = {0};
  make_model(&s, &f.m, &f.lo);
  for (size_t i = 0; i < f.lo->n_params; i++) f.lo->params[i] = NAN;
  train_device_t dev = fd_hooks(&f);
  /* The host holds the shape only (no weights) and adapters seeded as a job's. */
  llama_config_t c = tiny_config();
  model_t shape;
  char err[256];
  assert_int_equal(model_init_shape(&shape, &c, s.train.micro_batch_size, s.data.seq_len,
                                    MODEL_TRAIN_LORA, err, sizeof err),
                   0);
  lora_t *hl;
  assert_int_equal(
      lora_create(&hl, &shape, s.lora_rank, s.lora_alpha, s.target_modules, err, sizeof err), 0);
  lora_init(hl, s.train.seed);
  snprintf(s.output_dir, sizeof s.output_dir, "%s/dev-dev", g_dir);
  train_result_t rd = run_on(&s, &shape, hl, &dev, 0, &onDev);

  for (int i = 1; i <= 10; i++)
    if (host.loss[i] != onDev.loss[i])
      fail_msg("step %d: loss %.9g on the host, %.9g through the device hooks", i, host.loss[i],
               onDev.loss[i]);
  assert_true(rh.eval_loss_start == rd.eval_loss_start && rh.eval_loss_end == rd.eval_loss_end);
  assert_memory_equal(lo->params, hl->params, lo->n_params * sizeof(float));
  assert_memory_equal(hl->params, f.lo->params, lo->n_params * sizeof(float));
  assert_int_equal(f.span.ups, 11); /* at the start, then after each step */
  assert_int_equal(f.span.downs, 10);
  lora_free(hl);
  lora_free(f.lo);
  model_free(f.m);
  lora_free(lo);
  model_free(m);
}

/* Full training through the hooks: the stand-in holds a whole model
 * (weights and gradients, as model_cuda's full mode does on a GPU); the
 * host holds weights and gradients only (model_create_weights), which the
 * optimizer updates and the checkpoint is written from. */
static void test_device_full_training_matches_host(void **state) {
  jobspec_t s = tiny_spec(false, 8, "devfull-host");
  model_t *m;
  lora_t *lo;
  losses_t host = {{0}, 0}, onDev = {{0}, 0};
  make_model(&s, &m, &lo);
  run(&s, m, lo, 0, &host);

  fake_dev_t f = {0};
  make_model(&s, &f.m, &f.lo);
  for (size_t i = 0; i < f.m->n_params; i++) f.m->params[i] = NAN; /* fixed by the first upload */
  train_device_t dev = fd_hooks(&f);
  llama_config_t c = tiny_config();
  model_t *hw;
  char err[256];
  assert_int_equal(model_create_weights(&hw, &c, s.train.micro_batch_size, s.data.seq_len,
                                        MODEL_TRAIN_FULL, err, sizeof err),
                   0);
  assert_int_equal(model_activation_bytes(hw), 0);
  model_io_init_scratch(hw, 99);
  snprintf(s.output_dir, sizeof s.output_dir, "%s/devfull-dev", g_dir);
  run_on(&s, hw, NULL, &dev, 0, &onDev);
  for (int i = 1; i <= 8; i++)
    if (host.loss[i] != onDev.loss[i])
      fail_msg("step %d: loss %.9g on the host, %.9g through the device hooks", i, host.loss[i],
               onDev.loss[i]);
  assert_memory_equal(m->params, hw->params, m->n_params * sizeof(float));
  assert_memory_equal(hw->params, f.m->params, m->n_params * sizeof(float));
  assert_int_equal(f.span.ups, 9);
  assert_int_equal(f.span.downs, 8);

  /* Without weights of its own the host model cannot be the trained span. */
  model_t shape;
  assert_int_equal(model_init_shape(&shape, &c, s.train.micro_batch_size, s.data.seq_len,
                                    MODEL_TRAIN_FULL, err, sizeof err),
                   0);
  train_backend_t b;
  assert_int_equal(train_backend_host(&b, &shape, NULL, err, sizeof err), TY_EINTERNAL);
  assert_non_null(strstr(err, "model_create_weights"));
  model_free(hw);
  model_free(f.m);
  model_free(m);
}

/* AdamW on the stand-in device: the host path's losses bit for bit with
 * neither weights nor gradients crossing during the steps; an interrupted
 * run resumed from its checkpoint (the span and moments brought to the
 * host for it, and sent back on resuming) continues them; the host model
 * ends holding the trained weights, which the outputs are written from.
 * A replicated span (LoRA) keeps the optimizer on the host. */
static void test_device_optimizer_matches_host(void **state) {
  jobspec_t s = tiny_spec(false, 8, "devopt-host");
  model_t *m;
  lora_t *lo;
  losses_t host = {{0}, 0}, onDev = {{0}, 0};
  make_model(&s, &m, &lo);
  run(&s, m, lo, 0, &host);
  llama_config_t c = tiny_config();
  char err[256];
  snprintf(s.output_dir, sizeof s.output_dir, "%s/devopt-dev", g_dir);
  for (int part = 0; part < 2; part++) { /* 4 steps and a checkpoint, then the rest */
    fake_dev_t f = {0};
    make_model(&s, &f.m, &f.lo);
    for (size_t i = 0; i < f.m->n_params; i++) f.m->params[i] = NAN;
    train_device_t dev = fd_hooks(&f);
    with_device_adamw(&dev);
    model_t *hw;
    assert_int_equal(model_create_weights(&hw, &c, s.train.micro_batch_size, s.data.seq_len,
                                          MODEL_TRAIN_FULL, err, sizeof err),
                     0);
    model_io_init_scratch(hw, 99);
    train_result_t r = run_on(&s, hw, NULL, &dev, part == 0 ? 4 : 0, &onDev);
    assert_int_equal(r.start_step, part == 0 ? 0 : 4);
    assert_int_equal(f.span.ups + f.span.downs, 0);
    assert_int_equal(f.span.steps, 4);
    assert_int_equal(f.span.from_host, 1);
    assert_int_equal(f.span.to_host, part == 0 ? 2 : 1); /* the checkpoint, the end */
    if (part == 1) assert_memory_equal(m->params, hw->params, m->n_params * sizeof(float));
    span_free(&f.span);
    model_free(f.m);
    model_free(hw);
  }
  for (int i = 1; i <= 8; i++)
    if (host.loss[i] != onDev.loss[i])
      fail_msg("step %d: loss %.9g on the host, %.9g with AdamW on the device", i, host.loss[i],
               onDev.loss[i]);
  model_free(m);

  jobspec_t sl = tiny_spec(true, 2, "devopt-lora");
  fake_dev_t f = {0};
  make_model(&sl, &f.m, &f.lo);
  train_device_t dev = fd_hooks(&f);
  with_device_adamw(&dev);
  train_backend_t hb, b;
  assert_int_equal(train_backend_host(&hb, f.m, f.lo, err, sizeof err), 0);
  assert_int_equal(train_backend_device(&b, &hb, &dev, 1, err, sizeof err), TY_EINTERNAL);
  assert_non_null(strstr(err, "not for a replicated span"));
  train_backend_free(&hb);
  lora_free(f.lo);
  model_free(f.m);
}

/* --- Full training over several ranks through the hooks, as over GPUs:
 * the host keeps only its shards as the trained span (an FSDP_SPAN over a
 * table-only model); the stand-in device is a CPU fsdp of its own (the
 * passes, the gradient reduce-scatter), reached only through the hooks.
 * Run in forked shm ranks, so the checks below report on stderr and by
 * exit status instead of cmocka's asserts. */
typedef struct {
  fake_span_t span;
  fsdp_t *f;
} fake_shard_t;

static int fs_forward(void *ctx, const model_batch_t *bt, double *loss, char *err, size_t errlen) {
  return fsdp_forward(((fake_shard_t *)ctx)->f, bt, NULL, loss, err, errlen);
}
static int fs_backward(void *ctx, float scale, char *err, size_t errlen) {
  return fsdp_backward(((fake_shard_t *)ctx)->f, NULL, scale, err, errlen);
}
static train_device_t fs_hooks(fake_shard_t *d) {
  d->span.p = fsdp_params(d->f), d->span.g = fsdp_grads(d->f), d->span.n = fsdp_span(d->f);
  return span_hooks(d, fs_forward, fs_backward);
}

/* This rank's float32 shard of the seeded model, over a model built by
 * create, in mode. */
static int shard_model(comm_t *c, model_mode_t mmode, fsdp_mode_t fmode, const jobspec_t *s,
                       model_t **m, fsdp_t **f, char *err, size_t errlen) {
  int (*create)(model_t **, const llama_config_t *, int, int, model_mode_t, char *, size_t) =
      fmode == FSDP_SPAN ? model_create_table : model_create_unowned;
  static placement_t pl;
  placement_cpu_init(&pl);
  llama_config_t cfg = tiny_config();
  loader_opts_t o = {.rank = comm_rank(c),
                     .world_size = comm_world_size(c),
                     .dtype = TY_DTYPE_F32,
                     .seed = 99,
                     .pl = &pl};
  loader_shard_t *sh;
  int rc = create(m, &cfg, s->train.micro_batch_size, s->data.seq_len, mmode, err, errlen);
  if (!rc) rc = loader_init_scratch(&cfg, &o, &sh, NULL, err, errlen);
  return rc ? rc : fsdp_create(f, *m, c, sh, fmode, err, errlen);
}

static int train_sharded(comm_t *c, const jobspec_t *s, fsdp_t *f, const train_device_t *dev,
                         losses_t *l, char *err, size_t errlen) {
  train_result_t res;
  train_backend_t b;
  int rc = fsdp_backend(&b, f, NULL, err, errlen);
  return rc ? rc : run_loop(&b, dev, 0, s, c, l, &res, err, errlen);
}

/* One line per failure, written at once (ranks share stderr). */
#define CHILD_CHECK(cond, ...)                      \
  do {                                              \
    if (!(cond)) {                                  \
      char msg_[600];                               \
      snprintf(msg_, sizeof msg_, __VA_ARGS__);     \
      fprintf(stderr, "rank %d: %s\n", rank, msg_); \
      return 1;                                     \
    }                                               \
  } while (0)

/* Every tensor's shard of a and b holds the same floats (the padding
 * between them is not compared). */
static bool same_shards(fsdp_t *a, fsdp_t *b) {
  const loader_shard_t *sa = fsdp_shard(a), *sb = fsdp_shard(b);
  for (size_t i = 0; i < sa->layout.ntensors; i++) {
    const loader_view_t *va = &sa->views[i], *vb = &sb->views[i];
    if (va->offset != vb->offset || va->nbytes != vb->nbytes ||
        memcmp(fsdp_params(a) + va->offset / sizeof(float),
               fsdp_params(b) + vb->offset / sizeof(float), va->nbytes))
      return false;
  }
  return true;
}

static int sharded_rank(const char *rdv, int rank, int world) {
  char err[512] = "";
  comm_t *c;
  CHILD_CHECK(!comm_open(&c, rdv, rank, world, err, sizeof err), "%s", err);
  jobspec_t s = tiny_spec(false, 6, "shard-host");
  s.world_size = world;
  s.train.micro_batch_size = 2;
  model_t *mh;
  fsdp_t *fh;
  losses_t host = {{0}, 0};
  /* The host's own sharded passes. */
  CHILD_CHECK(!shard_model(c, MODEL_TRAIN_FULL, FSDP_FULL, &s, &mh, &fh, err, sizeof err) &&
                  !train_sharded(c, &s, fh, NULL, &host, err, sizeof err),
              "host: %s", err);
  llama_config_t cfg = tiny_config();
  char out[200];
  snprintf(out, sizeof out, "%s/out-host", g_dir);
  CHILD_CHECK(!fsdp_write_model(fh, out, &cfg, err, sizeof err), "writing: %s", err);
  /* Through the hooks, AdamW on the host and then on the device: the
   * device's copy starts as NaN, fixed by the first upload. */
  for (int opt = 0; opt < 2; opt++) {
    fake_shard_t d = {0};
    model_t *md, *mt;
    fsdp_t *ft;
    losses_t onDev = {{0}, 0};
    CHILD_CHECK(!shard_model(c, MODEL_TRAIN_FULL, FSDP_FULL, &s, &md, &d.f, err, sizeof err) &&
                    !shard_model(c, MODEL_TRAIN_FULL, FSDP_SPAN, &s, &mt, &ft, err, sizeof err),
                "%s", err);
    for (size_t k = 0; k < fsdp_span(d.f); k++) fsdp_params(d.f)[k] = NAN;
    CHILD_CHECK(model_activation_bytes(mt) == 0 && !mt->params, "the table model holds buffers");
    const model_batch_t none = {.b = 1, .t = 1};
    int rc = fsdp_forward(ft, &none, NULL, NULL, err, sizeof err);
    CHILD_CHECK(rc == TY_EINTERNAL && strstr(err, "on the device"), "a span ran a pass: %d %s", rc,
                err);
    train_device_t dev = fs_hooks(&d);
    if (opt) with_device_adamw(&dev);
    snprintf(s.output_dir, sizeof s.output_dir, "%s/shard-dev-%d", g_dir, opt);
    CHILD_CHECK(!train_sharded(c, &s, ft, &dev, &onDev, err, sizeof err), "device %d: %s", opt,
                err);
    for (int i = 1; i <= 6; i++)
      CHILD_CHECK(host.loss[i] == onDev.loss[i],
                  "step %d: loss %.9g on the host, %.9g on the device (AdamW there: %d)", i,
                  host.loss[i], onDev.loss[i], opt);
    const fake_span_t *sp = &d.span;
    if (opt)
      CHILD_CHECK(
          sp->ups + sp->downs == 0 && sp->steps == 6 && sp->from_host == 1 && sp->to_host == 1,
          "AdamW on the device: %d uploads, %d downloads, %d steps, %d/%d state moves", sp->ups,
          sp->downs, sp->steps, sp->from_host, sp->to_host);
    else
      CHILD_CHECK(sp->ups == 7 && sp->downs == 6, "%d uploads, %d downloads", sp->ups, sp->downs);
    CHILD_CHECK(fsdp_span(ft) == fsdp_span(fh) && same_shards(ft, fh) && same_shards(d.f, fh),
                "the trained shards differ (AdamW on the device: %d)", opt);
    /* The span writes the model the host's passes trained. */
    snprintf(out, sizeof out, "%s/out-span-%d", g_dir, opt);
    CHILD_CHECK(!fsdp_write_model(ft, out, &cfg, err, sizeof err), "writing: %s", err);
    span_free(&d.span);
    fsdp_free(d.f), fsdp_free(ft);
    model_free(md), model_free(mt);
  }
  fsdp_free(fh);
  model_free(mh);
  comm_close(c);
  return 0;
}

static bool same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  bool same = fa && fb;
  for (int x = 0, y = 0; same && (x != EOF || y != EOF);) same = (x = fgetc(fa)) == (y = fgetc(fb));
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

static void test_device_sharded_full_matches_host(void **state) {
  char rdv[96], a[200], b[200];
  snprintf(rdv, sizeof rdv, "shm:test-train-shard-%d", (int)getpid());
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) _exit(sharded_rank(rdv, r, 2));
  }
  for (int r = 0; r < 2; r++) {
    int st;
    assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fail_msg("rank %d failed", r);
  }
  snprintf(a, sizeof a, "%s/out-host/model.safetensors", g_dir);
  for (int opt = 0; opt < 2; opt++) {
    snprintf(b, sizeof b, "%s/out-span-%d/model.safetensors", g_dir, opt);
    assert_true(same_file(a, b));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_full_training_lowers_heldout_loss, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lora_training_lowers_heldout_loss, setup, teardown),
      cmocka_unit_test_setup_teardown(test_adapter_save_reload_same_loss, setup, teardown),
      cmocka_unit_test_setup_teardown(test_full_checkpoint_save_reload, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resume_matches_uninterrupted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resume_rejects_other_batch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_path_matches_host, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_full_training_matches_host, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_optimizer_matches_host, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_sharded_full_matches_host, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
