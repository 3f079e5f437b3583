/* placement_cuda.c - the CUDA placement: device shards by cudaMalloc, host
 * bytes through one pinned staging bucket, our high-water mark checked
 * against cudaMemGetInfo. */
#include "worker/cuda/placement_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/errors.h"
#include "worker/cuda/mem_cuda.h"

#define PCUDA_MIN_STAGING ((size_t)64 << 10)

typedef struct {
  int device;
  char *staging; /* pinned, staging_bytes */
  size_t staging_bytes;
  uint64_t total, used_at_init, driver_peak;
} pcuda_t;

static const placement_ops_t g_cuda_ops;

int placement_cuda_devices(int *count, char *err, size_t errlen) {
  *count = 0;
  cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess || *count < 1) {
    *count = 0;
    if (err && errlen)
      snprintf(err, errlen,
               "device cuda: no CUDA device is visible (%s); run on a host with an NVIDIA GPU and "
               "its driver, check CUDA_VISIBLE_DEVICES, or use device cpu",
               e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports 0 devices");
    cudaGetLastError(); /* clear the sticky-free error state */
    return TY_EUNAVAILABLE;
  }
  return 0;
}

/* One more driver sample: the device's used memory above the init level. */
static void sample(pcuda_t *c) {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return;
  uint64_t used = (uint64_t)(tot - fr);
  uint64_t above = used > c->used_at_init ? used - c->used_at_init : 0;
  if (above > c->driver_peak) c->driver_peak = above;
}

int placement_cuda_init(placement_t *p, int device, size_t staging_bytes, char *err,
                        size_t errlen) {
  memset(p, 0, sizeof *p);
  int count;
  int rc = mem_cuda_init(err, errlen);
  if (!rc) rc = placement_cuda_devices(&count, err, errlen);
  if (rc) return rc;
  if (device < 0 || device >= count) {
    if (err && errlen)
      snprintf(err, errlen, "device cuda: device %d does not exist (%d visible); use 0..%d", device,
               count, count - 1);
    return TY_EUNAVAILABLE;
  }
  cudaError_t e = cudaSetDevice(device);
  size_t fr = 0, tot = 0;
  if (e == cudaSuccess) e = cudaMemGetInfo(&fr, &tot); /* also creates the context */
  if (e != cudaSuccess) {
    if (err && errlen)
      snprintf(err, errlen, "device cuda: cannot use device %d: %s", device, cudaGetErrorString(e));
    return TY_EUNAVAILABLE;
  }
  pcuda_t *c = calloc(1, sizeof *c);
  if (!c) return TY_EEXHAUSTED;
  c->device = device;
  c->total = tot;
  c->used_at_init = tot - fr;
  c->staging_bytes = staging_bytes < PCUDA_MIN_STAGING ? PCUDA_MIN_STAGING : staging_bytes;
  e = cudaHostAlloc((void **)&c->staging, c->staging_bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    if (err && errlen)
      snprintf(err, errlen,
               "device cuda: cannot pin a %.1f MiB staging bucket: %s (lower "
               "fsdp.bucket_mb)",
               (double)c->staging_bytes / 1048576.0, cudaGetErrorString(e));
    free(c);
    return TY_EEXHAUSTED;
  }
  p->ops = &g_cuda_ops;
  p->ctx = c;
  return 0;
}

void placement_cuda_free(placement_t *p) {
  pcuda_t *c = p->ctx;
  if (!c || p->ops != &g_cuda_ops) return;
  cudaFreeHost(c->staging);
  free(c);
  p->ctx = NULL;
}

int placement_is_cuda(const placement_t *p) {
  return p->ops == &g_cuda_ops;
}

void placement_cuda_info(placement_t *p, placement_cuda_info_t *info) {
  pcuda_t *c = p->ctx;
  memset(info, 0, sizeof *info);
  if (!c) return;
  cudaSetDevice(c->device);
  sample(c);
  info->device = c->device;
  info->total = c->total;
  info->used_at_init = c->used_at_init;
  info->driver_peak = c->driver_peak;
  info->staging_bytes = c->staging_bytes;
}

int placement_cuda_check(placement_t *p, uint64_t slack_bytes, char *err, size_t errlen) {
  placement_cuda_info_t in;
  placement_cuda_info(p, &in);
  /* Either way: the driver rounds allocations up (2 MiB pages), and it
   * places small ones in pages it already holds, freed or not, which
   * cudaMemGetInfo then does not count again. */
  if (in.driver_peak + slack_bytes >= p->peak && in.driver_peak <= p->peak + slack_bytes) return 0;
  if (err && errlen)
    snprintf(err, errlen,
             "device peak mismatch on device %d: our allocator %.1f MiB, cudaMemGetInfo %.1f MiB "
             "(allowed slack %.1f MiB)",
             in.device, (double)p->peak / 1048576.0, (double)in.driver_peak / 1048576.0,
             (double)slack_bytes / 1048576.0);
  return TY_EINTERNAL;
}

static int cuda_alloc(placement_t *p, size_t n, void **out) {
  pcuda_t *c = p->ctx;
  *out = NULL;
  if (!n) return 0;
  cudaSetDevice(c->device);
  if (mem_cuda_alloc(out, n)) return TY_EEXHAUSTED;
  sample(c);
  return 0;
}

static void cuda_release(placement_t *p, void *ptr, size_t n) {
  (void)n;
  pcuda_t *c = p->ctx;
  if (!ptr) return;
  cudaSetDevice(c->device);
  mem_cuda_free(ptr);
}

/* Host src -> pinned bucket -> device, one bucket at a time. */
static int cuda_copy_in(placement_t *p, void *dst, size_t off, const void *src, size_t n) {
  pcuda_t *c = p->ctx;
  cudaSetDevice(c->device);
  for (size_t done = 0; done < n;) {
    size_t k = n - done < c->staging_bytes ? n - done : c->staging_bytes;
    memcpy(c->staging, (const char *)src + done, k);
    if (cudaMemcpy((char *)dst + off + done, c->staging, k, cudaMemcpyHostToDevice) != cudaSuccess)
      return TY_EINTERNAL;
    done += k;
  }
  return 0;
}

static int cuda_copy_within(placement_t *p, void *dst, size_t dst_off, const void *src,
                            size_t src_off, size_t n) {
  pcuda_t *c = p->ctx;
  if (!n) return 0;
  cudaSetDevice(c->device);
  if (cudaMemcpy((char *)dst + dst_off, (const char *)src + src_off, n, cudaMemcpyDeviceToDevice) !=
      cudaSuccess)
    return TY_EINTERNAL;
  return 0;
}

static const placement_ops_t g_cuda_ops = {"cuda", cuda_alloc, cuda_release, cuda_copy_in,
                                           cuda_copy_within};
