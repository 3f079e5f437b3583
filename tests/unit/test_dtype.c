/* test_dtype.c - bf16/f16 <-> f32 conversions: exhaustive over all 65536
 * half-width values (subnormals, infinities and NaN included) and
 * round-to-nearest-even at every midpoint between neighbours. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float widen(ty_dtype_t t, uint16_t h) {
  unsigned char b[2] = {(unsigned char)(h & 0xff), (unsigned char)(h >> 8)};
  float f;
  ty_dtype_to_f32(t, b, &f, 1);
  return f;
}

static uint16_t narrow(ty_dtype_t t, float f) {
  unsigned char b[2];
  ty_dtype_from_f32(t, &f, b, 1);
  return (uint16_t)(b[0] | (b[1] << 8));
}

/* The f16 value of h from its definition, in double. */
static double f16_reference(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, -24);
  else
    v = ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

static void test_names_and_sizes(void **state) {
  (void)state;
  ty_dtype_t t;
  assert_int_equal(ty_dtype_size(TY_DTYPE_F32), 4);
  assert_int_equal(ty_dtype_size(TY_DTYPE_BF16), 2);
  assert_int_equal(ty_dtype_size(TY_DTYPE_F16), 2);
  assert_string_equal(ty_dtype_name(TY_DTYPE_BF16), "bfloat16");
  assert_string_equal(ty_dtype_st_name(TY_DTYPE_F16), "F16");
  const char *ok[] = {"float32", "F32", "fp32", "bf16", "BF16", "bfloat16", "f16", "float16"};
  const ty_dtype_t want[] = {TY_DTYPE_F32,  TY_DTYPE_F32,  TY_DTYPE_F32, TY_DTYPE_BF16,
                             TY_DTYPE_BF16, TY_DTYPE_BF16, TY_DTYPE_F16, TY_DTYPE_F16};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    assert_int_equal(ty_dtype_parse(ok[i], &t), 0);
    assert_int_equal(t, want[i]);
  }
  assert_int_equal(ty_dtype_parse("int8", &t), -1);
  assert_int_equal(ty_dtype_parse("", &t), -1);
}

static void test_bf16_exhaustive(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = widen(TY_DTYPE_BF16, (uint16_t)h);
    assert_int_equal(bits(f), h << 16); /* bf16 is the top half of an f32 */
    uint16_t back = narrow(TY_DTYPE_BF16, f);
    if (isnan(f))
      assert_true(isnan(widen(TY_DTYPE_BF16, back)));
    else
      assert_int_equal(back, h);
  }
}

static void test_f16_exhaustive(void **state) {
  (void)state;
  int subnormals = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = widen(TY_DTYPE_F16, (uint16_t)h);
    double ref = f16_reference((uint16_t)h);
    if (isnan(ref)) {
      assert_true(isnan(f));
      assert_true(isnan(widen(TY_DTYPE_F16, narrow(TY_DTYPE_F16, f))));
      continue;
    }
    assert_true((double)f == ref);
    assert_int_equal(signbit(f) != 0, (h >> 15) != 0); /* -0 stays -0 */
    if (((h >> 10) & 31) == 0 && (h & 1023)) subnormals++;
    assert_int_equal(narrow(TY_DTYPE_F16, f), h);
  }
  assert_int_equal(subnormals, 2 * 1023);
}

/* For each pair of neighbouring finite values a < b (positive and negative):
 * the exact midpoint rounds to the even one, and one f32 step either side of
 * it rounds to the nearer. */
static void check_midpoints(ty_dtype_t t, uint16_t max_finite) {
  for (uint32_t sign = 0; sign <= 0x8000u; sign += 0x8000u) {
    for (uint32_t a = 0; a < max_finite; a++) {
      uint16_t ha = (uint16_t)(sign | a), hb = (uint16_t)(sign | (a + 1));
      float fa = widen(t, ha), fb = widen(t, hb);
      float mid = (float)(((double)fa + (double)fb) / 2); /* exact: needs one more bit */
      assert_true((double)mid == ((double)fa + (double)fb) / 2);
      uint16_t even = (a & 1) ? hb : ha;
      assert_int_equal(narrow(t, mid), even);
      float toward_a = nextafterf(mid, fa), toward_b = nextafterf(mid, fb);
      assert_int_equal(narrow(t, toward_a), ha);
      assert_int_equal(narrow(t, toward_b), hb);
    }
  }
}

static void test_round_to_nearest_even(void **state) {
  (void)state;
  check_midpoints(TY_DTYPE_BF16, 0x7f7f); /* 0x7f7f: largest finite bf16 */
  check_midpoints(TY_DTYPE_F16, 0x7bff);  /* 0x7bff: 65504 */
}

static void test_overflow_and_specials(void **state) {
  (void)state;
  assert_int_equal(narrow(TY_DTYPE_F16, 65519.0f), 0x7bff);
  assert_int_equal(narrow(TY_DTYPE_F16, 65520.0f), 0x7c00); /* halfway to 2^16 rounds to inf */
  assert_int_equal(narrow(TY_DTYPE_F16, -1e10f), 0xfc00);
  assert_int_equal(narrow(TY_DTYPE_F16, INFINITY), 0x7c00);
  assert_int_equal(narrow(TY_DTYPE_F16, ldexpf(1, -25)), 0x0000); /* tie with 0 -> 0 */
  assert_int_equal(narrow(TY_DTYPE_F16, ldexpf(3, -26)), 0x0001);
  assert_int_equal(narrow(TY_DTYPE_F16, ldexpf(1, -30)), 0x0000);
  assert_int_equal(narrow(TY_DTYPE_F16, -ldexpf(1, -30)), 0x8000);
  assert_int_equal(narrow(TY_DTYPE_BF16, 3.4e38f), 0x7f80); /* above max bf16 -> inf */
  assert_int_equal(narrow(TY_DTYPE_BF16, -INFINITY), 0xff80);
  assert_int_equal(narrow(TY_DTYPE_BF16, ldexpf(1, -140)), bits(ldexpf(1, -140)) >> 16);
  /* A NaN whose payload sits only in the low 16 bits must not become inf. */
  uint32_t snan = 0x7f800001u;
  float f;
  memcpy(&f, &snan, 4);
  assert_true(isnan(widen(TY_DTYPE_BF16, narrow(TY_DTYPE_BF16, f))));
  assert_true(isnan(widen(TY_DTYPE_F16, narrow(TY_DTYPE_F16, f))));
  /* Arrays, unaligned source. */
  unsigned char buf[7] = {0, 0x80, 0x3f, 0x00, 0xc0, 0, 0};
  float out[2];
  ty_dtype_to_f32(TY_DTYPE_BF16, buf + 1, out, 2);
  assert_true(out[0] == 1.0f && out[1] == -2.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_and_sizes),       cmocka_unit_test(test_bf16_exhaustive),
      cmocka_unit_test(test_f16_exhaustive),        cmocka_unit_test(test_round_to_nearest_even),
      cmocka_unit_test(test_overflow_and_specials),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
