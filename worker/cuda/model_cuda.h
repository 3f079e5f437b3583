/* model_cuda.h - the Llama decoder on a GPU, for LoRA training (or, over a
 * float32 base, for training every weight): the same
 * forward and backward as worker/model/model_step.c, built from the kernels of
 * worker/cuda/backend_cuda.h. Base weights are a loader shard on the CUDA
 * placement, fp32 or bf16, frozen and borrowed: either the whole model
 * (world size 1), read in place, or this rank's dim-0 shard of it, each
 * unit (the embedding, a layer, norm + head) all-gathered by NCCL into one
 * of a few reused slots as the pass reaches it, the next unit's gather
 * running while the current unit computes (worker/cuda/prefetch_cuda.h). Matrix
 * products take the weights as they lie (bf16 through cublasGemmEx with
 * fp32 accumulation, the fp32 activations rounded to bf16 on the way in).
 * LoRA adapters, their gradients and all activations are fp32 on the
 * device, replicated on every rank (the caller sums their gradients).
 * Training every weight keeps the gradients of the base (whole, or this
 * rank's shard) in its layout; over a shard each unit's whole gradients are
 * computed into one unit-sized buffer, then summed over the ranks by NCCL
 * and this rank's rows added into the shard's gradients
 * (prefetch_scatter_add), so a rank holds 1/N of the gradients. Every
 * buffer is allocated by model_cuda_create for micro-batches of up to
 * B x T tokens; a step allocates nothing.
 *
 * Attention runs in fp32 on CUDA cores over a float32 base; over a bf16
 * base its products run on tensor cores (TF32, cuda_attention_forward),
 * through a workspace for chunks of scores of at most about 128 MiB, less
 * where a micro-batch's scores all take less (RANKENV_CUDA_ATTN_MIB sets
 * the bound, 0 keeps the fp32 kernels; where the device has no room left
 * for it, the model takes the fp32 kernels rather than fail).
 *
 * Device memory: the activations of every layer (as the CPU model keeps
 * them for its backward pass: the attention keeps each score row's
 * log-sum-exp, no (T, T) matrix), the logits of at most 256 MiB worth of
 * tokens (the head runs over the tokens in chunks where all of them would
 * take more, and the backward pass recomputes each chunk's logits;
 * RANKENV_HEAD_ROWS sets a chunk's tokens),
 * plus attention's workspace over a bf16 base,
 * plus, for a sharded base, the slots (each the size of the largest unit),
 * plus, for full training, the base's gradients (and over a shard one
 * more unit-sized buffer); model_cuda_bytes says how much. */
#ifndef TY_WORKER_MODEL_CUDA_H
#define TY_WORKER_MODEL_CUDA_H

#include <stddef.h>

#include "worker/cuda/backend_cuda.h"
#include "worker/dist/comm.h"
#include "worker/ckpt/loader.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/cuda/prefetch_cuda.h"

typedef struct model_cuda model_cuda_t;

/* A GPU model over base (a CUDA placement's shard; its dtype F32 or BF16)
 * with adapters shaped and initialised like the host lora (its parameters
 * are copied to the device). lora NULL: full training, where base (F32,
 * whole or a shard) is the weights and their gradients are kept on the
 * device in the same layout (model_cuda_base_grads); the caller updates
 * the weights in place. comm NULL: base is a
 * whole model (world size 1). Otherwise comm (nccl, this rank's) gathers
 * base, a shard of comm's world, unit by unit through `slots` slots (2
 * overlaps the next unit's gather with the current unit's computation, 1
 * does not); every rank must then run the same passes. recompute (the
 * job's gradient_checkpointing): one layer's activations are kept instead
 * of L, and the backward pass runs each layer's forward again before its
 * backward. Returns 0, TY_EINVAL
 * (a shard without a comm, a shard of other ranks, a half-precision-f16
 * base, a shape mismatch, a RANKENV_CUDA_ATTN_MIB or
 * RANKENV_HEAD_ROWS that is not a whole number in its range) or
 * TY_EEXHAUSTED (device memory), with the
 * reason in err. base, cb, comm and lora are borrowed and must outlive the
 * model. */
int model_cuda_create(model_cuda_t **out, cuda_backend_t *cb, const loader_shard_t *base,
                      const lora_t *lora, comm_t *comm, int slots, int B, int T, bool recompute,
                      char *err, size_t errlen);
void model_cuda_free(model_cuda_t *m);

/* Device bytes the model allocated (activations, scratch, adapters, unit
 * slots, attention's workspace). */
size_t model_cuda_bytes(const model_cuda_t *m);
/* Bytes of attention's tensor-core workspace: 0 where attention runs in
 * fp32 on CUDA cores (a float32 base, RANKENV_CUDA_ATTN_MIB=0, or a
 * device without room for it). */
size_t model_cuda_attention_bytes(const model_cuda_t *m);

/* tokens, targets: host (b, t) ids. Copies them, runs the forward pass and
 * returns the mean loss in *loss. TY_EINVAL for a batch too large or an id
 * outside the vocabulary (err names it), TY_EINTERNAL for a CUDA error, or
 * a failed gather's code (TY_EABORTED, TY_EDEADLINE) with comm's reason. */
int model_cuda_forward(model_cuda_t *m, const int *tokens, const int *targets, int b, int t,
                       double *loss, char *err, size_t errlen);
/* The same for a batch with loss weights and positions (model.h's
 * model_batch_t; targets required): the loss is the mean over the counted
 * targets, attention block-diagonal over the documents of a row. */
int model_cuda_forward_batch(model_cuda_t *m, const model_batch_t *batch, double *loss, char *err,
                             size_t errlen);
/* Backward of loss_scale * (mean loss over the counted targets) of the last forward into the
 * adapters' gradients (+=). */
int model_cuda_backward(model_cuda_t *m, float loss_scale, char *err, size_t errlen);

/* Objectives over whole rows (DPO), as model.h's: each row's summed loss
 * over its counted targets in the last forward (sums [b]); the next
 * backward the gradient of sum_i scales[i] x row loss i (scales [b];
 * loss_scale then unused; a forward clears them); and forwards without
 * the adapters (false: the frozen base, DPO's reference) or with them. */
int model_cuda_row_losses(model_cuda_t *m, double *sums, char *err, size_t errlen);
int model_cuda_set_row_scales(model_cuda_t *m, const float *scales, char *err, size_t errlen);
void model_cuda_adapters_on(model_cuda_t *m, bool on);

/* Full training: the base's gradients on the device, laid out as the base
 * shard (view v's at v->offset bytes), added to by every backward pass
 * (over a shard: this rank's rows of the sum over ranks); NULL for LoRA.
 * The weights are the base shard's own memory. */
float *model_cuda_base_grads(model_cuda_t *m);
/* The base shard was written (an optimizer step, a resume): units gathered
 * from it before are stale, and each is gathered again when next used. */
void model_cuda_base_changed(model_cuda_t *m);

/* The adapters' parameters and gradients (n_params floats each, in the host
 * lora's layout), on the device; 0 floats for full training. */
float *model_cuda_lora_params(model_cuda_t *m);
float *model_cuda_lora_grads(model_cuda_t *m);
size_t model_cuda_lora_size(const model_cuda_t *m);

#endif
