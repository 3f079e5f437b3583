/* prefetch.h - FSDP units of a sharded base gathered into a few reused
 * slots, the next unit's gather queued while the current unit computes.
 *
 * A unit is what one stage of the model reads: the embedding (unit 0), one
 * layer (unit 1 + l), or the final norm with the head (unit L + 1; with
 * tied embeddings its lm_head is the embedding table). Each tensor of a
 * unit lies whole in the slot, row-major in the shard's dtype, at a 64-byte
 * aligned offset; gathering it concatenates every rank's dim-0 rows
 * (worker/ckpt/loader.h) with one all-gather.
 *
 * A pass declares the order of its units (forward: embedding, layers,
 * head; backward: head, layers in reverse), then acquires them in turn.
 * Acquiring unit i releases unit i-1's slot (everything queued so far was
 * its last use), queues unit i+1's gather into the slot just released,
 * and only then makes the computation wait for unit i. With two slots the
 * next unit's gather thus runs while the current unit computes; a unit
 * still resident (the head, from the forward into the backward pass) is not
 * gathered again. With one slot nothing overlaps.
 *
 * Where the bytes move is the caller's (prefetch_ops_t): on the GPU, NCCL
 * on the communicator's stream ordered by CUDA events against the compute
 * stream (worker/cuda/prefetch_cuda.c); on the host, blocking collectives
 * (prefetch_host_ops). The schedule itself knows neither. */
#ifndef TY_WORKER_PREFETCH_H
#define TY_WORKER_PREFETCH_H

#include <stddef.h>

#include "worker/dist/comm.h"
#include "worker/ckpt/loader.h"

/* Slots at most. */
#define PREFETCH_MAX_SLOTS 4

/* Each call returns 0 or a TY_E* code with the reason in err. */
typedef struct {
  void *ctx;
  /* Gathers queued into `slot` from now on start only after its last
   * release. */
  int (*begin)(void *ctx, int slot, char *err, size_t errlen);
  /* All-gathers counts[r] elements of elem_size bytes of every rank from
   * send (this rank's rows) into recv (the whole tensor). */
  int (*gather)(void *ctx, const void *send, void *recv, const size_t *counts, size_t elem_size,
                char *err, size_t errlen);
  /* The gathers since begin(slot) are the slot's contents. */
  int (*end)(void *ctx, int slot, char *err, size_t errlen);
  /* Computation queued from now on reads the slot: it waits for the slot's
   * gathers (the host too, until they are done: run-ahead stays bounded
   * and a failed peer shows here). */
  int (*wait)(void *ctx, int slot, char *err, size_t errlen);
  /* The computation queued so far is the slot's last use. */
  int (*release)(void *ctx, int slot, char *err, size_t errlen);
  /* The shards changed (prefetch_forget): gathers queued from now on read
   * what the computation queued so far wrote. Called before the first
   * gather after a forget; may be NULL where computation is done when
   * queued. */
  int (*written)(void *ctx, char *err, size_t errlen);
  /* Full training's gradients (prefetch_scatter_add); may be NULL when it
   * is not used. reduce_begin: reductions queued from now on read what the
   * computation queued so far wrote. reduce: comm_reduce_scatter_queue's
   * contract, in place: every rank's send (sum(counts) floats) summed into
   * recv, this rank's block of send. reduce_end: computation queued from
   * now on reads the reductions' results. add: dst[n] += src[n], queued as
   * computation. */
  int (*reduce_begin)(void *ctx, char *err, size_t errlen);
  int (*reduce)(void *ctx, float *send, float *recv, const size_t *counts, char *err,
                size_t errlen);
  int (*reduce_end)(void *ctx, char *err, size_t errlen);
  int (*add)(void *ctx, float *dst, const float *src, size_t n, char *err, size_t errlen);
} prefetch_ops_t;

typedef struct prefetch prefetch_t;

/* The largest unit of shard's model, in bytes: what each slot must hold. */
size_t prefetch_slot_bytes(const loader_shard_t *shard);

/* A prefetcher over shard (this rank's shard; read, borrowed) with nslots (1..PREFETCH_MAX_SLOTS)
 * slots of slot_bytes each (borrowed; the memory ops move bytes in). ops is copied. *out is the
 * caller's (prefetch_free). TY_EINVAL when the slots are too small or the
 * shard's rows do not follow the collectives' split. */
int prefetch_create(prefetch_t **out, const loader_shard_t *shard, int nslots, void *const *slots,
                    size_t slot_bytes, const prefetch_ops_t *ops, char *err, size_t errlen);
/* Accepts NULL. */
void prefetch_free(prefetch_t *p);

/* Units of the model: L + 2. */
int prefetch_units(const prefetch_t *p);
/* Unit numbers. */
#define PREFETCH_EMBED 0
#define PREFETCH_LAYER(l) (1 + (l))
int prefetch_head(const prefetch_t *p);

/* Starts a pass over order[n] (copied; units in 0..units-1). The unit
 * acquired last stays held until the next acquire. */
int prefetch_pass(prefetch_t *p, const int *order, int n, char *err, size_t errlen);
/* Acquires the pass's next unit (see the top of this file); its tensors
 * are then prefetch_tensor's. TY_EINVAL past the pass's end. */
int prefetch_acquire(prefetch_t *p, char *err, size_t errlen);
/* The shards changed (an optimizer step or a resume wrote them): no unit
 * counts as resident any more, so every unit is gathered again when next
 * acquired, the first gather after ops.written. The unit held now stays
 * held until the next acquire. */
void prefetch_forget(prefetch_t *p);
/* The unit acquired last, or -1. */
int prefetch_current(const prefetch_t *p);
/* Tensor (kind, layer) of the unit acquired last (layer ignored for the
 * global kinds; CKPT_LM_HEAD of a tied model is the embedding), in its
 * slot; NULL when that unit does not hold it. */
void *prefetch_tensor(const prefetch_t *p, ckpt_kind_t kind, int layer);
/* The unit that holds tensor (kind, layer): the embedding's, layer's, or
 * for the final norm and lm_head the head unit. */
int prefetch_unit_of(const prefetch_t *p, ckpt_kind_t kind, int layer);
/* Unit u's extent in a slot, in bytes (0 for a unit out of range). */
size_t prefetch_unit_bytes(const prefetch_t *p, int u);
/* Where tensor (kind, layer) lies in unit u's slot, in bytes from the
 * slot's start (as prefetch_tensor finds it), or -1 when u does not hold
 * it. A buffer laid out like a slot (full training's unit gradients) uses
 * the same offsets. */
long prefetch_offset(const prefetch_t *p, int u, ckpt_kind_t kind, int layer);

/* Full training (a float32 shard): grad holds unit u's whole gradients,
 * laid out as the unit lies in a slot. Each tensor's gradient is summed
 * over the ranks (ops->reduce, in place in grad) and this rank's rows are
 * added into gshard, laid out as the shard (a view's rows at its offset;
 * a tied head's into the embedding's). Every rank must call it for the
 * same units in the same order. TY_EINVAL for a shard not in float32 or
 * ops without the reductions. */
int prefetch_scatter_add(prefetch_t *p, int u, float *grad, float *gshard, char *err,
                         size_t errlen);

/* Gathers unit u has queued since prefetch_create (each gathered once per
 * residence). */
long prefetch_gathers(const prefetch_t *p, int u);

/* Blocking host collectives through comm (self or shm; host slots), the
 * reductions included. */
prefetch_ops_t prefetch_host_ops(comm_t *comm);

#endif
