/* test_llama_config.c - the Llama config: a real Hugging Face config.json
 * read leniently, the spec's strict mode, derived defaults, validation,
 * serialization and parameter counts of known models. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
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
       "rope_scaling",
       "rotary scaling \"yarn\" is not supported (trainyard implements rope_type "
       "\"llama3\""},
      {"{\"hidden_size\": 64, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
       "rope_scaling", "rope_scaling.low_freq_factor must be a positive number"},
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
  assert_true(c.rope_llama3.factor == 32.0 && c.rope_llama3.high_freq_factor == 4.0);
  assert_int_equal(c.rope_llama3.original_max_position_embeddings, 8192);
  json_t *back = llama_config_to_json(&c);
  llama_config_t c2;
  llama_config_init(&c2);
  llama_config_from_json(back, &c2, "", false, &e); /* its unset sizes are refused: not ours */
  assert_false(tu_has(&e, "rope_scaling", ""));
  assert_memory_equal(&c.rope_llama3, &c2.rope_llama3, sizeof c.rope_llama3);
  json_decref(back);
  ty_errlist_clear(&e);
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
      cmocka_unit_test(test_newer_dtype_key_and_nulls),
      cmocka_unit_test(test_types_and_ranges),
      cmocka_unit_test(test_validate_relations),
      cmocka_unit_test(test_to_json_round_trip),
      cmocka_unit_test(test_llama2_7b_params),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
