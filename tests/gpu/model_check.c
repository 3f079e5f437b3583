/* model_check.c - the GPU LoRA model (worker/cuda/model_cuda.c) against the CPU
 * model (worker/model/model.c + lora.c) on the same checkpoint and batch (ctest
 * label gpu). A tiny Llama with grouped-query attention, an untied head and
 * LoRA on all seven projections (B made non-zero so that every adapter
 * gradient is exercised): with fp32 base weights the loss agrees within
 * 1e-5 relative and every adapter gradient within 1e-3 relative (summation
 * order only); with bf16 base weights (the GPU also rounds activations to
 * bf16 for its products, and takes attention's products on tensor cores,
 * TF32, which this checks it does) the loss within 1% and the gradients
 * within 5% in relative L2 norm. Then full training (no adapters, fp32 base, tied and
 * untied heads): the loss within 1e-5 and the gradient of every weight,
 * the embedding and norm gains included, within 1e-3 relative. All of it
 * again with the output head run over the tokens in chunks, and with
 * activation checkpointing on both sides; and the bf16 LoRA step once more
 * with attention in fp32 (TRAINYARD_CUDA_ATTN_MIB=0). A workspace bound or
 * head chunk that is not a whole number in range is refused by name. Then
 * all of it with a loss mask and documents packed in the rows (positions
 * restarting: block-diagonal attention, restarted rotary angles); and
 * with Qwen2's q/k/v biases. Exits 77 (a skip) where no CUDA device is
 * visible. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "api/jobspec.h"
#include "api/model_acts.h"
#include "tests/gpu/gpu_util.h"
#include "worker/ckpt/loader.h"
#include "worker/cuda/mem_cuda.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/cuda/model_cuda.h"

enum { B = 2, T = 11, R = 4 };

static bool g_qkv_bias; /* the model is Qwen2's: biases on q, k and v */

static void config(llama_config_t *c) {
  llama_config_init(c);
  c->hidden_size = 48, c->intermediate_size = 72, c->num_hidden_layers = 2;
  c->num_attention_heads = 4, c->num_key_value_heads = 2, c->vocab_size = 61;
  c->head_dim = 12;
  c->rope_theta = 10000.0;
  c->qkv_bias = g_qkv_bias;
  /* Llama 3.1's rotary scaling, its bands set so that this head size has
   * frequencies both interpolated and divided: the device's tables must be
   * the host's (cuda_rope_tables), scaling included. */
  c->rope_scaling = (llama_rope_scaling_t){.type = LLAMA_ROPE_LLAMA3,
                                           .factor = 8,
                                           .low_freq_factor = 1,
                                           .high_freq_factor = 4,
                                           .original_max_position_embeddings = 16};
}

/* The shard's tensors (any dtype) into the CPU model's fp32 parameters. */
static int fill_cpu(model_t *m, const loader_shard_t *s) {
  for (size_t i = 0; i < s->layout.ntensors; i++) {
    const loader_view_t *v = &s->views[i];
    const model_tensor_t *t = model_find_tensor(m, v->t->name);
    if (!t || t->numel != (size_t)v->rows * v->t->cols) {
      printf("FAIL tensor %s has no match in the CPU model\n", v->t->name);
      return 1;
    }
    ty_dtype_to_f32(s->dtype, v->data, t->data, t->numel);
  }
  return 0;
}

/* The same seeded model on the CPU (m, its weights from the host shard
 * hs) and on GPU 0 (ds: hs copied there; mc over it). */
typedef struct {
  placement_t cpu, gpu;
  loader_shard_t *hs, *ds;
  model_t *m;
  model_cuda_t *mc;
} twins_t;

/* Both sides keep one layer's activations and recompute the others in the
 * backward pass (gradient_checkpointing). */
static bool g_recompute;
/* Batches carry loss weights and packed documents' positions. */
static bool g_masked;

