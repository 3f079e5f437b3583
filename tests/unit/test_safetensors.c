/* test_safetensors.c - safetensors round trip through the streaming writer,
 * byte-range reads, sharded checkpoints, and every malformed-file case
 * (each must fail with a clear message and never crash). */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/partial.h"
#include "worker/ckpt/safetensors.h"

#include "tmpdir_testutil.h"

static void path_of(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", g_dir, name);
}

/* Writes 8-byte length, header text as given, then data_len bytes 0..255. */
static void write_raw(const char *name, uint64_t declared_len, const char *hdr, size_t data_len) {
  char p[512];
  path_of(p, sizeof p, name);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  unsigned char l8[8];
  for (int i = 0; i < 8; i++) l8[i] = (unsigned char)(declared_len >> (8 * i));
  fwrite(l8, 1, 8, f);
  fwrite(hdr, 1, strlen(hdr), f);
  for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
  fclose(f);
}

/* Opens a raw file whose header is hdr, expects failure with code and a
 * message containing want. */
static void expect_bad(const char *hdr, size_t data_len, int code, const char *want) {
  write_raw("bad.safetensors", strlen(hdr), hdr, data_len);
  char p[512], err[512] = "";
  path_of(p, sizeof p, "bad.safetensors");
  st_ckpt_t *c = (st_ckpt_t *)1;
  int rc = st_open(p, &c, err, sizeof err);
  if (rc != code || !strstr(err, want))
    fail_msg("header %s: rc %d (want %d), message '%s' (want '%s')", hdr, rc, code, err, want);
  assert_null(c);
}

static void test_roundtrip(void **state) {
  (void)state;
  char p[512], err[512];
  path_of(p, sizeof p, "rt.safetensors");
  st_desc_t d[3] = {{"b.f32", TY_DTYPE_F32, 2, {3, 5}},
                    {"a.bf16", TY_DTYPE_BF16, 1, {7}},
                    {"c.f16", TY_DTYPE_F16, 3, {2, 1, 3}}};
  const char *md[] = {"format", "pt", NULL};
  st_writer_t *w;
  assert_int_equal(st_writer_open(p, d, 3, md, &w, err, sizeof err), 0);
  float f32[15];
  for (int i = 0; i < 15; i++) f32[i] = (float)i * 0.5f;
  uint16_t bf[7], h[6];
  for (int i = 0; i < 7; i++) bf[i] = (uint16_t)(0x3f80 + i);
  for (int i = 0; i < 6; i++) h[i] = (uint16_t)(0x3c00 + i);
  /* In uneven pieces: the writer streams. */
  assert_int_equal(st_writer_write(w, f32, 7, err, sizeof err), 0);
  assert_int_equal(st_writer_write(w, (char *)f32 + 7, 53, err, sizeof err), 0);
  assert_int_equal(st_writer_write(w, bf, sizeof bf, err, sizeof err), 0);
  assert_int_equal(st_writer_write(w, h, sizeof h, err, sizeof err), 0);
  assert_int_not_equal(st_writer_write(w, h, 1, err, sizeof err), 0); /* past the end */
  assert_int_equal(st_writer_close(w, err, sizeof err), 0);

  st_ckpt_t *c;
  assert_int_equal(st_open(p, &c, err, sizeof err), 0);
  assert_int_equal(c->ntensors, 3);
  assert_string_equal(c->tensors[0].name, "a.bf16"); /* sorted by name */
  assert_int_equal(c->data_bytes, 60 + 14 + 12);
  assert_int_equal(c->files[0].data_start % 8, 0);
  const st_tensor_t *t = st_find(c, "b.f32");
  assert_non_null(t);
  assert_int_equal(t->ndim, 2);
  assert_int_equal(t->shape[1], 5);
  float back[15];
  assert_int_equal(st_read(c, t, 0, back, 60, err, sizeof err), 0);
  assert_memory_equal(back, f32, 60);
  assert_int_equal(st_read(c, t, 20, back, 8, err, sizeof err), 0); /* a byte range */
  assert_true(back[0] == f32[5] && back[1] == f32[6]);
  assert_int_equal(st_read(c, t, 56, back, 8, err, sizeof err), TY_ERANGE);
  t = st_find(c, "c.f16");
  assert_int_equal(t->ndim, 3);
  uint16_t hb[6];
  assert_int_equal(st_read(c, t, 0, hb, 12, err, sizeof err), 0);
  assert_memory_equal(hb, h, 12);
  assert_null(st_find(c, "zzz"));
  st_close(c);

  /* While a writer writes, the path holds the previous file whole; one
   * closed early leaves it so, and no part of its own. */
  char partial[600];
  snprintf(partial, sizeof partial, "%s.partial", p);
  assert_int_equal(st_writer_open(p, d, 3, NULL, &w, err, sizeof err), 0);
  assert_int_equal(st_writer_write(w, f32, 10, err, sizeof err), 0);
  assert_int_equal(st_open(p, &c, err, sizeof err), 0);
  assert_non_null(st_find(c, "c.f16"));
  st_close(c);
  assert_int_equal(access(partial, F_OK), 0);
  assert_int_not_equal(st_writer_close(w, err, sizeof err), 0);
  assert_non_null(strstr(err, "10 of 86 data bytes written; not written (what was there stays)"));
  assert_int_equal(access(partial, F_OK), -1);
  assert_int_equal(st_open(p, &c, err, sizeof err), 0);
  t = st_find(c, "c.f16");
  assert_int_equal(st_read(c, t, 0, hb, 12, err, sizeof err), 0);
  assert_memory_equal(hb, h, 12);
  st_close(c);
  /* A writer into a new path leaves nothing there when closed early. */
  char fresh[600];
  snprintf(fresh, sizeof fresh, "%s.new", p);
  assert_int_equal(st_writer_open(fresh, d, 3, NULL, &w, err, sizeof err), 0);
  assert_int_not_equal(st_writer_close(w, err, sizeof err), 0);
  assert_int_equal(access(fresh, F_OK), -1);
  unlink(p);
}

