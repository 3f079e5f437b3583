/* test_quant4.c - the 4-bit quantization's API (worker/ckpt/quant4.h):
 * names, sizes, range checks, the fixed points of each code book, the odd
 * and all-zero cases, the dynamic map's shape, and pieces == whole. The
 * bit-exact comparison with bitsandbytes' algorithm is
 * tests/numerics/quant4_ref.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/ckpt/quant4.h"

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void test_names_and_sizes(void **state) {
  (void)state;
  q4_type_t t = Q4_FP4;
  assert_int_equal(q4_type_parse("nf4", &t), 0);
  assert_int_equal(t, Q4_NF4);
  assert_int_equal(q4_type_parse("fp4", &t), 0);
  assert_int_equal(t, Q4_FP4);
  assert_int_equal(q4_type_parse("NF4", &t), -1);
  assert_int_equal(q4_type_parse("", &t), -1);
  assert_int_equal(q4_type_parse(NULL, &t), -1);
  assert_int_equal(t, Q4_FP4);
  assert_string_equal(q4_type_name(Q4_NF4), "nf4");
  assert_string_equal(q4_type_name(Q4_FP4), "fp4");
  assert_int_equal(q4_blocks(0), 0);
  assert_int_equal(q4_blocks(1), 1);
  assert_int_equal(q4_blocks(64), 1);
  assert_int_equal(q4_blocks(65), 2);
  assert_int_equal(q4_code_bytes(0), 0);
  assert_int_equal(q4_code_bytes(3), 2);
  assert_int_equal(q4_code_bytes(64), 32);
  assert_int_equal(q4_nested_blocks(256), 1);
  assert_int_equal(q4_nested_blocks(257), 2);
  assert_int_equal(q4_range_elems(1000, 15, 5), 40);
  assert_int_equal(q4_range_elems(1000, 14, 1), 64);
  assert_int_equal(q4_range_elems(1000, 16, 1), 0);
  assert_int_equal(q4_range_elems(1000, 0, 100), 1000);
}

static void test_range_checks(void **state) {
  (void)state;
  float x[128] = {1.0f}, absmax[2] = {-7.0f, -7.0f}, out[64];
  uint8_t codes[64] = {0xAB}, q[512] = {0};
  assert_int_equal(q4_quantize_range(Q4_NF4, 100, 1, 2, x, codes, absmax), -1);
  assert_int_equal(q4_quantize_range(Q4_NF4, 100, 3, 0, x, codes, absmax), -1);
  assert_true(absmax[0] == -7.0f && absmax[1] == -7.0f && codes[0] == 0xAB);
  assert_int_equal(q4_dequantize_range(Q4_NF4, 100, 2, 1, codes, absmax, out), -1);
  assert_int_equal(q4_quantize_range(Q4_NF4, 100, 2, 0, x, codes, absmax), 0);
  float a[512] = {0}, a2[2] = {0};
  assert_int_equal(q4_nest_range(512, 100, 10, a, 0.0f, q, a2), -1);
  assert_int_equal(q4_nest_range(512, 256, 257, a, 0.0f, q, a2), -1);
  assert_int_equal(q4_nest_range(512, 256, 256, a, 0.0f, q, a2), 0);
}

/* Each code value, in a block whose absmax is 1, comes back as itself. */
static void test_code_fixed_points(void **state) {
  (void)state;
  for (int t = Q4_NF4; t <= Q4_FP4; t++) {
    const float *code = q4_code((q4_type_t)t);
    float x[17], out[17], absmax;
    uint8_t codes[9];
    x[0] = 1.0f;
    memcpy(x + 1, code, 16 * sizeof(float));
    q4_quantize((q4_type_t)t, x, 17, codes, &absmax);
    q4_dequantize((q4_type_t)t, codes, &absmax, 17, out);
    assert_true(absmax == 1.0f);
    for (int i = 0; i < 17; i++) assert_true(out[i] == x[i]);
  }
  /* quant_map's FP4 entry 8 is +0.0 (get_4bit_type), the kernel's is -0.0. */
  assert_int_equal(bits(q4_code(Q4_FP4)[8]), 0);
}

