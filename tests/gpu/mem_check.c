/* mem_check.c - the worker's device allocator (worker/cuda/mem_cuda.h) under a
 * cap of 3 MiB set in the environment before its first use: allocations
 * up to the cap succeed and one past it fails without touching the count;
 * a free gives its bytes back; the peak holds the most held at once; an
 * out-of-memory error gains the cap's note, any other error does not.
 * Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "tests/gpu/gpu_util.h"
#include "worker/cuda/mem_cuda.h"

#define MIB ((size_t)1 << 20)

static int g_failed;

static void expect(int ok, const char *what) {
  printf("%-4s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) g_failed = 1;
}

int main(void) {
  gpu_require_device("mem_check");
  setenv("TRAINYARD_CUDA_MEM_LIMIT_MIB", "3", 1);
  char err[256];
  expect(mem_cuda_init(err, sizeof err) == 0, "a cap of 3 MiB is read");
  expect(mem_cuda_limit() == 3 * MIB, "the cap is 3 MiB");
  void *a, *b, *c, *d;
  expect(mem_cuda_alloc(&a, 2 * MIB) == 0 && a, "2 MiB under the cap");
  expect(mem_cuda_used() == 2 * MIB, "2 MiB counted");
  expect(mem_cuda_alloc(&b, 2 * MIB) != 0 && !b, "2 MiB more is refused");
  expect(mem_cuda_used() == 2 * MIB, "the refusal counts nothing");
  expect(cudaGetLastError() == cudaSuccess, "the refusal leaves no CUDA error");
  expect(mem_cuda_alloc(&c, 1 * MIB) == 0 && c, "1 MiB more fills the cap exactly");
  expect(mem_cuda_alloc(&d, 1) != 0, "one byte past the cap is refused");
  mem_cuda_free(a);
  expect(mem_cuda_used() == 1 * MIB, "a free gives its 2 MiB back");
  expect(mem_cuda_alloc(&b, 2 * MIB) == 0 && b, "2 MiB fits again");
  expect(mem_cuda_peak() == 3 * MIB, "the peak is 3 MiB");
  mem_cuda_free(b);
  mem_cuda_free(c);
  mem_cuda_free(NULL);
  expect(mem_cuda_used() == 0, "everything given back");
  strcpy(err, "out of device memory");
  mem_cuda_explain(TY_EEXHAUSTED, err, sizeof err);
  expect(strstr(err, "capped at 3.0 MiB by TRAINYARD_CUDA_MEM_LIMIT_MIB") != NULL,
         "an out-of-memory error names the cap");
  strcpy(err, "no such file");
  mem_cuda_explain(TY_ENOTFOUND, err, sizeof err);
  expect(strcmp(err, "no such file") == 0, "another error is left as it was");
  return g_failed;
}