static void test_malformed_headers(void **state) {
  (void)state;
  const char *one = "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
  char hdr[512];
  snprintf(hdr, sizeof hdr, "{%s}", one);
  expect_bad("{\"t\":", 8, TY_EINVAL, "not valid JSON");
  expect_bad("[1,2]", 0, TY_EINVAL, "not a JSON object");
  expect_bad("{\"t\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
             TY_EUNIMPLEMENTED, "tensor 't': unsupported dtype 'I64'");
  expect_bad("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
             TY_EUNIMPLEMENTED, "unsupported dtype");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, TY_EINVAL,
             "shape x F32 size is 12 bytes but data_offsets span 8");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, TY_EINVAL,
             "past the data section");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, TY_EINVAL,
             "end 0 < begin 8");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, TY_EINVAL,
             "shape[0]");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, TY_EINVAL,
             "shape[0]");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
             TY_EINVAL, "9 dimensions");
  expect_bad(
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
      "\"data_offsets\":[0,8]}}",
      8, TY_EINVAL, "more than 2^50");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, TY_EINVAL, "data_offsets");
  expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
             TY_EINVAL, "unknown key 'x'");
  expect_bad("{\"t\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TY_EINVAL,
             "'dtype' missing");
  expect_bad("{\"t\":3}", 8, TY_EINVAL, "not an object");
  expect_bad(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      12, TY_EINVAL, "overlap");
  expect_bad(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
      20, TY_EINVAL, "hole of 4 bytes");
  expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, TY_EINVAL,
             "hole of 4 bytes in the data section before tensor 'a'");
  expect_bad(hdr, 9, TY_EINVAL, "trailing bytes");
  expect_bad("{\"__metadata__\":{\"k\":1}}", 0, TY_EINVAL, "'__metadata__.k' is not a string");
  expect_bad("{\"__metadata__\":[]}", 0, TY_EINVAL, "'__metadata__' is not an object");
  snprintf(hdr, sizeof hdr, "{%s,%s}", one, one);
  expect_bad(hdr, 8, TY_EINVAL, "duplicate");
  expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TY_EINVAL,
             "empty name");
  /* Valid: metadata strings, a scalar, a zero-size tensor, trailing spaces. */
  write_raw("ok.safetensors", 0, "", 0);
  const char *good =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,2]},"
      "\"z\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[2,2]}}   ";
  write_raw("ok.safetensors", strlen(good), good, 2);
  char p[512], err[512];
  path_of(p, sizeof p, "ok.safetensors");
  st_ckpt_t *c;
  assert_int_equal(st_open(p, &c, err, sizeof err), 0);
  assert_int_equal(c->ntensors, 2);
  assert_int_equal(st_find(c, "s")->nelem, 1);
  assert_int_equal(st_find(c, "z")->nbytes, 0);
  st_close(c);
}