static void test_odd_and_zero(void **state) {
  (void)state;
  float x[3] = {1.0f, 0.5f, -0.5f}, z[3] = {0.0f, 0.0f, 0.0f}, absmax, out[3];
  uint8_t codes[2];
  q4_quantize(Q4_NF4, x, 3, codes, &absmax);
  assert_int_equal(codes[1] & 15, 7); /* the zero padding quantizes to NF4's 0.0 */
  q4_quantize(Q4_FP4, x, 3, codes, &absmax);
  assert_int_equal(codes[1] & 15, 0);
  for (int t = Q4_NF4; t <= Q4_FP4; t++) {
    q4_quantize((q4_type_t)t, z, 3, codes, &absmax);
    assert_true(absmax == 0.0f);
    assert_int_equal(codes[0], 0); /* 0 * (1 / 0) is NaN: code 0 */
    assert_int_equal(codes[1], 0);
    q4_dequantize((q4_type_t)t, codes, &absmax, 3, out);
    for (int i = 0; i < 3; i++) assert_true(out[i] == 0.0f && !signbit(out[i]) == (t == Q4_FP4));
  }
}

static void test_dynamic_map(void **state) {
  (void)state;
  const float *d = q4_dynamic_code();
  for (int i = 0; i < 255; i++) assert_true(d[i] < d[i + 1]);
  assert_true(d[127] == 0.0f && d[255] == 1.0f && d[0] == -d[254]);
  /* One scale: absmax2 = 0, every code 0, and the offset comes back exactly. */
  float a = 0.03125f, back, a2;
  uint8_t q;
  float off = q4_mean(&a, 1);
  q4_nest(&a, 1, off, &q, &a2);
  q4_unnest(&q, &a2, 1, off, &back);
  assert_true(off == a && a2 == 0.0f && q == 0 && back == a);
  assert_true(isnan(q4_mean(&a, 0)));
}

/* Quantizing in block-aligned pieces (nested: 256-aligned) gives the bytes
 * of quantizing whole. */
static void test_pieces_equal_whole(void **state) {
  (void)state;
  enum { N = 64 * 600 + 7, NB = 601 };
  float *x = malloc(N * sizeof *x);
  assert_non_null(x);
  uint32_t s = 12345;
  for (int i = 0; i < N; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + i % 7);
  }
  static uint8_t c1[N / 2 + 1], c2[N / 2 + 1], q1[NB], q2[NB];
  static float a1[NB], a2[NB], n1[3], n2[3];
  q4_quantize(Q4_NF4, x, N, c1, a1);
  size_t cuts[] = {0, 1, 256, 599, NB};
  for (int p = 0; p < 4; p++)
    assert_int_equal(q4_quantize_range(Q4_NF4, N, cuts[p], cuts[p + 1] - cuts[p],
                                       x + cuts[p] * Q4_BLOCK, c2, a2),
                     0);
  assert_memory_equal(c1, c2, q4_code_bytes(N));
  assert_memory_equal(a1, a2, sizeof a1);
  float off = q4_mean(a1, NB);
  q4_nest(a1, NB, off, q1, n1);
  assert_int_equal(q4_nest_range(NB, 512, NB - 512, a1, off, q2, n2), 0);
  assert_int_equal(q4_nest_range(NB, 0, 512, a1, off, q2, n2), 0);
  assert_memory_equal(q1, q2, sizeof q1);
  assert_memory_equal(n1, n2, sizeof n1);
  free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_and_sizes),   cmocka_unit_test(test_range_checks),
      cmocka_unit_test(test_code_fixed_points), cmocka_unit_test(test_odd_and_zero),
      cmocka_unit_test(test_dynamic_map),       cmocka_unit_test(test_pieces_equal_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
