/* prefetch_cuda.c - prefetch's ops on a GPU; see prefetch_cuda.h. */
#include "worker/cuda/prefetch_cuda.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "worker/cuda/mem_cuda.h"

struct prefetch_cuda {
  cuda_backend_t *cb;
  comm_t *comm;
  cudaStream_t cs; /* the comm's stream */
  int nslots;
  void *slots[PREFETCH_MAX_SLOTS];
  size_t slot_bytes;
  cudaEvent_t gathered[PREFETCH_MAX_SLOTS], released[PREFETCH_MAX_SLOTS];
  bool was_released[PREFETCH_MAX_SLOTS];
  cudaEvent_t computed; /* the compute stream before reductions, and after shard updates */
  cudaEvent_t reduced;  /* full training's gradient reductions */
  prefetch_t *p;
};

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen) {
  return ty_errf(err, errlen, TY_EINTERNAL, "prefetch: %s: %s", what, cudaGetErrorString(e));
}

static int from_comm(prefetch_cuda_t *pc, int rc, char *err, size_t errlen) {
  return ty_errf(err, errlen, rc, "prefetch: %s", comm_error(pc->comm));
}

static int pc_begin(void *ctx, int slot, char *err, size_t errlen) {
  prefetch_cuda_t *pc = ctx;
  if (!pc->was_released[slot]) return 0;
  cudaError_t e = cudaStreamWaitEvent(pc->cs, pc->released[slot], 0);
  return e == cudaSuccess
             ? 0
             : cuda_fail(e, "ordering a gather after the slot's last use", err, errlen);
}

static int pc_gather(void *ctx, const void *send, void *recv, const size_t *counts,
                     size_t elem_size, char *err, size_t errlen) {
  prefetch_cuda_t *pc = ctx;
  int rc = comm_all_gather_queue(pc->comm, send, recv, counts, elem_size);
  return rc ? from_comm(pc, rc, err, errlen) : 0;
}

static int pc_end(void *ctx, int slot, char *err, size_t errlen) {
  prefetch_cuda_t *pc = ctx;
  cudaError_t e = cudaEventRecord(pc->gathered[slot], pc->cs);
  return e == cudaSuccess ? 0 : cuda_fail(e, "recording a gather", err, errlen);
}

static int pc_wait(void *ctx, int slot, char *err, size_t errlen) {
  prefetch_cuda_t *pc = ctx;
  cudaError_t e = cudaStreamWaitEvent(0, pc->gathered[slot], 0);
  if (e != cudaSuccess) return cuda_fail(e, "ordering compute after a gather", err, errlen);
  int rc = comm_wait_event(pc->comm, pc->gathered[slot], "gathering a unit");
  return rc ? from_comm(pc, rc, err, errlen) : 0;
}

static int pc_release(void *ctx, int slot, char *err, size_t errlen) {
  prefetch_cuda_t *pc = ctx;
  cudaError_t e = cudaEventRecord(pc->released[slot], 0);
  if (e != cudaSuccess) return cuda_fail(e, "recording a slot's last use", err, errlen);
  pc->was_released[slot] = true;
  return 0;
}

/* The comm stream's work from now on reads what the compute stream has
 * written so far. */
static int after_compute(prefetch_cuda_t *pc, const char *what, char *err, size_t errlen) {
  cudaError_t e = cudaEventRecord(pc->computed, 0);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(pc->cs, pc->computed, 0);
  return e == cudaSuccess ? 0 : cuda_fail(e, what, err, errlen);
}

/* The gathers after an optimizer step or a resume read the new shards. */
static int pc_written(void *ctx, char *err, size_t errlen) {
  return after_compute(ctx, "ordering gathers after the shards' update", err, errlen);
}

/* The reductions read the gradients. */
static int pc_reduce_begin(void *ctx, char *err, size_t errlen) {
  return after_compute(ctx, "ordering a reduction after the gradients", err, errlen);
}

static int pc_reduce(void *ctx, float *send, float *recv, const size_t *counts, char *err,
                     size_t errlen) {
  prefetch_cuda_t *pc = ctx;
  int rc = comm_reduce_scatter_queue(pc->comm, send, recv, counts);
  return rc ? from_comm(pc, rc, err, errlen) : 0;
}

