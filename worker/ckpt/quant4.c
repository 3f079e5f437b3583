/* quant4.c - bitsandbytes' NF4 / FP4 blockwise quantization and the 8-bit
 * double quantization of its scales, bit for bit; see quant4.h.
 *
 * Read from bitsandbytes (csrc/kernels.cu, csrc/ops.cu,
 * bitsandbytes/functional.py, bitsandbytes/backends/cuda/ops.py):
 * - a block's scale is the float max of |x| over its elements, reduced with
 *   fmaxf from -FLT_MAX; a partial last block is loaded with 0.0f padding,
 *   so its reduction sees one 0 more (it only matters for NaN input);
 * - the value is scaled by the block's reciprocal, x * (1.0f / absmax), and
 *   coded by dQuantizeNF4 / dQuantizeFP4, whose trees compare `x > cut`
 *   against float constants: a value on a cut takes the lower code;
 * - an all-zero block: absmax 0, 1/0 = inf, 0 * inf = NaN; every compare is
 *   false for NaN, so both trees give code 0 (NF4: -1.0, FP4: +0.0) and
 *   dequantization gives code * 0 (-0.0 for NF4, +0.0 for FP4);
 * - for odd n the padding element sits in the last byte's low nibble and is
 *   quantized like the rest: the code of 0.0f * inv (NF4 7, FP4 0), not a
 *   bare 0 nibble (the CUDA kernel stores (valid_items + 1) / 2 bytes);
 * - dequantization is code[q] * absmax in float (FP4: lut[q & 7] * sign,
 *   the sign a +-1 factor, so a signed table gives the same product; its
 *   code 8 is -0.0 where the saved quant_map has +0.0, see k_fp4);
 * - double quantization: offset = absmax.mean(), then quantize_blockwise
 *   (absmax - offset, blocksize=256) with create_dynamic_map(signed=True):
 *   the same reciprocal scaling, then dQuantize<0>'s binary search;
 *   recovery is dequantize_blockwise (code * absmax2) then `+= offset`.
 *
 * Where the CUDA build's arithmetic is not the C source's: bitsandbytes
 * compiles its kernels with --use_fast_math (CMakeLists.txt), so on a GPU
 * 1.0f / absmax is an approximate reciprocal (<= 1 ulp, PTX rcp.approx)
 * and subnormals are flushed to zero. We compute the IEEE reciprocal and
 * keep subnormals; a code can then differ from a GPU's only where x * inv
 * lies within an ulp of a cut (or, for FP4, in the sign of a subnormal).
 * The offset: torch's float32 mean may differ from our double sum in the
 * last ulp (its reduction order is the device's); the offset is stored with
 * the state, so a reader never recomputes it.
 *
 * Float contraction: every product here is either compared or stored
 * before any addition, except unnest's, which goes through mul_add_apart so
 * that a compiler allowed to contract (gnu11 on an FMA target) cannot fuse
 * it. */
