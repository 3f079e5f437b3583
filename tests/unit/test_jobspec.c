/* test_jobspec.c - the job spec from JSON: defaults, the full sample,
 * malformed JSON with line and column, wrong types, nulls, duplicate keys,
 * huge / negative / non-finite numbers, deep nesting, unknown fields with a
 * suggestion, and the round trip through jobspec_to_json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/jobspec_internal.h"
#include "jobspec_testutil.h"

static const char *k_sample =
    "{\n"
    "  \"name\": \"tiny-lora\",\n"
    "  \"model_path\": \"models/tiny\",\n"
    "  \"init_from_scratch\": false,\n"
    "  \"model\": null,\n"
    "  \"dtype\": \"bfloat16\",\n"
    "  \"device\": \"cpu\",\n"
    "  \"allocation_mode\": \"static\",\n"
    "  \"world_size\": 2,\n"
    "  \"fsdp\": { \"memory_efficient_load\": true, \"bucket_mb\": 32 },\n"
    "  \"use_lora\": true, \"lora_rank\": 4, \"lora_alpha\": 8,\n"
    "  \"target_modules\": [\"q_proj\", \"v_proj\", \"down_proj\"],\n"
    "  \"gradient_checkpointing\": true,\n"
    "  \"data\": { \"path\": \"data/train.bin\", \"format\": \"u16\", \"seq_len\": 64,\n"
    "            \"eval_fraction\": 0.1 },\n"
    "  \"train\": { \"steps\": 200, \"micro_batch_size\": 2, \"grad_accum\": 3, \"lr\": 1e-3,\n"
    "             \"warmup_steps\": 10, \"weight_decay\": 0.01, \"grad_clip\": 0.5,\n"
    "             \"seed\": 99, \"checkpoint_every\": 50 },\n"
    "  \"max_restarts\": 2,\n"
    "  \"output_dir\": \"runs/x\"\n"
    "}\n";

static void test_defaults(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&s, "{\"model_path\": \"m\"}", &e), 0);
  assert_string_equal(s.name, "job");
  assert_string_equal(s.allocation_mode, "static");
  assert_int_equal(s.world_size, 1);
  assert_int_equal(s.dp_degree, 0);
  assert_false(s.fsdp.memory_efficient_load);
  assert_int_equal(s.fsdp.bucket_mb, 64);
  assert_int_equal(s.lora_rank, 8);
  assert_true(s.lora_alpha == 16);
  assert_int_equal(s.target_modules, 0xfu); /* q, k, v, o */
  assert_false(s.gradient_checkpointing);
  assert_int_equal(s.dtype, TY_DTYPE_F32);
  assert_int_equal(s.device, JOBSPEC_DEVICE_AUTO);
  assert_int_equal(s.data.format, JOBSPEC_DATA_TEXT);
  assert_int_equal(s.data.seq_len, 128);
  assert_int_equal(s.train.steps, 100);
  assert_true(s.train.lr == 3e-4);
  assert_true(s.train.grad_clip == 1.0);
  assert_int_equal(s.train.seed, 1234);
  assert_string_equal(s.output_dir, "runs/job");
  assert_false(s.has_model);
  ty_errlist_clear(&e);
}

