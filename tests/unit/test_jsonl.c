/* test_jsonl.c - JSONL examples (worker/data/jsonl.c): kinds by key or forced,
 * each refusal by file and line; and their tokenization into an examples
 * file (worker/data/data_prepare.c) with a small hand-written tokenizer: which
 * tokens count for text, prompt/completion and chat examples, loss_on
 * all, the vocabulary check, the cache kept while nothing changed and
 * built anew when the data changes, nothing left of a refused file. */
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
#include "text/tokenizer.h"
#include "worker/data/data_prepare.h"
#include "worker/data/examples.h"
#include "worker/data/jsonl.h"

#include "tmpdir_testutil.h"

static int parse(const char *line, jobspec_data_kind_t want, jsonl_example_t *ex, char *err,
                 size_t errlen) {
  return jsonl_parse(line, strlen(line), want, "d.jsonl", 7, ex, err, errlen);
}

static void refused(const char *line, jobspec_data_kind_t want, const char *part) {
  jsonl_example_t ex;
  char err[512] = "";
  assert_int_equal(parse(line, want, &ex, err, sizeof err), TY_EINVAL);
  if (!strstr(err, part)) fail_msg("'%s': got \"%s\", wanted \"%s\"", line, err, part);
  assert_non_null(strstr(err, "d.jsonl line 7: "));
}

static void test_parse(void **state) {
  (void)state;
  jsonl_example_t ex;
  char err[512];
  assert_int_equal(parse("  \r", JOBSPEC_KIND_AUTO, &ex, err, sizeof err), 1);
  assert_int_equal(parse("{\"text\": \"hi\", \"id\": 3}", JOBSPEC_KIND_AUTO, &ex, err, sizeof err),
                   0);
  assert_int_equal(ex.kind, JOBSPEC_KIND_TEXT);
  assert_string_equal(ex.text, "hi");
  json_decref(ex.root);
  assert_int_equal(
      parse("{\"prompt\": \"p\", \"completion\": \"c\"}", JOBSPEC_KIND_AUTO, &ex, err, sizeof err),
      0);
  assert_int_equal(ex.kind, JOBSPEC_KIND_PROMPT_COMPLETION);
  assert_int_equal(ex.completion_len, 1);
  json_decref(ex.root);
  assert_int_equal(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
                         "\"assistant\", \"content\": \"b\"}], \"text\": \"x\"}",
                         JOBSPEC_KIND_AUTO, &ex, err, sizeof err),
                   0);
  assert_int_equal(ex.kind, JOBSPEC_KIND_MESSAGES);
  json_decref(ex.root);
  refused("{\"text\": \"a\"", JOBSPEC_KIND_AUTO, "not valid JSON at column");
  refused("[1, 2]", JOBSPEC_KIND_AUTO, "a JSON object is needed");
  refused("{\"id\": 1}", JOBSPEC_KIND_AUTO,
          "no \"text\", \"prompt\"/\"completion\" or \"messages\"");
  refused("{\"prompt\": \"p\"}", JOBSPEC_KIND_AUTO, "no \"completion\"");
  refused("{\"text\": 5}", JOBSPEC_KIND_AUTO, "\"text\" must be a string");
  refused("{\"text\": \"a\"}", JOBSPEC_KIND_MESSAGES, "no \"messages\"; data.kind is messages");
  refused("{\"messages\": []}", JOBSPEC_KIND_AUTO, "must be a non-empty list");
  refused("{\"messages\": [{\"role\": \"bot\", \"content\": \"a\"}]}", JOBSPEC_KIND_AUTO,
          "\"messages\"[0] has role \"bot\"; roles are system, user and assistant");
  refused("{\"messages\": [{\"role\": \"user\"}]}", JOBSPEC_KIND_AUTO,
          "\"messages\"[0] (user) has no string \"content\"");
  refused("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", JOBSPEC_KIND_AUTO,
          "no assistant turn");
  refused("{\"a\": 1, \"a\": 2}", JOBSPEC_KIND_AUTO, "duplicate");
}

/* A tokenizer of single characters: each printable ASCII character and
 * "\n" its own code as id, then <s> 200, </s> 201, <|im_start|> 202,
 * <|im_end|> 203; BOS added by tokenizer_config.json. */
