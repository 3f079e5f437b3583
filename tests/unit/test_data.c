/* test_data.c - token windows: formats, vocabulary checks, the held-out
 * tail, seeded shuffling, disjoint per-rank micro-batches, resume checks. */
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
#include "worker/data/data.h"

static char g_path[64];

/* Writes n bytes to a fresh temporary file named in g_path. */
static void write_file(const void *bytes, size_t n) {
  strcpy(g_path, "/tmp/ty_test_data_XXXXXX");
  int fd = mkstemp(g_path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bytes, n), (ssize_t)n);
  close(fd);
}

static data_config_t config(jobspec_data_format_t f, int64_t vocab, int T) {
  data_config_t c = {.path = g_path,
                     .format = f,
                     .vocab_size = vocab,
                     .seq_len = T,
                     .eval_fraction = 0,
                     .seed = 1,
                     .world_size = 1,
                     .rank = 0,
                     .micro_batch_size = 1,
                     .grad_accum = 1};
  return c;
}

static void test_text_layout(void **state) {
  (void)state;
  char text[101];
  for (int i = 0; i < 101; i++) text[i] = (char)(i * 7 % 251);
  write_file(text, 101);
  data_config_t c = config(JOBSPEC_DATA_TEXT, 256, 10);
  c.eval_fraction = 0.2;
  data_t *d;
  char msg[512];
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  /* 101 tokens: W = 10 windows of 11; 2 held out at E = 101 - 21 = 80;
   * training windows must end before token 80: (80-1)/10 = 7. */
  assert_int_equal(data_num_tokens(d), 101);
  assert_int_equal(data_num_eval_windows(d), 2);
  assert_int_equal(data_num_train_windows(d), 7);
  int32_t w[11], want[11];
  assert_int_equal(data_eval_window(d, 1, w, msg, sizeof msg), 0);
  data_text_tokens(text + 90, 11, want);
  assert_memory_equal(w, want, sizeof w);
  assert_int_equal(data_eval_window(d, 2, w, msg, sizeof msg), TY_ERANGE);
  assert_int_equal(data_read_window(d, 3, w, msg, sizeof msg), 0);
  data_text_tokens(text + 3, 11, want);
  assert_memory_equal(w, want, sizeof w);
  /* Every training window lies before the evaluation tail. */
  for (int s = 0; s < 7; s++) {
    assert_int_equal(data_train_micro_batch(d, s, 0, w, msg, sizeof msg), 0);
    const char *at = memchr(text, (char)w[0], 80);
    assert_non_null(at);
    assert_true((at - text) % 10 == 0 && (at - text) + 10 < 80);
  }
  data_free(d);
  unlink(g_path);
}

static void test_text_needs_byte_vocab(void **state) {
  (void)state;
  write_file("hello world", 11);
  data_config_t c = config(JOBSPEC_DATA_TEXT, 100, 4);
  data_t *d;
  char msg[512];
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "vocab_size >= 256"));
  assert_null(d);
  unlink(g_path);
}

static void test_u16_u32_and_vocab_offsets(void **state) {
  (void)state;
  uint8_t b[40];
  for (int i = 0; i < 20; i++) b[2 * i] = (uint8_t)i, b[2 * i + 1] = (uint8_t)(i == 13);
  write_file(b, 40); /* u16: token 13 is 256 + 13 = 269 */
  data_config_t c = config(JOBSPEC_DATA_U16, 300, 4);
  data_t *d;
  char msg[512];
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  int32_t w[5];
  assert_int_equal(data_read_window(d, 12, w, msg, sizeof msg), 0);
  assert_int_equal(w[1], 269);
  data_free(d);
  c.vocab_size = 200;
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  assert_int_equal(data_read_window(d, 10, w, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "token id 269 at byte offset 26"));
  data_free(d);
  /* The same bytes as u32: 10 tokens, little-endian. */
  c = config(JOBSPEC_DATA_U32, 1 << 30, 4);
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  assert_int_equal(data_num_tokens(d), 10);
  assert_int_equal(data_read_window(d, 5, w, msg, sizeof msg), 0);
  assert_int_equal(w[1], 12 | (13 | 1 << 8) << 16); /* bytes 24..27 */
  data_free(d);
  unlink(g_path);
  /* An odd number of bytes is not u16. */
  write_file(b, 39);
  c = config(JOBSPEC_DATA_U16, 300, 4);
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "partial token"));
  unlink(g_path);
}

