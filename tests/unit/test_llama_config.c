/* test_llama_config.c - the Llama config: a real Hugging Face config.json
 * read leniently, the spec's strict mode, derived defaults, validation,
 * serialization and parameter counts of known models. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/llama_config.h"
#include "jobspec_testutil.h"

/* TinyLlama-1.1B's config.json, as published (keys a trainer ignores
 * included). */
static const char *k_tinyllama =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
    "\"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 2048, "
    "\"initializer_range\": 0.02, \"intermediate_size\": 5632, \"max_position_embeddings\": "
    "2048, \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 22, "
    "\"num_key_value_heads\": 4, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, "
    "\"rope_scaling\": null, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
    "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.35.0\", \"use_cache\": true, "
    "\"vocab_size\": 32000}";

static json_t *load(const char *t) {
  json_t *j = json_loads(t, 0, NULL);
  assert_non_null(j);
  return j;
}

static void test_hf_config_lenient(void **state) {
  (void)state;
  llama_config_t c;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  json_t *j = load(k_tinyllama);
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  assert_int_equal(llama_config_validate(&c, "", &e), 0);
  assert_int_equal(c.hidden_size, 2048);
  assert_int_equal(c.intermediate_size, 5632);
  assert_int_equal(c.num_hidden_layers, 22);
  assert_int_equal(c.num_attention_heads, 32);
  assert_int_equal(c.num_key_value_heads, 4);
  assert_int_equal(c.head_dim, 64);
  assert_int_equal(c.vocab_size, 32000);
  assert_true(c.rms_norm_eps == 1e-5);
  assert_int_equal(c.torch_dtype, TY_DTYPE_BF16);
  assert_int_equal(llama_config_num_params(&c), 1100048384); /* TinyLlama's 1.1B */
  /* The same object is rejected in strict mode, naming each foreign key. */
  llama_config_init(&c);
  assert_int_equal(llama_config_from_json(j, &c, "model", true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model.bos_token_id", "unknown field"));
  assert_true(tu_has(&e, "model.rope_scaling", "unknown field"));
  assert_int_equal(e.len, 9);
  json_decref(j);
  ty_errlist_clear(&e);
}

/* Keys that would change what the model computes are refused with the
 * value that is supported, never ignored: rotary scaling other than Llama
 * 3.1's "llama3" (or llama3 without its figures), a GELU model, projection
 * biases. */
static void test_lenient_refuses_semantic_changes(void **state) {
  (void)state;
  static const struct {
    const char *json, *field, *says;
  } cases[] = {
      {"{\"hidden_size\": 64, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
       "rope_scaling.rope_type", "\"yarn\" rotary scaling is not supported"},
      {"{\"hidden_size\": 64, \"hidden_act\": \"gelu\"}", "hidden_act", "only \"silu\""},
      {"{\"hidden_size\": 64, \"attention_bias\": true}", "attention_bias", "biases"},
      {"{\"hidden_size\": 64, \"mlp_bias\": true}", "mlp_bias", "biases"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    llama_config_t c;
    ty_errlist_t e = TY_ERRLIST_INIT;
    llama_config_init(&c);
    json_t *j = load(cases[i].json);
    assert_int_equal(llama_config_from_json(j, &c, "", false, &e), TY_EINVAL);
    assert_int_equal(e.len, 1);
    assert_true(tu_has(&e, cases[i].field, cases[i].says));
    json_decref(j);
    ty_errlist_clear(&e);
  }
  /* The supported values pass: silu, null scaling, no biases. */
  llama_config_t c;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  json_t *j = load(
      "{\"hidden_size\": 64, \"hidden_act\": \"silu\", \"rope_scaling\": null, "
      "\"attention_bias\": false, \"mlp_bias\": false}");
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  json_decref(j);
  /* Llama 3.1's scaling is read, and written back by llama_config_to_json. */
  llama_config_init(&c);
  j = load(
      "{\"hidden_size\": 64, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": "
      "32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
      "\"original_max_position_embeddings\": 8192}}");
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  json_decref(j);
  assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_LLAMA3);
  assert_true(c.rope_scaling.factor == 32.0 && c.rope_scaling.high_freq_factor == 4.0);
  assert_int_equal(c.rope_scaling.original_max_position_embeddings, 8192);
  json_t *back = llama_config_to_json(&c);
  llama_config_t c2;
  llama_config_init(&c2);
  llama_config_from_json(back, &c2, "", false, &e); /* its unset sizes are refused: not ours */
  assert_false(tu_has(&e, "rope_scaling", ""));
  assert_memory_equal(&c.rope_scaling, &c2.rope_scaling, sizeof c.rope_scaling);
  json_decref(back);
  ty_errlist_clear(&e);
}

/* Llama 3.1's rope_scaling (and the older "type" spelling of linear) are
 * read, validated, written back by llama_config_to_json and read again. */
static void test_rope_scaling_parsed(void **state) {
  (void)state;
  llama_config_t c, d;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  json_t *j = load(
      "{\"hidden_size\": 64, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
      "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, "
      "\"rope_type\": \"llama3\"}}");
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  json_decref(j);
  assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_LLAMA3);
  assert_true(c.rope_scaling.factor == 32 && c.rope_scaling.low_freq_factor == 1);
  assert_true(c.rope_scaling.high_freq_factor == 4);
  assert_int_equal(c.rope_scaling.original_max_position_embeddings, 8192);
  c.intermediate_size = c.num_hidden_layers = c.num_attention_heads = c.vocab_size = 4;
  c.num_key_value_heads = 4, c.head_dim = 16;
  assert_int_equal(llama_config_validate(&c, "", &e), 0);
  j = llama_config_to_json(&c);
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "", false, &e), 0);
  assert_memory_equal(&c.rope_scaling, &d.rope_scaling, sizeof c.rope_scaling);
  /* A job spec's model takes no rope_scaling. */
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "model", true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model.rope_scaling", "unknown field"));
  json_decref(j);
  ty_errlist_clear(&e);
  j = load("{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.5}}");
  llama_config_init(&c);
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_LINEAR);
  assert_true(c.rope_scaling.factor == 2.5);
  json_decref(j);
  /* "default" is no scaling. */
  j = load("{\"rope_scaling\": {\"rope_type\": \"default\"}}");
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_DEFAULT);
  json_decref(j);
  /* The three bands of Hugging Face's _compute_llama3_parameters, with
   * theta 10000, HS 16 and an original context of 64 (wavelengths 2 pi /
   * inv_freq: 6.3 kept, 19.9 and 62.8 interpolated, 198.7 divided). */
  llama_rope_scaling_t s = {LLAMA_ROPE_LLAMA3, 8, 1, 4, 64};
  assert_true(llama_rope_inv_freq(10000, 16, 0, &s) == 1.0);
  double f1 = pow(10000, -2.0 / 16), smooth = (64 / (2 * M_PI / f1) - 1) / 3;
  assert_true(fabs(llama_rope_inv_freq(10000, 16, 1, &s) - ((1 - smooth) * f1 / 8 + smooth * f1)) <
              1e-15);
  double f3 = pow(10000, -6.0 / 16);
  assert_true(fabs(llama_rope_inv_freq(10000, 16, 3, &s) - f3 / 8) < 1e-15);
  s = (llama_rope_scaling_t){.type = LLAMA_ROPE_LINEAR, .factor = 4};
  assert_true(fabs(llama_rope_inv_freq(10000, 16, 3, &s) - f3 / 4) < 1e-15);
  assert_true(llama_rope_inv_freq(10000, 16, 3, NULL) == f3);
}

