/* dtype.c - element types (F32, BF16, F16; U8 by size and name only):
 * names, sizes and exact conversions to and from fp32 (round to nearest
 * even when narrowing). */
#include "common/dtype.h"

#include <string.h>
#include <strings.h>

static const struct {
  size_t size;
  const char *name;    /* spec / config.json spelling */
  const char *st_name; /* safetensors spelling */
} g_dtypes[TY_DTYPE_COUNT] = {
    [TY_DTYPE_F32] = {4, "float32", "F32"},
    [TY_DTYPE_BF16] = {2, "bfloat16", "BF16"},
    [TY_DTYPE_F16] = {2, "float16", "F16"},
};

size_t ty_dtype_size(ty_dtype_t t) {
  if (t == TY_DTYPE_U8) return 1;
  return (unsigned)t < TY_DTYPE_COUNT ? g_dtypes[t].size : 0;
}

const char *ty_dtype_name(ty_dtype_t t) {
  if (t == TY_DTYPE_U8) return "uint8";
  return (unsigned)t < TY_DTYPE_COUNT ? g_dtypes[t].name : "unknown";
}

const char *ty_dtype_st_name(ty_dtype_t t) {
  if (t == TY_DTYPE_U8) return "U8";
  return (unsigned)t < TY_DTYPE_COUNT ? g_dtypes[t].st_name : "unknown";
}

int ty_dtype_parse(const char *s, ty_dtype_t *out) {
  static const struct {
    const char *alias;
    ty_dtype_t t;
  } aliases[] = {
      {"float32", TY_DTYPE_F32}, {"f32", TY_DTYPE_F32},       {"fp32", TY_DTYPE_F32},
      {"float", TY_DTYPE_F32},   {"bfloat16", TY_DTYPE_BF16}, {"bf16", TY_DTYPE_BF16},
      {"float16", TY_DTYPE_F16}, {"f16", TY_DTYPE_F16},       {"fp16", TY_DTYPE_F16},
      {"half", TY_DTYPE_F16},
  };
  if (!s) return -1;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
    /* Case-insensitive, so the safetensors spellings F32/BF16/F16 match too. */
    if (!strcasecmp(s, aliases[i].alias)) {
      *out = aliases[i].t;
      return 0;
    }
  }
  return -1;
}

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Loads are byte-wise little-endian so that unaligned sources (a staging
 * bucket at an odd offset) and big-endian hosts both work. */
static inline uint16_t load_u16(const unsigned char *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void store_u16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)(v & 0xff);
  p[1] = (unsigned char)(v >> 8);
}

/* f16 layout: 1 sign, 5 exponent (bias 15), 10 mantissa. */
static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) /* inf or NaN: keep the payload, shifted into place */
    return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp != 0) /* normal: rebias 15 -> 127 */
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return bits_f32(sign);
  /* Subnormal: value = man * 2^-24; normalise so the leading 1 is implicit. */
  int e = -1;
  do {
    man <<= 1;
    e++;
  } while (!(man & 0x400u));
  man &= 0x3ffu;
  return bits_f32(sign | ((uint32_t)(112 - e) << 23) | (man << 13));
}

static inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) /* NaN: keep it quiet and keep what payload fits */
    return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) /* >= 65520 rounds to infinity (max half is 65504) */
    return (uint16_t)(sign | 0x7c00u);
  if (abs >= 0x38800000u) {                         /* normal half range (>= 2^-14) */
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u); /* round to nearest even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) /* below half the smallest subnormal (2^-25): zero */
    return sign;
  /* Subnormal half: value / 2^-24, rounded to nearest even. */
  uint32_t exp = abs >> 23; /* 102..112 */
  uint32_t man = (abs & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - exp; /* 14..24 */
  uint32_t q = man >> shift;
  uint32_t rem = man & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint16_t)(sign | q);
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet it so truncation cannot make inf */
    return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; overflow carries to inf */
  return (uint16_t)(u >> 16);
}

void ty_dtype_to_f32(ty_dtype_t t, const void *src, float *dst, size_t n) {
  const unsigned char *s = src;
  switch (t) {
    case TY_DTYPE_F32:
      memcpy(dst, src, n * 4); /* little-endian hosts only, like the rest of trainyard */
      break;
    case TY_DTYPE_BF16:
      for (size_t i = 0; i < n; i++) dst[i] = bits_f32((uint32_t)load_u16(s + 2 * i) << 16);
      break;
    case TY_DTYPE_F16:
      for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(load_u16(s + 2 * i));
      break;
    default: /* not a float type (U8): cannot happen in a correct caller */
      for (size_t i = 0; i < n; i++) dst[i] = bits_f32(0x7fc00000u);
      break;
  }
}

void ty_dtype_from_f32(ty_dtype_t t, const float *src, void *dst, size_t n) {
  unsigned char *d = dst;
  switch (t) {
    case TY_DTYPE_F32:
      memcpy(dst, src, n * 4);
      break;
    case TY_DTYPE_BF16:
      for (size_t i = 0; i < n; i++) store_u16(d + 2 * i, f32_to_bf16(src[i]));
      break;
    case TY_DTYPE_F16:
      for (size_t i = 0; i < n; i++) store_u16(d + 2 * i, f32_to_f16(src[i]));
      break;
    default: /* not a float type (U8): cannot happen in a correct caller */
      break;
  }
}

void ty_dtype_round(ty_dtype_t t, float *x, size_t n) {
  if (t == TY_DTYPE_F32) return;
  uint16_t tmp[1024];
  for (size_t i = 0; i < n; i += 1024) {
    size_t k = n - i < 1024 ? n - i : 1024;
    ty_dtype_from_f32(t, x + i, tmp, k);
    ty_dtype_to_f32(t, tmp, x + i, k);
  }
}