#include "worker/ckpt/quant4.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* get_4bit_type("nf4") == kernels.cu's nf4_dequantization_lut. */
static const float k_nf4[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

/* get_4bit_type("fp4"), the quant_map: the FP4 values in bit order (sign
 * bit 8) divided by their absmax 12. Its entry 8 is +0.0: the Python list
 * writes it `-0`, which is the integer 0. Each quotient rounds to the float
 * of kernels.cu's fp4_dequantization_lut literal (0.005208333333f,
 * 0.66666667f, ...); the numerics test checks both. */
static const float k_fp4[16] = {
    0.0f / 12.0f,  0.0625f / 12.0f, 8.0f / 12.0f,  12.0f / 12.0f,    4.0f / 12.0f,  6.0f / 12.0f,
    2.0f / 12.0f,  3.0f / 12.0f,    0.0f / 12.0f,  -0.0625f / 12.0f, -8.0f / 12.0f, -12.0f / 12.0f,
    -4.0f / 12.0f, -6.0f / 12.0f,   -2.0f / 12.0f, -3.0f / 12.0f,
};

/* What dDequantizeFP4Tree multiplies by: lut[q & 7] * (1 - 2 * sign bit),
 * so code 8 is -0.0 (and dequantizes to -0.0), unlike k_fp4[8]. */
static const float k_fp4_tree[16] = {
    0.0f / 12.0f,  0.0625f / 12.0f, 8.0f / 12.0f,  12.0f / 12.0f,    4.0f / 12.0f,  6.0f / 12.0f,
    2.0f / 12.0f,  3.0f / 12.0f,    -0.0f / 12.0f, -0.0625f / 12.0f, -8.0f / 12.0f, -12.0f / 12.0f,
    -4.0f / 12.0f, -6.0f / 12.0f,   -2.0f / 12.0f, -3.0f / 12.0f,
};

/* dQuantizeNF4's 15 cuts in increasing order, written as the kernel writes
 * them: decimal (double) midpoints of neighbouring NF4 values, which the
 * compiler rounds straight to float. Four of them (0, 8, 12, 14 here) land
 * one ulp off the float midpoint of the two float values, so a value on
 * that float midpoint codes by the literal, not by "nearest"; the numerics
 * test has such values. */
static const float k_nf4_cut[15] = {
    -0.8480964004993439f,  -0.6106329262256622f,  -0.4599952697753906f,   -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,   0.2035212516784668f,   0.2920137718319893f,    0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,   0.8614784181118011f,
};

/* dQuantizeFP4's 7 cuts on |x| in increasing order, as the kernel writes
 * them. Not all are the float midpoints of the FP4 magnitudes (0.583333f
 * is a few ulps below 7/12): the kernel's constants rule. */
static const float k_fp4_cut[7] = {
    0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f, 0.4166667f, 0.583333f, 0.8333333f,
};

/* The FP4 code of the k-th magnitude (k = cuts below |x|): 0, 1/192, 1/6,
 * 1/4, 1/3, 1/2, 2/3, 1 are bits 000 001 110 111 100 101 010 011. */
static const uint8_t k_fp4_rank_code[8] = {0, 1, 6, 7, 4, 5, 2, 3};

/* dQuantizeNF4. Its tree is the balanced binary search over k_nf4_cut that
 * this loop walks: the root compares cut 7, its children cuts 3 and 11,
 * and so on; `x > cut` goes right. NaN goes left at every node: code 0. */
static uint8_t nf4_quantize(float x) {
  unsigned lo = 0; /* cuts known to lie below x */
  for (unsigned step = 8; step; step >>= 1)
    if (x > k_nf4_cut[lo + step - 1]) lo += step;
  return (uint8_t)lo;
}

/* dQuantizeFP4: sign bit from x < 0 (so -0.0 and NaN have none), then the
 * same search over |x|. */
static uint8_t fp4_quantize(float x) {
  uint8_t sign = x < 0.0f ? 8 : 0;
  float a = fabsf(x);
  unsigned lo = 0;
  for (unsigned step = 4; step; step >>= 1)
    if (a > k_fp4_cut[lo + step - 1]) lo += step;
  return (uint8_t)(sign | k_fp4_rank_code[lo]);
}

static uint8_t code_of(q4_type_t t, float x) {
  return t == Q4_FP4 ? fp4_quantize(x) : nf4_quantize(x);
}

/* max |x[i]| over m elements as the kernel reduces it; pad: the block was
 * loaded with zero padding (a partial last block). */
static float block_absmax(const float *x, size_t m, int pad) {
  float amax = -FLT_MAX;
  for (size_t i = 0; i < m; i++) amax = fmaxf(amax, fabsf(x[i]));
  return pad ? fmaxf(amax, 0.0f) : amax;
}

const char *q4_type_name(q4_type_t t) {
  return t == Q4_FP4 ? "fp4" : "nf4";
}

int q4_type_parse(const char *s, q4_type_t *out) {
  if (s && strcmp(s, "nf4") == 0) {
    *out = Q4_NF4;
    return 0;
  }
  if (s && strcmp(s, "fp4") == 0) {
    *out = Q4_FP4;
    return 0;
  }
  return -1;
}

const float *q4_code(q4_type_t t) {
  return t == Q4_FP4 ? k_fp4 : k_nf4;
}

size_t q4_blocks(size_t n) {
  return n / Q4_BLOCK + (n % Q4_BLOCK != 0);
}
size_t q4_code_bytes(size_t n) {
  return n / 2 + (n & 1);
}
size_t q4_nested_blocks(size_t nb) {
  return nb / Q4_NESTED_BLOCK + (nb % Q4_NESTED_BLOCK != 0);
}

size_t q4_range_elems(size_t n, size_t first_block, size_t nblocks) {
  size_t nb = q4_blocks(n);
  if (first_block >= nb) return 0;
  if (nblocks > nb - first_block) nblocks = nb - first_block;
  size_t start = first_block * Q4_BLOCK, end = (first_block + nblocks) * Q4_BLOCK;
  return (end < n ? end : n) - start;
}

void q4_quantize(q4_type_t t, const float *x, size_t n, uint8_t *codes, float *absmax) {
  for (size_t b = 0; b * Q4_BLOCK < n; b++) {
    const float *xb = x + b * Q4_BLOCK;
    size_t m = n - b * Q4_BLOCK; /* elements in this block */
    if (m > Q4_BLOCK) m = Q4_BLOCK;
    float amax = block_absmax(xb, m, m < Q4_BLOCK);
    absmax[b] = amax;
    float inv = 1.0f / amax; /* the kernel's order: one reciprocal, then products */
    uint8_t *cb = codes + b * Q4_BLOCK_BYTES;
    for (size_t i = 0; i < m; i += 2) {
      float hi = xb[i] * inv;
      float lo = (i + 1 < m ? xb[i + 1] : 0.0f) * inv; /* the padding element */
      cb[i / 2] = (uint8_t)(code_of(t, hi) << 4 | code_of(t, lo));
    }
  }
}

void q4_dequantize(q4_type_t t, const uint8_t *codes, const float *absmax, size_t n, float *out) {
  const float *code = t == Q4_FP4 ? k_fp4_tree : k_nf4;
  for (size_t i = 0; i < n; i++) {
    uint8_t byte = codes[i / 2];
    out[i] = code[i & 1 ? byte & 15 : byte >> 4] * absmax[i / Q4_BLOCK];
  }
}

int q4_quantize_range(q4_type_t t, size_t n, size_t first_block, size_t nblocks, const float *x,
                      uint8_t *codes, float *absmax) {
  size_t nb = q4_blocks(n);
  if (first_block > nb || nblocks > nb - first_block) return -1;
  q4_quantize(t, x, q4_range_elems(n, first_block, nblocks), codes + first_block * Q4_BLOCK_BYTES,
              absmax + first_block);
  return 0;
}

int q4_dequantize_range(q4_type_t t, size_t n, size_t first_block, size_t nblocks,
                        const uint8_t *codes, const float *absmax, float *out) {
  size_t nb = q4_blocks(n);
  if (first_block > nb || nblocks > nb - first_block) return -1;
  q4_dequantize(t, codes + first_block * Q4_BLOCK_BYTES, absmax + first_block,
                q4_range_elems(n, first_block, nblocks), out);
  return 0;
}

/* ---- The 8-bit signed dynamic map and the nested quantization ---- */

static float g_dynamic[256];
static pthread_once_t g_dynamic_once = PTHREAD_ONCE_INIT;

/* torch.linspace(0.1, 1, steps, dtype=float32)[i]. torch >= 2.0's CPU
 * kernel (aten/src/ATen/native/cpu/RangeFactoriesKernel.cpp, scalar only
 * since pytorch#89048) computes start + step * i in the first half and
 * end - step * (steps - 1 - i) in the second, in float; its x86 AVX2 and
 * AVX512 kernels are built with -mfma and contract each into one fused
 * multiply-add, so every value is rounded once: fmaf. (Checked against
 * torch 1.13's scalar path, which is the same code; its vectorized path,
 * gone in 2.0, and a build without FMA differ in the last ulp of some
 * boundaries: torch 1.13 gives 42 of the 256 entries 1-2 ulp apart. The map
 * is saved as nested_quant_map; q4_unnest_with decodes by a file's own.) */
static float linspace_at(int steps, int i) {
  const float start = 0.1f, end = 1.0f;
  float step = (end - start) / (float)(steps - 1);
  if (i < steps / 2) return fmaf(step, (float)i, start);
  return fmaf(-step, (float)(steps - 1 - i), end);
}

/* create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for
 * exponent e = 0..6, the 2^e midpoints of linspace(0.1, 1, 2^e + 1) scaled
 * by 10^(e-6) (the Python scale rounded to float, then a float product, as
 * torch multiplies a float tensor by a Python number), and their negatives;
 * then 0 and 1; sorted. No "additional items" for 7 exponent bits of 8. */
static void dynamic_build(void) {
  /* Python's 10 ** (e - 6): the doubles nearest these decimals. */
  static const double k_scale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  float v[256];
  int k = 0;
  for (int e = 0; e < 7; e++) {
    int steps = (1 << e) + 1;
    float scale = (float)k_scale[e];
    for (int i = 0; i + 1 < steps; i++) {
      float mean = (linspace_at(steps, i) + linspace_at(steps, i + 1)) / 2.0f;
      v[k++] = scale * mean;
      v[k++] = -(scale * mean);
    }
  }
  v[k++] = 0.0f;
  v[k++] = 1.0f;
  /* 256 distinct values: insertion sort is plenty. */
  for (int i = 1; i < k; i++) {
    float key = v[i];
    int j = i - 1;
    for (; j >= 0 && v[j] > key; j--) v[j + 1] = v[j];
    v[j + 1] = key;
  }
  memcpy(g_dynamic, v, sizeof g_dynamic);
}

const float *q4_dynamic_code(void) {
  pthread_once(&g_dynamic_once, dynamic_build);
  return g_dynamic;
}

/* dQuantize<0> (stochastic off): seven halvings from pivot 127 keep the
 * last codes seen below and above x, then x goes to the nearer of pivot and
 * that neighbour by their float midpoint; a value on the midpoint stays at
 * pivot (either side, depending on where the search ended). The neighbours
 * start as -1 / +1 and are re-read from code[0] / code[255] when the search
 * never moved past them (code[0] is -0.99297..., not -1). */
static uint8_t dynamic_quantize(const float *code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f, val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) return (uint8_t)(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return (uint8_t)(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

float q4_mean(const float *absmax, size_t nb) {
  if (nb == 0) return NAN;
  double sum = 0.0; /* left to right: the numerics reference sums the same way */
  for (size_t i = 0; i < nb; i++) sum += absmax[i];
  return (float)(sum / (double)nb);
}

void q4_nest(const float *absmax, size_t nb, float offset, uint8_t *qabsmax, float *absmax2) {
  const float *code = q4_dynamic_code();
  for (size_t b = 0; b * Q4_NESTED_BLOCK < nb; b++) {
    const float *ab = absmax + b * Q4_NESTED_BLOCK;
    size_t m = nb - b * Q4_NESTED_BLOCK;
    if (m > Q4_NESTED_BLOCK) m = Q4_NESTED_BLOCK;
    /* torch makes the float tensor absmax - offset first; the kernel reads it. */
    float amax = -FLT_MAX;
    for (size_t i = 0; i < m; i++) amax = fmaxf(amax, fabsf(ab[i] - offset));
    if (m < Q4_NESTED_BLOCK) amax = fmaxf(amax, 0.0f);
    absmax2[b] = amax;
    float inv = 1.0f / amax; /* all scales equal the offset: inv = inf, codes 0 */
    for (size_t i = 0; i < m; i++)
      qabsmax[b * Q4_NESTED_BLOCK + i] = dynamic_quantize(code, (ab[i] - offset) * inv);
  }
}

/* a * b + c with the product rounded first (no fused multiply-add). */
static float mul_add_apart(float a, float b, float c) {
  volatile float p = a * b;
  return p + c;
}

void q4_unnest_with(const float *map, const uint8_t *qabsmax, const float *absmax2, size_t nb,
                    float offset, float *absmax) {
  for (size_t i = 0; i < nb; i++)
    absmax[i] = mul_add_apart(map[qabsmax[i]], absmax2[i / Q4_NESTED_BLOCK], offset);
}

void q4_unnest(const uint8_t *qabsmax, const float *absmax2, size_t nb, float offset,
               float *absmax) {
  q4_unnest_with(q4_dynamic_code(), qabsmax, absmax2, nb, offset, absmax);
}

int q4_nest_range(size_t nb, size_t first, size_t count, const float *absmax, float offset,
                  uint8_t *qabsmax, float *absmax2) {
  if (first % Q4_NESTED_BLOCK || first > nb || count > nb - first) return -1;
  q4_nest(absmax + first, count, offset, qabsmax + first, absmax2 + first / Q4_NESTED_BLOCK);
  return 0;
}