static void write_tokenizer(void) {
  char path[512], vocab[8192] = "";
  size_t n = 0;
  n += (size_t)snprintf(vocab + n, sizeof vocab - n, "\"\\n\": 10");
  for (int c = 32; c < 127; c++) {
    if (c == '"' || c == '\\')
      n += (size_t)snprintf(vocab + n, sizeof vocab - n, ", \"\\%c\": %d", c, c);
    else
      n += (size_t)snprintf(vocab + n, sizeof vocab - n, ", \"%c\": %d", c, c);
  }
  const char *specials[] = {"<s>", "</s>", "<|im_start|>", "<|im_end|>"};
  char added[1024] = "";
  size_t m = 0;
  for (int i = 0; i < 4; i++) {
    n += (size_t)snprintf(vocab + n, sizeof vocab - n, ", \"%s\": %d", specials[i], 200 + i);
    m += (size_t)snprintf(added + m, sizeof added - m,
                          "%s{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": "
                          "false, \"rstrip\": false, \"normalized\": false, \"special\": true}",
                          i ? ", " : "", 200 + i, specials[i]);
  }
  snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
  FILE *f = fopen(path, "w");
  fprintf(f,
          "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [%s], "
          "\"normalizer\": null, \"pre_tokenizer\": null, \"post_processor\": null, \"decoder\": "
          "null, \"model\": {\"type\": \"BPE\", \"vocab\": {%s}, \"merges\": []}}",
          added, vocab);
  fclose(f);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", g_dir);
  f = fopen(path, "w");
  fprintf(f, "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_bos_token\": true}");
  fclose(f);
}

