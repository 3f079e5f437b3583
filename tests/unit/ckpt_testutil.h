/* ckpt_testutil.h - the tiny models of the unit tests: a Llama config by
 * its dimensions, and a checkpoint folder (config.json + safetensors of
 * seeded weights, ckpt_write_random) written from one, the test failing
 * with the reason when it cannot be. Include in a test's .c file after
 * cmocka.h. */
#ifndef TY_TESTS_CKPT_TESTUTIL_H
#define TY_TESTS_CKPT_TESTUTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "api/llama_config.h"
#include "worker/ckpt/checkpoint.h"

/* hidden C, intermediate FF, L layers, NH query heads of HS dims, NKV
 * key/value heads, a vocabulary of V, the head tied to the embedding or
 * not; every other field its default. */
static inline llama_config_t tu_tiny_config(int C, int FF, int L, int NH, int NKV, int HS, int V,
                                            bool tied) {
  llama_config_t c;
  llama_config_init(&c);
  c.hidden_size = C;
  c.intermediate_size = FF;
  c.num_hidden_layers = L;
  c.num_attention_heads = NH;
  c.num_key_value_heads = NKV;
  c.head_dim = HS;
  c.vocab_size = V;
  c.tie_word_embeddings = tied;
  return c;
}

/* c's checkpoint in dir: weights seeded by seed, stored as dtype in
 * `shards` safetensors files; bytes (may be NULL) receives their size. */
static inline void tu_write_ckpt(const char *dir, const llama_config_t *c, ty_dtype_t dtype,
                                 int shards, uint64_t seed, uint64_t *bytes) {
  char err[512];
  if (ckpt_write_random(dir, c, dtype, shards, seed, bytes, err, sizeof err))
    fail_msg("writing the checkpoint %s: %s", dir, err);
}

#endif
