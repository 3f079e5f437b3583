/* test_checkpoint.c - the Llama tensor table, mkmodel's writer (values,
 * determinism, shards) and the strict match: a missing, extra or
 * mis-shaped tensor fails with its name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/model/model.h"
#include "worker/model/weightinit.h"

#include "ckpt_testutil.h"
#include "tmpdir_testutil.h"

/* head_dim 5 != C / NH: q is [15, 12], o is [12, 15]. */
static llama_config_t tiny(void) {
  return tu_tiny_config(12, 10, 2, 3, 1, 5, 7, false);
}

static void sub(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", g_dir, name);
}

static void test_layout(void **state) {
  (void)state;
  llama_config_t c = tiny();
  ckpt_layout_t l;
  assert_int_equal(ckpt_layout_init(&l, &c), 0);
  assert_int_equal(l.ntensors, 1 + 2 * 9 + 2);
  assert_string_equal(l.tensors[0].name, "model.embed_tokens.weight");
  assert_string_equal(l.tensors[1].name, "model.layers.0.input_layernorm.weight");
  const struct {
    ckpt_kind_t k;
    int layer;
    const char *name;
    int64_t rows, cols;
  } want[] = {
      {CKPT_WQ, 1, "model.layers.1.self_attn.q_proj.weight", 15, 12},
      {CKPT_WK, 0, "model.layers.0.self_attn.k_proj.weight", 5, 12},
      {CKPT_WV, 1, "model.layers.1.self_attn.v_proj.weight", 5, 12},
      {CKPT_WO, 0, "model.layers.0.self_attn.o_proj.weight", 12, 15},
      {CKPT_WGATE, 1, "model.layers.1.mlp.gate_proj.weight", 10, 12},
      {CKPT_WUP, 0, "model.layers.0.mlp.up_proj.weight", 10, 12},
      {CKPT_WDOWN, 1, "model.layers.1.mlp.down_proj.weight", 12, 10},
      {CKPT_MLP_NORM, 1, "model.layers.1.post_attention_layernorm.weight", 12, 1},
      {CKPT_EMBED, -1, "model.embed_tokens.weight", 7, 12},
      {CKPT_FINAL_NORM, -1, "model.norm.weight", 12, 1},
      {CKPT_LM_HEAD, -1, "lm_head.weight", 7, 12},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int idx = ckpt_layout_index(&l, want[i].k, want[i].layer);
    assert_true(idx >= 0);
    const ckpt_tensor_t *t = &l.tensors[idx];
    assert_string_equal(t->name, want[i].name);
    assert_int_equal(t->rows, want[i].rows);
    assert_int_equal(t->cols, want[i].cols);
    assert_int_equal(t->ndim, want[i].cols == 1 ? 1 : 2);
    assert_int_equal(t->is_norm, want[i].cols == 1);
  }
  /* Every index round-trips. */
  for (size_t i = 0; i < l.ntensors; i++)
    assert_int_equal(ckpt_layout_index(&l, l.tensors[i].kind, l.tensors[i].layer), (int)i);
  assert_int_equal(ckpt_layout_index(&l, CKPT_WQ, 2), -1);
  assert_int_equal(l.nparams, (uint64_t)llama_config_num_params(&c));
  ckpt_layout_free(&l);
  c.tie_word_embeddings = true;
  assert_int_equal(ckpt_layout_init(&l, &c), 0);
  assert_int_equal(l.ntensors, 1 + 2 * 9 + 1);
  assert_int_equal(ckpt_layout_index(&l, CKPT_LM_HEAD, -1), -1);
  assert_int_equal(l.nparams, (uint64_t)llama_config_num_params(&c));
  assert_int_equal(ckpt_layout_index(&l, CKPT_BQ, 0), -1); /* Llama: no biases */
  ckpt_layout_free(&l);
  /* Qwen2: three 1-D biases close each layer, counted in the parameters,
   * initialised like matrices (not as norms). */
  c.qkv_bias = true;
  assert_int_equal(ckpt_layout_init(&l, &c), 0);
  assert_int_equal(l.per_layer, 12);
  assert_int_equal(l.ntensors, 1 + 2 * 12 + 1);
  assert_int_equal(l.nparams, (uint64_t)llama_config_num_params(&c));
  const ckpt_tensor_t *bk = &l.tensors[ckpt_layout_index(&l, CKPT_BK, 1)];
  assert_string_equal(bk->name, "model.layers.1.self_attn.k_proj.bias");
  assert_int_equal(bk->ndim, 1);
  assert_int_equal(bk->rows, c.num_key_value_heads * c.head_dim);
  assert_false(bk->is_norm);
  assert_true(l.tensors[ckpt_layout_index(&l, CKPT_FINAL_NORM, -1)].is_norm);
  assert_string_equal(l.tensors[ckpt_layout_index(&l, CKPT_FINAL_NORM, -1)].name,
                      "model.norm.weight");
  ckpt_layout_free(&l);
}

