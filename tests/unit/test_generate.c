/* test_generate.c - the decoder's pieces that numerics/generate does not
 * reach: the choice of the next token on a constructed distribution
 * (greedy ties, top-p's nucleus, reproducibility with a seed), the key/value
 * cache against the training forward over the whole sequence (fed at once,
 * a token at a time, and across prompt chunks), the decoder's refusals, the
 * --device names (and cuda refused in a build without CUDA), and
 * the streamed text never splitting a multi-byte character. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "worker/model/generate.h"
#include "worker/model/generate_text.h"
#include "worker/model/model.h"

/* 10 logits whose softmax is 0.4, 0.3, 0.15, 0.1, 0.05 (at ids 7, 2, 9, 0,
 * 4) and about 0 elsewhere. */
static void constructed(float *logits) {
  const int ids[] = {7, 2, 9, 0, 4};
  const double p[] = {0.4, 0.3, 0.15, 0.1, 0.05};
  for (int i = 0; i < 10; i++) logits[i] = -1e4f;
  for (int i = 0; i < 5; i++) logits[ids[i]] = (float)log(p[i]);
}

static void greedy_takes_the_first_largest(void **state) {
  (void)state;
  float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f}, scratch[6];
  int idx[6];
  uint64_t rng = 1;
  assert_int_equal(gen_sample(logits, 6, 0.0f, 1.0f, &rng, scratch, idx), 1);
  assert_int_equal(rng, 1); /* greedy draws nothing */
}

static void top_p_stays_in_the_nucleus(void **state) {
  (void)state;
  float logits[10], scratch[10];
  int idx[10], count[10] = {0};
  constructed(logits);
  /* top_p 0.8: 0.4 + 0.3 = 0.7 < 0.8, so 9 (0.15) joins; 0.85 >= 0.8 stops. */
  uint64_t rng = 12345;
  const int draws = 20000;
  for (int i = 0; i < draws; i++) count[gen_sample(logits, 10, 1.0f, 0.8f, &rng, scratch, idx)]++;
  for (int i = 0; i < 10; i++)
    if (i != 7 && i != 2 && i != 9) assert_int_equal(count[i], 0);
  /* Renormalised over the nucleus: 0.4/0.85, 0.3/0.85, 0.15/0.85. */
  assert_true(fabs(count[7] / (double)draws - 0.4 / 0.85) < 0.02);
  assert_true(fabs(count[2] / (double)draws - 0.3 / 0.85) < 0.02);
  assert_true(fabs(count[9] / (double)draws - 0.15 / 0.85) < 0.02);
  /* top_p 0.4: the first token's mass reaches it, so it alone. */
  for (int i = 0; i < 200; i++)
    assert_int_equal(gen_sample(logits, 10, 1.0f, 0.4f, &rng, scratch, idx), 7);
  /* A tiny top_p still keeps one token. */
  assert_int_equal(gen_sample(logits, 10, 1.0f, 1e-6f, &rng, scratch, idx), 7);
  /* top_p 1 with a high temperature reaches every token. */
  memset(count, 0, sizeof count);
  for (int i = 0; i < 20000; i++)
    count[gen_sample(logits, 10, 5000.0f, 1.0f, &rng, scratch, idx)]++;
  for (int i = 0; i < 10; i++) assert_true(count[i] > 0);
}

static void sampling_is_reproducible(void **state) {
  (void)state;
  float logits[10], scratch[10];
  int idx[10], a[64], b[64], c[64];
  constructed(logits);
  uint64_t r1 = 99, r2 = 99, r3 = 100;
  for (int i = 0; i < 64; i++) {
    a[i] = gen_sample(logits, 10, 1.0f, 0.95f, &r1, scratch, idx);
    b[i] = gen_sample(logits, 10, 1.0f, 0.95f, &r2, scratch, idx);
    c[i] = gen_sample(logits, 10, 1.0f, 0.95f, &r3, scratch, idx);
  }
  assert_memory_equal(a, b, sizeof a);
  assert_memory_not_equal(a, c, sizeof a);
}

