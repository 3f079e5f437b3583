/* test_cuda_blas.c - the worker maps cuBLAS only when a GPU computation
 * needs it: not at start (its libraries cost a process ~200 MiB of resident
 * memory), and cuda_backend_blas_check finds and loads it (no GPU needed).
 * Skipped in builds without the CUDA toolkit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#ifdef TRAINYARD_HAVE_CUDA
#include "worker/cuda/backend_cuda.h"
#endif

static bool mapped(const char *lib) {
  FILE *f = fopen("/proc/self/maps", "r");
  assert_non_null(f);
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, lib) != NULL;
  fclose(f);
  return found;
}

static void test_blas_loaded_on_demand(void **state) {
  (void)state;
#ifndef TRAINYARD_HAVE_CUDA
  skip();
#else
  assert_false(mapped("libcublas"));
  char err[512] = "";
  int rc = cuda_backend_blas_check(err, sizeof err);
  if (rc) fail_msg("cuBLAS did not load: %s", err);
  assert_true(mapped("libcublas"));
  assert_int_equal(cuda_backend_blas_check(err, sizeof err), 0); /* once per process */
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_blas_loaded_on_demand)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
