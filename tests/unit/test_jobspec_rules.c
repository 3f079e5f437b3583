/* test_jobspec_rules.c - every rule of the validation table, accepted and
 * rejected: the spec-time rules through jobspec_validate, the filesystem
 * rule with check_paths, and the server-side path-root and GPU checks. */
#include <limits.h>
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

#include "jobspec_testutil.h"

#define SCRATCH_MODEL                                                                       \
  "\"model\": {\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, " \
  "\"num_attention_heads\": 4, \"vocab_size\": 256}"

/* Asserts that text validates with no error. */
static void ok(const char *text) {
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  size_t n = tu_check(&s, text, &e);
  if (n) {
    fprintf(stderr, "expected valid: %s\n", text);
    tu_dump(&e);
  }
  assert_int_equal(n, 0);
  ty_errlist_clear(&e);
}

/* Asserts that text fails with exactly one error, on field, containing part. */
static void bad(const char *text, const char *field, const char *part) {
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  size_t n = tu_check(&s, text, &e);
  assert_true(tu_has(&e, field, part));
  if (n != 1) {
    fprintf(stderr, "expected one error for: %s\n", text);
    tu_dump(&e);
  }
  assert_int_equal(n, 1);
  ty_errlist_clear(&e);
}

static void test_name_safe(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"name\": \"run-1.b_2\"}");
  bad("{\"model_path\": \"m\", \"name\": \"../etc\"}", "name", "not a valid name");
  bad("{\"model_path\": \"m\", \"name\": \"a/b\"}", "name", "not a valid name");
  bad("{\"model_path\": \"m\", \"name\": \"\"}", "name", "not a valid name");
  bad("{\"model_path\": \"m\", \"name\": \".hidden\"}", "name", "starting with a letter");
}

static void test_scratch_no_memory_efficient_load(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"fsdp\": {\"memory_efficient_load\": true}}");
  ok("{\"init_from_scratch\": true, " SCRATCH_MODEL "}");
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  tu_check(
      &s,
      "{\"init_from_scratch\": true, \"fsdp\": {\"memory_efficient_load\": true}, " SCRATCH_MODEL
      "}",
      &e);
  assert_int_equal(e.len, 1);
  /* Names both fields and says to drop one. */
  assert_string_equal(e.items[0].field, "fsdp.memory_efficient_load");
  assert_non_null(strstr(e.items[0].message, "init_from_scratch"));
  assert_non_null(strstr(e.items[0].message, "drop one of the two"));
  ty_errlist_clear(&e);
}

static void test_model_path_required(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\"}");
  bad("{}", "model_path", "is required");
  bad("{\"init_from_scratch\": true, \"model_path\": \"m\", " SCRATCH_MODEL "}", "model_path",
      "is not used with init_from_scratch");
}

static void test_model_iff_scratch(void **state) {
  (void)state;
  bad("{\"init_from_scratch\": true}", "model", "is required with init_from_scratch");
  bad("{\"model_path\": \"m\", " SCRATCH_MODEL "}", "model", "is only for init_from_scratch");
  ok("{\"model_path\": \"m\", \"model\": null}");
}

static void test_model_shape(void **state) {
  (void)state;
  bad("{\"init_from_scratch\": true, \"model\": {\"hidden_size\": 64, \"intermediate_size\": "
      "128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 3, "
      "\"vocab_size\": 256}}",
      "model.num_key_value_heads", "must divide num_attention_heads (4), got 3");
  bad("{\"init_from_scratch\": true, \"model\": {\"hidden_size\": 66, \"intermediate_size\": "
      "128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 256}}",
      "model.head_dim", "not divisible by num_attention_heads");
  ok("{\"init_from_scratch\": true, \"model\": {\"hidden_size\": 66, \"intermediate_size\": "
     "128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"head_dim\": 16, "
     "\"vocab_size\": 256}}");
  bad("{\"init_from_scratch\": true, \"model\": {\"hidden_size\": 64, \"intermediate_size\": "
      "128, \"num_attention_heads\": 4, \"vocab_size\": 256}}",
      "model.num_hidden_layers", "is required");
}

static void test_scratch_no_lora(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"use_lora\": true}");
  bad("{\"init_from_scratch\": true, \"use_lora\": true, " SCRATCH_MODEL "}", "use_lora",
      "init_from_scratch");
}

/* merge_adapter folds a LoRA adapter into the base: full training has
 * none (rule merge-needs-lora). */
static void test_merge_needs_lora(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"use_lora\": true, \"merge_adapter\": true}");
  ok("{\"model_path\": \"m\", \"use_lora\": false, \"merge_adapter\": false}");
  bad("{\"model_path\": \"m\", \"use_lora\": false, \"merge_adapter\": true}", "merge_adapter",
      "set use_lora to true");
  bad("{\"init_from_scratch\": true, \"merge_adapter\": true, " SCRATCH_MODEL "}", "merge_adapter",
      "use_lora is false");
}

static void test_ranges(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"world_size\": 4096, \"lora_rank\": 1, \"train\": {\"lr\": 10, "
     "\"steps\": 1, \"warmup_steps\": 1}, \"data\": {\"seq_len\": 1, \"eval_fraction\": 0}}");
  bad("{\"model_path\": \"m\", \"world_size\": 0}", "world_size", "must be >= 1");
  bad("{\"model_path\": \"m\", \"world_size\": 4097}", "world_size", "<= 4096");
  bad("{\"model_path\": \"m\", \"lora_rank\": 0}", "lora_rank", "must be >= 1");
  bad("{\"model_path\": \"m\", \"lora_alpha\": 0}", "lora_alpha", "must be > 0");
  bad("{\"model_path\": \"m\", \"train\": {\"lr\": 0}}", "train.lr", "must be > 0");
  bad("{\"model_path\": \"m\", \"train\": {\"steps\": 0}}", "train.steps", "must be >= 1");
  bad("{\"model_path\": \"m\", \"data\": {\"seq_len\": 0}}", "data.seq_len", "must be >= 1");
  bad("{\"model_path\": \"m\", \"data\": {\"eval_fraction\": 0.9}}", "data.eval_fraction",
      "<= 0.5");
  bad("{\"model_path\": \"m\", \"fsdp\": {\"bucket_mb\": 0}}", "fsdp.bucket_mb", ">= 1");
  bad("{\"model_path\": \"m\", \"max_restarts\": 101}", "max_restarts", "<= 100");
  bad("{\"model_path\": \"m\", \"train\": {\"grad_clip\": -1}}", "train.grad_clip", ">= 0");
  /* Non-finite values can only come from code that fills the struct. */
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  jobspec_init(&s);
  strcpy(s.model_path, "m");
  s.train.lr = 0.0 / 0.0;
  s.lora_alpha = 1.0 / 0.0;
  assert_int_equal(jobspec_validate(&s, false, &e), TY_EINVAL);
  assert_true(tu_has(&e, "train.lr", "must be a finite number"));
  assert_true(tu_has(&e, "lora_alpha", "must be a finite number"));
  ty_errlist_clear(&e);
}

static void test_allocation_mode(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  /* fsdp:d<N> sets world_size when it is not given, and is normalized. */
  assert_int_equal(tu_check(&s, "{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d4\"}", &e),
                   0);
  assert_int_equal(s.world_size, 4);
  assert_int_equal(s.dp_degree, 4);
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"allocation_mode\": "
                            "\"fsdp:d2p1t1c1e1\"}",
                            &e),
                   0);
  assert_string_equal(s.allocation_mode, "fsdp:d2");
  assert_int_equal(s.world_size, 2);
  assert_int_equal(tu_check(&s, "{\"model_path\": \"m\", \"allocation_mode\": \"d3m1\"}", &e), 0);
  assert_string_equal(s.allocation_mode, "fsdp:d3");
  assert_int_equal(tu_check(&s, "{\"model_path\": \"m\", \"world_size\": 3}", &e), 0);
  assert_int_equal(s.dp_degree, 0);
  ty_errlist_clear(&e);
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2p2\"}", "allocation_mode",
      "pipeline degree p2 is not supported");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2t4\"}", "allocation_mode",
      "tensor degree t4 is not supported");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2c2\"}", "allocation_mode",
      "context degree c2");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2e8\"}", "allocation_mode",
      "expert degree e8");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"megatron:d2\"}", "allocation_mode",
      "backend \"megatron\" is not supported");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"sglang:d4+fsdp:d4\"}", "allocation_mode",
      "keep only the training part");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:p1\"}", "allocation_mode",
      "no data-parallel degree");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d0\"}", "allocation_mode",
      "between 1 and 4096");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2d2\"}", "allocation_mode",
      "given once");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:dx\"}", "allocation_mode",
      "cannot read");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"\"}", "allocation_mode", "empty");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"dynamic\"}", "allocation_mode",
      "cannot read");
  /* Several unsupported degrees: one error each, naming it. */
  tu_check(&s, "{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2p2t2\"}", &e);
  assert_int_equal(e.len, 2);
  assert_true(tu_has(&e, "allocation_mode", "p2"));
  assert_true(tu_has(&e, "allocation_mode", "t2"));
  ty_errlist_clear(&e);
}

