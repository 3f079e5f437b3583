/* test_merge.c - trainyard merge (worker/ckpt/merge.h): the merged
 * checkpoint of a Qwen2 model (q/k/v biases copied) and an adapter on some
 * projections loads, and its logits equal the base with the adapter
 * applied unmerged; the unadapted tensors are the base's, bit for bit; an
 * existing output, a missing adapter, an adapter for another model and a
 * missing base are refused by name and leave nothing behind. (The merged
 * values against PyTorch: integration/merge.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/merge.h"
#include "worker/ckpt/model_io.h"
#include "worker/ckpt/outputs.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

#include "tmpdir_testutil.h"

enum { B = 2, T = 7 };

static llama_config_t qwen2(int64_t hidden) {
  llama_config_t c;
  llama_config_init(&c);
  c.hidden_size = hidden;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 50;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  c.qkv_bias = true;
  return c;
}

static void sub(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", g_dir, name);
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* A model of cfg loaded from dir (the caller frees it). */
static model_t *load(const char *dir, const llama_config_t *cfg, model_mode_t mode) {
  model_t *m;
  char err[1024];
  if (model_create(&m, cfg, B, T, mode, err, sizeof err)) fail_msg("model: %s", err);
  if (model_io_load(m, dir, NULL, NULL, NULL, err, sizeof err)) fail_msg("load %s: %s", dir, err);
  return m;
}

/* A base checkpoint and an adapter for it on q, v and down (B non-zero,
 * so that the merge changes them), written under g_dir. */
static void make_base_and_adapter(const char *base, const char *adapter, int64_t hidden,
                                  unsigned targets) {
  char err[1024];
  llama_config_t c = qwen2(hidden);
  if (ckpt_write_random(base, &c, TY_DTYPE_F32, 1, 5, NULL, err, sizeof err))
    fail_msg("mkmodel: %s", err);
  model_t *m;
  if (model_create_table(&m, &c, B, T, MODEL_TRAIN_LORA, err, sizeof err)) fail_msg("%s", err);
  lora_t *lo;
  if (lora_create(&lo, m, 3, 6.0, targets, err, sizeof err)) fail_msg("%s", err);
  lora_init(lo, 9);
  for (int i = 0; i < lo->n_tensors; i++)
    if (lo->tensors[i].is_b)
      for (size_t k = 0; k < lo->tensors[i].numel; k++)
        lo->tensors[i].data[k] = 0.05f * (float)((int)((k * 7 + (size_t)i) % 11) - 5);
  if (outputs_write_adapter(adapter, lo, base, err, sizeof err)) fail_msg("%s", err);
  lora_free(lo);
  model_free(m);
}

