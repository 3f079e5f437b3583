/* train_cuda.h - training on GPU ranks for the loop of worker/rank/train.h,
 * the device side of a train_backend_device (worker/model/train_backend.h):
 * the base weights on the device (loaded there through the loader, its
 * memory-efficient or standard path into a CUDA placement, in spec->dtype:
 * float32 or bfloat16; with several ranks only this rank's shard, gathered
 * unit by unit during the passes), worker/cuda/model_cuda.h's passes, and the
 * train_device_t hooks: for LoRA the adapters' gradients come down and
 * their parameters go up once a step (the loop sums them over ranks
 * through the comm). What is trained: LoRA adapters; every
 * weight on one GPU (a host weights-only model mirrors them); or every
 * weight over several GPUs, where the host's fsdp span (this rank's float32
 * shards, loaded on the host) is copied onto the device and each unit's
 * gradients are reduce-scattered there, so the host, the device and the
 * optimizer hold 1/N of the model each. Full training also runs AdamW on
 * the device (train_device_t's adamw hooks: the moments beside the shard, one
 * cuda_adamw_step per tensor, norm gains without decay), so no weight or
 * gradient crosses PCIe during the steps; the span and the moments come
 * down for checkpoints and the outputs. Built only with the CUDA toolkit
 * (TRAINYARD_HAVE_CUDA). */
#ifndef TY_WORKER_TRAIN_CUDA_H
#define TY_WORKER_TRAIN_CUDA_H

#include <stddef.h>

#include "api/jobspec.h"
#include "api/llama_config.h"
#include "worker/dist/comm.h"
#include "worker/dist/fsdp.h"
#include "worker/ckpt/loader.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/train_backend.h"

typedef struct train_cuda train_cuda_t;

/* What the host trains: exactly one of these is set. */
typedef struct {
  const lora_t *lora; /* LoRA adapters (the device model gets their shape and values) */
  model_t *host;      /* every weight on one GPU (world size 1, float32): a weights-only
                       * model (model_create_weights) that receives the loaded weights */
  fsdp_t *span;       /* every weight over the comm's GPUs (float32): this rank's shards
                       * (an FSDP_SPAN), copied onto the device instead of a load */
} train_cuda_trained_t;

/* Sets up CUDA device `device` for this rank of comm (self for one rank,
 * nccl for several; its device must be `device`): the rank's shard of
 * spec->model_path (or of the seeded initialisation of cfg when
 * spec->init_from_scratch) loaded onto the device, or for tr->span that
 * span's shard copied there; creates the device model for micro-batches of
 * B x T tokens; and fills *dev with its hooks (valid until
 * train_cuda_free), whose span is tr's. ls (may be NULL) receives the
 * load's figures (bytes, seconds) and as device peak the load's or what
 * training then holds on the device (shard, gradients and moments,
 * activations, adapters, unit slots), whichever is larger. Returns 0, TY_EUNAVAILABLE
 * (no such device), TY_EINVAL (a dtype the device model does not take, a
 * comm that cannot gather device memory) or TY_EEXHAUSTED (device memory),
 * with the reason in err. cfg, comm and tr's members are borrowed. */
int train_cuda_create(train_cuda_t **out, const jobspec_t *spec, const llama_config_t *cfg,
                      comm_t *comm, int device, const train_cuda_trained_t *tr, int B, int T,
                      loader_stats_t *ls, train_device_t *dev, char *err, size_t errlen);
/* Accepts NULL. */
void train_cuda_free(train_cuda_t *t);

/* Device bytes of the model's training buffers (model_cuda_bytes:
 * activations, adapters, unit slots, attention's workspace). */
size_t train_cuda_buffer_bytes(const train_cuda_t *t);

#endif
