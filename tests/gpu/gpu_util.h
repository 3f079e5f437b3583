/* gpu_util.h - what the GPU checks share: the skip rule (exit 77 with the
 * reason printed when no CUDA device is visible), seeded host data, device
 * copies, a tolerance comparison that prints its worst element, and the
 * worst difference against the largest value. */
#ifndef TY_TESTS_GPU_UTIL_H
#define TY_TESTS_GPU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "worker/cuda/placement_cuda.h"

#define GPU_SKIP 77

/* Exits 77 (ctest SKIP_RETURN_CODE) with the reason when there is no GPU. */
static inline void gpu_require_device(const char *prog) {
  int n;
  char why[512];
  if (placement_cuda_devices(&n, why, sizeof why)) {
    printf("SKIP %s: %s\n", prog, why);
    fflush(stdout);
    exit(GPU_SKIP);
  }
  fprintf(stderr, "%s: %d CUDA device(s) visible\n", prog, n);
}

/* Uniform values in [-amp, amp) from a 64-bit LCG (deterministic). */
static inline void gpu_fill(float *x, size_t n, uint64_t seed, float amp) {
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = amp * (2.0f * (float)((s >> 40) & 0xffffff) / 16777216.0f - 1.0f);
  }
}

/* A device copy of h (bytes), or uninitialised device memory when h is NULL. */
static inline void *gpu_dup(const void *h, size_t bytes) {
  void *d = NULL;
  if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc of %zu bytes failed\n", bytes);
    exit(1);
  }
  if (h && bytes) cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
  return d;
}

static inline void gpu_get(void *h, const void *d, size_t bytes) {
  cudaError_t e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    fprintf(stderr, "cudaMemcpy: %s\n", cudaGetErrorString(e));
    exit(1);
  }
}

/* The largest |got - want| (NaN: infinite) over n floats, in *worst with
 * its index in *at, and the largest |want| in *top: products of rounded
 * operands are judged by worst / top, since their errors scale with the
 * whole sum, not with each element (which may cancel to near 0). */
static inline void gpu_worst_diff(const float *got, const float *want, size_t n, double *worst,
                                  size_t *at, double *top) {
  *worst = 0.0, *at = 0, *top = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= *worst)) *worst = isnan(e) ? INFINITY : e, *at = i;
    if (fabs((double)want[i]) > *top) *top = fabs((double)want[i]);
  }
}

/* |got - want| <= atol + rtol * |want| everywhere; prints one line either
 * way and returns 1 on a failure. */
static inline int gpu_close(const char *what, const float *got, const float *want, size_t n,
                            float rtol, float atol) {
  size_t worst = 0;
  double worst_excess = -1.0, max_abs = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    if (!(d == d)) d = INFINITY; /* NaN */
    if (d > max_abs) max_abs = d;
    double excess = d - (atol + rtol * fabs((double)want[i]));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  int bad = n && worst_excess > 0.0;
  printf("%-4s %-28s n=%-8zu max|diff| %.3g%s", bad ? "FAIL" : "ok", what, n, max_abs,
         bad ? "" : "\n");
  if (bad) printf("  at [%zu]: got %.9g want %.9g\n", worst, got[worst], want[worst]);
  return bad;
}

#endif