static void test_merged_logits(void **state) {
  (void)state;
  char base[300], adapter[300], out[300], err[1024];
  sub(base, sizeof base, "base");
  sub(adapter, sizeof adapter, "adapter");
  sub(out, sizeof out, "merged");
  const unsigned targets =
      (1u << JOBSPEC_TARGET_BIT_Q) | (1u << JOBSPEC_TARGET_BIT_V) | (1u << JOBSPEC_TARGET_BIT_DOWN);
  make_base_and_adapter(base, adapter, 32, targets);
  llama_config_t c = qwen2(32);

  /* The base with the adapter applied unmerged. */
  model_t *m = load(base, &c, MODEL_TRAIN_LORA);
  lora_t *lo;
  if (outputs_read_adapter(adapter, m, &lo, err, sizeof err)) fail_msg("%s", err);
  int tok[B * T];
  for (int i = 0; i < B * T; i++) tok[i] = (i * 13 + 3) % 50;
  if (model_forward(m, tok, NULL, B, T, lo, NULL, err, sizeof err)) fail_msg("%s", err);

  merge_opts_t o = {0};
  merge_stats_t s;
  assert_int_equal(ckpt_merge_dir(base, adapter, out, &o, &s, err, sizeof err), 0);
  assert_int_equal(s.tensors, 1 + 2 * 12 + 1);
  assert_int_equal(s.merged, 2 * 3);
  char part[320];
  snprintf(part, sizeof part, "%s.partial", out);
  assert_false(exists(part));

  /* The merged checkpoint loads as a Qwen2 model; its logits without an
   * adapter are the unmerged ones. */
  llama_config_t mc;
  assert_int_equal(ckpt_read_config(out, &mc, err, sizeof err), 0);
  assert_true(mc.qkv_bias);
  model_t *mm = load(out, &mc, MODEL_EVAL);
  if (model_forward(mm, tok, NULL, B, T, NULL, NULL, err, sizeof err)) fail_msg("%s", err);
  double worst = 0, peak = 0;
  for (size_t i = 0; i < (size_t)B * T * c.vocab_size; i++) {
    double d = (double)mm->logits[i] - m->logits[i];
    if (d < 0) d = -d;
    if (d > worst) worst = d;
    if (m->logits[i] > peak) peak = m->logits[i];
    if (-m->logits[i] > peak) peak = -m->logits[i];
  }
  print_message("merged vs unmerged logits: max |diff| %.3g of max |logit| %.3g\n", worst, peak);
  assert_true(worst <= 1e-5 * peak);
  /* Unadapted tensors, biases included, are the base's bit for bit;
   * adapted ones changed. */
  for (int i = 0; i < m->n_tensors; i++) {
    const model_tensor_t *a = &m->tensors[i], *b = model_find_tensor(mm, a->name);
    assert_non_null(b);
    bool same = !memcmp(a->data, b->data, a->numel * sizeof(float));
    bool adapted = strstr(a->name, "q_proj.weight") || strstr(a->name, "v_proj.weight") ||
                   strstr(a->name, "down_proj.weight");
    if (same == adapted) fail_msg("%s: %s", a->name, adapted ? "not merged" : "changed");
  }
  model_free(mm);
  lora_free(lo);
  model_free(m);

  /* bfloat16 output: config.json says so, and it still loads. */
  char out16[300];
  sub(out16, sizeof out16, "merged-bf16");
  o.set_dtype = true, o.dtype = TY_DTYPE_BF16;
  assert_int_equal(ckpt_merge_dir(base, adapter, out16, &o, &s, err, sizeof err), 0);
  assert_int_equal(ckpt_read_config(out16, &mc, err, sizeof err), 0);
  assert_int_equal(mc.torch_dtype, TY_DTYPE_BF16);
  mm = load(out16, &mc, MODEL_EVAL);
  model_free(mm);
}

static void test_refused(void **state) {
  (void)state;
  char base[300], adapter[300], other[300], obase[300], out[300], part[320], err[1024];
  sub(base, sizeof base, "rbase");
  sub(adapter, sizeof adapter, "radapter");
  sub(obase, sizeof obase, "obase");
  sub(other, sizeof other, "oadapter");
  sub(out, sizeof out, "rout");
  snprintf(part, sizeof part, "%s.partial", out);
  make_base_and_adapter(base, adapter, 32, JOBSPEC_TARGET_ALL_LINEAR);
  make_base_and_adapter(obase, other, 40, JOBSPEC_TARGET_ALL_LINEAR);
  merge_opts_t o = {0};

  /* An adapter for a model of another hidden size. */
  assert_int_equal(ckpt_merge_dir(base, other, out, &o, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "has another shape"));
  assert_non_null(strstr(err, "is it an adapter for the model at"));
  assert_false(exists(out));
  assert_false(exists(part));
  /* No adapter there. */
  char none[300];
  sub(none, sizeof none, "no-such-adapter");
  assert_int_equal(ckpt_merge_dir(base, none, out, &o, NULL, err, sizeof err), TY_ENOTFOUND);
  assert_non_null(strstr(err, "adapter_config.json"));
  /* No base there. */
  assert_int_equal(ckpt_merge_dir(none, adapter, out, &o, NULL, err, sizeof err), TY_ENOTFOUND);
  assert_non_null(strstr(err, "config.json: missing"));
  assert_false(exists(out));
  /* An output that exists is never written over; with replace (a job's
   * merged folder from an earlier attempt) it is, and a stale part from a
   * killed merge is cleared. */
  assert_int_equal(mkdir(out, 0755), 0);
  assert_int_equal(ckpt_merge_dir(base, adapter, out, &o, NULL, err, sizeof err), TY_EEXISTS);
  assert_non_null(strstr(err, "already exists"));
  assert_int_equal(mkdir(part, 0755), 0);
  FILE *f = fopen(strcat(strcpy(err, part), "/model.safetensors"), "w");
  assert_non_null(f);
  fclose(f);
  o.replace = true;
  assert_int_equal(ckpt_merge_dir(base, adapter, out, &o, NULL, err, sizeof err), 0);
  assert_false(exists(part));
  char cfg[320];
  snprintf(cfg, sizeof cfg, "%s/model.safetensors", out);
  assert_true(exists(cfg));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_merged_logits),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