/* Kinds we do not compute are refused by name, and so are a missing
 * parameter, a key the kind does not take and values that would divide
 * by zero. */
static void test_rope_scaling_refused(void **state) {
  (void)state;
  static const struct {
    const char *json, *field, *says;
  } cases[] = {
      {"{\"rope_type\": \"dynamic\", \"factor\": 2.0}", "rope_scaling.rope_type",
       "\"dynamic\" rotary scaling is not supported"},
      {"{\"type\": \"yarn\", \"factor\": 4.0}", "rope_scaling.type", "\"yarn\""},
      {"{\"rope_type\": \"longrope\"}", "rope_scaling.rope_type", "\"longrope\""},
      {"{\"factor\": 2.0}", "rope_scaling", "needs \"rope_type\""},
      {"\"llama3\"", "rope_scaling", "must be null or an object"},
      {"{\"rope_type\": \"linear\"}", "rope_scaling.factor", "is required"},
      {"{\"rope_type\": \"linear\", \"factor\": 2, \"low_freq_factor\": 1}",
       "rope_scaling.low_freq_factor", "not a key of \"linear\""},
      {"{\"rope_type\": \"linear\", \"factor\": \"2\"}", "rope_scaling.factor", "must be a number"},
      {"{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
       "\"high_freq_factor\": 4}",
       "rope_scaling.original_max_position_embeddings", "is required"},
      {"{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
       "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
       "rope_scaling.high_freq_factor", "greater than low_freq_factor"},
      {"{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
       "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192.5}",
       "rope_scaling.original_max_position_embeddings", "must be an integer"},
      {"{\"rope_type\": \"linear\", \"factor\": 0}", "rope_scaling.factor", "must be > 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    llama_config_t c;
    ty_errlist_t e = TY_ERRLIST_INIT;
    llama_config_init(&c);
    c.hidden_size = c.intermediate_size = c.num_hidden_layers = c.vocab_size = 8;
    c.num_attention_heads = c.num_key_value_heads = 2;
    c.head_dim = 4;
    json_t *rs = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
    assert_non_null(rs);
    json_t *j = json_pack("{s:o}", "rope_scaling", rs);
    if (llama_config_from_json(j, &c, "", false, &e) == 0)
      assert_int_equal(llama_config_validate(&c, "", &e), TY_EINVAL);
    if (e.len != 1 || !tu_has(&e, cases[i].field, cases[i].says))
      fail_msg("case %zu: %s: got %zu errors, first %s: %s", i, cases[i].json, e.len,
               e.len ? e.items[0].field : "-", e.len ? e.items[0].message : "-");
    json_decref(j);
    ty_errlist_clear(&e);
  }
}

/* Parses {"hidden_size": 64, KEY: VALUE} leniently into *e; returns the code. */
static int parse_one(const char *key, const char *value, ty_errlist_t *e) {
  llama_config_t c;
  llama_config_init(&c);
  json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
  assert_non_null(v);
  json_t *j = json_pack("{s:i,s:o}", "hidden_size", 64, key, v);
  int rc = llama_config_from_json(j, &c, "", false, e);
  json_decref(j);
  return rc;
}

/* Keys that leave the model as it is, each with a value published configs
 * carry, are accepted one by one. */
static void test_inert_keys_accepted(void **state) {
  (void)state;
  static const char *const kv[][2] = {
      {"torch_dtype", "\"bfloat16\""},
      {"transformers_version", "\"4.45.0.dev0\""},
      {"bos_token_id", "128000"},
      {"eos_token_id", "[128001, 128008, 128009]"},
      {"pad_token_id", "null"},
      {"architectures", "[\"LlamaForCausalLM\"]"},
      {"model_type", "\"llama\""},
      {"attention_dropout", "0.0"},
      {"attention_dropout", "0"},
      {"mlp_bias", "false"},
      {"attention_bias", "false"},
      {"pretraining_tp", "1"},
      {"use_cache", "true"},
      {"initializer_range", "0.02"},
      {"hidden_act", "\"silu\""},
      {"rope_scaling", "null"},
      {"sliding_window", "null"},
      {"use_sliding_window", "false"},
      {"partial_rotary_factor", "1.0"},
      {"_name_or_path", "\"meta-llama/Llama-3.2-1B\""},
      {"quantization_config", "null"},
  };
  for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
    ty_errlist_t e = TY_ERRLIST_INIT;
    if (parse_one(kv[i][0], kv[i][1], &e) != 0)
      fail_msg("%s: %s refused: %s", kv[i][0], kv[i][1], e.items[0].message);
    ty_errlist_clear(&e);
  }
}

