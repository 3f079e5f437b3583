/* test_tb_events.c - TensorBoard event files and metrics.jsonl
 * (worker/rank/tb_events.c, worker/rank/run_metrics.c): CRC-32C against published
 * check values, the TFRecord framing byte by byte, and files read back
 * record by record (every CRC checked, every event decoded with protobuf-c);
 * values that are not finite left out; a folder that cannot be created
 * named in the error. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/errors.h"
#include "tensorboard.pb-c.h"
#include "tests/unit/tmpdir_testutil.h"
#include "worker/rank/run_metrics.h"
#include "worker/rank/tb_events.h"

static void test_crc32c_check_values(void **state) {
  (void)state;
  /* The standard check value of CRC-32C, and RFC 3720's (iSCSI) vectors. */
  assert_int_equal(tb_crc32c("123456789", 9), 0xE3069283u);
  uint8_t zeros[32] = {0}, ones[32];
  memset(ones, 0xFF, sizeof ones);
  assert_int_equal(tb_crc32c(zeros, 32), 0x8A9136AAu);
  assert_int_equal(tb_crc32c(ones, 32), 0x62A8AB43u);
  assert_int_equal(tb_crc32c("", 0), 0u);
  uint32_t c = tb_crc32c("123456789", 9);
  assert_int_equal(tb_masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void test_record_frame(void **state) {
  (void)state;
  uint8_t out[3 + 16];
  assert_int_equal(tb_record_frame("abc", 3, out), 19);
  assert_int_equal(out[0], 3);
  for (int i = 1; i < 8; i++) assert_int_equal(out[i], 0);
  assert_int_equal(le32(out + 8), tb_masked_crc32c(out, 8));
  assert_memory_equal(out + 12, "abc", 3);
  assert_int_equal(le32(out + 15), tb_masked_crc32c("abc", 3));
}

/* Reads the one events.out.tfevents.* file of dir: every record's CRCs
 * checked, each event decoded; returns the count, events in ev[]. */
static int read_events(const char *dir, Tensorboard__Event **ev, int max) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  char path[600] = "";
  int files = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      files++;
    }
  closedir(d);
  assert_int_equal(files, 1);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  int n = 0;
  uint8_t head[12];
  while (fread(head, 1, 12, f) == 12) {
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)head[i] << (8 * i);
    assert_int_equal(le32(head + 8), tb_masked_crc32c(head, 8));
    uint8_t *data = malloc(len + 4);
    assert_int_equal(fread(data, 1, len + 4, f), len + 4);
    assert_int_equal(le32(data + len), tb_masked_crc32c(data, len));
    assert_true(n < max);
    ev[n] = tensorboard__event__unpack(NULL, len, data);
    assert_non_null(ev[n]);
    n++;
    free(data);
  }
  assert_true(feof(f));
  fclose(f);
  return n;
}

static void test_events_read_back(void **state) {
  (void)state;
  char dir[300], err[512];
  snprintf(dir, sizeof dir, "%s/tb/deeper", g_dir);
  tb_events_t *w;
  assert_int_equal(tb_events_open(&w, dir, 1700000000.5, err, sizeof err), 0);
  tb_scalar_t v[] = {{"train/loss", 2.5}, {"eval/loss", NAN}, {"train/lr", 3e-4}};
  assert_int_equal(tb_events_write(w, 7, 1700000001.25, v, 3, err, sizeof err), 0);
  tb_scalar_t none[] = {{"x", INFINITY}};
  assert_int_equal(tb_events_write(w, 8, 1700000002.0, none, 1, err, sizeof err), 0);
  tb_events_close(w);

  Tensorboard__Event *ev[8];
  int n = read_events(dir, ev, 8);
  assert_int_equal(n, 2); /* the all-NaN step wrote nothing */
  assert_int_equal(ev[0]->what_case, TENSORBOARD__EVENT__WHAT_FILE_VERSION);
  assert_string_equal(ev[0]->file_version, "brain.Event:2");
  assert_true(ev[0]->wall_time == 1700000000.5);
  assert_int_equal(ev[1]->what_case, TENSORBOARD__EVENT__WHAT_SUMMARY);
  assert_int_equal(ev[1]->step, 7);
  assert_true(ev[1]->wall_time == 1700000001.25);
  assert_int_equal(ev[1]->summary->n_value, 2);
  assert_string_equal(ev[1]->summary->value[0]->tag, "train/loss");
  assert_true(ev[1]->summary->value[0]->simple_value == 2.5f);
  assert_string_equal(ev[1]->summary->value[1]->tag, "train/lr");
  assert_true(ev[1]->summary->value[1]->simple_value == 3e-4f);
  for (int i = 0; i < n; i++) tensorboard__event__free_unpacked(ev[i], NULL);
}

