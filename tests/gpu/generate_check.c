/* generate_check.c - the GPU decoder (gen_create_on GEN_DEVICE_CUDA,
 * worker/cuda/generate_cuda.h) against the CPU decoder on the same
 * weights: the logits of a 150-token sequence (more than two 64-token
 * prompt chunks) fed at once, and as a 70-token prompt then one token at a
 * time, every step within 1e-4 of the largest logit; over a Llama shape
 * (GQA, untied head), a tied head with Llama 3.1's rope_scaling, Qwen2's
 * q/k/v biases, a LoRA adapter on every projection (unmerged), and
 * Mistral's sliding window of 8; with bf16 matrices on the GPU (the CPU
 * decoder over the same bf16-rounded weights, within 6e-2: each product's
 * input is rounded to bf16 as well); and the same refusals as the CPU's. Exits
 * 77 (a ctest skip), saying why, where no GPU is visible. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"
#include "common/errors.h"
#include "tests/gpu/gpu_util.h"
#include "worker/model/generate.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

enum { T = 150, V = 53 };

typedef struct {
  const char *name;
  bool tied, llama3, bias, lora;
  int window;
  bool bf16; /* bf16 matrices on the GPU (the CPU's weights rounded alike) */
} gcase_t;

static double g_worst; /* the largest max|diff| / max|logit| of a case */

/* max |a - b| <= tol * max |b|, printed on a failure. */
static int close_to(const char *what, int step, const float *a, const float *b, double tol) {
  double mx = 0, ref = 0;
  for (int i = 0; i < V; i++) {
    double e = fabs((double)a[i] - b[i]);
    mx = isnan(e) || e > mx ? (isnan(e) ? INFINITY : e) : mx;
    ref = fmax(ref, fabs((double)b[i]));
  }
  if (mx / ref > g_worst) g_worst = mx / ref;
  if (mx <= tol * ref) return 0;
  printf("FAIL %s at position %d: max|diff| %.3g over max|logit| %.3g\n", what, step, mx, ref);
  return 1;
}

