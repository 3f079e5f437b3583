/* dtype.h - the element types trainyard reads and writes (safetensors F32,
 * F16, BF16, and U8 for bitsandbytes' 4-bit layout) and exact conversions
 * between the float ones and fp32. */
#ifndef TY_COMMON_DTYPE_H
#define TY_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/* TY_DTYPE_COUNT counts the float types: those a weight takes, that every
 * conversion handles and that `t < TY_DTYPE_COUNT` checks accept. U8 (bytes:
 * bitsandbytes' packed 4-bit codes, its 8-bit statistics and its JSON
 * quant_state, worker/ckpt/bnb4.h) comes after the count, so that every
 * such check, and every loop over the float types, keeps refusing it where
 * floats are meant; only the sizes and names below know it. */
typedef enum {
  TY_DTYPE_F32 = 0,
  TY_DTYPE_BF16,
  TY_DTYPE_F16,
  TY_DTYPE_COUNT,
  TY_DTYPE_U8 = TY_DTYPE_COUNT + 1
} ty_dtype_t;

/* Bytes per element: 4, 2, 2; 1 for U8; 0 for anything else. */
size_t ty_dtype_size(ty_dtype_t t);
/* Spec / config.json spelling: "float32", "bfloat16", "float16" ("uint8"). */
const char *ty_dtype_name(ty_dtype_t t);
/* safetensors spelling: "F32", "BF16", "F16" ("U8"). */
const char *ty_dtype_st_name(ty_dtype_t t);
/* Parses either spelling of a float type (and "f32", "bf16", "f16",
 * "fp32", ...); 0 on success, -1 for an unknown name and for U8, which is
 * never a dtype a user asks for. */
int ty_dtype_parse(const char *s, ty_dtype_t *out);

/* Exact widening to fp32 (every bf16 and f16 value, subnormals, infinities
 * and NaN included, has an exact fp32 form). src holds n little-endian
 * elements of type t; dst receives n floats. src and dst may not overlap.
 * t must be a float type; U8 holds no numbers to widen, and gives n NaN
 * (a caller that let one through sees it at once, never plausible values). */
void ty_dtype_to_f32(ty_dtype_t t, const void *src, float *dst, size_t n);
/* Narrowing from fp32, round to nearest even; NaN stays NaN. t must be a
 * float type: for U8 nothing is written. */
void ty_dtype_from_f32(ty_dtype_t t, const float *src, void *dst, size_t n);

/* n floats of x rounded to float type t and back, in place: the values a
 * tensor of type t holds (float32: unchanged). */
void ty_dtype_round(ty_dtype_t t, float *x, size_t n);

#endif
