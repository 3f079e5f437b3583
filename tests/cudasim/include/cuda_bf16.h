/* cuda_bf16.h - bfloat16 for the simulated device: the storage type and the
 * two conversions kernels use, rounding to nearest even as the GPU does
 * (NaN stays a quiet NaN). */
#ifndef TY_CUDASIM_CUDA_BF16_H
#define TY_CUDASIM_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

typedef struct {
  uint16_t x;
} __nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  __nv_bfloat16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u)
    h.x = (uint16_t)((u >> 16) | 0x40u);
  else
    h.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return h;
}

static inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.x << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

#endif
