/* model_io.h - filling a whole (unsharded) model's parameter buffer: from a
 * Hugging Face checkpoint directory, tensor by tensor through one staging
 * buffer of the largest tensor's file bytes (only for F16/BF16 files; F32
 * is read straight into place), or from the deterministic initialisation
 * of weightinit.h (the same values `trainyard mkmodel` and the loader's
 * from-scratch path produce for a seed). */
#ifndef TY_WORKER_MODEL_IO_H
#define TY_WORKER_MODEL_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/llama_config.h"
#include "worker/ckpt/loader.h"
#include "worker/model/model.h"

/* Reads dir's config.json into *cfg (may be NULL) without opening weights. */
int model_io_read_config(const char *dir, llama_config_t *cfg, char *err, size_t errlen);

/* Fills every tensor of m from the checkpoint in dir, matched strictly
 * (ckpt_open); m must have been created from the same config. progress
 * (may be NULL) is called after each tensor with the file bytes read and
 * to read; stats (may be NULL) gets the bytes read, the model's parameter
 * bytes as its shard and placement peak (one rank holds it all), the host
 * peak after the load and the seconds taken, as loader_load gives them for
 * a rank's shard. */
int model_io_load(model_t *m, const char *dir, loader_progress_fn progress, void *progress_ctx,
                  loader_stats_t *stats, char *err, size_t errlen);

/* Fills m with weightinit's values for seed (matrices ~ N(0, 0.02^2),
 * norm weights 1). */
void model_io_init_scratch(model_t *m, uint64_t seed);

/* Whether the checkpoint in dir is a bitsandbytes 4-bit one (its
 * config.json has a quantization_config): model_io_load dequantizes it. */
bool model_io_quantized(const char *dir);

#endif