static void test_sample_parses(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&s, k_sample, &e), 0);
  assert_string_equal(s.name, "tiny-lora");
  assert_string_equal(s.model_path, "models/tiny");
  assert_int_equal(s.dtype, TY_DTYPE_BF16);
  assert_int_equal(s.device, JOBSPEC_DEVICE_CPU);
  assert_int_equal(s.world_size, 2);
  assert_true(s.fsdp.memory_efficient_load);
  assert_int_equal(s.fsdp.bucket_mb, 32);
  assert_true(s.use_lora);
  assert_true(s.gradient_checkpointing);
  assert_int_equal(s.lora_rank, 4);
  assert_true(s.lora_alpha == 8);
  assert_int_equal(s.target_modules, 1u << JOBSPEC_TARGET_BIT_Q | 1u << JOBSPEC_TARGET_BIT_V |
                                         1u << JOBSPEC_TARGET_BIT_DOWN);
  assert_string_equal(s.data.path, "data/train.bin");
  assert_int_equal(s.data.format, JOBSPEC_DATA_U16);
  assert_int_equal(s.data.seq_len, 64);
  assert_true(s.data.eval_fraction == 0.1);
  assert_int_equal(s.train.steps, 200);
  assert_int_equal(s.train.micro_batch_size, 2);
  assert_int_equal(s.train.grad_accum, 3);
  assert_true(s.train.lr == 1e-3);
  assert_int_equal(s.train.warmup_steps, 10);
  assert_true(s.train.weight_decay == 0.01);
  assert_true(s.train.grad_clip == 0.5);
  assert_int_equal(s.train.seed, 99);
  assert_int_equal(s.train.checkpoint_every, 50);
  assert_int_equal(s.max_restarts, 2);
  assert_string_equal(s.output_dir, "runs/x");
  ty_errlist_clear(&e);
}

static void test_malformed_json_line_column(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  /* The stray comma is on line 3; jansson reports the '}' after it. */
  assert_int_equal(tu_parse(&s, "{\n  \"name\": \"x\",\n  \"world_size\": 2,\n}", &e), TY_EINVAL);
  assert_int_equal(e.len, 1);
  assert_true(tu_has(&e, "", "invalid JSON at line 4, column 1"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"name\": \"x\"\n  \"steps\": 1}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "line 2, column 9"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "invalid JSON at line"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"name\": \"x\"} trailing", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "end of file expected"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "[1, 2]", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "must be a JSON object, got an array"));
  ty_errlist_clear(&e);
  /* An embedded NUL is not allowed in a string. */
  assert_int_equal(tu_parse(&s, "{\"name\": \"a\\u0000b\"}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "invalid JSON"));
  ty_errlist_clear(&e);
}

static void test_wrong_types(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s,
                            "{\"name\": 5, \"world_size\": \"2\", \"use_lora\": 1, "
                            "\"lora_alpha\": \"x\", \"fsdp\": 3, \"target_modules\": 5, "
                            "\"dtype\": 3, \"device\": \"tpu\", \"model\": [1], "
                            "\"train\": {\"steps\": 2.5, \"lr\": true}, "
                            "\"data\": {\"format\": \"txt\"}}",
                            &e),
                   TY_EINVAL);
  assert_true(tu_has(&e, "name", "must be a string, got an integer"));
  assert_true(tu_has(&e, "world_size", "must be an integer, got a string"));
  assert_true(tu_has(&e, "use_lora", "must be true or false, got an integer"));
  assert_true(tu_has(&e, "lora_alpha", "must be a number, got a string"));
  assert_true(tu_has(&e, "fsdp", "must be an object, got an integer"));
  assert_true(tu_has(&e, "target_modules", "must be a list of module names"));
  assert_true(tu_has(&e, "dtype", "must be \"float32\", \"bfloat16\" or \"float16\""));
  assert_true(
      tu_has(&e, "device",
             "unknown value \"tpu\"; did you mean \"cpu\"? (one of \"auto\", \"cpu\", \"cuda\")"));
  assert_true(tu_has(&e, "model", "must be an object of Llama config.json fields"));
  assert_true(tu_has(&e, "train.steps", "must be an integer, got a number"));
  assert_true(tu_has(&e, "train.lr", "must be a number, got a boolean"));
  assert_true(tu_has(&e, "data.format", "did you mean \"text\""));
  assert_int_equal(e.len, 12);
  /* The fields that failed keep their defaults. */
  assert_int_equal(s.world_size, 1);
  assert_string_equal(s.name, "job");
  ty_errlist_clear(&e);
  /* An integral real is an integer. */
  assert_int_equal(tu_parse(&s, "{\"world_size\": 2.0, \"train\": {\"steps\": 1e3}}", &e), 0);
  assert_int_equal(s.world_size, 2);
  assert_int_equal(s.train.steps, 1000);
  ty_errlist_clear(&e);
}