static void test_allocation_world_size(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2\", \"world_size\": 2}");
  bad("{\"model_path\": \"m\", \"allocation_mode\": \"fsdp:d2\", \"world_size\": 3}", "world_size",
      "allocation_mode \"fsdp:d2\" asks for 2");
}

static void test_lora_targets(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"use_lora\": true, \"target_modules\": [\"up_proj\"]}");
  ok("{\"model_path\": \"m\", \"use_lora\": false, \"target_modules\": []}");
  bad("{\"model_path\": \"m\", \"use_lora\": true, \"target_modules\": []}", "target_modules",
      "is empty but use_lora is true");
}

static void test_warmup_within_steps(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"train\": {\"steps\": 10, \"warmup_steps\": 10}}");
  bad("{\"model_path\": \"m\", \"train\": {\"steps\": 10, \"warmup_steps\": 11}}",
      "train.warmup_steps", "more than train.steps (10)");
}

static void test_seq_len_within_model(void **state) {
  (void)state;
  ok("{\"init_from_scratch\": true, \"data\": {\"seq_len\": 2048}, " SCRATCH_MODEL "}");
  bad("{\"init_from_scratch\": true, \"data\": {\"seq_len\": 4096}, " SCRATCH_MODEL "}",
      "data.seq_len", "longer than model.max_position_embeddings (2048)");
}

/* A scratch directory for filesystem rules; removed by the caller. */
static char g_tmp[256];

static int make_tmp(void **state) {
  (void)state;
  snprintf(g_tmp, sizeof g_tmp, "/tmp/ty-rules-XXXXXX");
  if (!mkdtemp(g_tmp)) return -1;
  char p[512];
  snprintf(p, sizeof p, "%s/models", g_tmp);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/models/tiny", g_tmp);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/runs", g_tmp);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/secret", g_tmp);
  mkdir(p, 0755);
  /* Text enough for the default spec's global batch (4 windows of 129
   * bytes, and a held-out one). */
  snprintf(p, sizeof p, "%s/models/train.txt", g_tmp);
  FILE *f = fopen(p, "w");
  if (!f) return -1;
  for (int i = 0; i < 100; i++) fputs("hello trainyard\n", f);
  fclose(f);
  /* A link inside the model root that points out of it. */
  char target[512];
  snprintf(target, sizeof target, "%s/secret", g_tmp);
  snprintf(p, sizeof p, "%s/models/escape", g_tmp);
  return symlink(target, p);
}

static int remove_tmp(void **state) {
  (void)state;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  return system(cmd);
}

static void test_paths_exist(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  char text[1024];
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"data\": {\"path\": "
           "\"%s/models/train.txt\"}}",
           g_tmp, g_tmp);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), 0);
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/train.txt\", \"data\": {\"path\": "
           "\"%s/nope.txt\"}}",
           g_tmp, g_tmp);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path", "is neither a directory nor a checkpoint file"));
  assert_true(tu_has(&e, "data.path", "does not exist"));
  ty_errlist_clear(&e);
  /* One checkpoint file (config.json beside it) is a model_path. */
  const char *files[] = {"model.pt", "pytorch_model.bin", "x.pth", "model.safetensors"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char file[600];
    snprintf(file, sizeof file, "%s/models/tiny/%s", g_tmp, files[i]);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(text, sizeof text, "{\"model_path\": \"%s\"}", file);
    assert_int_equal(tu_parse(&s, text, &e), 0);
    assert_int_equal(jobspec_validate(&s, true, &e), 0);
  }
  snprintf(text, sizeof text, "{\"model_path\": \"%s/none\", \"data\": {\"path\": \"%s\"}}", g_tmp,
           g_tmp);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path", "does not exist"));
  assert_true(tu_has(&e, "data.path", "is not a readable file"));
  ty_errlist_clear(&e);
  /* Without check_paths the same spec passes. */
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, false, &e), 0);
  /* A file where output_dir, or a folder above it, would be. */
  const char *beneath[] = {"", "/", "/sub/deeper"};
  for (size_t i = 0; i < sizeof beneath / sizeof beneath[0]; i++) {
    snprintf(text, sizeof text,
             "{\"model_path\": \"%s/models/tiny\", \"output_dir\": \"%s/models/train.txt%s\"}",
             g_tmp, g_tmp, beneath[i]);
    assert_int_equal(tu_parse(&s, text, &e), 0);
    assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
    char want[700];
    snprintf(want, sizeof want, "cannot be a folder: %s/models/train.txt is a file", g_tmp);
    assert_true(tu_has(&e, "output_dir", want));
    ty_errlist_clear(&e);
  }
  /* A folder that does not exist yet, under one that does, is fine. */
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"output_dir\": \"%s/runs/new/one\"}", g_tmp,
           g_tmp);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), 0);
}

/* A checkpoint's limit comes from its config.json, where paths are
 * checked: longer windows are refused naming the file, shorter or equal
 * ones pass, and without paths (or without the field) nothing is read. */
static void test_seq_len_within_checkpoint(void **state) {
  (void)state;
  char dir[512], path[600], text[1024];
  snprintf(dir, sizeof dir, "%s/models/short", g_tmp);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\"hidden_size\": 64, \"max_position_embeddings\": 256}", f);
  fclose(f);
  const int lens[] = {256, 257};
  for (int i = 0; i < 2; i++) {
    for (int paths = 0; paths < 2; paths++) {
      jobspec_t s;
      ty_errlist_t e = TY_ERRLIST_INIT;
      snprintf(text, sizeof text, "{\"model_path\": \"%s\", \"data\": {\"seq_len\": %d}}", dir,
               lens[i]);
      assert_int_equal(tu_parse(&s, text, &e), 0);
      bool refused = i == 1 && paths;
      assert_int_equal(jobspec_validate(&s, paths, &e), refused ? TY_EINVAL : 0);
      if (refused) {
        char want[700];
        snprintf(want, sizeof want,
                 "is 257, longer than the checkpoint's max_position_embeddings (256, in "
                 "%s/config.json)",
                 dir);
        assert_true(tu_has(&e, "data.seq_len", want));
        assert_int_equal(e.len, 1);
      }
      ty_errlist_clear(&e);
    }
  }
  /* model_path naming a file: the config.json beside it. */
  snprintf(path, sizeof path, "%s/model.pt", dir);
  FILE *pt = fopen(path, "w");
  assert_non_null(pt);
  fclose(pt);
  {
    jobspec_t s;
    ty_errlist_t e = TY_ERRLIST_INIT;
    snprintf(text, sizeof text, "{\"model_path\": \"%s\", \"data\": {\"seq_len\": 257}}", path);
    assert_int_equal(tu_parse(&s, text, &e), 0);
    assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
    assert_true(tu_has(&e, "data.seq_len", "longer than the checkpoint's max_position_embeddings"));
    ty_errlist_clear(&e);
  }
  snprintf(path, sizeof path, "%s/config.json", dir);
  /* A config.json without the field limits nothing. */
  f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\"hidden_size\": 64}", f);
  fclose(f);
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  snprintf(text, sizeof text, "{\"model_path\": \"%s\", \"data\": {\"seq_len\": 100000}}", dir);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), 0);
}

/* The data file holds one global batch, where paths are checked; the
 * figures are the worker's own (jobspec_data_split). */
