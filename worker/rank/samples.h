/* samples.h - train.sample_prompts during a run: rank 0 decodes each
 * prompt greedily (worker/model/generate.h) with the weights being trained,
 * every train.sample_every steps and at the end, at most
 * train.sample_max_new_tokens new tokens each (an eos_token_id ends one
 * sooner), and hands each sample to a callback (the worker makes it a
 * report, which the server keeps as a "sample" event).
 *
 * The weights: the model's own buffer when this CPU rank holds the model
 * whole (one rank: the base under LoRA, or the weights full training
 * updates in place), with the adapters as they are now (the host's: on GPU
 * ranks too, whose optimizer steps the host's adapters and copies them up);
 * under LoRA on several CPU ranks (the base sharded, and frozen) or on GPU
 * ranks (the base on the device) rank 0 reads the base whole once more
 * from model_path into host memory. CPU ranks decode on the CPU; a GPU
 * rank 0 decodes on its GPU (worker/cuda/generate_cuda.h: a copy of the
 * base in the job's dtype, made at the first sample, when training's
 * buffers are all allocated, the adapters copied up again at each), or,
 * where the device has no room for that copy, on its CPU, saying so once.
 * Full training sharded over several ranks or on GPUs is refused (rule
 * sample-prompts). The prompt is plain text encoded with
 * the tokenizer's special tokens; the tokenizer is data.tokenizer, else
 * tokenizer.json beside the model. */
#ifndef TY_WORKER_SAMPLES_H
#define TY_WORKER_SAMPLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/jobspec.h"
#include "api/llama_config.h"
#include "worker/dist/fsdp.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

typedef struct samples samples_t;

/* One sample: prompt i of the spec and the text generated after it. */
typedef void (*samples_fn)(void *ctx, int64_t step, const char *prompt, const char *text);

/* For rank `rank` of job s (model cfg): *out NULL when there is nothing to
 * do (no prompts, or not rank 0); else a sampler over m (the training
 * model: its own weights, or a shape only when f holds this rank's shards
 * or s trains on GPUs),
 * and lo (NULL for full training). Every prompt is encoded now: a missing
 * tokenizer or a prompt that leaves no room in max_position_embeddings
 * fails here, before the first step, naming it. Borrowed arguments must
 * outlive the sampler. 0 or a TY_E* code with the reason in err. */
int samples_open(samples_t **out, const jobspec_t *s, const llama_config_t *cfg, model_t *m,
                 const fsdp_t *f, const lora_t *lo, int rank, char *err, size_t errlen);
void samples_free(samples_t *sm); /* accepts NULL */

/* At the end of step `step` (its update done): samples when step is a
 * multiple of train.sample_every (> 0), or when final (the run's end) and
 * this step was not sampled yet; each through fn. No-op for NULL. */
int samples_at_step(samples_t *sm, int64_t step, bool final, samples_fn fn, void *ctx, char *err,
                    size_t errlen);

#endif
