/* quant4.h - bitsandbytes' 4-bit blockwise quantization (NF4 and FP4) and its
 * double quantization of the block scales, bit for bit as bitsandbytes'
 * CUDA kernels compute them (csrc/kernels.cu: kQuantizeBlockwise[Small],
 * kDequantizeBlockwise, dQuantizeNF4, dQuantizeFP4, dQuantize), so that a
 * checkpoint we write loads in bitsandbytes and one it wrote loads here.
 *
 * Shapes (n = elements of the flattened tensor, nb = q4_blocks(n)):
 *   codes    uint8 [q4_code_bytes(n)]   two 4-bit codes a byte: element 2j in
 *                                       the high nibble, 2j+1 in the low one
 *   absmax   f32   [nb]                 max |x| of each block of Q4_BLOCK
 *   qabsmax  uint8 [nb]                 absmax - offset, 8-bit dynamic codes
 *   absmax2  f32   [q4_nested_blocks(nb)] max |absmax - offset| of each run
 *                                       of Q4_NESTED_BLOCK scales
 *   offset   f32                        q4_mean(absmax, nb)
 * In QuantState.as_dict(packed=True) terms: codes is the weight, absmax is
 * "absmax" (qabsmax with compress_statistics), q4_code() is "quant_map",
 * absmax2 is "nested_absmax", q4_dynamic_code() is "nested_quant_map" and
 * offset is "nested_offset"; blocksize 64, nested_blocksize 256.
 *
 * Ranges. Callers quantize a rank's shard as it arrives: a run of whole
 * blocks [first_block, first_block + nblocks) of the flat tensor (the last
 * block may be partial). Its elements are [first_block * Q4_BLOCK,
 * min(n, (first_block + nblocks) * Q4_BLOCK)), its codes start at byte
 * first_block * Q4_BLOCK_BYTES and its scales at absmax[first_block];
 * quantizing the pieces of a tensor in any order gives the bytes of
 * quantizing it whole. The nested quantization splits the same way in runs
 * of Q4_NESTED_BLOCK scales, given the tensor-wide offset. In the *_range
 * functions the float side (x, out) is the range's own elements and the
 * packed state (codes, absmax, qabsmax, absmax2) is the whole tensor's.
 *
 * Nothing here allocates; every pointer is borrowed. The code books are
 * static and read-only. */
#ifndef TY_WORKER_QUANT4_H
#define TY_WORKER_QUANT4_H

#include <stddef.h>
#include <stdint.h>

typedef enum { Q4_NF4 = 0, Q4_FP4 = 1 } q4_type_t;

enum {
  Q4_BLOCK = 64,         /* elements per 4-bit block (bitsandbytes' default blocksize) */
  Q4_BLOCK_BYTES = 32,   /* code bytes of a whole block */
  Q4_NESTED_BLOCK = 256, /* scales per nested block (quantize_4bit's blocksize=256) */
};

/* "nf4" / "fp4": QuantState's quant_type. */
const char *q4_type_name(q4_type_t t);
/* "nf4" or "fp4" into *out: 0, or -1 (and *out untouched) for anything else. */
int q4_type_parse(const char *s, q4_type_t *out);

/* The 16 values a code stands for ([16], code order): get_4bit_type(name),
 * saved as quant_map. q4_dequantize multiplies by these, except that the
 * kernel's FP4 code 8 is -0.0 where this table (as bitsandbytes', whose
 * list writes it as the integer `-0`) holds +0.0. */
const float *q4_code(q4_type_t t);
/* create_dynamic_map(signed=True): 256 values in increasing order, built
 * by the same construction (see quant4.c for torch's rounding). */
const float *q4_dynamic_code(void);

size_t q4_blocks(size_t n);         /* ceil(n / Q4_BLOCK) */
size_t q4_code_bytes(size_t n);     /* (n + 1) / 2 */
size_t q4_nested_blocks(size_t nb); /* ceil(nb / Q4_NESTED_BLOCK) */
/* Elements of blocks [first_block, first_block + nblocks) of an n-element
 * tensor, clipped at n (0 when the range starts at or past the end). */
size_t q4_range_elems(size_t n, size_t first_block, size_t nblocks);

/* x[n] -> codes[q4_code_bytes(n)], absmax[q4_blocks(n)]. x may start at any
 * block boundary of a larger tensor (codes and absmax then point at that
 * block's byte and scale). For odd n the last low nibble is the code of
 * 0.0f (what the kernel's zero padding quantizes to: NF4 7, FP4 0; 0 when
 * the block is all zeros). */
void q4_quantize(q4_type_t t, const float *x, size_t n, uint8_t *codes, float *absmax);
/* codes, absmax as q4_quantize wrote them -> out[n] = code[q] * absmax. */
void q4_dequantize(q4_type_t t, const uint8_t *codes, const float *absmax, size_t n, float *out);

/* Blocks [first_block, first_block + nblocks) of an n-element tensor:
 * x[q4_range_elems(...)] -> the whole tensor's codes / absmax at the range's
 * bytes and scales, and back. 0, or -1 (nothing written) when the range
 * passes the end of the tensor. */
int q4_quantize_range(q4_type_t t, size_t n, size_t first_block, size_t nblocks, const float *x,
                      uint8_t *codes, float *absmax);
int q4_dequantize_range(q4_type_t t, size_t n, size_t first_block, size_t nblocks,
                        const uint8_t *codes, const float *absmax, float *out);

/* Double quantization (compress_statistics=True). The offset is the mean of
 * all nb scales of the tensor: summed in double, divided by nb, rounded
 * once to float (NaN for nb = 0, as torch's mean of nothing). */
float q4_mean(const float *absmax, size_t nb);
/* absmax[nb] and the tensor's offset -> qabsmax[nb], absmax2[q4_nested_blocks(nb)].
 * absmax may start at any multiple of Q4_NESTED_BLOCK scales of the tensor
 * (qabsmax and absmax2 then point at that scale and nested block). */
void q4_nest(const float *absmax, size_t nb, float offset, uint8_t *qabsmax, float *absmax2);
/* The scales back: absmax[i] = dynamic[qabsmax[i]] * absmax2[i / 256] + offset,
 * two float32 roundings in that order (as dequantize_blockwise, then
 * `absmax += offset`). Same alignment rule as q4_nest. */
void q4_unnest(const uint8_t *qabsmax, const float *absmax2, size_t nb, float offset,
               float *absmax);
/* q4_unnest through map[256] instead of q4_dynamic_code(): a checkpoint's own
 * nested_quant_map, which bitsandbytes decodes with. Its last ulps depend on
 * the torch that wrote it (see quant4.c), so a reader that must match
 * bitsandbytes bit for bit passes the file's map. */
void q4_unnest_with(const float *map, const uint8_t *qabsmax, const float *absmax2, size_t nb,
                    float offset, float *absmax);
/* Scales [first, first + count) of a tensor with nb scales, first a multiple
 * of Q4_NESTED_BLOCK: the whole tensor's absmax / qabsmax / absmax2 at that
 * range. 0, or -1 (nothing written) for a misaligned or out-of-bounds range. */
int q4_nest_range(size_t nb, size_t first, size_t count, const float *absmax, float offset,
                  uint8_t *qabsmax, float *absmax2);

#endif
