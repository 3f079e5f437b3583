/* dtype.h - the element types trainyard reads and writes (safetensors F32,
 * F16, BF16) and exact conversions between them and fp32. */
#ifndef TY_COMMON_DTYPE_H
#define TY_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { TY_DTYPE_F32 = 0, TY_DTYPE_BF16, TY_DTYPE_F16, TY_DTYPE_COUNT } ty_dtype_t;

/* Bytes per element: 4, 2, 2. */
size_t ty_dtype_size(ty_dtype_t t);
/* Spec / config.json spelling: "float32", "bfloat16", "float16". */
const char *ty_dtype_name(ty_dtype_t t);
/* safetensors spelling: "F32", "BF16", "F16". */
const char *ty_dtype_st_name(ty_dtype_t t);
/* Parses either spelling (and "f32", "bf16", "f16", "fp32", ...); 0 on
 * success, -1 for an unknown name. */
int ty_dtype_parse(const char *s, ty_dtype_t *out);

/* Exact widening to fp32 (every bf16 and f16 value, subnormals, infinities
 * and NaN included, has an exact fp32 form). src holds n little-endian
 * elements of type t; dst receives n floats. src and dst may not overlap. */
void ty_dtype_to_f32(ty_dtype_t t, const void *src, float *dst, size_t n);
/* Narrowing from fp32, round to nearest even; NaN stays NaN. */
void ty_dtype_from_f32(ty_dtype_t t, const float *src, void *dst, size_t n);

#endif
