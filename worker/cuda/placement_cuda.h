/* placement_cuda.h - the CUDA placement: a rank's shards in device memory.
 *
 * Slots into the loader through placement_t (worker/ckpt/placement.h). Device
 * memory is taken with plain cudaMalloc, one allocation per placement_alloc,
 * so the loader's memory-efficient path puts only this rank's shard on the
 * device and its standard path the whole model (for comparison).
 *
 * Host bytes travel through PLACEMENT_CUDA_BUFFERS pinned staging buffers
 * (cudaHostAlloc) of staging_bytes each, used in turn, with every copy
 * queued on the placement's own non-blocking stream: the loader reads the
 * next chunk from its file straight into one buffer (stage; converted into
 * it where the dtypes differ) while the other's cudaMemcpyAsync runs, and
 * an event per buffer marks when its copy has left it, so a buffer is
 * waited for before it is lent again. copy_in (a whole host shard) goes
 * through the same buffers; copy_within queues on the same stream. Bytes
 * are on the device once placement_finish returns 0 (the loader calls it
 * before it returns, on errors too), and placement_release waits for the
 * stream before cudaFree. Pinned host memory: PLACEMENT_CUDA_BUFFERS x
 * staging_bytes, for the placement's lifetime; device memory: only what
 * alloc hands out (the stream and events are counted in the baseline).
 *
 * Accounting: p->peak is our allocator's high-water mark (the device peak a
 * rank reports). The driver's view is sampled with cudaMemGetInfo after
 * every allocation: its used-memory peak above the level seen at init
 * (driver_peak) must agree with ours within allocation granularity, either
 * way (placement_cuda_check). */
#ifndef TY_WORKER_PLACEMENT_CUDA_H
#define TY_WORKER_PLACEMENT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "worker/ckpt/placement.h"

/* Pinned staging buffers a placement uses in turn. */
#define PLACEMENT_CUDA_BUFFERS 2

/* Figures of a CUDA placement, in bytes. */
typedef struct {
  int device;             /* CUDA device index */
  uint64_t total;         /* the device's memory */
  uint64_t used_at_init;  /* total - free when the placement was made */
  uint64_t driver_peak;   /* max over samples of (total - free) - used_at_init */
  uint64_t staging_bytes; /* each pinned staging buffer */
  int staging_buffers;    /* PLACEMENT_CUDA_BUFFERS */
} placement_cuda_info_t;

/* The number of visible CUDA devices into *count. Returns 0, or
 * TY_EUNAVAILABLE with the runtime's reason in err when there is none (no
 * driver, no device, CUDA_VISIBLE_DEVICES empty). */
int placement_cuda_devices(int *count, char *err, size_t errlen);

/* Makes p a placement on CUDA device `device` with PLACEMENT_CUDA_BUFFERS
 * pinned staging buffers of staging_bytes each (at least 64 KiB is used).
 * Release with placement_cuda_free. Returns 0, TY_EUNAVAILABLE (no such
 * device: err says why and what to do) or TY_EEXHAUSTED (the pinned
 * buffers: err names their size and fsdp.bucket_mb). */
int placement_cuda_init(placement_t *p, int device, size_t staging_bytes, char *err, size_t errlen);
/* Waits for the placement's stream, frees the buffers and its state;
 * every allocation must have been released. Accepts a placement never
 * initialised (zeroed). */
void placement_cuda_free(placement_t *p);

/* True when p is a CUDA placement. */
int placement_is_cuda(const placement_t *p);

/* The placement's figures (samples the driver once more first). */
void placement_cuda_info(placement_t *p, placement_cuda_info_t *info);

/* The cross-check: 0 when the driver's peak and our high-water mark
 * differ by at most slack_bytes; else TY_EINTERNAL with both figures in
 * err. */
int placement_cuda_check(placement_t *p, uint64_t slack_bytes, char *err, size_t errlen);

#endif