/* Keys that change the model are refused by name, each alone: a value
 * other than the one implemented, and keys trainyard does not know. */
static void test_model_changing_keys_refused(void **state) {
  (void)state;
  static const char *const cases[][3] = {
      {"attention_dropout", "0.1", "attention dropout is not implemented"},
      {"mlp_bias", "true", "biases"},
      {"attention_bias", "true", "biases"},
      {"hidden_act", "\"gelu_pytorch_tanh\"", "only \"silu\""},
      {"partial_rotary_factor", "0.5", "part of each head"},
      {"use_sliding_window", "true", "sliding-window"},
      {"sliding_window", "\"4096\"", "must be null or an integer"},
      {"sliding_window", "0", "must be null or an integer"},
      {"model_type", "\"gemma\"", "only \"llama\" is supported, got gemma"},
      {"architectures", "[\"LlamaForSequenceClassification\"]", "LlamaForCausalLM"},
      {"quantization_config", "{\"quant_method\": \"gptq\"}",
       "quant_method gptq: trainyard reads bitsandbytes' 4-bit checkpoints only"},
      {"num_experts", "8", "not a config.json key"},
      {"final_logit_softcapping", "30.0", "not a config.json key"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ty_errlist_t e = TY_ERRLIST_INIT;
    assert_int_equal(parse_one(cases[i][0], cases[i][1], &e), TY_EINVAL);
    if (e.len != 1 || !tu_has(&e, cases[i][0], cases[i][2]))
      fail_msg("%s: %s: got %zu errors, first %s: %s", cases[i][0], cases[i][1], e.len,
               e.len ? e.items[0].field : "-", e.len ? e.items[0].message : "-");
    ty_errlist_clear(&e);
  }
}

/* Mistral: sliding_window read (Qwen2's unused one, with use_sliding_window
 * false, is not), written back by llama_config_to_json as a Mistral model,
 * and a sequence longer than the window refused by model_init_shape. */
static void test_sliding_window(void **state) {
  (void)state;
  llama_config_t c, d;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  json_t *j = load(
      "{\"model_type\": \"mistral\", \"architectures\": [\"MistralForCausalLM\"], "
      "\"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 1, "
      "\"num_attention_heads\": 2, \"vocab_size\": 10, \"sliding_window\": 8}");
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  assert_int_equal(llama_config_validate(&c, "", &e), 0);
  assert_int_equal(c.sliding_window, 8);
  json_decref(j);
  j = llama_config_to_json(&c);
  assert_string_equal(json_string_value(json_object_get(j, "model_type")), "mistral");
  assert_int_equal(json_integer_value(json_object_get(j, "sliding_window")), 8);
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "", false, &e), 0);
  assert_memory_equal(&c, &d, sizeof c);
  json_decref(j);
  j = load("{\"sliding_window\": 4096, \"use_sliding_window\": false}");
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "", false, &e), 0);
  assert_int_equal(d.sliding_window, 0);
  json_decref(j);
}