static void test_data_holds_a_batch(void **state) {
  (void)state;
  char path[600], text[1024];
  snprintf(path, sizeof path, "%s/models/ids.u16", g_tmp);
  /* 1001 u16 tokens: with seq_len 99, 10 windows, 1 held out (5%), 9 to
   * train on. */
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 1001; i++) fputc(i % 200, f), fputc(0, f);
  fclose(f);
  struct {
    const char *extra;
    bool paths;
    const char *want; /* NULL: valid */
  } cases[] = {
      {"\"train\": {\"micro_batch_size\": 9}", true, NULL},
      {"\"world_size\": 3, \"train\": {\"micro_batch_size\": 3}", true, NULL},
      {"\"train\": {\"micro_batch_size\": 10}", true,
       "holds 1001 tokens: 9 training windows of seq_len+1 = 100 tokens (after a held-out tail of "
       "1 windows), fewer than one global batch of 10 windows (world_size 1 x micro_batch_size 10 "
       "x grad_accum 1)"},
      {"\"world_size\": 2, \"train\": {\"micro_batch_size\": 5}", true,
       "fewer than one global batch of 10 windows (world_size 2 x micro_batch_size 5"},
      {"\"train\": {\"micro_batch_size\": 3, \"grad_accum\": 4}", true,
       "fewer than one global batch of 12 windows"},
      {"\"train\": {\"micro_batch_size\": 10}", false, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    jobspec_t s;
    ty_errlist_t e = TY_ERRLIST_INIT;
    snprintf(text, sizeof text,
             "{\"model_path\": \"%s/models/tiny\", \"data\": {\"path\": \"%s\", \"format\": "
             "\"u16\", \"seq_len\": 99}, %s}",
             g_tmp, path, cases[i].extra);
    assert_int_equal(tu_parse(&s, text, &e), 0);
    int rc = jobspec_validate(&s, cases[i].paths, &e);
    if (!cases[i].want) {
      if (rc) tu_dump(&e);
      assert_int_equal(rc, 0);
    } else {
      assert_int_equal(rc, TY_EINVAL);
      assert_true(tu_has(&e, "data.path", cases[i].want));
      assert_int_equal(e.len, 1);
    }
    ty_errlist_clear(&e);
  }
  /* Numbers out of range are the ranges rule's alone: no split of them is
   * tried (a seq_len of 0 divided by zero). */
  for (int i = 0; i < 2; i++) {
    jobspec_t s;
    ty_errlist_t e = TY_ERRLIST_INIT;
    snprintf(text, sizeof text,
             "{\"model_path\": \"%s/models/tiny\", \"data\": {\"path\": \"%s\", \"seq_len\": %d}, "
             "\"train\": {\"grad_accum\": %d}}",
             g_tmp, path, i ? 99 : 0, i ? 0 : 1);
    assert_int_equal(tu_parse(&s, text, &e), 0);
    assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
    assert_int_equal(e.len, 1);
    assert_true(tu_has(&e, i ? "train.grad_accum" : "data.seq_len", "must be >= 1"));
    ty_errlist_clear(&e);
  }
  /* A partial token: an odd number of bytes read as u16. */
  f = fopen(path, "a");
  assert_non_null(f);
  fputc(7, f);
  fclose(f);
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"data\": {\"path\": \"%s\", \"format\": "
           "\"u16\", \"seq_len\": 99}, \"train\": {\"micro_batch_size\": 1}}",
           g_tmp, path);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "data.path", "has 2003 bytes, not a whole number of u16 tokens"));
  ty_errlist_clear(&e);
}

/* jobspec_validate of a spec training models/tiny (LoRA or every weight)
 * into g_tmp + out, errors in e. */
static int validate_out(bool lora, const char *out, bool check_paths, ty_errlist_t *e) {
  jobspec_t s;
  char text[1024];
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"use_lora\": %s, \"output_dir\": \"%s%s\"}",
           g_tmp, lora ? "true" : "false", g_tmp, out);
  assert_int_equal(tu_parse(&s, text, e), 0);
  return jobspec_validate(&s, check_paths, e);
}

/* Training every weight must not write over its own base checkpoint; LoRA
 * adapters, and a model from scratch, may go anywhere. */
static void test_output_not_model(void **state) {
  (void)state;
  ty_errlist_t e = TY_ERRLIST_INIT;
  const char *same[] = {"/models/tiny", "/models/tiny/", "/models/tiny/../tiny"};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
    assert_int_equal(validate_out(false, same[i], true, &e), TY_EINVAL);
    assert_true(tu_has(&e, "output_dir", "is model_path's folder: training every weight writes"));
    assert_int_equal(e.len, 1);
    ty_errlist_clear(&e);
  }
  /* model_path naming a file: its folder is the model's. */
  char file[600], text[1024];
  snprintf(file, sizeof file, "%s/models/tiny/model.pt", g_tmp);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  jobspec_t s;
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s\", \"use_lora\": false, \"output_dir\": \"%s/models/tiny\"}",
           file, g_tmp);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "output_dir", "is model_path's folder"));
  ty_errlist_clear(&e);
  /* LoRA beside its base, every weight into a folder of its own. */
  assert_int_equal(validate_out(true, "/models/tiny", true, &e), 0);
  assert_int_equal(validate_out(false, "/models/tiny/out", true, &e), 0);
  /* Without check_paths nothing is resolved. */
  assert_int_equal(validate_out(false, "/models/tiny", false, &e), 0);
}

static void test_paths_in_roots(void **state) {
  (void)state;
  char models[300], runs[300];
  snprintf(models, sizeof models, "%s/models", g_tmp);
  snprintf(runs, sizeof runs, "%s/runs", g_tmp);
  const char *const rd[] = {models, NULL};
  const char *const wr[] = {runs, NULL};
  char resolved[PATH_MAX], real[PATH_MAX], want_out[PATH_MAX + 16];
  assert_non_null(realpath(g_tmp, real));
  jobspec_roots_t roots = {rd, wr, g_tmp, resolved};
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  /* Relative paths resolve against base; output_dir need not exist yet. */
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"models/tiny\", \"data\": {\"path\": "
                            "\"models/train.txt\"}, \"output_dir\": \"runs/a/b\"}",
                            &e),
                   0);
  assert_int_equal(jobspec_check_roots(&s, &roots, &e), 0);
  snprintf(want_out, sizeof want_out, "%s/runs/a/b", real); /* as it was compared */
  assert_string_equal(resolved, want_out);
  /* A model may come from an earlier job's output (write roots are readable). */
  assert_int_equal(tu_check(&s, "{\"model_path\": \"runs\", \"output_dir\": \"runs/x\"}", &e), 0);
  assert_int_equal(jobspec_check_roots(&s, &roots, &e), 0);
  /* Outside, through "..", through a symbolic link, output in a read root. */
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"models/../secret\", \"data\": {\"path\": "
                            "\"models/escape\"}, \"output_dir\": \"models/out\"}",
                            &e),
                   0);
  assert_int_equal(jobspec_check_roots(&s, &roots, &e), TY_EINVAL);
  assert_int_equal(e.len, 3);
  assert_true(tu_has(&e, "model_path", "outside the server's allowed roots"));
  assert_true(tu_has(&e, "data.path", "/secret, outside"));
  assert_true(tu_has(&e, "output_dir", "outside the server's output roots"));
  ty_errlist_clear(&e);
  /* ".." in the part that does not exist yet. */
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"models/tiny\", \"output_dir\": "
                            "\"runs/new/../../secret\"}",
                            &e),
                   0);
  assert_int_equal(jobspec_check_roots(&s, &roots, &e), TY_EINVAL);
  assert_true(tu_has(&e, "output_dir", "cannot be resolved safely"));
  assert_string_equal(resolved, "");
  ty_errlist_clear(&e);
  /* A dangling link inside the output root pointing out of it. */
  char link[600], target[600];
  snprintf(target, sizeof target, "%s/secret/new", g_tmp);
  snprintf(link, sizeof link, "%s/runs/dangling", g_tmp);
  assert_int_equal(symlink(target, link), 0);
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"models/tiny\", \"output_dir\": "
                            "\"runs/dangling/out\"}",
                            &e),
                   0);
  assert_int_equal(jobspec_check_roots(&s, &roots, &e), TY_EINVAL);
  assert_true(tu_has(&e, "output_dir", "symbolic link that points nowhere"));
  ty_errlist_clear(&e);
  /* Absolute paths; no roots at all allows nothing. */
  char text[600];
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"output_dir\": "
           "\"%s/runs/z\"}",
           g_tmp, g_tmp);
  assert_int_equal(tu_check(&s, text, &e), 0);
  assert_int_equal(jobspec_check_roots(&s, &roots, &e), 0);
  jobspec_roots_t none = {NULL, NULL, NULL, NULL};
  assert_int_equal(jobspec_check_roots(&s, &none, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path", "(none configured)"));
  ty_errlist_clear(&e);
  /* The error lists the roots as they are compared (resolved), each once,
   * and names a root that does not exist as configured. */
  char dotted[600], missing[600], want[3 * PATH_MAX];
  snprintf(dotted, sizeof dotted, "%s/models/../models/.", g_tmp);
  snprintf(missing, sizeof missing, "%s/nothere", g_tmp);
  const char *const rd2[] = {dotted, models, missing, NULL};
  const char *const wr2[] = {runs, runs, NULL};
  jobspec_roots_t twice = {rd2, wr2, NULL, NULL};
  assert_int_equal(tu_check(&s, "{\"model_path\": \"/usr\"}", &e), 0);
  assert_int_equal(jobspec_check_roots(&s, &twice, &e), TY_EINVAL);
  snprintf(want, sizeof want, "roots (%s/models, %s (does not exist), %s/runs); move it", real,
           missing, real);
  assert_true(tu_has(&e, "model_path", want));
  ty_errlist_clear(&e);
}

/* Every spelling of one folder resolves to one form, existing or not: the
 * key under which the server finds a folder's unfinished job. */
static void test_resolve_path(void **state) {
  (void)state;
  char real[PATH_MAX], want[PATH_MAX + 32], got[PATH_MAX], abs[600];
  assert_non_null(realpath(g_tmp, real));
  snprintf(abs, sizeof abs, "%s//runs/new/deeper/", g_tmp);
  const char *spellings[] = {"runs/new/deeper", "runs//new/deeper/", "./runs/new//deeper//",
                             "models/../runs/new/deeper", abs};
  snprintf(want, sizeof want, "%s/runs/new/deeper", real);
  for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
    assert_int_equal(jobspec_resolve_path(spellings[i], g_tmp, got), 0);
    assert_string_equal(got, want);
  }
  /* An existing folder, with a trailing slash; the root itself. */
  snprintf(want, sizeof want, "%s/runs", real);
  assert_int_equal(jobspec_resolve_path("runs/", g_tmp, got), 0);
  assert_string_equal(got, want);
  assert_int_equal(jobspec_resolve_path("//", NULL, got), 0);
  assert_string_equal(got, "/");
  /* "." or ".." past what exists cannot be resolved yet. */
  assert_int_equal(jobspec_resolve_path("runs/new/./x", g_tmp, got), -1);
  assert_int_equal(jobspec_resolve_path("runs/new/../x", g_tmp, got), -1);
}

