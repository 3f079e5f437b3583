/* bench_util.h - what the GPU benches share: the checkpoint loaded onto
 * device 0 as a LoRA run loads it (the memory-efficient path, bf16, a
 * 64 MiB bucket) beside a backend on the same device. */
#ifndef TY_TESTS_GPU_BENCH_UTIL_H
#define TY_TESTS_GPU_BENCH_UTIL_H

#include <stddef.h>

#include "worker/ckpt/loader.h"
#include "worker/cuda/backend_cuda.h"
#include "worker/cuda/placement_cuda.h"

/* pl (a CUDA placement of device 0), cb and *s (the checkpoint at dir, bf16,
 * its figures in *st). 0, or the first failure's status with its reason in
 * err; the caller frees what was made either way (loader_shard_free,
 * cuda_backend_free, placement_cuda_free accept what was not). */
static inline int bench_load_bf16(const char *dir, placement_t *pl, cuda_backend_t **cb,
                                  loader_shard_t **s, loader_stats_t *st, char *err,
                                  size_t errlen) {
  *cb = NULL, *s = NULL;
  int rc = placement_cuda_init(pl, 0, (size_t)64 << 20, err, errlen);
  if (!rc) rc = cuda_backend_create(cb, 0, err, errlen);
  loader_opts_t o = {.rank = 0,
                     .world_size = 1,
                     .dtype = TY_DTYPE_BF16,
                     .memory_efficient = true,
                     .bucket_bytes = (size_t)64 << 20,
                     .pl = pl};
  if (!rc) rc = loader_load(dir, &o, s, st, err, errlen);
  return rc;
}

#endif