static int run(const gcase_t *c) {
  llama_config_t cfg;
  llama_config_init(&cfg);
  cfg.hidden_size = 48, cfg.intermediate_size = 72, cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4, cfg.num_key_value_heads = 2, cfg.head_dim = 12;
  cfg.vocab_size = V, cfg.max_position_embeddings = 256, cfg.rope_theta = 10000.0;
  cfg.tie_word_embeddings = c->tied;
  cfg.qkv_bias = c->bias;
  cfg.sliding_window = c->window;
  if (c->llama3)
    cfg.rope_scaling = (llama_rope_scaling_t){.type = LLAMA_ROPE_LLAMA3,
                                              .factor = 8,
                                              .low_freq_factor = 1,
                                              .high_freq_factor = 4,
                                              .original_max_position_embeddings = 16};
  char err[1024] = "";
  model_t *m = NULL;
  lora_t *lo = NULL;
  gen_t *cpu = NULL, *gpu = NULL;
  int bad = 0;
  if (model_create(&m, &cfg, 1, 1, MODEL_EVAL, err, sizeof err)) {
    printf("FAIL %s: %s\n", c->name, err);
    return 1;
  }
  model_init_random(m, 7, 0.3f);
  if (c->bf16) { /* the values a bf16 checkpoint holds */
    uint16_t *h = malloc(sizeof *h * m->n_params);
    ty_dtype_from_f32(TY_DTYPE_BF16, m->params, h, m->n_params);
    ty_dtype_to_f32(TY_DTYPE_BF16, h, m->params, m->n_params);
    free(h);
  }
  const ty_dtype_t wdt = c->bf16 ? TY_DTYPE_BF16 : TY_DTYPE_F32;
  /* fp32: summation order only; bf16: each product's input rounded too
   * (2^-9 relative), through two layers of weights of std 0.3. */
  const double tol = c->bf16 ? 6e-2 : 1e-4;
  g_worst = 0;
  if (c->lora) {
    if (lora_create(&lo, m, 4, 8.0, JOBSPEC_TARGET_ALL_LINEAR, err, sizeof err)) {
      printf("FAIL %s: %s\n", c->name, err);
      model_free(m);
      return 1;
    }
    lora_init(lo, 5);
    for (int i = 0; i < lo->n_tensors; i++) /* B = 0 would hide the adapter */
      if (lo->tensors[i].is_b) gpu_fill(lo->tensors[i].data, lo->tensors[i].numel, 100 + i, 0.2f);
  }
  int tokens[T];
  for (int i = 0; i < T; i++) tokens[i] = (i * 37 + 11) % V;
  if (gen_create_on(&cpu, GEN_DEVICE_CPU, &m->d, &m->w, lo, T, c->window, wdt, err, sizeof err) ||
      gen_create_on(&gpu, GEN_DEVICE_CUDA, &m->d, &m->w, lo, T, c->window, wdt, err, sizeof err)) {
    printf("FAIL %s: %s\n", c->name, err);
    bad = 1;
    goto out;
  }
  /* The whole sequence at once (three chunks): the last row's logits. */
  bad |= gen_feed(cpu, tokens, T, err, sizeof err) || gen_feed(gpu, tokens, T, err, sizeof err);
  if (!bad) bad |= close_to(c->name, T - 1, gen_logits(gpu), gen_logits(cpu), tol);
  /* A prompt of 70, then a token at a time: every step. */
  gen_reset(cpu);
  gen_reset(gpu);
  bad |= gen_feed(cpu, tokens, 70, err, sizeof err) || gen_feed(gpu, tokens, 70, err, sizeof err);
  if (!bad) bad |= close_to(c->name, 69, gen_logits(gpu), gen_logits(cpu), tol);
  for (int t = 70; t < T && !bad; t++) {
    bad |= gen_feed(cpu, tokens + t, 1, err, sizeof err) ||
           gen_feed(gpu, tokens + t, 1, err, sizeof err);
    if (!bad) bad |= close_to(c->name, t, gen_logits(gpu), gen_logits(cpu), tol);
  }
  if (bad && err[0]) printf("FAIL %s: %s\n", c->name, err); /* a feed's refusal */
  /* bf16 products round their inputs: exact agreement would mean the
   * fp32 path ran. */
  if (!bad && c->bf16 && !(g_worst > 1e-6)) {
    printf("FAIL %s: the bf16 decoder's logits equal the fp32 CPU's exactly\n", c->name);
    bad = 1;
  }
  /* Full: one more token does not fit, as on the CPU. */
  if (!bad && (gen_feed(gpu, tokens, 1, err, sizeof err) != TY_EINVAL ||
               !strstr(err, "150-token cache") || gen_len(gpu) != T)) {
    printf("FAIL %s: a full GPU cache took one more token (%s)\n", c->name, err);
    bad = 1;
  }
  if (!bad)
    printf(
        "ok   %s: %d positions on the GPU decoder agree with the CPU's (worst %.2g of the largest "
        "logit)\n",
        c->name, T, g_worst);
out:
  gen_free(cpu);
  gen_free(gpu);
  lora_free(lo);
  model_free(m);
  return bad;
}

int main(void) {
  gpu_require_device("gpu/generate");
  const gcase_t cases[] = {
      {"llama", false, false, false, false, 0, false},
      {"tied_llama3", true, true, false, false, 0, false},
      {"qwen2_bias", false, false, true, false, 0, false},
      {"lora", false, false, false, true, 0, false},
      {"qwen2_lora", true, false, true, true, 0, false},
      {"mistral_window", false, false, false, false, 8, false},
      {"bf16_qwen2_lora", false, false, true, true, 0, true},
      {"bf16_tied_window", true, true, false, false, 8, true},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bad |= run(&cases[i]);
  /* The device names. */
  gen_device_t dev;
  char err[512];
  if (gen_device_pick("cuda", &dev, err, sizeof err) || dev != GEN_DEVICE_CUDA ||
      gen_device_pick("auto", &dev, err, sizeof err) || dev != GEN_DEVICE_CUDA ||
      gen_device_pick("cpu", &dev, err, sizeof err) || dev != GEN_DEVICE_CPU ||
      gen_device_pick("gpu", &dev, err, sizeof err) != TY_EINVAL) {
    printf("FAIL gen_device_pick: %s\n", err);
    bad = 1;
  }
  printf(bad ? "FAIL gpu/generate\n" : "ok   gpu/generate\n");
  return bad;
}