static void test_lying_lengths_and_truncation(void **state) {
  (void)state;
  char p[512], err[512];
  st_ckpt_t *c;
  path_of(p, sizeof p, "short.safetensors");
  FILE *f = fopen(p, "wb");
  fwrite("abc", 1, 3, f);
  fclose(f);
  assert_int_equal(st_open(p, &c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "too short"));

  write_raw("huge.safetensors", 200u * 1000 * 1000, "{}", 0);
  path_of(p, sizeof p, "huge.safetensors");
  assert_int_equal(st_open(p, &c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "exceeds the 100 MB limit"));

  write_raw("past.safetensors", 4096, "{}", 10);
  path_of(p, sizeof p, "past.safetensors");
  assert_int_equal(st_open(p, &c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "runs past the end of the file"));

  write_raw("lie.safetensors", UINT64_MAX, "{}", 10); /* 2^64-1: must not wrap */
  path_of(p, sizeof p, "lie.safetensors");
  assert_int_equal(st_open(p, &c, err, sizeof err), TY_EINVAL);

  assert_int_equal(st_open("/nonexistent/x.safetensors", &c, err, sizeof err), TY_ENOTFOUND);

  /* A valid file cut at every length fails cleanly at open. */
  path_of(p, sizeof p, "cut.safetensors");
  st_desc_t d[2] = {{"x", TY_DTYPE_F32, 2, {4, 4}}, {"y", TY_DTYPE_BF16, 1, {8}}};
  st_writer_t *w;
  assert_int_equal(st_writer_open(p, d, 2, NULL, &w, err, sizeof err), 0);
  unsigned char data[80] = {0};
  assert_int_equal(st_writer_write(w, data, 80, err, sizeof err), 0);
  assert_int_equal(st_writer_close(w, err, sizeof err), 0);
  assert_int_equal(st_open(p, &c, err, sizeof err), 0);
  long full = (long)(c->files[0].data_start + 80);
  /* Truncation after open: st_read reports it instead of returning junk. */
  assert_int_equal(truncate(p, full - 10), 0);
  unsigned char buf[16];
  assert_int_equal(st_read(c, st_find(c, "y"), 0, buf, 16, err, sizeof err), TY_EDATALOSS);
  assert_non_null(strstr(err, "truncated"));
  st_close(c);
  for (long len = full - 1; len >= 0; len--) {
    assert_int_equal(truncate(p, len), 0);
    assert_int_not_equal(st_open(p, &c, err, sizeof err), 0);
  }
}

static void write_shard(const char *name, const char *t1, const char *t2, float base) {
  char p[512], err[512];
  path_of(p, sizeof p, name);
  st_desc_t d[2] = {{t1, TY_DTYPE_F32, 1, {4}}, {t2, TY_DTYPE_F32, 1, {2}}};
  st_writer_t *w;
  assert_int_equal(st_writer_open(p, d, 2, NULL, &w, err, sizeof err), 0);
  float v[6];
  for (int i = 0; i < 6; i++) v[i] = base + (float)i;
  assert_int_equal(st_writer_write(w, v, sizeof v, err, sizeof err), 0);
  assert_int_equal(st_writer_close(w, err, sizeof err), 0);
}

static void write_index(const char *json) {
  char p[512];
  path_of(p, sizeof p, ST_INDEX_NAME);
  FILE *f = fopen(p, "w");
  fputs(json, f);
  fclose(f);
}

static void test_sharded(void **state) {
  (void)state;
  char err[512];
  st_ckpt_t *c;
  write_shard("m-1.safetensors", "a", "b", 0);
  write_shard("m-2.safetensors", "c", "d", 100);
  write_index(
      "{\"metadata\":{\"total_size\":48},\"weight_map\":{\"a\":\"m-1.safetensors\","
      "\"b\":\"m-1.safetensors\",\"c\":\"m-2.safetensors\",\"d\":\"m-2.safetensors\"}}");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), 0);
  assert_int_equal(c->nfiles, 2);
  assert_int_equal(c->ntensors, 4);
  const st_tensor_t *t = st_find(c, "c");
  assert_int_equal(t->file, 1);
  float v[4];
  assert_int_equal(st_read(c, t, 4, v, 8, err, sizeof err), 0);
  assert_true(v[0] == 101 && v[1] == 102);
  st_close(c);

  write_index(
      "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-1.safetensors\","
      "\"c\":\"m-2.safetensors\"}}");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "tensor 'd' is in m-2.safetensors but the index does not list it"));
  write_index(
      "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\","
      "\"c\":\"m-2.safetensors\",\"d\":\"m-2.safetensors\"}}");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "'b'"));
  write_index(
      "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-1.safetensors\","
      "\"c\":\"m-2.safetensors\",\"d\":\"m-2.safetensors\",\"e\":\"m-2.safetensors\"}}");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "tensor 'e' is not in m-2.safetensors"));
  write_index("{\"weight_map\":{\"a\":\"../m-1.safetensors\"}}");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "beside the index"));
  write_index("{\"weight_map\":{\"a\":\"m-9.safetensors\"}}");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), TY_ENOTFOUND);
  assert_non_null(strstr(err, "m-9.safetensors"));
  write_index("{\"weight_map\":[]}");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), TY_EINVAL);
  write_index("{\"weight_map\":");
  assert_int_equal(st_open(g_dir, &c, err, sizeof err), TY_EINVAL);
  char p[512];
  path_of(p, sizeof p, ST_INDEX_NAME);
  unlink(p);
}