/* The batch of tok and tgt, with g_masked a loss mask (a third of the
 * targets and the whole second row's tail count 0) and positions of
 * documents of 4 and 7 tokens (row 0) and 2, 5 and 4 (row 1). */
static model_batch_t batch_of(const int *tok, const int *tgt, float *w, int *pos) {
  model_batch_t bt = {tok, tgt, NULL, NULL, B, T};
  if (!g_masked) return bt;
  static const int starts[B][3] = {{0, 4, 99}, {0, 2, 7}};
  for (int r = 0; r < B; r++)
    for (int t = 0, s = 0; t < T; t++) {
      while (s < 2 && t >= starts[r][s + 1]) s++;
      pos[r * T + t] = t - starts[r][s];
      w[r * T + t] = (r * T + t) % 3 && !(r == 1 && t > 8) ? 1.0f : 0.0f;
    }
  bt.weights = w, bt.pos = pos;
  return bt;
}

/* The CPU side: cfg's seeded weights in dt, a CPU model in mode. 0, or 1
 * with the failure printed. */
static int cpu_twin(twins_t *t, const llama_config_t *cfg, ty_dtype_t dt, uint64_t seed,
                    model_mode_t mode) {
  char err[1024];
  placement_cpu_init(&t->cpu);
  loader_opts_t o = {.rank = 0,
                     .world_size = 1,
                     .dtype = dt,
                     .bucket_bytes = 1 << 16,
                     .seed = seed,
                     .pl = &t->cpu};
  if (loader_init_scratch(cfg, &o, &t->hs, NULL, err, sizeof err) ||
      model_create(&t->m, cfg, B, T, mode, err, sizeof err) ||
      (g_recompute && model_recompute_layers(t->m, err, sizeof err))) {
    printf("FAIL setup: %s\n", err);
    return 1;
  }
  return fill_cpu(t->m, t->hs);
}

/* The GPU side: the host shard on GPU 0, a GPU model over it with adapters
 * shaped and valued like lo (NULL: full training). 0, or model_cuda_create's
 * status (1 where the shard did not reach the device) with err. */
static int gpu_twin_rc(twins_t *t, cuda_backend_t *cb, const lora_t *lo, char *err, size_t errlen) {
  if (placement_cuda_init(&t->gpu, 0, 1 << 20, err, errlen) ||
      loader_shard_upload(t->hs, &t->gpu, &t->ds, err, errlen))
    return 1;
  return model_cuda_create(&t->mc, cb, t->ds, lo, NULL, 0, B, T, g_recompute, err, errlen);
}

/* gpu_twin_rc, with a failure printed: 0 or 1. Also checks that what the
 * model allocated beyond attention's workspace (and, training every
 * weight, the base's gradients) is what the memory rules at submit count
 * (llama_device_activation_bytes, from the same table). */
static int gpu_twin(twins_t *t, cuda_backend_t *cb, const lora_t *lo) {
  char err[1024];
  if (gpu_twin_rc(t, cb, lo, err, sizeof err)) {
    printf("FAIL gpu setup: %s\n", err);
    return 1;
  }
  const char *hr = getenv("TRAINYARD_HEAD_ROWS");
  const uint64_t want =
      llama_device_activation_bytes(&t->ds->layout.cfg, B, T, g_recompute, lo ? lo->R : 0,
                                    lo ? lo->n_params : 0, hr ? atoll(hr) : 0);
  const uint64_t got =
      model_cuda_bytes(t->mc) - model_cuda_attention_bytes(t->mc) - (lo ? 0 : t->ds->bytes);
  if (got != want) {
    printf("FAIL device buffers: the model allocated %llu bytes, the rules count %llu\n",
           (unsigned long long)got, (unsigned long long)want);
    return 1;
  }
  return 0;
}

static void twins_free(twins_t *t) {
  model_cuda_free(t->mc);
  loader_shard_free(t->ds);
  placement_cuda_free(&t->gpu);
  model_free(t->m);
  loader_shard_free(t->hs);
}

