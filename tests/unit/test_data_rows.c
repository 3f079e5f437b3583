/* test_data_rows.c - tokenized examples on disk (worker/data/examples.c), their
 * rows with loss weights and document positions (worker/data/data_rows.c), and
 * data_open over them (format jsonl): truncation, padding, packing, the
 * held-out examples, the global count of counted targets, refusals. */
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
#include "worker/data/data.h"
#include "worker/data/data_rows.h"
#include "worker/data/examples.h"

static char g_dir[64], g_path[128];

static int setup(void **state) {
  (void)state;
  strcpy(g_dir, "/tmp/ty_test_rows_XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  snprintf(g_path, sizeof g_path, "%s/examples.bin", g_dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_path);
  rmdir(g_dir);
  return 0;
}

/* Writes examples: lens[i] tokens each, token k of example i has id
 * 10*i + k + 1, counted when k >= prompt[i]. */
static void write_examples(const size_t *lens, const size_t *prompt, size_t n, uint64_t key) {
  examples_writer_t *w;
  char err[256];
  assert_int_equal(examples_writer_open(&w, g_path, err, sizeof err), 0);
  for (size_t i = 0; i < n; i++) {
    uint32_t ids[64];
    uint8_t counted[64];
    for (size_t k = 0; k < lens[i]; k++)
      ids[k] = (uint32_t)(10 * i + k + 1), counted[k] = k >= prompt[i];
    assert_int_equal(examples_add(w, ids, counted, lens[i], err, sizeof err), 0);
  }
  assert_int_equal(examples_written(w), (int64_t)n);
  assert_int_equal(examples_commit(w, key, 1234, err, sizeof err), 0);
}

static void test_examples_round_trip(void **state) {
  (void)state;
  const size_t lens[] = {3, 0, 5}, prompt[] = {1, 0, 2};
  write_examples(lens, prompt, 3, 42);
  char part[160], err[256];
  snprintf(part, sizeof part, "%s.partial", g_path);
  assert_int_equal(access(part, F_OK), -1); /* renamed, nothing left */
  examples_t *x;
  assert_int_equal(examples_open(&x, g_path, 42, err, sizeof err), 0);
  assert_int_equal(examples_count(x), 3);
  assert_int_equal(examples_tokens(x), 8);
  size_t n;
  const uint32_t *t = examples_get(x, 2, &n);
  assert_int_equal(n, 5);
  assert_int_equal(t[0], 21);
  assert_int_equal(t[1], 22);
  assert_int_equal(t[2], 23 | EXAMPLES_COUNTED);
  examples_get(x, 1, &n);
  assert_int_equal(n, 0);
  examples_close(x);
  /* Another key: stale. */
  assert_int_equal(examples_open(&x, g_path, 43, err, sizeof err), TY_EPRECONDITION);
  /* A cut file: refused as not whole. */
  assert_int_equal(truncate(g_path, 64 + 4 * 8), 0); /* tokens, no offsets */
  assert_int_equal(examples_open(&x, g_path, 42, err, sizeof err), TY_EDATALOSS);
  assert_non_null(strstr(err, "not the 3 examples and 8 tokens its header names"));
  /* An aborted write leaves no file. */
  examples_writer_t *w;
  unlink(g_path);
  assert_int_equal(examples_writer_open(&w, g_path, err, sizeof err), 0);
  assert_int_equal(access(part, F_OK), 0);
  examples_abort(w);
  assert_int_equal(access(part, F_OK), -1);
  assert_int_equal(access(g_path, F_OK), -1);
  assert_int_equal(examples_open(&x, g_path, 42, err, sizeof err), TY_ENOTFOUND);
}

static void test_rows_one_example_a_row(void **state) {
  (void)state;
  /* T = 5: rows of 6 tokens. Example 0 (4 tokens, prompt 2), 1 (9 tokens:
   * cut), 2 (1 token: no target, left out), 3 (3 tokens, prompt 3: none
   * counted, left out). */
  const size_t lens[] = {4, 9, 1, 3}, prompt[] = {2, 1, 0, 3};
  write_examples(lens, prompt, 4, 7);
  examples_t *x;
  data_rows_t *r;
  char err[256];
  assert_int_equal(examples_open(&x, g_path, 7, err, sizeof err), 0);
  assert_int_equal(data_rows_build(&r, x, 0, 4, 5, false, false, err, sizeof err), 0);
  assert_int_equal(data_rows_count(r), 2);
  assert_int_equal(data_rows_truncated(r), 1);
  assert_int_equal(data_rows_skipped(r), 2);
  int32_t tok[6], pos[5];
  float w[5];
  data_rows_fill(r, 0, 99, tok, w, pos);
  const int32_t want_tok[] = {1, 2, 3, 4, 99, 99}, want_pos[] = {0, 1, 2, 3, 4};
  const float want_w[] = {0, 1, 1, 0, 0}; /* targets 2 (prompt), 3, 4; padding */
  assert_memory_equal(tok, want_tok, sizeof tok);
  assert_memory_equal(pos, want_pos, sizeof pos);
  assert_memory_equal(w, want_w, sizeof w);
  assert_int_equal(data_rows_counted(r, 0), 2);
  data_rows_fill(r, 1, 99, tok, w, pos);
  const int32_t want_tok1[] = {11, 12, 13, 14, 15, 16};
  const float want_w1[] = {1, 1, 1, 1, 1};
  assert_memory_equal(tok, want_tok1, sizeof tok);
  assert_memory_equal(w, want_w1, sizeof w);
  assert_int_equal(data_rows_counted(r, 1), 5);
  data_rows_free(r);
  examples_close(x);
}

/* Pairs: a pair is kept whole or left out whole (one side counting no
 * target), and packing never joins rows. */
static void test_rows_pairs(void **state) {
  (void)state;
  /* T = 5. Pairs (0, 1) kept, (2, 3) left out (3 counts nothing), (4, 5)
   * kept, its rejected side cut. */
  const size_t lens[] = {4, 3, 4, 3, 3, 9}, prompt[] = {2, 1, 1, 3, 1, 1};
  write_examples(lens, prompt, 6, 11);
  examples_t *x;
  data_rows_t *r;
  char err[256];
  assert_int_equal(examples_open(&x, g_path, 11, err, sizeof err), 0);
  assert_int_equal(data_rows_build(&r, x, 0, 6, 5, true, true, err, sizeof err), 0);
  assert_int_equal(data_rows_count(r), 4);
  assert_int_equal(data_rows_skipped(r), 2);
  assert_int_equal(data_rows_truncated(r), 1);
  int32_t tok[6], pos[5];
  float w[5];
  data_rows_fill(r, 2, 99, tok, w, pos); /* example 4 alone in its row */
  const int32_t want_tok[] = {41, 42, 43, 99, 99, 99};
  const float want_w[] = {1, 1, 0, 0, 0};
  assert_memory_equal(tok, want_tok, sizeof tok);
  assert_memory_equal(w, want_w, sizeof w);
  data_rows_fill(r, 3, 99, tok, w, pos);
  assert_int_equal(tok[0], 51);
  assert_int_equal(data_rows_counted(r, 3), 5);
  data_rows_free(r);
  examples_close(x);
}

static void test_rows_packed(void **state) {
  (void)state;
  /* T = 7: rows of 8. Examples of 3, 4, 2, 6 tokens (prompt 1 each): rows
   * {0, 1} (7 tokens + 1 pad), {2, 3} (8 tokens). */
  const size_t lens[] = {3, 4, 2, 6}, prompt[] = {1, 1, 1, 1};
  write_examples(lens, prompt, 4, 9);
  examples_t *x;
  data_rows_t *r;
  char err[256];
  assert_int_equal(examples_open(&x, g_path, 9, err, sizeof err), 0);
  assert_int_equal(data_rows_build(&r, x, 0, 4, 7, true, false, err, sizeof err), 0);
  assert_int_equal(data_rows_count(r), 2);
  int32_t tok[8], pos[7];
  float w[7];
  data_rows_fill(r, 0, 0, tok, w, pos);
  const int32_t want_tok[] = {1, 2, 3, 11, 12, 13, 14, 0};
  const int32_t want_pos[] = {0, 1, 2, 0, 1, 2, 3};
  /* The first token of example 1 (slot 3) is no target of example 0. */
  const float want_w[] = {1, 1, 0, 1, 1, 1, 0};
  assert_memory_equal(tok, want_tok, sizeof tok);
  assert_memory_equal(pos, want_pos, sizeof pos);
  assert_memory_equal(w, want_w, sizeof w);
  assert_int_equal(data_rows_counted(r, 0), 5);
  data_rows_fill(r, 1, 0, tok, w, pos);
  const int32_t want_pos1[] = {0, 1, 0, 1, 2, 3, 4};
  const float want_w1[] = {1, 0, 1, 1, 1, 1, 1};
  assert_memory_equal(pos, want_pos1, sizeof pos);
  assert_memory_equal(w, want_w1, sizeof w);
  data_rows_free(r);
  examples_close(x);
}

static data_config_t jsonl_config(int T, int world, int rank, int mbs, int accum) {
  data_config_t c = {.path = "train.jsonl",
                     .format = JOBSPEC_DATA_JSONL,
                     .vocab_size = 1000,
                     .seq_len = T,
                     .eval_fraction = 0.1,
                     .seed = 3,
                     .world_size = world,
                     .rank = rank,
                     .micro_batch_size = mbs,
                     .grad_accum = accum,
                     .examples_path = g_path,
                     .examples_key = 5,
                     .packing = false,
                     .pad_id = 0};
  return c;
}

static void test_jsonl_data(void **state) {
  (void)state;
  /* 20 examples of 2..9 tokens, prompts of 0 or 1 token. */
  size_t lens[20], prompt[20];
  for (int i = 0; i < 20; i++) lens[i] = 2 + (size_t)(i * 5 % 8), prompt[i] = (size_t)(i % 2);
  write_examples(lens, prompt, 20, 5);
  char msg[1024];
  data_t *d;
  /* 2 examples held out; 18 rows; 2 ranks x 2 x 2 = 8 a step. */
  data_config_t c = jsonl_config(6, 2, 0, 2, 2);
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  assert_true(data_masked(d));
  assert_int_equal(data_num_examples(d), 20);
  assert_int_equal(data_num_eval_windows(d), 2);
  assert_int_equal(data_num_train_windows(d), 18);
  assert_int_equal(data_num_truncated(d), 5); /* the examples of 8 and 9 tokens */
  /* The step's count is the sum over both ranks' micro-batches. */
  for (int64_t step = 0; step < 5; step++) {
    int64_t sum = 0;
    for (int rank = 0; rank < 2; rank++) {
      data_config_t cr = jsonl_config(6, 2, rank, 2, 2);
      data_t *dr;
      assert_int_equal(data_open(&dr, &cr, msg, sizeof msg), 0);
      for (int mb = 0; mb < 2; mb++) {
        int32_t tok[2 * 7], pos[2 * 6];
        float w[2 * 6];
        assert_int_equal(data_train_batch(dr, step, mb, tok, w, pos, msg, sizeof msg), 0);
        for (int i = 0; i < 12; i++) sum += w[i] != 0.0f;
      }
      data_free(dr);
    }
    assert_int_equal(data_step_count(d, step), sum);
    assert_true(sum > 0);
  }
  data_free(d);
  /* Too few rows for the batch: refused with the figures and the fixes. */
  c = jsonl_config(6, 4, 0, 4, 2);
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "data file train.jsonl holds 20 examples: 18 training rows"));
  assert_non_null(strstr(msg, "fewer than one global batch of 32 rows (world_size 4 x"));
  assert_non_null(strstr(msg, "or data.packing"));
  /* Packed, fewer rows: 18 examples of 2..9 tokens in rows of 7. */
  c = jsonl_config(6, 1, 0, 1, 1);
  c.packing = true;
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  assert_true(data_num_train_windows(d) < 18);
  data_free(d);
  /* A vocabulary the ids do not fit: the row is refused by name. */
  c = jsonl_config(6, 1, 0, 1, 1);
  c.vocab_size = 50;
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  int32_t tok[7], pos[6];
  float w[6];
  int rc = 0;
  for (int64_t s = 0; s < 18 && !rc; s++)
    rc = data_train_batch(d, s, 0, tok, w, pos, msg, sizeof msg);
  assert_int_equal(rc, TY_EINVAL);
  assert_non_null(strstr(msg, "is outside the vocabulary (vocab_size 50)"));
  data_free(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_examples_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rows_one_example_a_row, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rows_pairs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rows_packed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_jsonl_data, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