static void test_nulls(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s,
                            "{\"world_size\": null, \"fsdp\": null, \"model\": null, "
                            "\"train\": {\"lr\": null}, \"name\": null}",
                            &e),
                   TY_EINVAL);
  assert_true(
      tu_has(&e, "world_size", "must not be null; remove the field to use the default (1)"));
  assert_true(tu_has(&e, "fsdp", "must not be null"));
  assert_true(tu_has(&e, "train.lr", "default (0.0003)"));
  assert_true(tu_has(&e, "name", "default (\"job\")"));
  assert_int_equal(e.len, 4); /* "model": null is allowed: no model */
  assert_false(s.has_model);
  ty_errlist_clear(&e);
}

static void test_duplicate_keys(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s, "{\"world_size\": 1,\n \"world_size\": 2}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "duplicate object key"));
  assert_true(tu_has(&e, "", "line 2"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"fsdp\": {\"bucket_mb\": 1, \"bucket_mb\": 2}}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "duplicate object key"));
  ty_errlist_clear(&e);
}

static void test_numbers_huge_negative_nonfinite(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s, "{\"world_size\": 99999999999999999999999}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "too big integer"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"world_size\": 3000000000}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "world_size", "must be between 1 and 4096, got 3000000000"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"train\": {\"lr\": 1e400}}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "real number overflow"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"train\": {\"steps\": 1e300}}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "train.steps", "must be an integer"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"train\": {\"lr\": NaN}}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "invalid JSON"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"train\": {\"lr\": Infinity}}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "invalid JSON"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_parse(&s, "{\"train\": {\"seed\": -5}}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "train.seed", "must be >= 0, got -5"));
  ty_errlist_clear(&e);
  /* Negative values that parse are caught by the ranges rule. */
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"world_size\": -1, \"fsdp\": "
                            "{\"bucket_mb\": -64}, \"train\": {\"lr\": -0.1}}",
                            &e),
                   3);
  assert_true(tu_has(&e, "world_size", "must be >= 1 and <= 4096, got -1"));
  assert_true(tu_has(&e, "fsdp.bucket_mb", "got -64"));
  assert_true(tu_has(&e, "train.lr", "must be > 0 and <= 10, got -0.1"));
  ty_errlist_clear(&e);
  /* The largest seed a JSON integer holds. */
  assert_int_equal(tu_parse(&s, "{\"train\": {\"seed\": 9223372036854775807}}", &e), 0);
  assert_true(s.train.seed == 9223372036854775807ull);
  ty_errlist_clear(&e);
}

static char *nested(int depth, const char *open, const char *close) {
  size_t lo = strlen(open), lc = strlen(close), o = 0;
  char *t = malloc(strlen("{\"name\": ") + depth * (lo + lc) + 2);
  o += (size_t)sprintf(t, "{\"name\": ");
  for (int i = 0; i < depth; i++, o += lo) memcpy(t + o, open, lo);
  for (int i = 0; i < depth; i++, o += lc) memcpy(t + o, close, lc);
  strcpy(t + o, "}");
  return t;
}

static void test_deep_nesting(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  char *t = nested(100000, "[", "]");
  assert_int_equal(tu_parse(&s, t, &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "line 1, column 73: nested deeper than 64 levels"));
  free(t);
  ty_errlist_clear(&e);
  t = nested(5000, "{\"a\":", "}");
  assert_int_equal(tu_parse(&s, t, &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "nested deeper than 64 levels"));
  free(t);
  ty_errlist_clear(&e);
  /* Brackets inside strings do not count. */
  char deep_str[600] = "{\"name\": \"";
  for (int i = 0; i < 200; i++) strcat(deep_str, "[");
  strcat(deep_str, "\"}");
  assert_int_equal(tu_parse(&s, deep_str, &e), TY_EINVAL);
  assert_true(tu_has(&e, "name", "at most 127 are allowed"));
  ty_errlist_clear(&e);
  /* Moderate nesting in a wrong place is just a type error. */
  t = nested(10, "[", "]");
  assert_int_equal(tu_parse(&s, t, &e), TY_EINVAL);
  assert_true(tu_has(&e, "name", "must be a string, got an array"));
  free(t);
  ty_errlist_clear(&e);
}

static void test_unknown_fields_suggest(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s,
                            "{\"modle_path\": \"m\", \"fsdp\": {\"memory_eficient_load\": true},"
                            " \"bucket_mb\": 3, \"lr\": 1, \"xyzzy\": 1, \"fsdp.bucket_mb\": 2,"
                            " \"train\": {\"step\": 4}, \"model\": {\"hidden_sise\": 8}}",
                            &e),
                   TY_EINVAL);
  assert_true(tu_has(&e, "modle_path", "did you mean \"model_path\"?"));
  assert_true(
      tu_has(&e, "fsdp.memory_eficient_load", "did you mean \"fsdp.memory_efficient_load\"?"));
  assert_true(tu_has(&e, "bucket_mb", "did you mean \"fsdp.bucket_mb\"?"));
  assert_true(tu_has(&e, "lr", "did you mean \"train.lr\"?"));
  assert_true(tu_has(&e, "xyzzy", "unknown field; 'trainyard validate --fields' lists them"));
  assert_true(tu_has(&e, "fsdp.bucket_mb", "dotted names are for command-line flags"));
  assert_true(tu_has(&e, "train.step", "did you mean \"train.steps\"?"));
  assert_true(tu_has(&e, "model.hidden_sise", "did you mean \"hidden_size\"?"));
  assert_int_equal(e.len, 8);
  ty_errlist_clear(&e);
  /* Names other stacks give our fields say which of ours to set. */
  assert_int_equal(tu_parse(&s,
                            "{\"model_path\": \"m\", \"train\": {\"activation_checkpointing\": "
                            "true, \"learning_rate\": 0.1}, \"lora_r\": 4, \"max_seq_length\": 9}",
                            &e),
                   TY_EINVAL);
  assert_true(tu_has(&e, "train.activation_checkpointing",
                     "unknown field; trainyard calls it \"gradient_checkpointing\" (AReaL's and "
                     "Hugging Face's name): set that"));
  assert_true(tu_has(&e, "train.learning_rate", "trainyard calls it \"train.lr\""));
  assert_true(tu_has(&e, "lora_r", "trainyard calls it \"lora_rank\" (peft's r)"));
  assert_true(tu_has(&e, "max_seq_length", "trainyard calls it \"data.seq_len\""));
  assert_int_equal(e.len, 4);
  ty_errlist_clear(&e);
  jobspec_init(&s);
  assert_int_equal(jobspec_set_flag(&s, "train.activation_checkpointing", "true", &e), TY_EINVAL);
  assert_true(tu_has(&e, "train.activation_checkpointing",
                     "unknown flag --train.activation_checkpointing; trainyard calls it "
                     "--gradient_checkpointing"));
  ty_errlist_clear(&e);
  assert_int_equal(jobspec_edit_distance("kitten", "sitting"), 3);
  assert_int_equal(jobspec_edit_distance("", "abc"), 3);
  assert_int_equal(jobspec_edit_distance("same", "same"), 0);
}