/* Qwen2: model_type "qwen2" means q/k/v biases (config.json never says
 * so by a key), its rope_theta is read, its unused sliding_window (with
 * use_sliding_window false or absent, Hugging Face's default) ignored;
 * written back as Qwen2 and parsed back the same. A job spec's model
 * (strict) stays Llama's. */
static void test_qwen2(void **state) {
  (void)state;
  llama_config_t c, d;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  json_t *j = load(
      "{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForCausalLM\"], "
      "\"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 1, "
      "\"num_attention_heads\": 2, \"vocab_size\": 10, \"rope_theta\": 1000000.0, "
      "\"sliding_window\": 32768, \"max_window_layers\": 21}");
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  assert_int_equal(llama_config_validate(&c, "", &e), 0);
  assert_true(c.qkv_bias);
  assert_int_equal(c.sliding_window, 0);
  assert_true(c.rope_theta == 1e6);
  json_decref(j);
  j = llama_config_to_json(&c);
  assert_string_equal(json_string_value(json_object_get(j, "model_type")), "qwen2");
  assert_string_equal(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                      "Qwen2ForCausalLM");
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "", false, &e), 0);
  assert_memory_equal(&c, &d, sizeof c);
  json_decref(j);
  /* A Llama model has none. */
  j = load("{\"model_type\": \"llama\", \"hidden_size\": 16}");
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "", false, &e), 0);
  assert_false(d.qkv_bias);
  json_decref(j);
  /* Sliding windows on Qwen2's layers are refused by name. */
  j = load("{\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 64}");
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "", false, &e), TY_EINVAL);
  assert_true(tu_has(&e, "use_sliding_window", "sliding-window"));
  ty_errlist_clear(&e);
  json_decref(j);
  /* In a job spec only Llama's model_type. */
  j = load("{\"model_type\": \"qwen2\"}");
  llama_config_init(&d);
  assert_int_equal(llama_config_from_json(j, &d, "model", true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model.model_type", "only \"llama\""));
  ty_errlist_clear(&e);
  json_decref(j);
}