static void test_too_small(void **state) {
  (void)state;
  write_file("0123456789", 10);
  data_config_t c = config(JOBSPEC_DATA_TEXT, 256, 3);
  c.micro_batch_size = 2;
  c.world_size = 2;
  data_t *d;
  char msg[512];
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "fewer than one global batch of 4"));
  c.path = "/nonexistent/data.txt";
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), TY_ENOTFOUND);
  unlink(g_path);
}

/* u32 file whose token i is i: a window is named by its first token. */
static void make_counting_file(int n) {
  uint32_t *t = malloc((size_t)n * 4);
  for (int i = 0; i < n; i++) t[i] = (uint32_t)i;
  write_file(t, (size_t)n * 4);
  free(t);
}

static void test_shuffle_covers_epoch_and_is_seeded(void **state) {
  (void)state;
  make_counting_file(1 + 64 * 4); /* 64 windows of T = 4 */
  data_config_t c = config(JOBSPEC_DATA_U32, 1000, 4);
  c.micro_batch_size = 4;
  c.grad_accum = 2; /* G = 8: an epoch is 8 steps */
  data_t *d, *d2;
  char msg[512];
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  c.seed = 2;
  assert_int_equal(data_open(&d2, &c, msg, sizeof msg), 0);
  int seen[64] = {0}, in_order = 0, differs = 0;
  int32_t w[4 * 5], w2[4 * 5];
  for (int s = 0; s < 8; s++)
    for (int a = 0; a < 2; a++) {
      assert_int_equal(data_train_micro_batch(d, s, a, w, msg, sizeof msg), 0);
      assert_int_equal(data_train_micro_batch(d2, s, a, w2, msg, sizeof msg), 0);
      for (int b = 0; b < 4; b++) {
        assert_int_equal(w[b * 5] % 4, 0);
        assert_int_equal(w[b * 5 + 4], w[b * 5] + 4);
        seen[w[b * 5] / 4]++;
        in_order += w[b * 5] / 4 == (s * 8 + a * 4 + b);
        differs += w[b * 5] != w2[b * 5];
      }
    }
  for (int i = 0; i < 64; i++) assert_int_equal(seen[i], 1);
  assert_true(in_order < 16);
  assert_true(differs > 32);
  /* Same seed, same step: the same windows, in any call order (resume). */
  assert_int_equal(data_train_micro_batch(d, 3, 1, w, msg, sizeof msg), 0);
  data_t *d3;
  c.seed = 1;
  assert_int_equal(data_open(&d3, &c, msg, sizeof msg), 0);
  assert_int_equal(data_train_micro_batch(d3, 3, 1, w2, msg, sizeof msg), 0);
  assert_memory_equal(w, w2, sizeof w);
  /* The next epoch is a different order of the same windows. */
  assert_int_equal(data_train_micro_batch(d3, 8, 0, w2, msg, sizeof msg), 0);
  assert_int_equal(data_train_micro_batch(d3, 0, 0, w, msg, sizeof msg), 0);
  assert_memory_not_equal(w, w2, sizeof w);
  data_free(d);
  data_free(d2);
  data_free(d3);
  unlink(g_path);
}

/* world 2 x mbs 2 x accum 1 and world 1 x mbs 2 x accum 2 draw the same
 * global batch; the two ranks' windows are disjoint. */