/* A checkpoint folder g_tmp/models/<name> (dir) holding only the
 * config.json (path) of a 199.8M-parameter model: what the memory rules
 * read. */
static void make_big_model(const char *name, char dir[600], char path[700]) {
  snprintf(dir, 600, "%s/models/%s", g_tmp, name);
  mkdir(dir, 0755);
  snprintf(path, 700, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(
      "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 1024, "
      "\"intermediate_size\": 4096, \"num_hidden_layers\": 8, \"num_attention_heads\": 16, "
      "\"vocab_size\": 32000, \"hidden_act\": \"silu\", \"rope_scaling\": null}",
      f);
  fclose(f);
}

/* host_memory's verdict on a spec of models/big (LoRA or every weight,
 * world ranks, memory-efficient or not) and a host of gib GiB: 0, or the
 * error's field and message in e. */
static int host_memory(bool lora, int world, bool efficient, double gib, ty_errlist_t *e) {
  jobspec_t s;
  char text[1024];
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/big\", \"use_lora\": %s, \"world_size\": %d, "
           "\"fsdp\": {\"memory_efficient_load\": %s}}",
           g_tmp, lora ? "true" : "false", world, efficient ? "true" : "false");
  assert_int_equal(tu_parse(&s, text, e), 0);
  assert_int_equal(jobspec_validate(&s, false, e), 0);
  return jobspec_check_host_memory(&s, true, (uint64_t)(gib * 1073741824.0), "MemTotal", e);
}

/* CPU ranks must fit the host: the weights in float32 (whole in each rank
 * on the standard path, one shard each on the memory-efficient one), for
 * full training gradients and AdamW moments, and each training rank's
 * activations. models/big has 199.8M parameters, 0.744 GiB in float32; a
 * rank's activations for the default 4 x 128 tokens take 0.416 GiB (every
 * layer's), 0.155 GiB with gradient_checkpointing (one layer's): worked
 * out by hand from the buffers' shapes, not from api/model_acts.h. */