/* The published config.json files `trainyard mkmodel --like` copies
 * (tests/data/configs): each read whole, with its published parameter
 * count (Qwen2's with its q/k/v biases). */
static void test_published_configs(void **state) {
  (void)state;
  static const struct {
    const char *name;
    int64_t params;           /* 0: refused */
    const char *field, *says; /* for a refused one */
    llama_rope_type_t rope;
  } cases[] = {
      {"llama-3.2-1b", 1235814400, NULL, NULL, LLAMA_ROPE_LLAMA3},
      {"llama-3.1-8b", 8030261248, NULL, NULL, LLAMA_ROPE_LLAMA3},
      {"tinyllama-1.1b", 1100048384, NULL, NULL, LLAMA_ROPE_DEFAULT},
      /* 151936 x 896 embedding (tied) + 24 x (attention 2 x 896^2 + 2 x 128 x 896,
       * biases 896 + 2 x 128, MLP 3 x 896 x 4864, norms 2 x 896) + 896 */
      {"qwen2.5-0.5b", 494032768, NULL, NULL, LLAMA_ROPE_DEFAULT},
      {"mistral-7b-v0.1", 7241732096, NULL, NULL, LLAMA_ROPE_DEFAULT},
  };
  const char *src = getenv("TRAINYARD_SRC_DIR");
  assert_non_null(src);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/configs/%s.json", src, cases[i].name);
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) fail_msg("%s: cannot read", path);
    llama_config_t c;
    ty_errlist_t e = TY_ERRLIST_INIT;
    llama_config_init(&c);
    int rc = llama_config_from_json(j, &c, "", false, &e);
    if (!rc) rc = llama_config_validate(&c, "", &e);
    if (cases[i].params) {
      if (rc) fail_msg("%s: %s: %s", cases[i].name, e.items[0].field, e.items[0].message);
      assert_int_equal(llama_config_num_params(&c), cases[i].params);
      assert_int_equal(c.rope_scaling.type, cases[i].rope);
      assert_int_equal(c.sliding_window, strstr(cases[i].name, "mistral") ? 4096 : 0);
      assert_int_equal(c.qkv_bias, strstr(cases[i].name, "qwen2") != NULL);
    } else {
      assert_int_equal(rc, TY_EINVAL);
      if (!tu_has(&e, cases[i].field, cases[i].says))
        fail_msg("%s: refused without naming %s", cases[i].name, cases[i].field);
    }
    json_decref(j);
    ty_errlist_clear(&e);
  }
}