static void test_ranks_disjoint(void **state) {
  (void)state;
  make_counting_file(1 + 40 * 4);
  data_config_t c = config(JOBSPEC_DATA_U32, 1000, 4);
  c.micro_batch_size = 2;
  c.world_size = 2;
  data_t *r0, *r1, *one;
  char msg[512];
  c.rank = 0;
  assert_int_equal(data_open(&r0, &c, msg, sizeof msg), 0);
  c.rank = 1;
  assert_int_equal(data_open(&r1, &c, msg, sizeof msg), 0);
  c.rank = 0;
  c.world_size = 1;
  c.grad_accum = 2;
  assert_int_equal(data_open(&one, &c, msg, sizeof msg), 0);
  assert_int_equal(data_global_batch(r0), 4);
  assert_int_equal(data_global_batch(one), 4);
  for (int s = 0; s < 12; s++) {
    int32_t a[10], b[10], x[10], y[10];
    assert_int_equal(data_train_micro_batch(r0, s, 0, a, msg, sizeof msg), 0);
    assert_int_equal(data_train_micro_batch(r1, s, 0, b, msg, sizeof msg), 0);
    assert_int_equal(data_train_micro_batch(one, s, 0, x, msg, sizeof msg), 0);
    assert_int_equal(data_train_micro_batch(one, s, 1, y, msg, sizeof msg), 0);
    assert_memory_equal(a, x, sizeof a);
    assert_memory_equal(b, y, sizeof b);
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++) assert_int_not_equal(a[i * 5], b[j * 5]);
  }
  data_free(r0);
  data_free(r1);
  data_free(one);
  unlink(g_path);
}

static void test_position_check(void **state) {
  (void)state;
  make_counting_file(1 + 40 * 4);
  data_config_t c = config(JOBSPEC_DATA_U32, 1000, 4);
  data_t *d, *d2;
  char msg[512];
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  data_position_t pos;
  data_position_at(d, 17, &pos);
  assert_int_equal(pos.step, 17);
  assert_int_equal(data_position_check(d, &pos, msg, sizeof msg), 0);
  c.micro_batch_size = 2;
  assert_int_equal(data_open(&d2, &c, msg, sizeof msg), 0);
  assert_int_equal(data_position_check(d2, &pos, msg, sizeof msg), TY_EPRECONDITION);
  assert_non_null(strstr(msg, "global batch"));
  pos.seed = 99;
  assert_int_equal(data_position_check(d, &pos, msg, sizeof msg), TY_EPRECONDITION);
  assert_non_null(strstr(msg, "train.seed was 99"));
  data_free(d);
  data_free(d2);
  unlink(g_path);
}

/* No path: the built-in corpus, u32 ids of generated words below 64. */
static void test_builtin_corpus(void **state) {
  (void)state;
  data_config_t c = config(JOBSPEC_DATA_TEXT, 300, 16);
  c.path = "";
  c.eval_fraction = 0.1;
  data_t *d, *d2;
  char msg[512];
  assert_int_equal(data_open(&d, &c, msg, sizeof msg), 0);
  assert_int_equal(data_open(&d2, &c, msg, sizeof msg), 0);
  assert_int_equal(data_num_tokens(d), 1 << 20);
  assert_true(data_num_eval_windows(d) > 0);
  int32_t w[17], w2[17];
  int zeros = 0;
  for (int s = 0; s < 50; s++) {
    assert_int_equal(data_train_micro_batch(d, s, 0, w, msg, sizeof msg), 0);
    assert_int_equal(data_train_micro_batch(d2, s, 0, w2, msg, sizeof msg), 0);
    assert_memory_equal(w, w2, sizeof w);
    for (int i = 0; i < 17; i++) assert_true(w[i] >= 0 && w[i] < 64), zeros += w[i] == 0;
  }
  assert_true(zeros > 50 && zeros < 17 * 50 / 2);
  data_free(d);
  data_free(d2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_layout),
      cmocka_unit_test(test_text_needs_byte_vocab),
      cmocka_unit_test(test_u16_u32_and_vocab_offsets),
      cmocka_unit_test(test_too_small),
      cmocka_unit_test(test_shuffle_covers_epoch_and_is_seeded),
      cmocka_unit_test(test_ranks_disjoint),
      cmocka_unit_test(test_position_check),
      cmocka_unit_test(test_builtin_corpus),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