static void test_host_memory(void **state) {
  (void)state;
  char dir[600], path[700];
  make_big_model("big", dir, path);
  ty_errlist_t e = TY_ERRLIST_INIT;
  /* LoRA over 4 ranks: the standard path holds 4 x (whole + shard) = 3.72
   * GiB while loading, the memory-efficient one 4 x (shard + activations)
   * = 2.40 GiB. */
  assert_int_equal(host_memory(true, 4, false, 4.0, &e), 0);
  assert_int_equal(host_memory(true, 4, false, 3.0, &e), TY_EINVAL);
  assert_true(tu_has(&e, "fsdp.memory_efficient_load",
                     "is false: on the standard path each of the 4 ranks places the whole model "
                     "(199771136 parameters, 0.74 GiB in float32) before it keeps its shard, at "
                     "least 3.72 GiB in all on a host of 3.00 GiB (MemTotal); set it true"));
  assert_true(tu_has(&e, "fsdp.memory_efficient_load", "at least 2.40 GiB in all"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  assert_int_equal(host_memory(true, 4, true, 3.0, &e), 0);
  /* Every layer's activations do not fit 2 GiB; one layer's do. */
  assert_int_equal(host_memory(true, 4, true, 2.0, &e), TY_EINVAL);
  assert_true(tu_has(&e, "gradient_checkpointing",
                     "is false: each of the 4 ranks keeps every layer's activations for its "
                     "micro-batch of 4 x 128 tokens, 0.42 GiB a rank, at least 2.40 GiB in all "
                     "on a host of 2.00 GiB (MemTotal); set it true: a rank then keeps one "
                     "layer's and each layer's input, 0.16 GiB a rank"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  /* One rank holds the model once, whichever the path, and its activations. */
  assert_int_equal(host_memory(true, 1, false, 1.2, &e), 0);
  assert_int_equal(host_memory(true, 1, false, 1.1, &e), TY_EINVAL);
  ty_errlist_clear(&e);
  /* train.sample_prompts: rank 0 also reads the whole base, 0.74 GiB
   * beside 4 shards (0.74) and 4 ranks' activations of 1 x 32 tokens
   * (0.03 GiB each). */
  {
    jobspec_t sp;
    char st[1024];
    snprintf(st, sizeof st,
             "{\"model_path\": \"%s\", \"use_lora\": true, \"world_size\": 4, \"fsdp\": "
             "{\"memory_efficient_load\": true}, \"data\": {\"seq_len\": 32}, \"train\": "
             "{\"sample_prompts\": [\"a\"], \"micro_batch_size\": 1}}",
             dir);
    assert_int_equal(tu_parse(&sp, st, &e), 0);
    assert_int_equal(jobspec_validate(&sp, false, &e), 0);
    assert_int_equal(jobspec_check_host_memory(&sp, true, 5u << 28, "MemTotal", &e), TY_EINVAL);
    assert_true(tu_has(&e, "model_path", "needs at least 1.59 GiB"));
    ty_errlist_clear(&e);
    assert_int_equal(jobspec_check_host_memory(&sp, true, 1u << 31, "MemTotal", &e), 0);
  }
  /* Too little even for the weights once: no load path helps. */
  assert_int_equal(host_memory(true, 4, true, 0.5, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path",
                     "needs at least 2.40 GiB of this host's memory for its weights in float32 "
                     "over 4 ranks and their activations, more than the host's 0.50 GiB "
                     "(MemTotal): use device cuda"));
  ty_errlist_clear(&e);
  /* Every weight: gradients and AdamW's moments beside the weights, 2.98
   * GiB over 4 memory-efficient ranks, 4.64 with the activations; LoRA is
   * named as the way out. */
  assert_int_equal(host_memory(false, 4, true, 2.0, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path",
                     "needs at least 4.64 GiB of this host's memory for its weights, gradients "
                     "and AdamW moments in float32 over 4 ranks and their activations"));
  assert_true(tu_has(&e, "model_path", "train LoRA adapters (use_lora), use device cuda"));
  ty_errlist_clear(&e);
  /* A load alone (trainyard load) holds the job's dtype and no training
   * state: in bfloat16, 4 standard ranks hold 1.86 GiB, 4 shards 0.37. */
  jobspec_t ld;
  char text[1024];
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s\", \"use_lora\": false, \"world_size\": 4, \"dtype\": "
           "\"bfloat16\"}",
           dir);
  assert_int_equal(tu_parse(&ld, text, &e), 0);
  assert_int_equal(jobspec_validate(&ld, false, &e), 0);
  assert_int_equal(jobspec_check_host_memory(&ld, false, 2u << 30, "MemTotal", &e), 0);
  assert_int_equal(jobspec_check_host_memory(&ld, false, 1u << 30, "MemTotal", &e), TY_EINVAL);
  assert_true(tu_has(&e, "fsdp.memory_efficient_load",
                     "(199771136 parameters, 0.37 GiB in bfloat16) before it keeps its shard, at "
                     "least 1.86 GiB in all on a host of 1.00 GiB (MemTotal); set it true: each "
                     "rank then reads only its shard, at least 0.37 GiB in all"));
  ty_errlist_clear(&e);
  /* An unknown host size, or a config.json that cannot be read: nothing
   * to compare (loading says what is wrong with a checkpoint). */
  assert_int_equal(host_memory(true, 4, false, 0.0, &e), 0);
  unlink(path);
  assert_int_equal(host_memory(true, 4, false, 0.5, &e), 0);
  /* From scratch: the inline model, each rank initialising its shard. */
  jobspec_t s;
  assert_int_equal(
      tu_check(&s, "{\"init_from_scratch\": true, \"world_size\": 2, " SCRATCH_MODEL "}", &e), 0);
  assert_int_equal(jobspec_check_host_memory(&s, true, 1 << 30, "--host_mem_mib", &e), 0);
  assert_int_equal(jobspec_check_host_memory(&s, true, 1 << 10, "--host_mem_mib", &e), TY_EINVAL);
  assert_true(tu_has(&e, "model", "more than the host's 0.00 GiB (--host_mem_mib): use device"));
  ty_errlist_clear(&e);
  /* The host's own size is read. */
  assert_true(jobspec_host_memory() > (64u << 20));
}

#define CAP_WHAT "that --gpu_mem_limit_mib allows each GPU rank"
#define CAP_MORE "or a larger --gpu_mem_limit_mib"

/* device_memory's verdict on a cuda spec of models/gpu (LoRA or every
 * weight, dtype, world ranks, memory-efficient or not, more: the spec's
 * other fields) whose ranks may each take gib GiB of their GPU: 0, or the
 * error in e. */
static int device_memory(bool lora, const char *dtype, int world, bool efficient, const char *more,
                         double gib, ty_errlist_t *e) {
  jobspec_t s;
  char text[1024];
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/gpu\", \"device\": \"cuda\", \"use_lora\": %s, "
           "\"dtype\": \"%s\", \"world_size\": %d, \"fsdp\": {\"memory_efficient_load\": %s}%s}",
           g_tmp, lora ? "true" : "false", dtype, world, efficient ? "true" : "false", more);
  assert_int_equal(tu_parse(&s, text, e), 0);
  assert_int_equal(jobspec_validate(&s, false, e), 0);
  return jobspec_check_device_memory(&s, (uint64_t)(gib * 1073741824.0), CAP_WHAT, CAP_MORE, e);
}

/* Micro-batches of 1 x 32 tokens: the weights outweigh the activations
 * (32.6 MiB a LoRA rank, 28.6 every weight); 8 x 1024: the activations
 * outweigh the weights (6.09 GiB, 1.93 GiB with gradient_checkpointing). */
#define SMALL ", \"train\": {\"micro_batch_size\": 1}, \"data\": {\"seq_len\": 32}"
#define LARGE ", \"train\": {\"micro_batch_size\": 8}, \"data\": {\"seq_len\": 1024}"

/* GPU ranks must fit their cap: each its shard in the job's dtype, beside
 * the whole model on the standard path; for training, every weight's
 * float32 gradients and moments, the activations and adapters
 * (MODEL_ACTS_CUDA), and over several ranks two slots of the largest unit
 * (the head and final norm: 62.5 MiB in bfloat16). models/gpu has 199.8M
 * parameters, 381.0 MiB in bfloat16, 762.1 MiB in float32; sizes under a
 * GiB are said in MiB. */
static void test_device_memory(void **state) {
  (void)state;
  char dir[600], path[700];
  make_big_model("gpu", dir, path);
  ty_errlist_t e = TY_ERRLIST_INIT;
  /* LoRA in bfloat16 over 2 GPUs: the standard path holds the whole model
   * and the shard, 571.5 MiB a rank; the memory-efficient one the shard,
   * the activations and the slots, 190.5 + 32.6 + 125.0 MiB. */
  assert_int_equal(device_memory(true, "bfloat16", 2, false, SMALL, 0.6, &e), 0);
  assert_int_equal(device_memory(true, "bfloat16", 2, false, SMALL, 0.5, &e), TY_EINVAL);
  assert_true(tu_has(&e, "fsdp.memory_efficient_load",
                     "is false: on the standard path each GPU rank places the whole model "
                     "(199771136 parameters, 381.0 MiB in bfloat16) on its device beside its "
                     "shard, at least 571.5 MiB, more than the 512.0 MiB that "
                     "--gpu_mem_limit_mib allows each GPU rank; set it true: each rank then "
                     "places only its shard, at least 348.2 MiB with its training buffers"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  assert_int_equal(device_memory(true, "bfloat16", 2, true, SMALL, 0.5, &e), 0);
  /* One rank places the whole model twice on the standard path (the H200
   * measured 2 x 2858 MiB for a 2858 MiB model); no slots. */
  assert_int_equal(device_memory(true, "bfloat16", 1, false, SMALL, 0.7, &e), TY_EINVAL);
  assert_true(tu_has(&e, "fsdp.memory_efficient_load", "at least 762.1 MiB"));
  assert_true(tu_has(&e, "fsdp.memory_efficient_load", "at least 413.7 MiB with its training"));
  ty_errlist_clear(&e);
  assert_int_equal(device_memory(true, "bfloat16", 1, true, SMALL, 0.7, &e), 0);
  /* Too little for the float32 base once: bfloat16 and more ranks are
   * named. */
  assert_int_equal(device_memory(true, "float32", 1, true, SMALL, 0.5, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path",
                     "needs at least 794.7 MiB on each GPU for its weights in float32 and the "
                     "activations of micro-batches of 1 x 32 tokens over 1 rank, more than the "
                     "512.0 MiB that --gpu_mem_limit_mib allows each GPU rank: load the base in "
                     "bfloat16 (dtype), use more ranks (world_size, one GPU each), or a larger "
                     "--gpu_mem_limit_mib"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  /* Every weight over 4 GPUs: each loads its shard on the host and copies
   * it up, whichever the path, then holds 4 x 190.5 MiB of weights,
   * gradients and moments, its activations and three unit-sized buffers
   * (two slots and the unit's gradients, 125.0 MiB each). LoRA is named as
   * the way out. */
  assert_int_equal(device_memory(false, "float32", 4, false, SMALL, 1.2, &e), 0);
  assert_int_equal(device_memory(false, "float32", 4, true, SMALL, 1.2, &e), 0);
  assert_int_equal(device_memory(false, "float32", 4, false, SMALL, 1.1, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path",
                     "needs at least 1.14 GiB on each GPU for its weights, gradients and AdamW "
                     "moments in float32 and the activations of micro-batches of 1 x 32 tokens "
                     "over 4 ranks"));
  assert_true(tu_has(&e, "model_path", "train LoRA adapters (use_lora), use more ranks"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  /* Every weight on one GPU: the training state outweighs the standard
   * load, so the memory-efficient load is no way out. */
  assert_int_equal(device_memory(false, "float32", 1, false, SMALL, 2.0, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path", "needs at least 3.00 GiB on each GPU"));
  assert_false(tu_has(&e, "fsdp.memory_efficient_load", ""));
  ty_errlist_clear(&e);
  /* Long micro-batches: every layer's activations (6.09 GiB) outweigh the
   * bfloat16 base; gradient_checkpointing is named where it fits (one
   * layer's and each layer's input, 1.93 GiB), and then passes. */
  assert_int_equal(device_memory(true, "bfloat16", 1, true, LARGE, 4.0, &e), TY_EINVAL);
  assert_true(tu_has(&e, "gradient_checkpointing",
                     "is false: each GPU rank keeps every layer's activations for its "
                     "micro-batch of 8 x 1024 tokens, 6.09 GiB, at least 6.46 GiB in all, more "
                     "than the 4.00 GiB that --gpu_mem_limit_mib allows each GPU rank; set it "
                     "true: a rank then keeps one layer's and each layer's input, 1.93 GiB (or "
                     "lower train.micro_batch_size or data.seq_len)"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  assert_int_equal(
      device_memory(true, "bfloat16", 1, true, LARGE ", \"gradient_checkpointing\": true", 4.0, &e),
      0);
  /* Where even one layer's do not fit, the micro-batch is named. */
  assert_int_equal(
      device_memory(true, "bfloat16", 1, true, LARGE ", \"gradient_checkpointing\": true", 2.0, &e),
      TY_EINVAL);
  assert_true(tu_has(&e, "model_path",
                     "needs at least 2.30 GiB on each GPU for its weights in bfloat16 and the "
                     "activations of micro-batches of 8 x 1024 tokens over 1 rank"));
  assert_false(tu_has(&e, "gradient_checkpointing", ""));
  ty_errlist_clear(&e);
  assert_int_equal(device_memory(true, "bfloat16", 1, true, LARGE, 2.0, &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path", "needs at least 6.46 GiB on each GPU"));
  ty_errlist_clear(&e);
  /* No cap, or a config.json that cannot be read: nothing to compare. */
  assert_int_equal(device_memory(true, "float32", 1, false, "", 0.0, &e), 0);
  unlink(path);
  assert_int_equal(device_memory(true, "float32", 1, false, "", 0.1, &e), 0);
  assert_int_equal(e.len, 0);
  /* From scratch: the inline model, each rank initialising its shard. */
  jobspec_t s;
  assert_int_equal(tu_check(&s,
                            "{\"init_from_scratch\": true, \"device\": \"cuda\", \"world_size\": "
                            "2, " SCRATCH_MODEL "}",
                            &e),
                   0);
  assert_int_equal(jobspec_check_device_memory(&s, 1 << 30, CAP_WHAT, CAP_MORE, &e), 0);
  assert_int_equal(jobspec_check_device_memory(&s, 1 << 10, "of this host's largest GPU (NVML)",
                                               "or GPUs with more memory", &e),
                   TY_EINVAL);
  assert_true(tu_has(&e, "model", "more than the 0.0 MiB of this host's largest GPU (NVML)"));
  assert_true(
      tu_has(&e, "model", "use more ranks (world_size, one GPU each), or GPUs with more memory"));
  assert_true(tu_has(&e, "model",
                     "weights, gradients and AdamW moments in float32 and the activations of "
                     "micro-batches of 4 x 128 tokens over 2 ranks"));
  assert_false(tu_has(&e, "model", "use_lora"));
  ty_errlist_clear(&e);
}

static void test_jsonl_options(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"data\": {\"format\": \"jsonl\", \"packing\": true, "
     "\"tokenizer\": \"tok\", \"kind\": \"messages\", \"chat_template\": \"chatml\", "
     "\"loss_on\": \"all\"}}");
  bad("{\"model_path\": \"m\", \"data\": {\"packing\": true}}", "data.packing",
      "applies to examples of a JSONL file only; set data.format to jsonl");
  bad("{\"model_path\": \"m\", \"data\": {\"format\": \"u16\", \"loss_on\": \"all\"}}",
      "data.loss_on", "JSONL file only");
  bad("{\"model_path\": \"m\", \"data\": {\"format\": \"jsonl\", \"chat_template\": "
      "\"zephyr\"}}",
      "data.chat_template", "\"zephyr\" is not a built-in chat template; use llama3, llama2");
}

/* train.sample_prompts: their parse, and rule sample-prompts (rank 0's
 * CPU holding the weights whole: a frozen base it reads again, or the
 * weights of one CPU rank). */
static void test_sample_prompts(void **state) {
  (void)state;
  ok("{\"model_path\": \"m\", \"use_lora\": true, \"world_size\": 2, \"train\": "
     "{\"sample_prompts\": [\"Once upon\", \"The capital of France is\"], \"sample_every\": 5}}");
  ok("{\"model_path\": \"m\", \"world_size\": 1, \"device\": \"cpu\", \"train\": "
     "{\"sample_prompts\": [\"a\"], \"sample_max_new_tokens\": 1024}}");
  ok("{\"model_path\": \"m\", \"use_lora\": true, \"device\": \"cuda\", \"world_size\": 2, "
     "\"train\": {\"sample_prompts\": [\"a\"]}}");
  bad("{\"model_path\": \"m\", \"device\": \"cuda\", \"train\": {\"sample_prompts\": [\"a\"]}}",
      "train.sample_prompts",
      "training every weight on GPUs keeps the weights on the device, and samples are decoded "
      "on rank 0's CPU; use use_lora true");
  bad("{\"model_path\": \"m\", \"world_size\": 2, \"train\": {\"sample_prompts\": [\"a\"]}}",
      "train.sample_prompts", "training every weight on 2 ranks shards the weights");
  /* Without prompts neither matters. */
  ok("{\"model_path\": \"m\", \"world_size\": 2, \"device\": \"cuda\", \"train\": "
     "{\"sample_every\": 3}}");
  bad("{\"model_path\": \"m\", \"train\": {\"sample_every\": -1}}", "train.sample_every", "");
  bad("{\"model_path\": \"m\", \"train\": {\"sample_max_new_tokens\": 0}}",
      "train.sample_max_new_tokens", "");
  bad("{\"model_path\": \"m\", \"train\": {\"sample_max_new_tokens\": 1025}}",
      "train.sample_max_new_tokens", "");
  bad("{\"model_path\": \"m\", \"train\": {\"sample_prompts\": \"a\"}}", "train.sample_prompts",
      "must be a list of strings, got a string");
  bad("{\"model_path\": \"m\", \"train\": {\"sample_prompts\": [\"a\", \"\"]}}",
      "train.sample_prompts[1]", "must be a non-empty string");
  bad("{\"model_path\": \"m\", \"train\": {\"sample_prompts\": [\"a\", 3]}}",
      "train.sample_prompts[1]", "must be a non-empty string, got an integer");
  bad("{\"model_path\": \"m\", \"train\": {\"sample_prompts\": "
      "[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}}",
      "train.sample_prompts", "holds 9 strings; at most 8 are allowed");
  char text[1200], big[1030];
  memset(big, 'x', 1024);
  big[1024] = '\0';
  snprintf(text, sizeof text, "{\"model_path\": \"m\", \"train\": {\"sample_prompts\": [\"%s\"]}}",
           big);
  bad(text, "train.sample_prompts[0]", "is 1024 bytes; at most 1023 are allowed");
  /* The list round-trips through JSON; flags take a JSON list or one string. */
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_parse(&s, "{\"train\": {\"sample_prompts\": [\"x\", \"y z\"]}}", &e), 0);
  char *dump = jobspec_dumps(&s, false);
  assert_non_null(strstr(dump, "\"sample_prompts\":[\"x\",\"y z\"]"));
  free(dump);
  assert_int_equal(jobspec_set_flag(&s, "train.sample_prompts", "Hello there", &e), 0);
  assert_string_equal(s.train.sample_prompts[0], "Hello there");
  assert_string_equal(s.train.sample_prompts[1], "");
  assert_int_equal(jobspec_set_flag(&s, "train.sample_prompts", "[\"a\", \"b\"]", &e), 0);
  assert_string_equal(s.train.sample_prompts[1], "b");
  assert_int_equal(jobspec_set_flag(&s, "train.sample_prompts", "[\"a\"", &e), TY_EINVAL);
  assert_true(tu_has(&e, "train.sample_prompts", "must be a JSON list of strings"));
  ty_errlist_clear(&e);
}

/* Rule sample-tokenizer: data.tokenizer (for any data format when there
 * are samples), else tokenizer.json beside the model. */
static void test_sample_tokenizer(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  char text[2048];
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"data\": {\"path\": \"%s/models/train.txt\"}, "
           "\"train\": {\"sample_prompts\": [\"hi\"]}}",
           g_tmp, g_tmp);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "train.sample_prompts", "models/tiny/tokenizer.json does not exist"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  /* Without paths checked there is nothing to say yet. */
  assert_int_equal(jobspec_validate(&s, false, &e), 0);
  char p[600];
  snprintf(p, sizeof p, "%s/models/tiny/tokenizer.json", g_tmp);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs("{}", f);
  fclose(f);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), 0);
  /* data.tokenizer with a token file: allowed with samples, and must exist. */
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"data\": {\"path\": \"%s/models/train.txt\", "
           "\"tokenizer\": \"%s/models/nope.json\"}, \"train\": {\"sample_prompts\": [\"hi\"]}}",
           g_tmp, g_tmp, g_tmp);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), TY_EINVAL);
  assert_true(tu_has(&e, "data.tokenizer", "nope.json does not exist; give the tokenizer.json"));
  assert_int_equal(e.len, 1);
  ty_errlist_clear(&e);
  snprintf(text, sizeof text,
           "{\"model_path\": \"%s/models/tiny\", \"data\": {\"path\": \"%s/models/train.txt\", "
           "\"tokenizer\": \"%s\"}, \"train\": {\"sample_prompts\": [\"hi\"]}}",
           g_tmp, g_tmp, p);
  assert_int_equal(tu_parse(&s, text, &e), 0);
  assert_int_equal(jobspec_validate(&s, true, &e), 0);
  /* From scratch: only data.tokenizer can give one. */
  bad("{\"init_from_scratch\": true, \"model\": {\"hidden_size\": 64, \"intermediate_size\": 128, "
      "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 256}, \"train\": "
      "{\"sample_prompts\": [\"hi\"]}}",
      "train.sample_prompts", "a model initialised from scratch has no folder to find one in");
  ok("{\"init_from_scratch\": true, \"model\": {\"hidden_size\": 64, \"intermediate_size\": 128, "
     "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 256}, \"data\": "
     "{\"tokenizer\": \"t.json\"}, \"train\": {\"sample_prompts\": [\"hi\"]}}");
}

static void test_cuda_gpus(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"device\": \"cuda\", "
                            "\"allocation_mode\": \"fsdp:d4\"}",
                            &e),
                   0);
  assert_int_equal(jobspec_check_devices(&s, 4, &e), 0);
  assert_int_equal(jobspec_check_devices(&s, 2, &e), TY_EINVAL);
  assert_true(tu_has(&e, "device", "needs 4 GPUs, this server has 2"));
  ty_errlist_clear(&e);
  assert_int_equal(jobspec_check_devices(&s, 0, &e), TY_EINVAL);
  assert_true(tu_has(&e, "device", "no GPU"));
  /* ... and says how a GPU host gives it some. */
  assert_true(tu_has(&e, "device", "start trainyardd with --gpus N"));
  ty_errlist_clear(&e);
  /* auto and cpu never need a GPU. */
  assert_int_equal(tu_check(&s, "{\"model_path\": \"m\", \"world_size\": 8}", &e), 0);
  assert_int_equal(jobspec_check_devices(&s, 0, &e), 0);
}

static void count_rule(const char *id, const char *fields, const char *why, void *ctx) {
  int *n = ctx;
  (*n)++;
  assert_true(*id && *fields && *why);
  const char *stage = jobspec_rule_stage(id);
  assert_non_null(stage);
  assert_true(!strcmp(stage, "spec") || !strcmp(stage, "paths") || !strcmp(stage, "submit") ||
              !strcmp(stage, "load"));
}

/* dist-backend-device: shm and gloo need device cpu, nccl device cuda; auto
 * goes with every device. */
static void test_dist_backend(void **state) {
  (void)state;
  static const struct {
    jobspec_device_t device;
    jobspec_dist_backend_t backend;
    const char *msg; /* NULL: accepted */
  } cases[] = {
      {JOBSPEC_DEVICE_AUTO, JOBSPEC_DIST_AUTO, NULL},
      {JOBSPEC_DEVICE_CPU, JOBSPEC_DIST_AUTO, NULL},
      {JOBSPEC_DEVICE_CUDA, JOBSPEC_DIST_AUTO, NULL},
      {JOBSPEC_DEVICE_CPU, JOBSPEC_DIST_SHM, NULL},
      {JOBSPEC_DEVICE_CPU, JOBSPEC_DIST_GLOO, NULL},
      {JOBSPEC_DEVICE_CUDA, JOBSPEC_DIST_NCCL, NULL},
      {JOBSPEC_DEVICE_CUDA, JOBSPEC_DIST_GLOO,
       "\"gloo\" connects CPU ranks, and device is \"cuda\""},
      {JOBSPEC_DEVICE_AUTO, JOBSPEC_DIST_SHM, "\"shm\" connects CPU ranks, and device is \"auto\""},
      {JOBSPEC_DEVICE_CPU, JOBSPEC_DIST_NCCL, "\"nccl\" connects GPU ranks, and device is \"cpu\""},
      {JOBSPEC_DEVICE_AUTO, JOBSPEC_DIST_NCCL,
       "\"nccl\" connects GPU ranks, and device is \"auto\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    jobspec_t s;
    jobspec_init(&s);
    s.init_from_scratch = true;
    s.has_model = true;
    s.model.hidden_size = 64;
    s.model.intermediate_size = 128;
    s.model.num_hidden_layers = 2;
    s.model.num_attention_heads = 4;
    s.model.num_key_value_heads = 2;
    s.model.vocab_size = 256;
    s.device = cases[i].device;
    s.dist.backend = cases[i].backend;
    ty_errlist_t e = TY_ERRLIST_INIT;
    jobspec_validate(&s, false, &e);
    const char *found = NULL;
    for (size_t k = 0; k < e.len; k++)
      if (!strcmp(e.items[k].field, "dist.backend")) found = e.items[k].message;
    if (!cases[i].msg) {
      if (found) fail_msg("case %zu refused: %s", i, found);
    } else {
      if (!found) fail_msg("case %zu accepted", i);
      if (!strstr(found, cases[i].msg)) fail_msg("case %zu: %s", i, found);
    }
    ty_errlist_clear(&e);
  }
}

/* resources-world-size: nodes x ranks_per_node is world_size; either side
 * given alone sets the other. */
static void test_resources_world_size(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  const char *base = "{\"model_path\": \"m\", ";
  char text[512];
#define SPEC(rest) (snprintf(text, sizeof text, "%s%s}", base, rest), text)
  /* Defaults: one node, world_size ranks on it. */
  assert_int_equal(tu_check(&s, SPEC("\"world_size\": 3"), &e), 0);
  assert_int_equal(s.resources.nodes, 1);
  assert_int_equal(s.resources.ranks_per_node, 3);
  /* Both given and agreeing. */
  assert_int_equal(
      tu_check(&s, SPEC("\"world_size\": 4, \"resources\": {\"nodes\": 2, \"ranks_per_node\": 2}"),
               &e),
      0);
  /* ranks_per_node alone sets world_size. */
  assert_int_equal(tu_check(&s, SPEC("\"resources\": {\"nodes\": 2, \"ranks_per_node\": 3}"), &e),
                   0);
  assert_int_equal(s.world_size, 6);
  /* world_size alone spreads over the nodes. */
  assert_int_equal(tu_check(&s, SPEC("\"world_size\": 4, \"resources\": {\"nodes\": 2}"), &e), 0);
  assert_int_equal(s.resources.ranks_per_node, 2);
  /* ... with allocation_mode's degree too. */
  assert_int_equal(
      tu_check(&s, SPEC("\"allocation_mode\": \"fsdp:d2\", \"resources\": {\"nodes\": 2}"), &e), 0);
  assert_int_equal(s.resources.ranks_per_node, 1);
  /* Disagreeing. */
  assert_int_equal(
      tu_check(&s, SPEC("\"world_size\": 3, \"resources\": {\"nodes\": 2, \"ranks_per_node\": 2}"),
               &e),
      1);
  assert_true(
      tu_has(&e, "resources.ranks_per_node", "2 nodes x 2 ranks = 4 ranks, and world_size is 3"));
  /* Not spreading evenly. */
  assert_int_equal(tu_check(&s, SPEC("\"world_size\": 3, \"resources\": {\"nodes\": 2}"), &e), 1);
  assert_true(tu_has(&e, "resources.nodes", "does not spread evenly over 2 nodes"));
  /* shm reaches no other node. */
  assert_int_equal(tu_check(&s,
                            SPEC("\"device\": \"cpu\", \"dist\": {\"backend\": \"shm\"}, "
                                 "\"resources\": {\"nodes\": 2, \"ranks_per_node\": 1}"),
                            &e),
                   1);
  assert_true(tu_has(&e, "dist.backend", "asks for 2 nodes; use \"gloo\""));
  /* The normalized spec parses back to itself. */
  assert_int_equal(tu_check(&s, SPEC("\"resources\": {\"nodes\": 2, \"ranks_per_node\": 1}"), &e),
                   0);
  char *dump = jobspec_dumps(&s, false);
  jobspec_t back;
  assert_int_equal(tu_check(&back, dump, &e), 0);
  assert_true(jobspec_equal(&s, &back));
  assert_int_equal(back.world_size, 2);
  free(dump);
#undef SPEC
  ty_errlist_clear(&e);
}

/* nodes-dispatcher: more than one node only where the dispatcher reaches
 * other hosts; refused naming the dispatcher otherwise. */
static void test_nodes_dispatcher(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(
      tu_check(&s, "{\"model_path\": \"m\", \"resources\": {\"nodes\": 2, \"ranks_per_node\": 1}}",
               &e),
      0);
  assert_int_equal(jobspec_check_nodes(&s, "the local dispatcher", false, &e), TY_EINVAL);
  assert_true(
      tu_has(&e, "resources.nodes", "is 2, and the local dispatcher runs every rank on one host"));
  assert_true(tu_has(&e, "resources.nodes", "--dispatcher slurm"));
  ty_errlist_clear(&e);
  assert_int_equal(jobspec_check_nodes(&s, "slurm", true, &e), 0);
  assert_int_equal(tu_check(&s, "{\"model_path\": \"m\", \"world_size\": 4}", &e), 0);
  assert_int_equal(jobspec_check_nodes(&s, "the local dispatcher", false, &e), 0);
  assert_int_equal(e.len, 0);
}

/* qlora: a 4-bit base under adapters only, from a checkpoint, on CPU
 * ranks; the bnb_4bit_* options only with load_in_4bit. */
static void test_qlora(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"use_lora\": true, \"quantization\": "
                            "{\"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"fp4\", "
                            "\"bnb_4bit_use_double_quant\": true, \"bnb_4bit_compute_dtype\": "
                            "\"bf16\"}}",
                            &e),
                   0);
  assert_true(s.quantization.load_in_4bit && s.quantization.bnb_4bit_use_double_quant);
  assert_int_equal(s.quantization.bnb_4bit_quant_type, JOBSPEC_QUANT_FP4);
  assert_int_equal(s.quantization.bnb_4bit_compute_dtype, TY_DTYPE_BF16);
  assert_int_equal(
      tu_check(&s, "{\"model_path\": \"m\", \"quantization\": {\"load_in_4bit\": true}}", &e), 1);
  assert_true(tu_has(&e, "quantization.load_in_4bit", "needs use_lora: true"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"use_lora\": true, \"device\": \"cuda\", "
                            "\"quantization\": {\"load_in_4bit\": true}}",
                            &e),
                   1);
  assert_true(tu_has(&e, "quantization.load_in_4bit", "set device to \"cpu\""));
  ty_errlist_clear(&e);
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"quantization\": "
                            "{\"bnb_4bit_quant_type\": \"fp4\", \"bnb_4bit_compute_dtype\": "
                            "\"float16\"}}",
                            &e),
                   2);
  assert_true(tu_has(&e, "quantization.bnb_4bit_quant_type", "applies to a 4-bit base only"));
  assert_true(tu_has(&e, "quantization.bnb_4bit_compute_dtype", "applies to a 4-bit base only"));
  ty_errlist_clear(&e);
}

/* dpo: pairs of a JSONL file, not packed, their responses' tokens only,
 * on CPU ranks; its options and data.kind preference only with
 * train.objective dpo; a micro-batch of pairs is twice the rows. */
static void test_dpo(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"data\": {\"path\": \"p.jsonl\", \"format\": "
                            "\"jsonl\", \"kind\": \"preference\"}, \"train\": {\"objective\": "
                            "\"dpo\", \"micro_batch_size\": 3}, \"dpo\": {\"beta\": 0.5, "
                            "\"loss_type\": \"sigmoid\", \"label_smoothing\": 0.2}}",
                            &e),
                   0);
  assert_int_equal(s.train.objective, JOBSPEC_OBJECTIVE_DPO);
  assert_true(s.dpo.beta == 0.5 && s.dpo.label_smoothing == 0.2);
  assert_int_equal(jobspec_micro_batch_rows(&s), 6);
  assert_int_equal(tu_check(&s, "{\"model_path\": \"m\", \"train\": {\"micro_batch_size\": 3}}", &e),
                   0);
  assert_int_equal(jobspec_micro_batch_rows(&s), 3);
  /* Options of dpo without it; data.kind preference without it. */
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"data\": {\"format\": \"jsonl\", \"kind\": "
                            "\"preference\"}, \"dpo\": {\"beta\": 0.2, \"loss_type\": \"ipo\"}}",
                            &e),
                   3);
  assert_true(tu_has(&e, "dpo.beta", "applies to preference tuning only; set train.objective"));
  assert_true(tu_has(&e, "dpo.loss_type", "applies to preference tuning only"));
  assert_true(tu_has(&e, "data.kind", "applies to preference tuning only"));
  ty_errlist_clear(&e);
  /* A token file, packing (of a JSONL file only, too), smoothing of ipo;
   * GPU ranks train it too. */
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"device\": \"cuda\", \"train\": "
                            "{\"objective\": \"dpo\"}, \"dpo\": {\"loss_type\": \"ipo\", "
                            "\"label_smoothing\": 0.1}, \"data\": {\"packing\": true}}",
                            &e),
                   4);;
  assert_true(tu_has(&e, "data.format", "set data.format to jsonl"));
  assert_true(tu_has(&e, "data.packing", "set data.packing to false"));
  assert_true(tu_has(&e, "dpo.label_smoothing", "applies to dpo.loss_type sigmoid only"));
  ty_errlist_clear(&e);
  assert_int_equal(tu_check(&s,
                            "{\"model_path\": \"m\", \"train\": {\"objective\": \"dpo\"}, "
                            "\"data\": {\"format\": \"jsonl\", \"kind\": \"messages\", "
                            "\"loss_on\": \"all\"}, \"dpo\": {\"beta\": 0}}",
                            &e),
                   3);
  assert_true(tu_has(&e, "data.kind", "set data.kind to preference"));
  assert_true(tu_has(&e, "data.loss_on", "set data.loss_on to completion"));
  assert_true(tu_has(&e, "dpo.beta", "must be > 0"));
  ty_errlist_clear(&e);
  /* axolotl's rl and TRL's top-level names are answered with ours. */
  assert_true(tu_check(&s, "{\"model_path\": \"m\", \"rl\": \"dpo\", \"beta\": 0.1}", &e) >= 2);
  assert_true(tu_has(&e, "rl", "train.objective"));
  assert_true(tu_has(&e, "beta", "dpo.beta"));
  ty_errlist_clear(&e);
}