static void test_newer_dtype_key_and_nulls(void **state) {
  (void)state;
  llama_config_t c;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  json_t *j = load("{\"hidden_size\": 64, \"dtype\": \"float16\", \"head_dim\": null}");
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), 0);
  assert_int_equal(c.torch_dtype, TY_DTYPE_F16);
  llama_config_init(&c);
  assert_int_equal(llama_config_from_json(j, &c, "model", true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model.dtype", "unknown field"));
  assert_true(tu_has(&e, "model.head_dim", "must not be null"));
  json_decref(j);
  ty_errlist_clear(&e);
}

static void test_types_and_ranges(void **state) {
  (void)state;
  llama_config_t c;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  json_t *j = load(
      "{\"hidden_size\": \"64\", \"num_hidden_layers\": 2.5, \"vocab_size\": -1, "
      "\"rms_norm_eps\": 0, \"tie_word_embeddings\": 1, \"torch_dtype\": \"int8\", "
      "\"intermediate_size\": 1e30, \"model_type\": \"mistral\", "
      "\"architectures\": [\"X\"]}");
  assert_int_equal(llama_config_from_json(j, &c, "model", true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model.hidden_size", "must be an integer, got a string"));
  assert_true(tu_has(&e, "model.num_hidden_layers", "must be an integer, got a number"));
  assert_true(tu_has(&e, "model.vocab_size", "between 1 and 16777216, got -1"));
  assert_true(tu_has(&e, "model.rms_norm_eps", "must be > 0"));
  assert_true(tu_has(&e, "model.tie_word_embeddings", "true or false"));
  assert_true(tu_has(&e, "model.torch_dtype", "got int8"));
  assert_true(tu_has(&e, "model.intermediate_size", "between 1 and 1048576"));
  assert_true(tu_has(&e, "model.model_type", "only \"llama\""));
  assert_true(tu_has(&e, "model.architectures", "LlamaForCausalLM"));
  assert_int_equal(e.len, 9);
  json_decref(j);
  ty_errlist_clear(&e);
  j = json_pack("[i]", 1);
  assert_int_equal(llama_config_from_json(j, &c, "", false, &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "must be an object"));
  json_decref(j);
  ty_errlist_clear(&e);
}

static void test_validate_relations(void **state) {
  (void)state;
  llama_config_t c;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&c);
  assert_int_equal(llama_config_validate(&c, "", &e), TY_EINVAL);
  assert_true(tu_has(&e, "hidden_size", "is required"));
  assert_true(tu_has(&e, "vocab_size", "is required"));
  assert_int_equal(e.len, 5); /* C, FF, L, NH, V; NKV and HS follow from them */
  ty_errlist_clear(&e);
  c.hidden_size = 96;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  c.vocab_size = 100;
  assert_int_equal(llama_config_validate(&c, "model", &e), TY_EINVAL);
  assert_true(tu_has(&e, "model.num_key_value_heads", "must divide num_attention_heads (6)"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  c.num_key_value_heads = 2;
  assert_int_equal(llama_config_validate(&c, "model", &e), 0);
}

static void test_to_json_round_trip(void **state) {
  (void)state;
  llama_config_t a, b;
  ty_errlist_t e = TY_ERRLIST_INIT;
  llama_config_init(&a);
  json_t *j = load(k_tinyllama);
  assert_int_equal(llama_config_from_json(j, &a, "", false, &e), 0);
  json_decref(j);
  a.tie_word_embeddings = true;
  j = llama_config_to_json(&a);
  assert_string_equal(json_string_value(json_object_get(j, "model_type")), "llama");
  assert_string_equal(json_string_value(json_object_get(j, "torch_dtype")), "bfloat16");
  llama_config_init(&b);
  assert_int_equal(llama_config_from_json(j, &b, "model", true, &e), 0);
  assert_memory_equal(&a, &b, sizeof a);
  /* Tied embeddings drop lm_head from the count. */
  assert_int_equal(llama_config_num_params(&b), 1100048384 - 32000 * 2048);
  json_decref(j);
}

static void test_llama2_7b_params(void **state) {
  (void)state;
  llama_config_t c;
  llama_config_init(&c);
  c.hidden_size = 4096;
  c.intermediate_size = 11008;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 32;
  c.head_dim = 128;
  c.vocab_size = 32000;
  assert_int_equal(llama_config_num_params(&c), 6738415616); /* Llama-2-7b */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hf_config_lenient),
      cmocka_unit_test(test_lenient_refuses_semantic_changes),
      cmocka_unit_test(test_rope_scaling_parsed),
      cmocka_unit_test(test_rope_scaling_refused),
      cmocka_unit_test(test_inert_keys_accepted),
      cmocka_unit_test(test_model_changing_keys_refused),
      cmocka_unit_test(test_sliding_window),
      cmocka_unit_test(test_qwen2),
      cmocka_unit_test(test_published_configs),
      cmocka_unit_test(test_newer_dtype_key_and_nulls),
      cmocka_unit_test(test_types_and_ranges),
      cmocka_unit_test(test_validate_relations),
      cmocka_unit_test(test_to_json_round_trip),
      cmocka_unit_test(test_llama2_7b_params),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