static double rel_l2(const float *got, const float *want, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = (double)got[i] - want[i];
    num += e * e;
    den += (double)want[i] * want[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int run(cuda_backend_t *cb, ty_dtype_t dt) {
  llama_config_t cfg;
  config(&cfg);
  char err[1024];
  const char *tag = dt == TY_DTYPE_BF16 ? "bf16" : "fp32";
  twins_t tw;
  lora_t *lo;
  if (cpu_twin(&tw, &cfg, dt, 11, MODEL_TRAIN_LORA)) return 1;
  model_t *m = tw.m;
  if (lora_create(&lo, m, R, 8.0, JOBSPEC_TARGET_ALL_LINEAR, err, sizeof err)) {
    printf("FAIL setup: %s\n", err);
    return 1;
  }
  lora_init(lo, 5);
  for (int i = 0; i < lo->n_tensors; i++)
    if (lo->tensors[i].is_b) gpu_fill(lo->tensors[i].data, lo->tensors[i].numel, 100 + i, 0.05f);
  if (gpu_twin(&tw, cb, lo)) return 1;
  model_cuda_t *mc = tw.mc;
  /* A bf16 base takes the tensor-core attention (its workspace: all the
   * scores of this small batch, well under the 128 MiB bound), unless
   * TRAINYARD_CUDA_ATTN_MIB=0; a float32 base the fp32 kernels. */
  const char *amib = getenv("TRAINYARD_CUDA_ATTN_MIB");
  const size_t want_ws =
      dt == TY_DTYPE_BF16 && !(amib && !strcmp(amib, "0"))
          ? cuda_attention_tf32_bytes(B, T, cfg.num_attention_heads, (size_t)128 << 20)
          : 0;
  if (model_cuda_attention_bytes(mc) != want_ws) {
    printf("FAIL lora %s: attention's workspace is %zu bytes, not %zu\n", tag,
           model_cuda_attention_bytes(mc), want_ws);
    return 1;
  }
  printf("ok   lora %s: attention %s (workspace %zu bytes)\n", tag,
         want_ws ? "on tensor cores" : "fp32", want_ws);
  int tok[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) tok[i] = (i * 13 + 7) % 61, tgt[i] = (i * 29 + 3) % 61;

  double lc, lg;
  lora_zero_grad(lo);
  int bad = 0;
  float w[B * T];
  int pos[B * T];
  const model_batch_t bt = batch_of(tok, tgt, w, pos);
  if (model_forward_batch(m, &bt, lo, &lc, err, sizeof err)) {
    printf("FAIL cpu forward: %s\n", err);
    return 1;
  }
  model_backward(m, lo, 1.0f);
  if (model_cuda_forward_batch(mc, &bt, &lg, err, sizeof err) ||
      model_cuda_backward(mc, 1.0f, err, sizeof err)) {
    printf("FAIL gpu step: %s\n", err);
    return 1;
  }
  size_t n = lo->n_params;
  float *g = malloc(n * sizeof(float));
  gpu_get(g, model_cuda_lora_grads(mc), n * sizeof(float));
  double lerr = fabs(lg - lc) / fabs(lc), gerr = rel_l2(g, lo->grads, n);
  if (dt == TY_DTYPE_F32) {
    char name[64];
    float fl = (float)lg, fc = (float)lc;
    snprintf(name, sizeof name, "lora step loss %s", tag);
    bad |= gpu_close(name, &fl, &fc, 1, 1e-5f, 0.0f);
    snprintf(name, sizeof name, "lora step grads %s", tag);
    bad |= gpu_close(name, g, lo->grads, n, 1e-3f, 1e-6f);
  } else {
    bad |= lerr > 1e-2 || gerr > 5e-2;
    printf("%-4s lora step %s: loss %.6f vs cpu %.6f (rel %.2g), grads rel-L2 %.3g\n",
           bad ? "FAIL" : "ok", tag, lg, lc, lerr, gerr);
  }
  double gn = 0.0;
  for (size_t i = 0; i < n; i++) gn += (double)lo->grads[i] * lo->grads[i];
  if (!(gn > 0.0)) {
    printf("FAIL the CPU adapter gradients are all zero: the comparison would prove nothing\n");
    bad = 1;
  }
  free(g);
  lora_free(lo);
  twins_free(&tw);
  return bad;
}

/* Full training: every weight's gradient against the CPU model's. */
static int run_full(cuda_backend_t *cb, bool tied) {
  llama_config_t cfg;
  config(&cfg);
  cfg.tie_word_embeddings = tied;
  char err[1024];
  twins_t tw;
  if (cpu_twin(&tw, &cfg, TY_DTYPE_F32, 13, MODEL_TRAIN_FULL) || gpu_twin(&tw, cb, NULL)) return 1;
  model_t *m = tw.m;
  model_cuda_t *mc = tw.mc;
  const loader_shard_t *ds = tw.ds;
  int tok[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) tok[i] = (i * 17 + 5) % 61, tgt[i] = (i * 23 + 1) % 61;
  double lc, lg;
  memset(m->grads, 0, m->n_params * sizeof(float));
  float w[B * T];
  int pos[B * T];
  const model_batch_t bt = batch_of(tok, tgt, w, pos);
  if (model_forward_batch(m, &bt, NULL, &lc, err, sizeof err)) {
    printf("FAIL cpu forward: %s\n", err);
    return 1;
  }
  model_backward(m, NULL, 1.0f);
  if (model_cuda_forward_batch(mc, &bt, &lg, err, sizeof err) ||
      model_cuda_backward(mc, 1.0f, err, sizeof err)) {
    printf("FAIL gpu full step: %s\n", err);
    return 1;
  }
  char name[96];
  float fl = (float)lg, fc = (float)lc;
  snprintf(name, sizeof name, "full step loss %s", tied ? "tied" : "untied");
  int bad = gpu_close(name, &fl, &fc, 1, 1e-5f, 0.0f);
  const char *g = (const char *)model_cuda_base_grads(mc);
  for (size_t i = 0; i < ds->layout.ntensors; i++) {
    const loader_view_t *v = &ds->views[i];
    const model_tensor_t *t = model_find_tensor(m, v->t->name);
    float *got = malloc(v->nbytes);
    gpu_get(got, g + v->offset, v->nbytes);
    snprintf(name, sizeof name, "d %.26s", v->t->name + (strncmp(v->t->name, "model.", 6) ? 0 : 6));
    bad |= gpu_close(name, got, t->grad, t->numel, 1e-3f, 1e-6f);
    free(got);
  }
  twins_free(&tw);
  return bad;
}

/* name=value refused by model_cuda_create: TY_EINVAL, want in its message,
 * and no device memory kept. */
static int run_refused(cuda_backend_t *cb, const char *name, const char *value, const char *want) {
  llama_config_t cfg;
  config(&cfg);
  twins_t tw = {0};
  char err[1024] = "";
  if (cpu_twin(&tw, &cfg, TY_DTYPE_BF16, 11, MODEL_TRAIN_LORA)) return 1;
  lora_t *lo;
  if (lora_create(&lo, tw.m, R, 8.0, JOBSPEC_TARGET_ALL_LINEAR, err, sizeof err)) {
    printf("FAIL setup: %s\n", err);
    return 1;
  }
  const size_t before = mem_cuda_used();
  setenv(name, value, 1);
  int rc = gpu_twin_rc(&tw, cb, lo, err, sizeof err);
  unsetenv(name);
  const size_t kept = mem_cuda_used() - before - (tw.ds ? tw.ds->bytes : 0);
  const int bad = rc != TY_EINVAL || !strstr(err, want) || tw.mc || kept;
  printf("%-4s %s=%s refused (status %d, %zu device bytes kept): %s\n", bad ? "FAIL" : "ok", name,
         value, rc, kept, err);
  lora_free(lo);
  twins_free(&tw);
  return bad;
}

/* LoRA in fp32 and bf16, then full training with tied and untied heads. */
static int run_all(cuda_backend_t *cb) {
  int bad = run(cb, TY_DTYPE_F32);
  bad |= run(cb, TY_DTYPE_BF16);
  bad |= run_full(cb, false);
  bad |= run_full(cb, true);
  return bad;
}

int main(void) {
  gpu_require_device("gpu/model");
  cuda_backend_t *cb;
  char err[512];
  if (cuda_backend_create(&cb, 0, err, sizeof err)) {
    printf("FAIL %s\n", err);
    return 1;
  }
  int bad = run_all(cb);
  /* Again with the head over the B*T = 22 tokens in chunks of 7 rows (7,
   * 7, 7, 1), as a large vocabulary makes it: LoRA runs the head's backward
   * in the forward pass, full training computes each chunk's logits again
   * in the backward pass. */
  printf("-- the output head in chunks of 7 rows (TRAINYARD_HEAD_ROWS)\n");
  setenv("TRAINYARD_HEAD_ROWS", "7", 1);
  bad |= run_all(cb);
  unsetenv("TRAINYARD_HEAD_ROWS");
  /* Again with one layer's activations kept on both sides, every other
   * layer run forward again in the backward pass. */
  printf("-- gradient_checkpointing: one layer slot, layers recomputed\n");
  g_recompute = true;
  bad |= run_all(cb);
  g_recompute = false;
  /* The bf16 base with attention kept in fp32 on CUDA cores. */
  printf("-- bf16 with fp32 attention (TRAINYARD_CUDA_ATTN_MIB=0)\n");
  setenv("TRAINYARD_CUDA_ATTN_MIB", "0", 1);
  bad |= run(cb, TY_DTYPE_BF16);
  unsetenv("TRAINYARD_CUDA_ATTN_MIB");
  /* A loss mask and packed documents: the masked mean loss, block-diagonal
   * attention and restarted positions on every path (fp32, tensor cores,
   * full training), whole and in head chunks. */
  printf("-- a loss mask and packed documents\n");
  g_masked = true;
  bad |= run_all(cb);
  setenv("TRAINYARD_HEAD_ROWS", "7", 1);
  bad |= run_all(cb);
  unsetenv("TRAINYARD_HEAD_ROWS");
  setenv("TRAINYARD_CUDA_ATTN_MIB", "0", 1);
  bad |= run(cb, TY_DTYPE_BF16);
  unsetenv("TRAINYARD_CUDA_ATTN_MIB");
  g_masked = false;
  /* Qwen2: biases on the q, k and v projections, added on the device in
   * the base's dtype, frozen under LoRA, their gradients in full
   * training. */
  printf("-- Qwen2's q/k/v biases\n");
  g_qkv_bias = true;
  bad |= run_all(cb);
  g_qkv_bias = false;
  /* A bound or a chunk that is not a whole number in range is named. */
  printf("-- bad TRAINYARD_CUDA_ATTN_MIB and TRAINYARD_HEAD_ROWS\n");
  bad |= run_refused(cb, "TRAINYARD_CUDA_ATTN_MIB", "128M",
                     "TRAINYARD_CUDA_ATTN_MIB='128M' is not a whole number in 0..1048576 (MiB");
  bad |= run_refused(cb, "TRAINYARD_CUDA_ATTN_MIB", "-1", "'-1' is not a whole number in 0..");
  bad |= run_refused(cb, "TRAINYARD_HEAD_ROWS", "0",
                     "TRAINYARD_HEAD_ROWS='0' is not a whole number in 1..1073741824 (tokens");
  cuda_backend_free(cb);
  printf("gpu/model: %s\n",
         bad ? "FAILED" : "the GPU LoRA and full-training steps match the CPU model");
  return bad;
}
