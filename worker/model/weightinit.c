/* weightinit.c - counter-based initial weights: value = f(stream, index). */
#include "worker/model/weightinit.h"

#include <string.h>

/* splitmix64's finaliser: a bijective 64-bit mix, good enough that
 * consecutive counters give independent-looking outputs. */
static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t winit_stream(uint64_t seed, const char *tensor_name) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the name */
  for (const unsigned char *p = (const unsigned char *)tensor_name; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return mix64(h ^ mix64(seed + 0x9e3779b97f4a7c15ull));
}

void winit_fill(uint64_t stream, bool ones, uint64_t first, float *dst, size_t n) {
  if (ones) {
    for (size_t i = 0; i < n; i++) dst[i] = 1.0f;
    return;
  }
  /* Four 16-bit uniforms on [0, 1): sum has mean 2 and variance 4/12, so
   * (sum - 2) * sqrt(3) has std 1. */
  const float scale = WINIT_STD * 1.7320508f / 65536.0f;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = mix64(stream + (first + i) * 0x9e3779b97f4a7c15ull);
    int32_t s = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) +
                (int32_t)((r >> 32) & 0xffff) + (int32_t)(r >> 48) - 2 * 65535;
    dst[i] = (float)s * scale;
  }
}

bool winit_is_norm(const char *tensor_name) {
  size_t n = strlen(tensor_name), k = strlen("norm.weight");
  return n >= k && !strcmp(tensor_name + n - k, "norm.weight");
}