static void test_targets_and_enums(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s, "{\"target_modules\": \"all-linear\", \"dtype\": \"bf16\"}", &e),
                   0);
  assert_int_equal(s.target_modules, JOBSPEC_TARGET_ALL_LINEAR);
  assert_int_equal(s.dtype, TY_DTYPE_BF16);
  assert_int_equal(
      tu_parse(&s, "{\"target_modules\": [\"q_proj\", \"all-linear\", 3, \"xx\"]}", &e), TY_EINVAL);
  assert_true(tu_has(&e, "target_modules[1]", "\"all-linear\" stands alone"));
  assert_true(tu_has(&e, "target_modules[2]", "must be a module name string"));
  assert_true(tu_has(&e, "target_modules[3]", "unknown module \"xx\"; use q_proj"));
  assert_int_equal(s.target_modules, 0xfu); /* unchanged on error */
  ty_errlist_clear(&e);
  for (int i = 0; i < JOBSPEC_TARGET_COUNT; i++)
    assert_int_equal(jobspec_target_parse(jobspec_target_name(i)), i);
  assert_null(jobspec_target_name(JOBSPEC_TARGET_COUNT));
  assert_int_equal(jobspec_target_parse("nope"), -1);
}

static void test_round_trip(void **state) {
  (void)state;
  const char *specs[] = {
      k_sample,
      "{\"model_path\": \"m\"}",
      "{\"name\": \"s\", \"init_from_scratch\": true, \"model\": {\"hidden_size\": 64, "
      "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
      "\"num_key_value_heads\": 2, \"vocab_size\": 256, \"rms_norm_eps\": 1e-5, "
      "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\"}, \"allocation_mode\": "
      "\"fsdp:d3\", \"train\": {\"lr\": 0.30000000000000004, \"seed\": 18446744073}, "
      "\"target_modules\": \"all-linear\"}",
  };
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    jobspec_t a, b;
    ty_errlist_t e = TY_ERRLIST_INIT;
    assert_int_equal(tu_check(&a, specs[i], &e), 0);
    char *text = jobspec_dumps(&a, i % 2 == 0);
    assert_int_equal(tu_check(&b, text, &e), 0);
    assert_true(jobspec_equal(&a, &b));
    /* The struct holds no pointers; equal fields are equal bytes. */
    assert_memory_equal(&a, &b, sizeof a);
    json_t *ja = jobspec_to_json(&a);
    char *again = json_dumps(ja, JSON_COMPACT | JSON_REAL_PRECISION(17));
    assert_int_equal(tu_parse(&b, again, &e), 0);
    assert_int_equal(jobspec_validate(&b, false, &e), 0);
    assert_memory_equal(&a, &b, sizeof a);
    free(again);
    json_decref(ja);
    free(text);
    ty_errlist_clear(&e);
  }
  /* Short numbers stay short; ones that need 17 digits keep them. */
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&s, specs[2], &e), 0);
  char *text = jobspec_dumps(&s, false);
  assert_non_null(strstr(text, "\"lr\":0.30000000000000004"));
  assert_non_null(strstr(text, "\"allocation_mode\":\"fsdp:d3\""));
  assert_non_null(strstr(text, "\"world_size\":3"));
  free(text);
  assert_int_equal(tu_check(&s, k_sample, &e), 0);
  text = jobspec_dumps(&s, false);
  assert_non_null(strstr(text, "\"lr\":0.001,"));
  free(text);
  ty_errlist_clear(&e);
}

