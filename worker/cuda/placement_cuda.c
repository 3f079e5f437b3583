/* placement_cuda.c - the CUDA placement: device shards by cudaMalloc, host
 * bytes through PLACEMENT_CUDA_BUFFERS pinned staging buffers used in turn, each copy
 * queued on the placement's own stream; our high-water mark checked against
 * cudaMemGetInfo. */
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
  /* Its own non-blocking stream: every copy in and within is queued there,
   * in order; nothing else waits on it but our own waits. */
  cudaStream_t stream;
  char *buf[PLACEMENT_CUDA_BUFFERS];        /* pinned, staging_bytes each */
  cudaEvent_t sent[PLACEMENT_CUDA_BUFFERS]; /* recorded after the last copy out of buf[i] */
  int next;                                 /* the buffer lent next (round robin) */
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

/* Frees whatever part of c placement_cuda_init made, and c, once its
 * stream has nothing left to copy. */
static void pcuda_close(pcuda_t *c) {
  if (c->stream) cudaStreamSynchronize(c->stream);
  for (int i = 0; i < PLACEMENT_CUDA_BUFFERS; i++) {
    if (c->buf[i]) cudaFreeHost(c->buf[i]);
    if (c->sent[i]) cudaEventDestroy(c->sent[i]);
  }
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c);
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
  pcuda_t *c = calloc(1, sizeof *c);
  if (!c) return TY_EEXHAUSTED;
  c->device = device;
  c->staging_bytes = staging_bytes < PCUDA_MIN_STAGING ? PCUDA_MIN_STAGING : staging_bytes;
  size_t fr = 0, tot = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemGetInfo(&fr, &tot); /* also creates the context */
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  for (int i = 0; i < PLACEMENT_CUDA_BUFFERS && e == cudaSuccess; i++)
    e = cudaEventCreateWithFlags(&c->sent[i], cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (err && errlen)
      snprintf(err, errlen, "device cuda: cannot use device %d: %s", device, cudaGetErrorString(e));
    pcuda_close(c);
    return TY_EUNAVAILABLE;
  }
  for (int i = 0; i < PLACEMENT_CUDA_BUFFERS && e == cudaSuccess; i++)
    e = cudaHostAlloc((void **)&c->buf[i], c->staging_bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    if (err && errlen)
      snprintf(err, errlen,
               "device cuda: cannot pin %d staging buffers of %.1f MiB: %s (lower "
               "fsdp.bucket_mb)",
               PLACEMENT_CUDA_BUFFERS, (double)c->staging_bytes / 1048576.0, cudaGetErrorString(e));
    cudaGetLastError(); /* a refused cudaHostAlloc is not sticky; clear it */
    pcuda_close(c);
    return TY_EEXHAUSTED;
  }
  /* The baseline after the stream and events: whatever device memory the
   * runtime takes for them is not the shard's. */
  size_t fr2, tot2;
  if (cudaMemGetInfo(&fr2, &tot2) == cudaSuccess) fr = fr2, tot = tot2;
  c->total = tot;
  c->used_at_init = tot - fr;
  p->ops = &g_cuda_ops;
  p->ctx = c;
  return 0;
}

void placement_cuda_free(placement_t *p) {
  pcuda_t *c = p->ctx;
  if (!c || p->ops != &g_cuda_ops) return;
  cudaSetDevice(c->device);
  pcuda_close(c);
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
  info->staging_buffers = PLACEMENT_CUDA_BUFFERS;
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

/* placement_release has waited for the stream: nothing is copied into ptr
 * any more. */
static void cuda_release(placement_t *p, void *ptr, size_t n) {
  (void)n;
  pcuda_t *c = p->ctx;
  if (!ptr) return;
  cudaSetDevice(c->device);
  mem_cuda_free(ptr);
}

/* Lends the next buffer once the last copy out of it has run. */
static int cuda_stage(placement_t *p, void **buf, size_t *cap) {
  pcuda_t *c = p->ctx;
  cudaSetDevice(c->device);
  if (cudaEventSynchronize(c->sent[c->next]) != cudaSuccess) return TY_EINTERNAL;
  *buf = c->buf[c->next];
  *cap = c->staging_bytes;
  return 0;
}

/* Queues the lent buffer's first n bytes -> dst + off, marks when they
 * have left it, and turns to the other buffer. */
static int cuda_stage_in(placement_t *p, void *dst, size_t off, size_t n) {
  pcuda_t *c = p->ctx;
  const int i = c->next;
  if (!n) return 0;
  if (n > c->staging_bytes) return TY_EINVAL; /* cannot happen: *cap bounds the caller */
  c->next = (i + 1) % PLACEMENT_CUDA_BUFFERS;
  cudaSetDevice(c->device);
  if (cudaMemcpyAsync((char *)dst + off, c->buf[i], n, cudaMemcpyHostToDevice, c->stream) !=
          cudaSuccess ||
      cudaEventRecord(c->sent[i], c->stream) != cudaSuccess)
    return TY_EINTERNAL;
  return 0;
}

/* Host src -> the buffers in turn -> device: the memcpy into one buffer
 * overlaps the copy out of the other; src is read when it returns. */
static int cuda_copy_in(placement_t *p, void *dst, size_t off, const void *src, size_t n) {
  for (size_t done = 0; done < n;) {
    void *buf;
    size_t cap;
    int rc = cuda_stage(p, &buf, &cap);
    if (rc) return rc;
    size_t k = n - done < cap ? n - done : cap;
    memcpy(buf, (const char *)src + done, k);
    if ((rc = cuda_stage_in(p, dst, off + done, k))) return rc;
    done += k;
  }
  return 0;
}

/* On the placement's stream, so after every copy in queued before it. */
static int cuda_copy_within(placement_t *p, void *dst, size_t dst_off, const void *src,
                            size_t src_off, size_t n) {
  pcuda_t *c = p->ctx;
  if (!n) return 0;
  cudaSetDevice(c->device);
  if (cudaMemcpyAsync((char *)dst + dst_off, (const char *)src + src_off, n,
                      cudaMemcpyDeviceToDevice, c->stream) != cudaSuccess)
    return TY_EINTERNAL;
  return 0;
}

static int cuda_finish(placement_t *p) {
  pcuda_t *c = p->ctx;
  cudaSetDevice(c->device);
  return cudaStreamSynchronize(c->stream) == cudaSuccess ? 0 : TY_EINTERNAL;
}

static const placement_ops_t g_cuda_ops = {.name = "cuda",
                                           .alloc = cuda_alloc,
                                           .release = cuda_release,
                                           .copy_in = cuda_copy_in,
                                           .copy_within = cuda_copy_within,
                                           .finish = cuda_finish,
                                           .stage = cuda_stage,
                                           .stage_in = cuda_stage_in};
