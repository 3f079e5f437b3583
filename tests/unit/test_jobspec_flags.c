/* test_jobspec_flags.c - dotted command-line flags over an optional spec
 * file: every value type, both flag forms, bare booleans, lists, the inline
 * model, unknown flags with a suggestion, and flags winning over the file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "jobspec_testutil.h"

/* Runs jobspec_from_args over a NULL-terminated argument list. */
static int args(jobspec_t *s, ty_errlist_t *e, const char *const *passthrough, ...) {
  char *argv[64];
  int argc = 0;
  va_list ap;
  va_start(ap, passthrough);
  for (const char *a; (a = va_arg(ap, const char *)) != NULL && argc < 64;)
    argv[argc++] = (char *)a;
  va_end(ap);
  jobspec_init(s);
  ty_errlist_clear(e);
  return jobspec_from_args(s, argc, argv, passthrough, e);
}

static void test_every_type(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(args(&s, &e, NULL, "--fsdp.memory_efficient_load", "true", "--model_path", "DIR",
                        "--allocation_mode", "static", "--world_size", "2", "--train.lr=1e-4",
                        "--train.seed", "42", "--dtype", "bf16", "--device", "cpu", "--data.format",
                        "u32", "--name", "a-b", "--lora_alpha", "32", NULL),
                   0);
  assert_true(s.fsdp.memory_efficient_load);
  assert_string_equal(s.model_path, "DIR");
  assert_string_equal(s.allocation_mode, "static");
  assert_int_equal(s.world_size, 2);
  assert_true(s.world_size_given);
  assert_true(s.train.lr == 1e-4);
  assert_int_equal(s.train.seed, 42);
  assert_int_equal(s.dtype, TY_DTYPE_BF16);
  assert_int_equal(s.device, JOBSPEC_DEVICE_CPU);
  assert_int_equal(s.data.format, JOBSPEC_DATA_U32);
  assert_string_equal(s.name, "a-b");
  assert_true(s.lora_alpha == 32);
  ty_errlist_clear(&e);
}

static void test_bools_and_lists(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  /* A bare boolean flag means true; "off", "0", "no" mean false. */
  assert_int_equal(args(&s, &e, NULL, "--use_lora", "--init_from_scratch", "off",
                        "--target_modules", "q_proj, v_proj,gate_proj", NULL),
                   0);
  assert_true(s.use_lora);
  assert_false(s.init_from_scratch);
  assert_int_equal(s.target_modules, 1u << JOBSPEC_TARGET_BIT_Q | 1u << JOBSPEC_TARGET_BIT_V |
                                         1u << JOBSPEC_TARGET_BIT_GATE);
  assert_int_equal(args(&s, &e, NULL, "--target_modules", "all-linear", "--use_lora", NULL), 0);
  assert_int_equal(s.target_modules, JOBSPEC_TARGET_ALL_LINEAR);
  assert_true(s.use_lora);
  assert_int_equal(args(&s, &e, NULL, "--target_modules", "[\"o_proj\"]", NULL), 0);
  assert_int_equal(s.target_modules, 1u << JOBSPEC_TARGET_BIT_O);
  assert_int_equal(args(&s, &e, NULL, "--target_modules", "q_proj,qproj", NULL), TY_EINVAL);
  assert_true(tu_has(&e, "target_modules[1]", "did you mean \"q_proj\""));
  ty_errlist_clear(&e);
}