static void write_data(const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/d.jsonl", g_dir);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

static bool g_pairs; /* prepare's data_prepare_t.pairs */

static int prepare(jobspec_data_kind_t kind, jobspec_loss_on_t on, int64_t vocab,
                   data_prepared_t *out, char *err, size_t errlen) {
  char path[512], cache[512];
  snprintf(path, sizeof path, "%s/d.jsonl", g_dir);
  snprintf(cache, sizeof cache, "%s/cache", g_dir);
  const data_prepare_t p = {.path = path,
                            .tokenizer = g_dir,
                            .kind = kind,
                            .chat_template = "chatml",
                            .loss_on = on,
                            .vocab_size = vocab,
                            .pairs = g_pairs};
  return data_prepare(&p, cache, NULL, NULL, out, err, errlen);
}

/* Example e's tokens as text, counted ones in [brackets]. */
static void expect_example(const examples_t *x, int64_t e, const char *want) {
  size_t n;
  const uint32_t *t = examples_get(x, e, &n);
  char got[1024] = "";
  size_t g = 0;
  bool in = false;
  for (size_t i = 0; i < n; i++) {
    const bool c = (t[i] & EXAMPLES_COUNTED) != 0;
    const uint32_t id = t[i] & EXAMPLES_ID_MAX;
    if (c != in) got[g++] = c ? '[' : ']', in = c;
    static const char *const sp[] = {"<s>", "</s>", "<S>", "<E>"};
    if (id >= 200)
      g += (size_t)snprintf(got + g, sizeof got - g, "%s", sp[id - 200]);
    else
      got[g++] = id == 10 ? '/' : (char)id;
  }
  if (in) got[g++] = ']';
  got[g] = '\0';
  if (strcmp(got, want)) fail_msg("example %lld: %s, wanted %s", (long long)e, got, want);
}

static void test_prepare(void **state) {
  (void)state;
  write_tokenizer();
  write_data(
      "{\"text\": \"ab\"}\n"
      "\n"
      "{\"prompt\": \"q?\", \"completion\": \"a.\"}\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
      "\"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}, {\"role\": "
      "\"user\", \"content\": \"ok\"}, {\"role\": \"assistant\", \"content\": \"k\"}]}\n");
  data_prepared_t out;
  char err[1024];
  assert_int_equal(
      prepare(JOBSPEC_KIND_AUTO, JOBSPEC_LOSS_ON_COMPLETION, 256, &out, err, sizeof err), 0);
  assert_int_equal(out.examples, 3);
  assert_int_equal(out.pad_id, 201);
  examples_t *x;
  assert_int_equal(examples_open(&x, out.path, out.key, err, sizeof err), 0);
  expect_example(x, 0, "[<s>ab]");
  expect_example(x, 1, "<s>q?[a.</s>]");
  /* ChatML: each assistant turn's content, <|im_end|> and its newline. */
  expect_example(x, 2,
                 "<S>system/s<E>/<S>user/hi<E>/<S>assistant/[yo<E>/]<S>user/ok<E>/"
                 "<S>assistant/[k<E>/]");
  examples_close(x);
  /* Nothing changed: the same file, not built again. */
  struct stat a, b;
  assert_int_equal(stat(out.path, &a), 0);
  data_prepared_t again;
  assert_int_equal(
      prepare(JOBSPEC_KIND_AUTO, JOBSPEC_LOSS_ON_COMPLETION, 256, &again, err, sizeof err), 0);
  assert_string_equal(again.path, out.path);
  assert_int_equal(stat(again.path, &b), 0);
  assert_int_equal(a.st_ino, b.st_ino);
  /* loss_on all: another file where every token counts. */
  assert_int_equal(prepare(JOBSPEC_KIND_AUTO, JOBSPEC_LOSS_ON_ALL, 256, &again, err, sizeof err),
                   0);
  assert_string_not_equal(again.path, out.path);
  assert_int_equal(examples_open(&x, again.path, again.key, err, sizeof err), 0);
  expect_example(x, 1, "[<s>q?a.</s>]");
  examples_close(x);
  /* A tokenizer larger than the model's vocabulary. */
  assert_int_equal(
      prepare(JOBSPEC_KIND_AUTO, JOBSPEC_LOSS_ON_COMPLETION, 100, &again, err, sizeof err),
      TY_EINVAL);
  assert_non_null(strstr(err, "has 204 tokens, more than the model's vocab_size 100"));
}

static void test_prepare_refused(void **state) {
  (void)state;
  write_tokenizer();
  write_data(
      "{\"text\": \"ab\"}\n{\"text\": \"cd\"}\n{\"messages\": [{\"role\": \"user\", "
      "\"content\": \"a\"}, {\"role\": \"robot\", \"content\": \"b\"}]}\n");
  data_prepared_t out;
  char err[1024];
  assert_int_equal(
      prepare(JOBSPEC_KIND_AUTO, JOBSPEC_LOSS_ON_COMPLETION, 256, &out, err, sizeof err),
      TY_EINVAL);
  assert_non_null(strstr(err, "d.jsonl line 3: \"messages\"[1] has role \"robot\""));
  /* Nothing of it stays: no examples file, no part, no lock. */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/cache')\"", g_dir);
  assert_int_equal(system(cmd), 0);
  /* Forced kind text: a prompt/completion line lacks "text". */
  write_data("{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  assert_int_equal(
      prepare(JOBSPEC_KIND_TEXT, JOBSPEC_LOSS_ON_COMPLETION, 256, &out, err, sizeof err),
      TY_EINVAL);
  assert_non_null(strstr(err, "d.jsonl line 1: no \"text\""));
}

/* Preference pairs: the three forms by their keys, each refusal. */
static void test_parse_pairs(void **state) {
  (void)state;
  jsonl_example_t ex;
  char err[512];
  assert_int_equal(parse("{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": \"rr\"}",
                         JOBSPEC_KIND_AUTO, &ex, err, sizeof err),
                   0);
  assert_int_equal(ex.kind, JOBSPEC_KIND_PREFERENCE);
  assert_false(ex.conv_form);
  assert_string_equal(ex.side[1], "rr");
  json_decref(ex.root);
  /* TRL's conversational form: the prompt's turns, then each side's. */
  assert_int_equal(parse("{\"prompt\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": "
                         "\"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", "
                         "\"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", "
                         "\"content\": \"b\"}]}",
                         JOBSPEC_KIND_PREFERENCE, &ex, err, sizeof err),
                   0);
  assert_true(ex.conv_form);
  assert_int_equal(ex.prompt_turns, 2);
  assert_int_equal(json_array_size(ex.conv[0]), 3);
  json_decref(ex.root);
  /* Without "prompt": the shared leading turns. */
  assert_int_equal(parse("{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
                         "\"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": "
                         "\"more\"}, {\"role\": \"assistant\", \"content\": \"a2\"}], "
                         "\"rejected\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
                         "\"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": "
                         "\"more\"}, {\"role\": \"assistant\", \"content\": \"b2\"}]}",
                         JOBSPEC_KIND_AUTO, &ex, err, sizeof err),
                   0);
  assert_int_equal(ex.prompt_turns, 3);
  json_decref(ex.root);
  refused("{\"prompt\": \"p\", \"chosen\": \"c\"}", JOBSPEC_KIND_AUTO, "no \"rejected\"");
  refused("{\"prompt\": \"p\", \"rejected\": \"c\"}", JOBSPEC_KIND_PREFERENCE, "no \"chosen\"");
  refused("{\"text\": \"t\"}", JOBSPEC_KIND_PREFERENCE, "no \"chosen\"");
  refused("{\"chosen\": \"c\", \"rejected\": \"r\"}", JOBSPEC_KIND_AUTO, "no \"prompt\"");
  refused("{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": [{\"role\": \"assistant\", "
          "\"content\": \"b\"}]}",
          JOBSPEC_KIND_AUTO, "\"rejected\" must be a string like \"chosen\"");
  refused("{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
          "\"content\": \"a\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"r\"}, "
          "{\"role\": \"assistant\", \"content\": \"b\"}]}",
          JOBSPEC_KIND_AUTO, "share no first turn");
  refused("{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}], \"rejected\": [{\"role\": "
          "\"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}",
          JOBSPEC_KIND_AUTO, "\"chosen\" is the other side's first turns with nothing after");
  refused("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
          "\"content\": \"x\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
          "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
          JOBSPEC_KIND_AUTO, "the prompt's last turn is the assistant's; roles are out of order");
  refused("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": "
          "\"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"user\", "
          "\"content\": \"b\"}, {\"role\": \"assistant\", \"content\": \"c\"}]}",
          JOBSPEC_KIND_AUTO, "the \"rejected\" response's first turn is the user's");
  refused("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"system\", "
          "\"content\": \"s\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
          "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
          JOBSPEC_KIND_AUTO, "a system turn after the first turn");
  refused("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": "
          "\"bot\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": "
          "\"b\"}]}",
          JOBSPEC_KIND_AUTO, "has role \"bot\"");
}

/* A pair is two examples, the prompt's tokens never counted; without
 * pairs (train.objective sft) a pair is refused. */
static void test_prepare_pairs(void **state) {
  (void)state;
  write_tokenizer();
  write_data("{\"prompt\": \"q?\", \"chosen\": \"a.\", \"rejected\": \"b\"}\n"
             "{\"chosen\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
             "\"content\": \"yo\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"hi\"}, "
             "{\"role\": \"assistant\", \"content\": \"k\"}]}\n");
  data_prepared_t out;
  char err[1024];
  assert_int_equal(
      prepare(JOBSPEC_KIND_AUTO, JOBSPEC_LOSS_ON_COMPLETION, 256, &out, err, sizeof err),
      TY_EINVAL);
  assert_non_null(strstr(err, "d.jsonl line 1: a preference pair"));
  g_pairs = true;
  assert_int_equal(
      prepare(JOBSPEC_KIND_AUTO, JOBSPEC_LOSS_ON_COMPLETION, 256, &out, err, sizeof err), 0);
  g_pairs = false;
  assert_int_equal(out.examples, 4);
  examples_t *x;
  assert_int_equal(examples_open(&x, out.path, out.key, err, sizeof err), 0);
  expect_example(x, 0, "<s>q?[a.</s>]");
  expect_example(x, 1, "<s>q?[b</s>]");
  /* ChatML's template adds its default system turn: part of the prompt. */
  expect_example(x, 2,
                 "<S>system/You are a helpful assistant.<E>/<S>user/hi<E>/<S>assistant/[yo<E>/]");
  expect_example(x, 3,
                 "<S>system/You are a helpful assistant.<E>/<S>user/hi<E>/<S>assistant/[k<E>/]");
  examples_close(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_parse_pairs),
      cmocka_unit_test_setup_teardown(test_prepare_pairs, tmpdir_setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_prepare, tmpdir_setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_prepare_refused, tmpdir_setup, tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