/* A child that writes name's first 8 of 16 bytes, with the handlers of
 * ty_partial_cleanup_on_signals or without, then is stopped by SIGTERM
 * (closing the file whole first, with close_first). Returns after checking
 * that it died of the signal. */
static void write_then_stop(const char *name, bool handlers, bool close_first) {
  char p[512];
  path_of(p, sizeof p, name);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (handlers) ty_partial_cleanup_on_signals();
    st_desc_t d[1] = {{"w", TY_DTYPE_F32, 1, {4}}};
    const float x[4] = {1, 2, 3, 4};
    st_writer_t *w;
    char err[256];
    if (st_writer_open(p, d, 1, NULL, &w, err, sizeof err) ||
        st_writer_write(w, x, 8, err, sizeof err))
      _exit(3);
    if (close_first &&
        (st_writer_write(w, x + 2, 8, err, sizeof err) || st_writer_close(w, err, sizeof err)))
      _exit(4);
    raise(SIGTERM);
    _exit(5);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGTERM);
}

/* A rank stopped while it saves (a cancelled job) leaves no part of the
 * file beside the outputs, and still dies of the signal; a file it had
 * finished stays. Without the handlers the part would stay, as the first
 * case shows. */
static void test_stopped_mid_write(void **state) {
  (void)state;
  char p[512], part[600];
  path_of(p, sizeof p, "stopped.safetensors");
  snprintf(part, sizeof part, "%s.partial", p);
  write_then_stop("stopped.safetensors", false, false);
  assert_int_equal(access(part, F_OK), 0);
  unlink(part);
  write_then_stop("stopped.safetensors", true, false);
  assert_int_equal(access(part, F_OK), -1);
  assert_int_equal(access(p, F_OK), -1);
  write_then_stop("stopped.safetensors", true, true);
  assert_int_equal(access(part, F_OK), -1);
  st_ckpt_t *c;
  char err[256];
  assert_int_equal(st_open(p, &c, err, sizeof err), 0);
  assert_non_null(st_find(c, "w"));
  st_close(c);
  unlink(p);
  /* Every slot taken: a file past them is written untracked, as before;
   * so is one whose folder cannot be opened (its part cannot be made). */
  char x[600];
  path_of(x, sizeof x, "x.partial");
  int slots[16], n = 0;
  while (n < 16 && (slots[n] = ty_partial_track(x)) >= 0) n++;
  assert_true(n > 0 && n < 16);
  for (int i = 0; i < n; i++) ty_partial_untrack(slots[i]);
  assert_int_equal(ty_partial_track(x), slots[0]);
  ty_partial_untrack(slots[0]);
  assert_int_equal(ty_partial_track("/nonexistent/x.partial"), -1);
}

/* A part is removed where it was made: when a link has replaced its folder
 * since (here a decoy folder holding a file of the same name), the decoy's
 * file stays and the real part goes. */
static void test_stopped_after_a_swap(void **state) {
  (void)state;
  char sub[512], moved[512], decoy[600], p[600], q[700];
  path_of(sub, sizeof sub, "swap");
  path_of(moved, sizeof moved, "swap-moved");
  snprintf(decoy, sizeof decoy, "%s/decoy", g_dir);
  assert_int_equal(mkdir(sub, 0755), 0);
  assert_int_equal(mkdir(decoy, 0755), 0);
  snprintf(q, sizeof q, "%s/x.safetensors.partial", decoy);
  FILE *f = fopen(q, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(p, sizeof p, "%s/x.safetensors", sub);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    ty_partial_cleanup_on_signals();
    st_desc_t d[1] = {{"w", TY_DTYPE_F32, 1, {4}}};
    const float x[4] = {1, 2, 3, 4};
    st_writer_t *w;
    char err[256];
    if (st_writer_open(p, d, 1, NULL, &w, err, sizeof err) ||
        st_writer_write(w, x, 8, err, sizeof err) || rename(sub, moved) || symlink(decoy, sub))
      _exit(3);
    raise(SIGTERM);
    _exit(5);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(access(q, F_OK), 0);
  snprintf(q, sizeof q, "%s/x.safetensors.partial", moved);
  assert_int_equal(access(q, F_OK), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_malformed_headers),
      cmocka_unit_test(test_lying_lengths_and_truncation),
      cmocka_unit_test(test_sharded),
      cmocka_unit_test(test_stopped_mid_write),
      cmocka_unit_test(test_stopped_after_a_swap),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