/* A small model with random weights. */
static model_t *small_model(int T, int window) {
  llama_config_t c;
  llama_config_init(&c);
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 50;
  c.sliding_window = window;
  model_t *m = NULL;
  char err[256];
  int rc = model_create(&m, &c, 1, T, MODEL_EVAL, err, sizeof err);
  if (rc) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, 0);
  model_init_random(m, 7, 0.3f);
  return m;
}

static void max_rel(const float *a, const float *b, int n, double tol) {
  double mx = 0, ref = 0;
  for (int i = 0; i < n; i++) {
    mx = fmax(mx, fabs((double)a[i] - b[i]));
    ref = fmax(ref, fabs((double)b[i]));
  }
  assert_true(mx <= tol * ref);
}

static void cache_equals_the_whole_forward(void **state) {
  (void)state;
  enum { T = 150 }; /* more than two prompt chunks */
  model_t *m = small_model(T, 0);
  int tokens[T];
  for (int i = 0; i < T; i++) tokens[i] = (i * 37 + 11) % 50;
  char err[256];
  assert_int_equal(model_forward(m, tokens, NULL, 1, T, NULL, NULL, err, sizeof err), 0);
  gen_t *g;
  assert_int_equal(gen_create(&g, &m->d, &m->w, NULL, T, 0, err, sizeof err), 0);
  /* The whole prompt at once: the last row's logits. */
  assert_int_equal(gen_feed(g, tokens, T, err, sizeof err), 0);
  assert_int_equal(gen_len(g), T);
  max_rel(gen_logits(g), m->logits + (size_t)(T - 1) * 50, 50, 1e-5);
  /* One token at a time after a prompt of 70: every row. */
  gen_reset(g);
  assert_int_equal(gen_feed(g, tokens, 70, err, sizeof err), 0);
  max_rel(gen_logits(g), m->logits + (size_t)69 * 50, 50, 1e-5);
  for (int t = 70; t < T; t++) {
    assert_int_equal(gen_feed(g, tokens + t, 1, err, sizeof err), 0);
    max_rel(gen_logits(g), m->logits + (size_t)t * 50, 50, 1e-5);
  }
  /* Full: one more token does not fit. */
  assert_int_equal(gen_feed(g, tokens, 1, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "150-token cache"));
  gen_free(g);
  model_free(m);
}

static void sliding_window_applies_past_its_length(void **state) {
  (void)state;
  enum { T = 40 };
  model_t *m = small_model(T, 0);
  int tokens[T];
  for (int i = 0; i < T; i++) tokens[i] = (i * 13 + 5) % 50;
  char err[256];
  gen_t *a, *b;
  assert_int_equal(gen_create(&a, &m->d, &m->w, NULL, T, 0, err, sizeof err), 0);
  assert_int_equal(gen_create(&b, &m->d, &m->w, NULL, T, 8, err, sizeof err), 0);
  assert_int_equal(gen_feed(a, tokens, 8, err, sizeof err), 0);
  assert_int_equal(gen_feed(b, tokens, 8, err, sizeof err), 0);
  assert_memory_equal(gen_logits(a), gen_logits(b), 50 * sizeof(float));
  /* Past the window the last token sees fewer keys. */
  assert_int_equal(gen_feed(a, tokens + 8, 20, err, sizeof err), 0);
  assert_int_equal(gen_feed(b, tokens + 8, 20, err, sizeof err), 0);
  assert_memory_not_equal(gen_logits(a), gen_logits(b), 50 * sizeof(float));
  gen_free(a);
  gen_free(b);
  model_free(m);
}

static void refusals(void **state) {
  (void)state;
  model_t *m = small_model(4, 0);
  char err[256];
  gen_t *g;
  assert_int_equal(gen_create(&g, &m->d, &m->w, NULL, 0, 0, err, sizeof err), TY_EINVAL);
  assert_int_equal(gen_create(&g, &m->d, &m->w, NULL, 4, 0, err, sizeof err), 0);
  int bad[2] = {3, 50};
  assert_int_equal(gen_feed(g, bad, 2, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "token 50 at position 1 is outside the model's vocabulary"));
  assert_int_equal(gen_feed(g, bad, 0, err, sizeof err), TY_EINVAL);
  assert_int_equal(gen_len(g), 0);
  gen_free(g);
  model_free(m);
}