/* The host-memory rule over a 4-bit base: models/big's 134.2M projection
 * weights at 0.5 + 1/64 + 4/16384 bytes (double quantization) and 65.6M
 * others in float32, 0.309 GiB, beside one rank's activations of 4 x 128
 * tokens (0.416 GiB): worked out by hand, as test_host_memory's. */
static void test_host_memory_q4(void **state) {
  (void)state;
  char dir[600], path[700], text[1024];
  make_big_model("big4", dir, path);
  ty_errlist_t e = TY_ERRLIST_INIT;
  jobspec_t s;
  for (int q4 = 0; q4 < 2; q4++) {
    snprintf(text, sizeof text,
             "{\"model_path\": \"%s\", \"use_lora\": true, \"fsdp\": "
             "{\"memory_efficient_load\": true}, \"quantization\": {\"load_in_4bit\": %s%s}}",
             dir, q4 ? "true" : "false", q4 ? ", \"bnb_4bit_use_double_quant\": true" : "");
    assert_int_equal(tu_parse(&s, text, &e), 0);
    assert_int_equal(jobspec_validate(&s, false, &e), 0);
    /* float32: 0.744 + 0.416 = 1.16 GiB; 4 bits: 0.725 GiB. */
    assert_int_equal(jobspec_check_host_memory(&s, true, 1u << 30, "MemTotal", &e),
                     q4 ? 0 : TY_EINVAL);
    ty_errlist_clear(&e);
  }
  /* Half a GiB: one layer's activations (0.155 GiB) would fit. */
  assert_int_equal(jobspec_check_host_memory(&s, true, 1u << 29, "MemTotal", &e), TY_EINVAL);
  assert_true(
      tu_has(&e, "gradient_checkpointing", "at least 0.72 GiB in all on a host of 0.50 GiB"));
  ty_errlist_clear(&e);
  assert_int_equal(jobspec_check_host_memory(&s, true, 1u << 28, "MemTotal", &e), TY_EINVAL);
  assert_true(tu_has(&e, "model_path",
                     "needs at least 0.72 GiB of this host's memory for its weights in 4 bits (the "
                     "linear projections) and float32 over 1 rank and their activations"));
  ty_errlist_clear(&e);
  /* A load alone keeps the job's dtype: the 4-bit sizes are training's. */
  assert_int_equal(jobspec_check_host_memory(&s, false, 1u << 30, "MemTotal", &e), 0);
}

