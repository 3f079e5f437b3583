/* mem_cuda.h - the worker's device memory, all taken here: plain cudaMalloc,
 * counted per process, under an optional cap.
 *
 * RANKENV_CUDA_MEM_LIMIT_MIB=N caps what this process holds through
 * mem_cuda_alloc at N MiB: an allocation past it fails as the device's own
 * out-of-memory does, so that a job runs on a large GPU as it would on one
 * of N MiB (a GPU shared with other work; or planning: which load path,
 * micro-batch and checkpointing fit a smaller card). The CUDA context and
 * cuBLAS's and NCCL's own memory are not counted. Unset or 0: no cap. */
#ifndef TY_WORKER_MEM_CUDA_H
#define TY_WORKER_MEM_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the cap from the environment (once). 0, or TY_EINVAL naming the
 * variable and what to give. mem_cuda_alloc calls it too, ignoring a bad
 * value; callers that can report one (placement_cuda_init) call it first. */
int mem_cuda_init(char *err, size_t errlen);

/* cudaMalloc of bytes (at least 1) into *p, counted. 0, or -1 with *p NULL
 * when the device or the cap refuses (the runtime's error is cleared). */
int mem_cuda_alloc(void **p, size_t bytes);
/* cudaFree of a pointer from mem_cuda_alloc; NULL is accepted. */
void mem_cuda_free(void *p);

/* The cap in bytes (0: none); bytes held now and at most so far. */
size_t mem_cuda_limit(void);
size_t mem_cuda_used(void);
size_t mem_cuda_peak(void);

/* When rc is TY_EEXHAUSTED and a cap is set, appends to err that the cap
 * is in force, so that an out-of-memory on a large GPU says why. */
void mem_cuda_explain(int rc, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
