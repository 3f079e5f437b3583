/* outputs.h - what a finished job leaves in its output_dir.
 *
 * LoRA: a PEFT adapter, loadable by peft.PeftModel.from_pretrained:
 *   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r,
 *                              lora_alpha, target_modules,
 *                              base_model_name_or_path, ...
 *   adapter_model.safetensors  base_model.model.model.layers.{i}.self_attn.
 *                              q_proj.lora_A.weight [r, in], ...lora_B.weight
 *                              [out, r], F32
 *   merged/                    with merge_adapter: the base with the adapter
 *                              folded in (worker/ckpt/merge.h)
 * Full training: a Hugging Face checkpoint (config.json + model.safetensors,
 * F32, the model's tensor names) that a later job loads as its model_path. */
#ifndef TY_WORKER_OUTPUTS_H
#define TY_WORKER_OUTPUTS_H

#include <stddef.h>

#include "api/llama_config.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

#define OUTPUTS_ADAPTER_CONFIG "adapter_config.json"
#define OUTPUTS_ADAPTER_WEIGHTS "adapter_model.safetensors"

/* Writes the adapter into dir (created when missing). base_model names the
 * base checkpoint (the job's model_path). */
int outputs_write_adapter(const char *dir, const lora_t *lo, const char *base_model, char *err,
                          size_t errlen);

/* Reads an adapter written by outputs_write_adapter (or by PEFT, for
 * F32/F16/BF16 weights without bias or dropout-only options) for model m:
 * its r, lora_alpha and target_modules from adapter_config.json, every
 * tensor present with its shape. *out is the caller's (lora_free). */
int outputs_read_adapter(const char *dir, const model_t *m, lora_t **out, char *err, size_t errlen);

/* Writes config.json (cfg, with torch_dtype float32) into dir (created
 * when missing). */
int outputs_write_config(const char *dir, const llama_config_t *cfg, char *err, size_t errlen);

/* Writes config.json (cfg) and model.safetensors (every tensor of m's
 * table) into dir (created when missing). */
int outputs_write_model(const char *dir, const model_t *m, const llama_config_t *cfg, char *err,
                        size_t errlen);

#endif