/* The model's per-layer table (worker/model/model.h) and the checkpoint's list the
 * same tensors in the same order with the same shapes: a shard view of kind
 * k is the model_layer_t field k. */
static void test_model_table_agrees(void **state) {
  (void)state;
  llama_config_t c = tiny();
  c.head_dim = 4;    /* the model wants an even head size */
  c.qkv_bias = true; /* every kind present */
  model_dims_t dims;
  assert_int_equal(model_dims_from_config(&dims, &c, NULL, 0), 0);
  const model_dims_t *d = &dims;
  const struct {
    const char *name;
    int64_t rows, cols;
  } model[] = {
#define TY_X(field, name, rows, cols) {name, rows, (cols) + ((cols) == 0)},
      MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
  };
  assert_int_equal(sizeof model / sizeof model[0], CKPT_PER_LAYER);
  assert_int_equal(sizeof(model_layer_t) / sizeof(float *), CKPT_PER_LAYER);
  ckpt_layout_t l;
  assert_int_equal(ckpt_layout_init(&l, &c), 0);
  for (int k = 0; k < CKPT_PER_LAYER; k++) {
    const ckpt_tensor_t *t = &l.tensors[ckpt_layout_index(&l, (ckpt_kind_t)k, 1)];
    char want[CKPT_NAME_MAX];
    snprintf(want, sizeof want, "model.layers.1.%s", model[k].name);
    assert_string_equal(t->name, want);
    assert_int_equal(t->rows, model[k].rows);
    assert_int_equal(t->cols, model[k].cols);
  }
  ckpt_layout_free(&l);
}