/* The compute stream reads the sums only once they are made. */
static int pc_reduce_end(void *ctx, char *err, size_t errlen) {
  prefetch_cuda_t *pc = ctx;
  cudaError_t e = cudaEventRecord(pc->reduced, pc->cs);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(0, pc->reduced, 0);
  return e == cudaSuccess ? 0 : cuda_fail(e, "ordering compute after a reduction", err, errlen);
}

static int pc_add(void *ctx, float *dst, const float *src, size_t n, char *err, size_t errlen) {
  (void)err, (void)errlen;
  cuda_add(((prefetch_cuda_t *)ctx)->cb, dst, src, n);
  return 0;
}

int prefetch_cuda_create(prefetch_cuda_t **out, cuda_backend_t *cb, const loader_shard_t *shard,
                         comm_t *comm, int nslots, char *err, size_t errlen) {
  *out = NULL;
  if (!comm_stream(comm))
    return ty_errf(err, errlen, TY_EINVAL,
                   "prefetch: sharded GPU weights are gathered by NCCL, and this comm is %s",
                   comm_backend(comm));
  if (nslots < 1 || nslots > PREFETCH_MAX_SLOTS)
    return ty_errf(err, errlen, TY_EINVAL, "prefetch: %d slots (1..%d)", nslots,
                   PREFETCH_MAX_SLOTS);
  prefetch_cuda_t *pc = xcalloc(1, sizeof *pc);
  pc->cb = cb;
  pc->comm = comm;
  pc->cs = (cudaStream_t)comm_stream(comm);
  pc->nslots = nslots;
  pc->slot_bytes = prefetch_slot_bytes(shard);
  int rc = 0;
  cudaError_t ev = cudaEventCreateWithFlags(&pc->computed, cudaEventDisableTiming);
  if (ev == cudaSuccess) ev = cudaEventCreateWithFlags(&pc->reduced, cudaEventDisableTiming);
  if (ev != cudaSuccess) rc = cuda_fail(ev, "creating events", err, errlen);
  for (int k = 0; k < nslots && !rc; k++) {
    cudaError_t e;
    if (mem_cuda_alloc(&pc->slots[k], pc->slot_bytes)) {
      rc = ty_errf(err, errlen, TY_EEXHAUSTED,
                   "prefetch: no device memory for %d unit slots of %.1f MiB (the largest unit: "
                   "the embedding or the head)",
                   nslots, (double)pc->slot_bytes / 1048576.0);
    } else if ((e = cudaEventCreateWithFlags(&pc->gathered[k], cudaEventDisableTiming)) !=
                   cudaSuccess ||
               (e = cudaEventCreateWithFlags(&pc->released[k], cudaEventDisableTiming)) !=
                   cudaSuccess) {
      rc = cuda_fail(e, "creating events", err, errlen);
    }
  }
  prefetch_ops_t ops = {.ctx = pc,
                        .begin = pc_begin,
                        .gather = pc_gather,
                        .end = pc_end,
                        .wait = pc_wait,
                        .release = pc_release,
                        .written = pc_written,
                        .reduce_begin = pc_reduce_begin,
                        .reduce = pc_reduce,
                        .reduce_end = pc_reduce_end,
                        .add = pc_add};
  if (!rc)
    rc = prefetch_create(&pc->p, shard, nslots, pc->slots, pc->slot_bytes, &ops, err, errlen);
  if (rc) {
    prefetch_cuda_free(pc);
    return rc;
  }
  *out = pc;
  return 0;
}

void prefetch_cuda_free(prefetch_cuda_t *pc) {
  if (!pc) return;
  prefetch_free(pc->p);
  for (int k = 0; k < pc->nslots; k++) {
    mem_cuda_free(pc->slots[k]);
    if (pc->gathered[k]) cudaEventDestroy(pc->gathered[k]);
    if (pc->released[k]) cudaEventDestroy(pc->released[k]);
  }
  if (pc->computed) cudaEventDestroy(pc->computed);
  if (pc->reduced) cudaEventDestroy(pc->reduced);
  free(pc);
}

prefetch_t *prefetch_cuda_units(prefetch_cuda_t *pc) {
  return pc->p;
}

size_t prefetch_cuda_bytes(const prefetch_cuda_t *pc) {
  return (size_t)pc->nslots * pc->slot_bytes;
}

int prefetch_cuda_drain(prefetch_cuda_t *pc, char *err, size_t errlen) {
  int rc = comm_drain(pc->comm);
  return rc ? from_comm(pc, rc, err, errlen) : 0;
}
