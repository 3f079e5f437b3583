/* test_pytorch.c - the PyTorch checkpoint reader on a file torch.save wrote
 * (tests/fuzz/corpus/pytorch/state_dict.pt: float32, bfloat16, float16,
 * views at storage offsets, a tied alias), each tensor's bytes read back
 * through st_open; hand-made pickles for each refusal; and every truncation
 * and every single-byte change of the file and its data.pkl, which must each
 * load or fail with a message, never crash (run under ASan in CI). */
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
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/pytorch.h"
#include "worker/ckpt/safetensors.h"

static uint8_t *g_file;
static size_t g_size;

static uint8_t *slurp(const char *name, size_t *n) {
  const char *src = getenv("TRAINYARD_SRC_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/fuzz/corpus/pytorch/%s", src ? src : ".", name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = malloc(*n ? *n : 1);
  if (fread(p, 1, *n, f) != *n) *n = 0;
  fclose(f);
  return p;
}

typedef struct {
  const uint8_t *p;
  size_t n;
} mem_t;

static int mem_read(void *ctx, uint64_t off, void *dst, size_t n) {
  const mem_t *m = ctx;
  if (off > m->n || n > m->n - off) return -1;
  memcpy(dst, m->p + off, n);
  return 0;
}

static int read_mem(const uint8_t *p, size_t n, st_header_t *h, char *err, size_t errlen) {
  mem_t m = {p, n};
  return pt_read_archive(mem_read, &m, n, 0, h, err, errlen);
}

static const st_tensor_t *find(const st_header_t *h, const char *name) {
  for (size_t i = 0; i < h->ntensors; i++)
    if (!strcmp(h->tensors[i].name, name)) return &h->tensors[i];
  return NULL;
}

/* The file as torch wrote it: names, dtypes, shapes, and the values at
 * each tensor's byte range. */
static void test_torch_file(void **state) {
  (void)state;
  char err[512] = "";
  st_header_t h;
  assert_int_equal(read_mem(g_file, g_size, &h, err, sizeof err), 0);
  assert_int_equal(h.ntensors, 5);
  const st_tensor_t *a = find(&h, "a.weight"), *b = find(&h, "b"), *c = find(&h, "c");
  const st_tensor_t *d = find(&h, "d"), *tied = find(&h, "tied");
  assert_non_null(a), assert_non_null(b), assert_non_null(c), assert_non_null(d);
  assert_non_null(tied);
  assert_int_equal(a->dtype, TY_DTYPE_F32);
  assert_int_equal(a->ndim, 2);
  assert_int_equal(a->shape[0], 2);
  assert_int_equal(a->shape[1], 3);
  float av[6];
  memcpy(av, g_file + a->begin, sizeof av);
  for (int i = 0; i < 6; i++) assert_true(av[i] == (float)i);
  assert_int_equal(tied->begin, a->begin); /* one storage, two names */
  assert_int_equal(b->dtype, TY_DTYPE_BF16);
  assert_int_equal(g_file[b->begin] | g_file[b->begin + 1] << 8, 0x3f80); /* bf16 1.0 */
  /* c = arange(10, float16)[2:6].view(2, 2), d = [6:8]: views at offsets. */
  assert_int_equal(c->dtype, TY_DTYPE_F16);
  assert_int_equal(c->nbytes, 8);
  assert_int_equal(d->begin, c->begin + 8);
  float cv[4];
  ty_dtype_to_f32(TY_DTYPE_F16, g_file + c->begin, cv, 4);
  for (int i = 0; i < 4; i++) assert_true(cv[i] == (float)(i + 2));
  st_header_free(&h);
}

/* The same through st_open from a file on disk, and st_read. */
static void test_st_open(void **state) {
  (void)state;
  char path[] = "/tmp/ty-test-pytorch-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, g_file, g_size), (ssize_t)g_size);
  close(fd);
  st_ckpt_t *ck = NULL;
  char err[512] = "";
  assert_int_equal(st_open(path, &ck, err, sizeof err), 0);
  const st_tensor_t *d = st_find(ck, "d");
  assert_non_null(d);
  uint16_t v[2];
  assert_int_equal(st_read(ck, d, 0, v, sizeof v, err, sizeof err), 0);
  float f[2];
  ty_dtype_to_f32(TY_DTYPE_F16, v, f, 2);
  assert_true(f[0] == 6.0f && f[1] == 7.0f);
  st_close(ck);
  unlink(path);
  /* A safetensors file named .bin is still read as safetensors; a .bin
   * that is neither format says so. */
  const st_desc_t desc = {"x", TY_DTYPE_F32, 1, {2}};
  st_writer_t *w;
  assert_int_equal(st_writer_open(path, &desc, 1, NULL, &w, err, sizeof err), 0);
  const float x[2] = {1, 2};
  assert_int_equal(st_writer_write(w, x, sizeof x, err, sizeof err), 0);
  assert_int_equal(st_writer_close(w, err, sizeof err), 0);
  char bin[600];
  snprintf(bin, sizeof bin, "%s.bin", path);
  assert_int_equal(rename(path, bin), 0);
  assert_int_equal(st_open(bin, &ck, err, sizeof err), 0);
  assert_non_null(st_find(ck, "x"));
  st_close(ck);
  FILE *junk = fopen(bin, "wb");
  assert_non_null(junk);
  fputs("hello, not a checkpoint at all", junk);
  fclose(junk);
  assert_int_equal(st_open(bin, &ck, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "neither safetensors nor a PyTorch zip checkpoint"));
  unlink(bin);
}

static void expect_refused(const char *pkl, size_t n, const char *needle) {
  pt_dict_t d;
  char err[512] = "";
  assert_int_not_equal(pt_pickle_load((const uint8_t *)pkl, n, &d, err, sizeof err), 0);
  if (!strstr(err, needle)) fail_msg("expected '%s' in: %s", needle, err);
}

#define REFUSED(lit, needle) expect_refused(lit, sizeof lit - 1, needle)

static void test_refusals(void **state) {
  (void)state;
  REFUSED(
      "\x80\x02"
      "cposix\nsystem\n"
      "X\x04\x00\x00\x00true"
      "\x85R.",
      "global posix.system is refused");
  REFUSED(
      "\x80\x04\x8c\x08"
      "builtins"
      "\x8c\x04"
      "eval"
      "\x93.",
      "global builtins.eval is refused");
  REFUSED(
      "\x80\x02"
      "ctorch\nFloatStorage\n"
      ")R.",
      "REDUCE of torch.FloatStorage");
  REFUSED(
      "\x80\x02"
      "ccollections\nOrderedDict\n"
      "]\x85R.",
      "REDUCE of collections.OrderedDict");
  REFUSED(
      "\x80\x02"
      "ctorch\nfloat32\n"
      "}b.",
      "BUILD on a global is refused");
  REFUSED(
      "\x80\x02"
      "ctorch\nDoubleStorage\n.",
      "torch.DoubleStorage is not read");
  REFUSED(
      "\x80\x02"
      "(i__main__\nX\n.",
      "opcode INST (0x69)");
  REFUSED(
      "\x80\x02"
      "}X\x01\x00\x00\x00kK\x01s.",
      "entry 'k' is a int, not a tensor");
  REFUSED(
      "\x80\x02"
      "h\x05.",
      "memo get of an unset entry");
  REFUSED(
      "\x80\x02"
      "X\xff\xff\x00\x00"
      "ab",
      "truncated pickle");
  REFUSED(
      "\x80\x02"
      "].",
      "holds a list, not a state dict");
  REFUSED(
      "\x80\x02"
      "}}.",
      "STOP with 2 values");
  REFUSED(
      "\x80\x02"
      "(X\x07\x00\x00\x00storage"
      "ctorch\nFloatStorage\n"
      "X\x01\x00\x00\x00"
      "0"
      "X\x03\x00\x00\x00"
      "cpu"
      "tQ.",
      "a persistent id that is not");
  /* A view past its storage's end: storage of 2 elements, offset 1, size 2. */
  REFUSED(
      "\x80\x02"
      "}X\x01\x00\x00\x00w"
      "ctorch._utils\n_rebuild_tensor_v2\n"
      "((X\x07\x00\x00\x00storage"
      "ctorch\nFloatStorage\n"
      "X\x01\x00\x00\x00"
      "0"
      "X\x03\x00\x00\x00"
      "cpu"
      "K\x02"
      "tQ"
      "K\x01"
      "K\x02\x85"
      "K\x01\x85"
      "\x89"
      "}t"
      "Rs.",
      "lies outside it");
  /* A sole "model" wrapper is unwrapped; the same with a second key is not. */
  pt_dict_t d;
  char err[512] = "";
  static const char wrapped[] = "\x80\x02}X\x05\x00\x00\x00model}s.";
  assert_int_equal(
      pt_pickle_load((const uint8_t *)wrapped, sizeof wrapped - 1, &d, err, sizeof err), 0);
  assert_int_equal(d.n, 0);
  pt_dict_free(&d);
  REFUSED(
      "\x80\x02}X\x05\x00\x00\x00model}sX\x01\x00\x00\x00"
      "eK\x03s.",
      "entry 'model' is a dict");
}

/* Every prefix and every one-byte change of the file and of its data.pkl:
 * a message or a result, never a crash or a read outside the bytes. */
static void test_damage_sweep(void **state) {
  (void)state;
  size_t pn = 0;
  uint8_t *pkl = slurp("data.pkl", &pn);
  assert_non_null(pkl);
  uint8_t *buf = malloc(g_size > pn ? g_size : pn);
  char err[512];
  st_header_t h;
  pt_dict_t d;
  for (size_t cut = 0; cut < g_size; cut++) {
    err[0] = 0;
    assert_int_not_equal(read_mem(g_file, cut, &h, err, sizeof err), 0);
    assert_true(err[0]);
  }
  for (size_t at = 0; at < g_size; at++) {
    memcpy(buf, g_file, g_size);
    buf[at] ^= 0x5a;
    err[0] = 0;
    if (read_mem(buf, g_size, &h, err, sizeof err) == 0) {
      for (size_t i = 0; i < h.ntensors; i++)
        assert_true(h.tensors[i].begin + h.tensors[i].nbytes <= g_size);
      st_header_free(&h);
    } else {
      assert_true(err[0]);
    }
  }
  for (size_t cut = 0; cut < pn; cut++) {
    err[0] = 0;
    assert_int_not_equal(pt_pickle_load(pkl, cut, &d, err, sizeof err), 0);
    assert_true(err[0]);
  }
  for (size_t at = 0; at < pn; at++)
    for (int x = 1; x < 256; x += 37) {
      memcpy(buf, pkl, pn);
      buf[at] ^= (uint8_t)x;
      err[0] = 0;
      if (pt_pickle_load(buf, pn, &d, err, sizeof err) == 0)
        pt_dict_free(&d);
      else
        assert_true(err[0]);
    }
  free(buf);
  free(pkl);
}

/* A stored zip archive of n entries (names[i], data[i], lens[i]) into a
 * new buffer of *size bytes, as torch's writer lays one out. */
static uint8_t *build_zip(const char **names, const uint8_t **data, const size_t *lens, int n,
                          size_t *size) {
  size_t cap = 1024;
  for (int i = 0; i < n; i++) cap += 2 * (46 + strlen(names[i])) + lens[i];
  uint8_t *z = calloc(1, cap), *p = z;
  uint32_t offs[8];
#define PUT16(v) (p[0] = (uint8_t)(v), p[1] = (uint8_t)((v) >> 8), p += 2)
#define PUT32(v) (PUT16((v)&0xffff), PUT16((uint32_t)(v) >> 16))
  for (int i = 0; i < n; i++) {
    uint32_t crc = pt_crc32(0, data[i], lens[i]), nl = (uint32_t)strlen(names[i]);
    offs[i] = (uint32_t)(p - z);
    PUT32(0x04034b50u), PUT16(20), PUT16(0), PUT16(0), PUT16(0), PUT16(0), PUT32(crc);
    PUT32(lens[i]), PUT32(lens[i]), PUT16(nl), PUT16(0);
    memcpy(p, names[i], nl), p += nl;
    memcpy(p, data[i], lens[i]), p += lens[i];
  }
  uint32_t cd = (uint32_t)(p - z);
  for (int i = 0; i < n; i++) {
    uint32_t crc = pt_crc32(0, data[i], lens[i]), nl = (uint32_t)strlen(names[i]);
    PUT32(0x02014b50u), PUT16(20), PUT16(20), PUT16(0), PUT16(0), PUT16(0), PUT16(0);
    PUT32(crc), PUT32(lens[i]), PUT32(lens[i]), PUT16(nl), PUT16(0), PUT16(0), PUT16(0);
    PUT16(0), PUT32(0), PUT32(offs[i]);
    memcpy(p, names[i], nl), p += nl;
  }
  uint32_t cd_size = (uint32_t)(p - z) - cd;
  PUT32(0x06054b50u), PUT16(0), PUT16(0), PUT16(n), PUT16(n), PUT32(cd_size), PUT32(cd), PUT16(0);
#undef PUT16
#undef PUT32
  *size = (size_t)(p - z);
  return z;
}

/* Two PyTorch checkpoints of one shape differ only in their tensors'
 * bytes, after a data.pkl longer than 4 KiB (as a large model's is): their
 * fingerprints still differ. */
static void test_fingerprint(void **state) {
  (void)state;
  static const char head[] = "\x80\x02X\x88\x13\x00\x00"; /* a 5000-byte string, popped */
  static const char body[] =
      "0}X\x01\x00\x00\x00w"
      "ctorch._utils\n_rebuild_tensor_v2\n"
      "((X\x07\x00\x00\x00storage"
      "ctorch\nFloatStorage\n"
      "X\x01\x00\x00\x00"
      "0"
      "X\x03\x00\x00\x00"
      "cpu"
      "K\x04tQK\x00K\x04\x85K\x01\x85\x89}tRs.";
  size_t pn = sizeof head - 1 + 5000 + sizeof body - 1;
  uint8_t *pkl = malloc(pn);
  memcpy(pkl, head, sizeof head - 1);
  memset(pkl + sizeof head - 1, 'x', 5000);
  memcpy(pkl + sizeof head - 1 + 5000, body, sizeof body - 1);
  float w[4] = {1, 2, 3, 4};
  const char *names[] = {"archive/data.pkl", "archive/data/0", "archive/version"};
  const uint8_t *data[] = {pkl, (const uint8_t *)w, (const uint8_t *)"3\n"};
  const size_t lens[] = {pn, sizeof w, 2};
  char dir[] = "/tmp/ty-test-pytorch-fp-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[512], fp[2][CKPT_FINGERPRINT_LEN], err[512];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("{}", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
  for (int k = 0; k < 2; k++) {
    w[3] = (float)(4 + k);
    size_t zn;
    uint8_t *z = build_zip(names, data, lens, 3, &zn);
    st_header_t h;
    assert_int_equal(read_mem(z, zn, &h, err, sizeof err), 0);
    assert_int_equal(h.ntensors, 1);
    assert_true(h.tensors[0].begin > 5000);
    assert_memory_equal(z + h.tensors[0].begin, w, sizeof w);
    st_header_free(&h);
    f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(z, 1, zn, f);
    fclose(f);
    free(z);
    assert_int_equal(ckpt_fingerprint(dir, fp[k], err, sizeof err), 0);
  }
  assert_string_not_equal(fp[0], fp[1]);
  free(pkl);
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  g_file = slurp("state_dict.pt", &g_size);
  if (!g_file || !g_size) {
    fprintf(stderr,
            "test_pytorch: tests/fuzz/corpus/pytorch/state_dict.pt not found "
            "(set TRAINYARD_SRC_DIR to the source tree)\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_torch_file),  cmocka_unit_test(test_st_open),
      cmocka_unit_test(test_refusals),    cmocka_unit_test(test_damage_sweep),
      cmocka_unit_test(test_fingerprint),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  free(g_file);
  return rc;
}