static void test_run_metrics(void **state) {
  (void)state;
  char dir[300], err[512], path[400];
  snprintf(dir, sizeof dir, "%s/run", g_dir);
  run_metrics_t *m;
  assert_int_equal(run_metrics_open(&m, dir, err, sizeof err), 0);
  run_point_t p = run_point_empty(0);
  p.eval_loss = 5.25;
  assert_int_equal(run_metrics_write(m, &p, err, sizeof err), 0);
  p = run_point_empty(1);
  p.loss = 5.5, p.lr = 0.001, p.grad_norm = 1.5, p.tokens_per_s = 1000;
  p.host_peak_bytes = 123456789, p.device_peak_bytes = 0;
  assert_int_equal(run_metrics_write(m, &p, err, sizeof err), 0);
  run_metrics_close(m);

  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1024];
  assert_non_null(fgets(line, sizeof line, f));
  json_t *o = json_loads(line, 0, NULL);
  assert_non_null(o);
  assert_int_equal(json_integer_value(json_object_get(o, "step")), 0);
  assert_true(json_real_value(json_object_get(o, "eval_loss")) == 5.25);
  assert_null(json_object_get(o, "loss"));
  json_decref(o);
  assert_non_null(fgets(line, sizeof line, f));
  o = json_loads(line, 0, NULL);
  assert_int_equal(json_integer_value(json_object_get(o, "step")), 1);
  assert_true(json_real_value(json_object_get(o, "loss")) == 5.5);
  assert_true(json_real_value(json_object_get(o, "grad_norm")) == 1.5);
  assert_int_equal(json_integer_value(json_object_get(o, "host_peak_bytes")), 123456789);
  assert_true(json_is_integer(json_object_get(o, "device_peak_bytes")));
  assert_true(json_number_value(json_object_get(o, "time")) > 1.6e9);
  json_decref(o);
  assert_null(fgets(line, sizeof line, f));
  fclose(f);

  snprintf(path, sizeof path, "%s/tensorboard", dir);
  Tensorboard__Event *ev[8];
  int n = read_events(path, ev, 8);
  assert_int_equal(n, 3);
  assert_int_equal(ev[1]->step, 0);
  assert_int_equal(ev[1]->summary->n_value, 1);
  assert_string_equal(ev[1]->summary->value[0]->tag, "eval/loss");
  assert_int_equal(ev[2]->step, 1);
  assert_int_equal(ev[2]->summary->n_value, 6);
  assert_string_equal(ev[2]->summary->value[0]->tag, "train/loss");
  assert_string_equal(ev[2]->summary->value[5]->tag, "memory/device_peak_bytes");
  for (int i = 0; i < n; i++) tensorboard__event__free_unpacked(ev[i], NULL);
}

static void test_unwritable_folder(void **state) {
  (void)state;
  char file[300], dir[400], err[512];
  snprintf(file, sizeof file, "%s/plain-file", g_dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(dir, sizeof dir, "%s/out", file);
  run_metrics_t *m;
  assert_int_not_equal(run_metrics_open(&m, dir, err, sizeof err), 0);
  assert_null(m);
  assert_non_null(strstr(err, "plain-file"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crc32c_check_values), cmocka_unit_test(test_record_frame),
      cmocka_unit_test(test_events_read_back),    cmocka_unit_test(test_run_metrics),
      cmocka_unit_test(test_unwritable_folder),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
