/* mem_cuda.c - device allocations counted per process, under an optional
 * cap (mem_cuda.h). A process holds a few hundred allocations at most (the
 * shard, the training buffers, AdamW's moments per tensor, unit slots), so
 * a plain array maps each pointer to its size. */
#include "worker/cuda/mem_cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/errors.h"
#include "common/rankenv.h"

typedef struct {
  void *p;
  size_t bytes;
} cm_block_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static size_t g_limit, g_used, g_peak;
static char g_bad[256]; /* why the environment's value was refused, if it was */
static cm_block_t *g_blocks;
static size_t g_n, g_cap;

static void read_env(void) {
  long mib = 0;
  if (!rankenv_long(RANKENV_CUDA_MEM_LIMIT_MIB, &mib, g_bad, sizeof g_bad))
    g_limit = (size_t)mib << 20;
}

int mem_cuda_init(char *err, size_t errlen) {
  pthread_once(&g_once, read_env);
  return g_bad[0] ? ty_errf(err, errlen, TY_EINVAL, "%s", g_bad) : 0;
}

int mem_cuda_alloc(void **p, size_t bytes) {
  pthread_once(&g_once, read_env);
  *p = NULL;
  if (!bytes) bytes = 1;
  pthread_mutex_lock(&g_mu);
  int rc = -1;
  if (g_limit && (bytes > g_limit || g_used > g_limit - bytes)) goto out;
  if (g_n == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 64;
    cm_block_t *nb = realloc(g_blocks, cap * sizeof *nb);
    if (!nb) goto out;
    g_blocks = nb, g_cap = cap;
  }
  if (cudaMalloc(p, bytes) != cudaSuccess) {
    cudaGetLastError(); /* an out-of-memory cudaMalloc is not sticky; clear it */
    *p = NULL;
    goto out;
  }
  g_blocks[g_n++] = (cm_block_t){*p, bytes};
  g_used += bytes;
  if (g_used > g_peak) g_peak = g_used;
  rc = 0;
out:
  pthread_mutex_unlock(&g_mu);
  return rc;
}

void mem_cuda_free(void *p) {
  if (!p) return;
  pthread_mutex_lock(&g_mu);
  for (size_t i = g_n; i-- > 0;) {
    if (g_blocks[i].p == p) {
      g_used -= g_blocks[i].bytes;
      g_blocks[i] = g_blocks[--g_n];
      break;
    }
  }
  pthread_mutex_unlock(&g_mu);
  cudaFree(p);
}

size_t mem_cuda_limit(void) {
  pthread_once(&g_once, read_env);
  return g_limit;
}

size_t mem_cuda_used(void) {
  pthread_mutex_lock(&g_mu);
  size_t u = g_used;
  pthread_mutex_unlock(&g_mu);
  return u;
}

size_t mem_cuda_peak(void) {
  pthread_mutex_lock(&g_mu);
  size_t u = g_peak;
  pthread_mutex_unlock(&g_mu);
  return u;
}

void mem_cuda_explain(int rc, char *err, size_t errlen) {
  size_t lim = mem_cuda_limit(), len = err ? strlen(err) : 0;
  if (rc != TY_EEXHAUSTED || !lim || !err || len + 1 >= errlen) return;
  snprintf(err + len, errlen - len,
           "; this process's device memory is capped at %.1f MiB by %s (set by trainyardd's "
           "--gpu-mem-limit-mib for its ranks; raise or unset it)",
           (double)lim / 1048576.0, rankenv_name(RANKENV_CUDA_MEM_LIMIT_MIB));
}