static void test_write_values_and_shards(void **state) {
  (void)state;
  llama_config_t c = tiny();
  char dir[300], err[1024];
  const ty_dtype_t dts[] = {TY_DTYPE_F32, TY_DTYPE_BF16, TY_DTYPE_F16};
  const int shards[] = {1, 3, 21};
  for (int k = 0; k < 3; k++) {
    snprintf(dir, sizeof dir, "%s/w%d", g_dir, k);
    uint64_t bytes;
    tu_write_ckpt(dir, &c, dts[k], shards[k], 7, &bytes);
    ckpt_t *ck;
    if (ckpt_open(dir, &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(ck->st->nfiles, (size_t)shards[k]);
    assert_int_equal(ck->layout.cfg.torch_dtype, dts[k]);
    assert_int_equal(ck->st->data_bytes, bytes);
    for (size_t i = 0; i < ck->layout.ntensors; i++) {
      const ckpt_tensor_t *t = &ck->layout.tensors[i];
      const st_tensor_t *ft = ck->file_tensor[i];
      assert_int_equal(ft->dtype, dts[k]);
      size_t n = (size_t)ft->nelem;
      float *want = malloc(n * 4), *have = malloc(n * 4);
      unsigned char *raw = malloc(ft->nbytes), *wraw = malloc(ft->nbytes);
      winit_fill(winit_stream(7, t->name), t->is_norm, 0, want, n);
      ty_dtype_from_f32(dts[k], want, wraw, n);
      assert_int_equal(st_read(ck->st, ft, 0, raw, ft->nbytes, err, sizeof err), 0);
      assert_memory_equal(raw, wraw, ft->nbytes);
      ty_dtype_to_f32(dts[k], raw, have, n);
      for (size_t e = 0; e < n; e++) {
        if (t->is_norm)
          assert_true(have[e] == 1.0f);
        else
          assert_true(have[e] > -0.07f && have[e] < 0.07f && have[e] != 0.0f);
      }
      free(want), free(have), free(raw), free(wraw);
    }
    ckpt_close(ck);
  }
  /* The same seed writes the same bytes; shards 0 and too many are refused. */
  snprintf(dir, sizeof dir, "%s/w0b", g_dir);
  tu_write_ckpt(dir, &c, TY_DTYPE_F32, 1, 7, NULL);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "cmp -s %s/w0/model.safetensors %s/model.safetensors", g_dir, dir);
  assert_int_equal(system(cmd), 0);
  tu_write_ckpt(dir, &c, TY_DTYPE_F32, 1, 8, NULL);
  assert_int_not_equal(system(cmd), 0);
  assert_int_equal(ckpt_write_random(dir, &c, TY_DTYPE_F32, 0, 7, NULL, err, sizeof err),
                   TY_EINVAL);
  assert_int_equal(ckpt_write_random(dir, &c, TY_DTYPE_F32, 22, 7, NULL, err, sizeof err),
                   TY_EINVAL);
}

/* Rewrites key of dir/config.json to the integer or boolean v. */
static void set_config(const char *dir, const char *key, json_t *v) {
  char p[400];
  snprintf(p, sizeof p, "%s/config.json", dir);
  json_t *j = json_load_file(p, 0, NULL);
  assert_non_null(j);
  json_object_set_new(j, key, v);
  assert_int_equal(json_dump_file(j, p, 0), 0);
  json_decref(j);
}

static void expect_open_fails(const char *dir, int code, const char *want) {
  ckpt_t *ck = (ckpt_t *)1;
  char err[1024] = "";
  int rc = ckpt_open(dir, &ck, err, sizeof err);
  if (rc != code || !strstr(err, want))
    fail_msg("rc %d (want %d), message '%s' (want '%s')", rc, code, err, want);
  assert_null(ck);
}

static void test_strict_match(void **state) {
  (void)state;
  llama_config_t c = tiny();
  char dir[300], err[1024];
  sub(dir, sizeof dir, "strict");
  tu_write_ckpt(dir, &c, TY_DTYPE_BF16, 2, 1, NULL);
  set_config(dir, "num_hidden_layers", json_integer(3));
  expect_open_fails(dir, TY_EINVAL,
                    "tensor 'model.layers.2.input_layernorm.weight' (shape [12] from config.json) "
                    "is missing");
  set_config(dir, "num_hidden_layers", json_integer(1));
  expect_open_fails(dir, TY_EINVAL, "tensor 'model.layers.1.");
  expect_open_fails(dir, TY_EINVAL, "is not part of the Llama layout");
  set_config(dir, "num_hidden_layers", json_integer(2));
  set_config(dir, "intermediate_size", json_integer(11));
  expect_open_fails(dir, TY_EINVAL,
                    "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [10, 12] but "
                    "config.json implies [11, 12]");
  set_config(dir, "intermediate_size", json_integer(10));
  set_config(dir, "tie_word_embeddings", json_true());
  expect_open_fails(dir, TY_EINVAL, "tensor 'lm_head.weight' is not part of the Llama layout");
  set_config(dir, "tie_word_embeddings", json_false());
  set_config(dir, "num_attention_heads", json_integer(0));
  expect_open_fails(dir, TY_EINVAL, "num_attention_heads");
  set_config(dir, "num_attention_heads", json_integer(3));
  ckpt_t *ck;
  assert_int_equal(ckpt_open(dir, &ck, err, sizeof err), 0); /* restored */
  ckpt_close(ck);
  char p[400];
  snprintf(p, sizeof p, "%s/config.json", dir);
  FILE *f = fopen(p, "w");
  fputs("{\"hidden_size\": ", f);
  fclose(f);
  expect_open_fails(dir, TY_EINVAL, "not valid JSON");
  unlink(p);
  expect_open_fails(dir, TY_ENOTFOUND, "config.json: missing");
  /* A truncated shard of an otherwise valid checkpoint. */
  sub(dir, sizeof dir, "trunc");
  tu_write_ckpt(dir, &c, TY_DTYPE_F16, 1, 1, NULL);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  assert_int_equal(truncate(p, 2000), 0);
  expect_open_fails(dir, TY_EINVAL, "model.safetensors");
}

/* One fingerprint for a checkpoint and its copies; another for another
 * seed of the same shape, or other weights in the same files. */
static void test_fingerprint(void **state) {
  (void)state;
  llama_config_t c = tiny();
  char a[300], b[300], copy[300], err[1024], cmd[1000];
  char fa[CKPT_FINGERPRINT_LEN], fb[CKPT_FINGERPRINT_LEN], fc[CKPT_FINGERPRINT_LEN];
  sub(a, sizeof a, "fp-a");
  sub(b, sizeof b, "fp-b");
  sub(copy, sizeof copy, "fp-copy");
  tu_write_ckpt(a, &c, TY_DTYPE_BF16, 2, 1, NULL);
  tu_write_ckpt(b, &c, TY_DTYPE_BF16, 2, 2, NULL);
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", a, copy);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(ckpt_fingerprint(a, fa, err, sizeof err), 0);
  assert_int_equal(strlen(fa), 16);
  assert_int_equal(ckpt_fingerprint(copy, fc, err, sizeof err), 0);
  assert_string_equal(fa, fc);
  assert_int_equal(ckpt_fingerprint(b, fb, err, sizeof err), 0);
  assert_string_not_equal(fa, fb);
  /* A file beside the checkpoint's own (a LoRA output there) is not part
   * of it. */
  snprintf(cmd, sizeof cmd,
           "cp '%s/model-00001-of-00002.safetensors' '%s/adapter_model.safetensors'", b, copy);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(ckpt_fingerprint(copy, fc, err, sizeof err), 0);
  assert_string_equal(fa, fc);
  /* Without a config.json there is nothing to fingerprint. */
  snprintf(cmd, sizeof cmd, "rm '%s/config.json'", copy);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(ckpt_fingerprint(copy, fc, err, sizeof err), TY_ENOTFOUND);
  assert_non_null(strstr(err, "config.json"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_model_table_agrees),
      cmocka_unit_test(test_write_values_and_shards),
      cmocka_unit_test(test_strict_match),
      cmocka_unit_test(test_fingerprint),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