/* --device: the names, and cuda in a build without the CUDA backend
 * refused saying so (auto then the CPU); with it, gpu/generate checks the
 * GPU side. */
static void device_names(void **state) {
  (void)state;
  gen_device_t dev = GEN_DEVICE_CUDA;
  char err[512] = "";
  assert_int_equal(gen_device_pick("cpu", &dev, err, sizeof err), 0);
  assert_int_equal(dev, GEN_DEVICE_CPU);
  assert_int_equal(gen_device_pick("gpu", &dev, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "--device gpu: use cpu, cuda or auto"));
  assert_string_equal(gen_device_name(GEN_DEVICE_CUDA), "cuda");
#ifndef TRAINYARD_HAVE_CUDA
  assert_int_equal(gen_device_pick("cuda", &dev, err, sizeof err), TY_EUNAVAILABLE);
  assert_non_null(strstr(err, "built without the CUDA toolkit"));
  assert_non_null(strstr(err, "--device cpu"));
  assert_int_equal(gen_device_pick("auto", &dev, err, sizeof err), 0);
  assert_int_equal(dev, GEN_DEVICE_CPU);
  model_t *m = small_model(4, 0);
  gen_t *g = (gen_t *)&dev;
  assert_int_equal(
      gen_create_on(&g, GEN_DEVICE_CUDA, &m->d, &m->w, NULL, 4, 0, TY_DTYPE_F32, err, sizeof err),
      TY_EUNAVAILABLE);
  assert_null(g);
  assert_non_null(strstr(err, "built without the CUDA toolkit"));
  model_free(m);
#endif
}

/* A byte-level tokenizer: 0xC3 "Ã" and 0xA9 "©" are separate tokens, so
 * "é" (C3 A9) comes in two. */
static void stream_never_splits_a_character(void **state) {
  (void)state;
  const char *json =
      "{\"added_tokens\": [{\"id\": 5, \"content\": \"<|e|>\", \"special\": true, "
      "\"normalized\": false}], \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
      "\"add_prefix_space\": false, \"use_regex\": true}, \"decoder\": {\"type\": "
      "\"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"\\u0120\": 1, "
      "\"\\u00c3\": 2, \"\\u00a9\": 3, \"b\": 4}, \"merges\": []}}";
  tok_t *t;
  char err[256];
  assert_int_equal(tok_load_json(json, strlen(json), NULL, 0, &t, err, sizeof err), 0);
  gentext_stream_t s = {0};
  const uint32_t ids[] = {0, 2, 3, 1, 5, 4, 2};
  const char *want[] = {"a", "", "\xC3\xA9", " ", "", "b", ""};
  char *piece;
  for (int i = 0; i < 7; i++) {
    assert_int_equal(gentext_stream_push(&s, t, ids[i], false, &piece, err, sizeof err), 0);
    assert_string_equal(piece, want[i]);
    free(piece);
  }
  /* The end hands out what is left, the incomplete character as U+FFFD. */
  assert_int_equal(gentext_stream_flush(&s, t, &piece, err, sizeof err), 0);
  assert_string_equal(piece, "\xEF\xBF\xBD");
  free(piece);
  gentext_stream_free(&s);
  tok_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(greedy_takes_the_first_largest),
      cmocka_unit_test(top_p_stays_in_the_nucleus),
      cmocka_unit_test(sampling_is_reproducible),
      cmocka_unit_test(cache_equals_the_whole_forward),
      cmocka_unit_test(sliding_window_applies_past_its_length),
      cmocka_unit_test(refusals),
      cmocka_unit_test(device_names),
      cmocka_unit_test(stream_never_splits_a_character),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