static void test_bad_values(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(args(&s, &e, NULL, "--world_size", "two", "--use_lora", "maybe", "--train.lr",
                        "inf", "--train.seed", "-3", "--train.steps", "1.5", "--lora_rank",
                        "99999999999999999999", "--device", "gpu", "--data.seq_len", NULL),
                   TY_EINVAL);
  assert_true(tu_has(&e, "world_size", "must be an integer, got 'two'"));
  assert_true(tu_has(&e, "use_lora", "must be true or false, got 'maybe'"));
  assert_true(tu_has(&e, "train.lr", "must be a finite number, got 'inf'"));
  assert_true(tu_has(&e, "train.seed", "must be >= 0, got -3"));
  assert_true(tu_has(&e, "train.steps", "must be an integer, got '1.5'"));
  assert_true(tu_has(&e, "lora_rank", "out of range"));
  assert_true(tu_has(&e, "device", "one of \"auto\", \"cpu\", \"cuda\""));
  assert_true(tu_has(&e, "data.seq_len", "needs a value"));
  assert_int_equal(e.len, 8);
  ty_errlist_clear(&e);
}

static void test_unknown_flags(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(args(&s, &e, NULL, "--fsdp.memory_eficient_load", "true", "--modelpath", "x",
                        "--bucket_mb", "3", "--fsdp", "x", "--zzzzzz", "1", NULL),
                   TY_EINVAL);
  assert_true(
      tu_has(&e, "fsdp.memory_eficient_load", "did you mean --fsdp.memory_efficient_load?"));
  assert_true(tu_has(&e, "modelpath", "did you mean --model_path?"));
  assert_true(tu_has(&e, "bucket_mb", "did you mean --fsdp.bucket_mb?"));
  assert_true(tu_has(&e, "fsdp", "is a group; set its fields, e.g. --fsdp.memory_efficient_load"));
  assert_true(tu_has(&e, "zzzzzz", "unknown flag --zzzzzz"));
  assert_int_equal(e.len, 5);
  /* Passthrough flags are skipped and take no value. */
  assert_int_equal(
      args(&s, &e, (const char *const[]){"json", NULL}, "--json", "--model_path", "m", NULL), 0);
  assert_string_equal(s.model_path, "m");
  ty_errlist_clear(&e);
}

static void test_model_flags(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(
      args(&s, &e, NULL, "--init_from_scratch", "--model.hidden_size", "64",
           "--model.intermediate_size", "128", "--model.num_hidden_layers", "2",
           "--model.num_attention_heads", "4", "--model.vocab_size", "256", "--model.rms_norm_eps",
           "1e-5", "--model.tie_word_embeddings", "true", "--model.torch_dtype", "bfloat16", NULL),
      0);
  assert_true(s.has_model);
  assert_int_equal(s.model.hidden_size, 64);
  assert_int_equal(s.model.head_dim, 16);
  assert_true(s.model.rms_norm_eps == 1e-5);
  assert_true(s.model.tie_word_embeddings);
  assert_int_equal(s.model.torch_dtype, TY_DTYPE_BF16);
  assert_int_equal(jobspec_validate(&s, false, &e), 0);
  assert_int_equal(args(&s, &e, NULL, "--model",
                        "{\"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\":"
                        " 1, \"num_attention_heads\": 2, \"vocab_size\": 300}",
                        "--model.num_hidden_layers", "3", NULL),
                   0);
  assert_int_equal(s.model.num_hidden_layers, 3);
  assert_int_equal(s.model.vocab_size, 300);
  assert_int_equal(args(&s, &e, NULL, "--model", "null", NULL), 0);
  assert_false(s.has_model);
  assert_int_equal(args(&s, &e, NULL, "--model.hiden_size", "4", "--model.rope_theta", "nan",
                        "--model", "{bad", NULL),
                   TY_EINVAL);
  assert_true(tu_has(&e, "model.hiden_size", "did you mean \"hidden_size\""));
  assert_true(tu_has(&e, "model.rope_theta", "finite"));
  assert_true(tu_has(&e, "model", "invalid JSON"));
  ty_errlist_clear(&e);
}