static void test_rule_table(void **state) {
  (void)state;
  int n = 0;
  jobspec_rules_each(count_rule, &n);
  assert_int_equal(n, 30);
  assert_string_equal(jobspec_rule_stage("qlora"), "spec");
  assert_string_equal(jobspec_rule_stage("dpo"), "spec");
  assert_string_equal(jobspec_rule_stage("sample-prompts"), "spec");
  assert_string_equal(jobspec_rule_stage("sample-tokenizer"), "paths");
  assert_string_equal(jobspec_rule_stage("resources-world-size"), "spec");
  assert_string_equal(jobspec_rule_stage("nodes-dispatcher"), "submit");
  assert_null(jobspec_rule_stage("no-such-rule"));
  assert_string_equal(jobspec_rule_stage("dist-backend-device"), "spec");
  assert_string_equal(jobspec_rule_stage("data-holds-a-batch"), "paths");
  assert_string_equal(jobspec_rule_stage("cuda-gpus"), "submit");
  assert_string_equal(jobspec_rule_stage("device-memory"), "submit");
  assert_string_equal(jobspec_rule_stage("output-dir-free"), "submit");
}

static void test_all_errors_at_once(void **state) {
  (void)state;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  size_t n = tu_check(&s,
                      "{\"init_from_scratch\": true, \"use_lora\": true, \"fsdp\": "
                      "{\"memory_efficient_load\": true}, \"world_size\": 0, "
                      "\"allocation_mode\": \"fsdp:d2t2\"}",
                      &e);
  assert_true(tu_has(&e, "fsdp.memory_efficient_load", "drop one"));
  assert_true(tu_has(&e, "use_lora", "init_from_scratch"));
  assert_true(tu_has(&e, "model", "is required"));
  assert_true(tu_has(&e, "world_size", ">= 1"));
  assert_true(tu_has(&e, "allocation_mode", "t2"));
  assert_int_equal(n, 5);
  ty_errlist_clear(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_name_safe),
      cmocka_unit_test(test_scratch_no_memory_efficient_load),
      cmocka_unit_test(test_model_path_required),
      cmocka_unit_test(test_model_iff_scratch),
      cmocka_unit_test(test_model_shape),
      cmocka_unit_test(test_scratch_no_lora),
      cmocka_unit_test(test_ranges),
      cmocka_unit_test(test_allocation_mode),
      cmocka_unit_test(test_allocation_world_size),
      cmocka_unit_test(test_lora_targets),
      cmocka_unit_test(test_warmup_within_steps),
      cmocka_unit_test(test_seq_len_within_model),
      cmocka_unit_test_setup_teardown(test_paths_exist, make_tmp, remove_tmp),
      cmocka_unit_test_setup_teardown(test_seq_len_within_checkpoint, make_tmp, remove_tmp),
      cmocka_unit_test_setup_teardown(test_data_holds_a_batch, make_tmp, remove_tmp),
      cmocka_unit_test_setup_teardown(test_host_memory, make_tmp, remove_tmp),
      cmocka_unit_test_setup_teardown(test_device_memory, make_tmp, remove_tmp),
      cmocka_unit_test_setup_teardown(test_output_not_model, make_tmp, remove_tmp),
      cmocka_unit_test_setup_teardown(test_paths_in_roots, make_tmp, remove_tmp),
      cmocka_unit_test_setup_teardown(test_resolve_path, make_tmp, remove_tmp),
      cmocka_unit_test(test_cuda_gpus),
      cmocka_unit_test(test_dist_backend),
      cmocka_unit_test(test_jsonl_options),
      cmocka_unit_test(test_merge_needs_lora),
      cmocka_unit_test(test_sample_prompts),
      cmocka_unit_test_setup_teardown(test_sample_tokenizer, make_tmp, remove_tmp),
      cmocka_unit_test(test_resources_world_size),
      cmocka_unit_test(test_nodes_dispatcher),
      cmocka_unit_test(test_qlora),
      cmocka_unit_test(test_dpo),
      cmocka_unit_test_setup_teardown(test_host_memory_q4, make_tmp, remove_tmp),
      cmocka_unit_test(test_rule_table),
      cmocka_unit_test(test_all_errors_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