static void test_oversized_document(void **state) {
  (void)state;
  size_t n = (1u << 20) + 10;
  char *t = malloc(n + 1);
  memset(t, ' ', n);
  t[0] = '{';
  t[n - 1] = '}';
  t[n] = '\0';
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s, t, &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "at most 1048576 are accepted"));
  ty_errlist_clear(&e);
  free(t);
}

/* Long non-ASCII names and values are cut at character boundaries, so every
 * error still encodes as JSON in the API error model. */
static void test_long_utf8_in_errors(void **state) {
  (void)state;
  char text[8192] = "{\"";
  for (int i = 0; i < 400; i++) strcat(text, "\xc3\xa9"); /* U+00E9, 2 bytes */
  strcat(text, "\": 1, \"device\": \"");
  for (int i = 0; i < 700; i++) strcat(text, "\xe2\x82\xac"); /* U+20AC, 3 bytes */
  strcat(text, "\"}");
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s, text, &e), TY_EINVAL);
  assert_int_equal(e.len, 2);
  json_t *j = ty_error_json(TY_EINVAL, "invalid", &e);
  assert_int_equal(json_array_size(json_object_get(json_object_get(j, "error"), "details")), 2);
  json_decref(j);
  ty_errlist_clear(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_sample_parses),
      cmocka_unit_test(test_malformed_json_line_column),
      cmocka_unit_test(test_wrong_types),
      cmocka_unit_test(test_nulls),
      cmocka_unit_test(test_duplicate_keys),
      cmocka_unit_test(test_numbers_huge_negative_nonfinite),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_unknown_fields_suggest),
      cmocka_unit_test(test_targets_and_enums),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_oversized_document),
      cmocka_unit_test(test_long_utf8_in_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
