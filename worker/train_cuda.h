/* train_cuda.h - LoRA training on GPU ranks for the loop of
 * worker/train.h: the base weights loaded onto the device through the
 * loader (its memory-efficient or standard path into a CUDA placement, in
 * spec->dtype: float32 or bfloat16; with several ranks only this rank's
 * shard, gathered unit by unit during the passes), worker/model_cuda.h's
 * passes, and the train_device_t hooks that bring the adapters' gradients
 * down and send their parameters up once a step (the loop sums the
 * gradients over ranks through the comm). Built only with the CUDA toolkit
 * (TRAINYARD_HAVE_CUDA). */
#ifndef TY_WORKER_TRAIN_CUDA_H
#define TY_WORKER_TRAIN_CUDA_H

#include <stddef.h>

#include "api/jobspec.h"
#include "api/llama_config.h"
#include "worker/comm.h"
#include "worker/loader.h"
#include "worker/lora.h"
#include "worker/model.h"
#include "worker/train.h"

typedef struct train_cuda train_cuda_t;

/* lora NULL: full training on one GPU (world size 1, float32): the base
 * is trained in place on the device, and host (a weights-only model of the
 * same shape, model_create_weights) receives the loaded weights and is the
 * trained span the hooks copy (every weight up, every gradient down, once a
 * step); host is otherwise unused and may be NULL.
 *
 * Sets up CUDA device `device` for this rank of comm (self for one rank,
 * nccl for several; its device must be `device`): loads the rank's shard
 * of spec->model_path (or of the seeded initialisation of cfg when
 * spec->init_from_scratch), creates the device model for micro-batches of
 * B x T tokens with adapters shaped like lora, and fills *dev with its
 * hooks (valid until train_cuda_free). ls (may be NULL) receives the
 * load's figures (bytes, seconds) and as device peak the load's or what
 * training then holds on the device (shard, activations, adapters, unit
 * slots), whichever is larger. Returns 0, TY_EUNAVAILABLE (no such
 * device), TY_EINVAL (a dtype the device model does not take, a comm that
 * cannot gather device memory) or TY_EEXHAUSTED (device memory), with the
 * reason in err. cfg, comm and lora are borrowed. */
int train_cuda_create(train_cuda_t **out, const jobspec_t *spec, const llama_config_t *cfg,
                      comm_t *comm, int device, const lora_t *lora, model_t *host, int B, int T,
                      loader_stats_t *ls, train_device_t *dev, char *err, size_t errlen);
/* Accepts NULL. */
void train_cuda_free(train_cuda_t *t);

#endif
