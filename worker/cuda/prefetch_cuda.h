/* prefetch_cuda.h - worker/dist/prefetch.h's slots on a GPU: device slots, each
 * unit's gathers queued by NCCL on the communicator's stream, and two CUDA
 * events per slot ordering them against the compute stream (the legacy
 * default stream, where worker/cuda/backend_cuda.h queues its work):
 *   begin    the comm stream waits for the slot's `released` event
 *   end      `gathered` is recorded on the comm stream
 *   wait     the compute stream waits for `gathered`, and the host polls it
 *            (comm_wait_event: the collective timeout, NCCL's errors)
 *   release  `released` is recorded on the compute stream
 * so unit i+1's gather runs on the comm stream while unit i computes, and
 * never overwrites a slot the compute stream still reads. Full training's
 * gradient reductions go the same way: the comm stream waits for the
 * compute stream's `computed` event, reduce-scatters there, and the
 * compute stream waits for `reduced` before adding the sums into the
 * gradient shard (cuda_add). Built only with the CUDA toolkit. */
#ifndef TY_WORKER_PREFETCH_CUDA_H
#define TY_WORKER_PREFETCH_CUDA_H

#include <stddef.h>

#include "worker/cuda/backend_cuda.h"
#include "worker/dist/comm.h"
#include "worker/ckpt/loader.h"
#include "worker/dist/prefetch.h"

typedef struct prefetch_cuda prefetch_cuda_t;

/* nslots device slots (1..PREFETCH_MAX_SLOTS) for shard (a CUDA placement's,
 * borrowed) gathered through comm (nccl, borrowed; the current device must
 * be the comm's and cb's; cb borrowed). Returns 0, TY_EINVAL (not an nccl comm, a bad shard),
 * TY_EEXHAUSTED (device memory: err says how much) or TY_EINTERNAL. */
int prefetch_cuda_create(prefetch_cuda_t **out, cuda_backend_t *cb, const loader_shard_t *shard,
                         comm_t *comm, int nslots, char *err, size_t errlen);
/* Waits for nothing: call prefetch_cuda_drain first. Accepts NULL. */
void prefetch_cuda_free(prefetch_cuda_t *pc);

prefetch_t *prefetch_cuda_units(prefetch_cuda_t *pc);
/* Device bytes of the slots. */
size_t prefetch_cuda_bytes(const prefetch_cuda_t *pc);
/* Waits for every queued gather (as comm_drain); 0 or the comm's code with
 * its reason in err. */
int prefetch_cuda_drain(prefetch_cuda_t *pc, char *err, size_t errlen);

#endif
