/* fsdp.h - fully sharded training of one rank (DESIGN.md "Sharding and
 * collectives"): the base weights stay as this rank's dim-0 shards (the
 * loader's shard, float32); each unit of the model (the embedding, one
 * layer, the final norm and head) is all-gathered into one reused buffer
 * for its forward pass and again for its backward pass, so a rank holds its
 * shards plus about one unit. Full training computes a unit's gradients
 * into a second unit-sized buffer and reduce-scatters them into gradient
 * shards (so AdamW's moments are sharded too); LoRA leaves the base frozen
 * and its replicated adapters are all-reduced by the caller.
 *
 * The model_t passed in (model_create_unowned) provides the activations
 * and the layer functions; it has no parameter or gradient buffer.
 *
 * Full training whose passes run on GPUs (worker/cuda/train_cuda.h) keeps only
 * the span here (FSDP_SPAN): the shards and their gradient shards, which
 * checkpoints and outputs are written from (the optimizer updates them
 * here only when it runs on the host); the model_t is then a table alone
 * (model_create_table). */
#ifndef TY_WORKER_FSDP_H
#define TY_WORKER_FSDP_H

#include <stdbool.h>
#include <stddef.h>

#include "api/llama_config.h"
#include "worker/dist/comm.h"
#include "worker/ckpt/loader.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/train_backend.h"

typedef struct fsdp fsdp_t;

typedef enum {
  FSDP_FROZEN, /* LoRA: the base frozen, no gradient shards */
  FSDP_FULL,   /* full training, the passes here: gradient shards, two unit buffers */
  FSDP_SPAN,   /* full training, the passes elsewhere: gradient shards, no unit buffers */
} fsdp_mode_t;

/* Takes ownership of shard (this rank's float32 shards of m's tensors, from
 * loader_load or loader_init_scratch with world_size = comm's). *out is the
 * caller's (fsdp_free, which also frees the shard). */
int fsdp_create(fsdp_t **out, model_t *m, comm_t *comm, loader_shard_t *shard, fsdp_mode_t mode,
                char *err, size_t errlen);
void fsdp_free(fsdp_t *f);

/* The flat span of this rank's shards (padding between tensors included,
 * its gradients always zero), and its gradients (NULL for FSDP_FROZEN). */
float *fsdp_params(fsdp_t *f);
float *fsdp_grads(fsdp_t *f);
size_t fsdp_span(const fsdp_t *f);
/* The shard the span is (its layout: the views' offsets into the span). */
const loader_shard_t *fsdp_shard(const fsdp_t *f);

/* Calls fn(ctx, offset, numel) for every 1-D tensor's shard (norm gains) in
 * the span, for the optimizer's no-decay ranges. */
void fsdp_each_norm(const fsdp_t *f, void (*fn)(void *ctx, size_t off, size_t n), void *ctx);

/* Forward over the gathered units; the same contract as model_forward_batch. A
 * failed collective returns its code with comm_error's text in err;
 * TY_EINTERNAL for an FSDP_SPAN (as for fsdp_backward). */
int fsdp_forward(fsdp_t *f, const model_batch_t *batch, lora_t *lora, double *loss, char *err,
                 size_t errlen);
/* Backward of loss_scale * (mean loss over the counted targets) of the last forward: adapters'
 * gradients (lora) are added locally; with full, every unit's gradients are
 * reduce-scattered (summed over ranks) and added into the gradient shards. */
int fsdp_backward(fsdp_t *f, lora_t *lora, float loss_scale, char *err, size_t errlen);

/* The loop's backend over f (worker/model/train_backend.h): the adapters
 * lora over f's frozen base (FSDP_FROZEN), or with lora NULL every weight,
 * this rank's shards the span (FSDP_FULL; an FSDP_SPAN, whose passes run
 * elsewhere, as the host side of train_backend_device). f and lora are
 * borrowed; train_backend_free(b). 0, or TY_EINTERNAL for another pair. */
int fsdp_backend(train_backend_t *b, fsdp_t *f, lora_t *lora, char *err, size_t errlen);

/* Writes config.json + model.safetensors of the whole model into dir: every
 * rank gathers each tensor in turn (into the unit buffer, or for an
 * FSDP_SPAN into a buffer of the largest tensor held meanwhile), rank 0
 * writes it. All ranks call it. */
int fsdp_write_model(fsdp_t *f, const char *dir, const llama_config_t *cfg, char *err,
                     size_t errlen);

#endif