static void test_flags_win_over_file(void **state) {
  (void)state;
  char path[] = "/tmp/ty-spec-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *text =
      "{\"model_path\": \"from-file\", \"world_size\": 4, \"fsdp\": "
      "{\"bucket_mb\": 16, \"memory_efficient_load\": false}, \"train\": "
      "{\"steps\": 7}}";
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  /* Flags given before the file still win. */
  assert_int_equal(
      args(&s, &e, NULL, "--world_size", "2", path, "--fsdp.memory_efficient_load", "true", NULL),
      0);
  assert_string_equal(s.model_path, "from-file");
  assert_int_equal(s.world_size, 2);
  assert_true(s.fsdp.memory_efficient_load);
  assert_int_equal(s.fsdp.bucket_mb, 16);
  assert_int_equal(s.train.steps, 7);
  /* Later flags win over earlier ones. */
  assert_int_equal(args(&s, &e, NULL, path, "--world_size", "2", "--world_size=3", NULL), 0);
  assert_int_equal(s.world_size, 3);
  /* Two files, a missing file. */
  assert_int_equal(args(&s, &e, NULL, path, path, NULL), TY_EINVAL);
  assert_true(tu_has(&e, "", "more than one spec file"));
  assert_int_equal(args(&s, &e, NULL, "/nonexistent/spec.json", NULL), TY_EINVAL);
  assert_true(tu_has(&e, "", "cannot open spec file /nonexistent/spec.json"));
  /* A broken file names itself; field errors keep their field. */
  FILE *f = fopen(path, "w");
  fputs("{\"world_size\": 2,\n\"fsdp\": {\"bucket_mb\": 1,}}", f);
  fclose(f);
  assert_int_equal(args(&s, &e, NULL, path, NULL), TY_EINVAL);
  char want[128];
  snprintf(want, sizeof want, "%s: invalid JSON at line 2, column", path);
  assert_true(tu_has(&e, "", want));
  f = fopen(path, "w");
  fputs("{\"world_size\": \"2\"}", f);
  fclose(f);
  assert_int_equal(args(&s, &e, NULL, path, "--world_size", "5", NULL), TY_EINVAL);
  assert_true(tu_has(&e, "world_size", "must be an integer"));
  assert_int_equal(s.world_size, 5);
  /* The one reader of spec files: a file past the size the parser takes
   * is refused by its size (read no further), a missing one by name. */
  f = fopen(path, "w");
  fputs("{\"name\": \"", f);
  for (int i = 0; i < (1 << 20); i++) fputc('x', f);
  fputs("\"}", f);
  fclose(f);
  ty_errlist_clear(&e);
  jobspec_init(&s);
  assert_int_equal(jobspec_parse_file(&s, path, &e), TY_EINVAL);
  assert_true(tu_has(&e, "", "at most 1048576 are accepted"));
  ty_errlist_clear(&e);
  assert_int_equal(jobspec_parse_file(&s, "/nonexistent/spec.json", &e), TY_ENOTFOUND);
  assert_true(tu_has(&e, "", "cannot open spec file /nonexistent/spec.json"));
  unlink(path);
  ty_errlist_clear(&e);
}

static void test_flags_equal_json(void **state) {
  (void)state;
  jobspec_t a, b;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(
      args(&a, &e, NULL, "--model_path", "m", "--use_lora", "--lora_rank", "4", "--target_modules",
           "q_proj,v_proj", "--allocation_mode", "fsdp:d2", "--train.lr", "0.001", NULL),
      0);
  assert_int_equal(jobspec_validate(&a, false, &e), 0);
  assert_int_equal(tu_check(&b,
                            "{\"model_path\": \"m\", \"use_lora\": true, \"lora_rank\": 4, "
                            "\"target_modules\": [\"q_proj\", \"v_proj\"], "
                            "\"allocation_mode\": \"fsdp:d2\", \"train\": {\"lr\": 0.001}}",
                            &e),
                   0);
  assert_memory_equal(&a, &b, sizeof a);
  ty_errlist_clear(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_type),       cmocka_unit_test(test_bools_and_lists),
      cmocka_unit_test(test_bad_values),       cmocka_unit_test(test_unknown_flags),
      cmocka_unit_test(test_model_flags),      cmocka_unit_test(test_flags_win_over_file),
      cmocka_unit_test(test_flags_equal_json),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
