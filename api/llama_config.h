/* llama_config.h - a Llama-family model shape, as a Hugging Face config.json
 * states it. The job spec's "model" field (init_from_scratch) and every
 * checkpoint's config.json parse into this one struct. */
#ifndef TY_API_LLAMA_CONFIG_H
#define TY_API_LLAMA_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/dtype.h"

/* config.json's rope_scaling: how the rotary inverse frequencies are
 * rescaled for a longer context (Hugging Face's ROPE_INIT_FUNCTIONS). */
typedef enum {
  LLAMA_ROPE_DEFAULT = 0, /* rope_scaling null, or rope_type "default" */
  LLAMA_ROPE_LINEAR,      /* inv_freq / factor (positions / factor) */
  LLAMA_ROPE_LLAMA3,      /* Llama 3.1's band-wise rescaling */
} llama_rope_type_t;

typedef struct {
  llama_rope_type_t type;
  double factor;                            /* linear, llama3: > 0 */
  double low_freq_factor, high_freq_factor; /* llama3: 0 < low < high */
  int64_t original_max_position_embeddings; /* llama3: >= 1 */
} llama_rope_scaling_t;

typedef struct {
  int64_t hidden_size;               /* C */
  int64_t intermediate_size;         /* FF */
  int64_t num_hidden_layers;         /* L */
  int64_t num_attention_heads;       /* NH */
  int64_t num_key_value_heads;       /* NKV; defaults to NH */
  int64_t head_dim;                  /* HS; defaults to C / NH */
  int64_t vocab_size;                /* V */
  int64_t max_position_embeddings;   /* default 2048 */
  double rms_norm_eps;               /* default 1e-6 */
  double rope_theta;                 /* default 10000 */
  bool tie_word_embeddings;          /* default false */
  ty_dtype_t torch_dtype;            /* default float32 */
  llama_rope_scaling_t rope_scaling; /* default none; config.json only */
  /* Mistral's sliding_window (config.json only; 0: none). trainyard has
   * no sliding-window attention: within the window the model is Llama's,
   * so data.seq_len must not exceed it (model_init_shape, the job rule
   * seq-len-within-model). */
  int64_t sliding_window;
  /* Qwen2's biases on the q, k and v projections (model_type "qwen2";
   * config.json only: Hugging Face states them by the model type, never
   * by a key). */
  bool qkv_bias;
} llama_config_t;

/* Fills the defaults above; sizes are 0 (unset). */
void llama_config_init(llama_config_t *c);

/* Parses a config.json-shaped object into c (which should hold defaults).
 * field_prefix ("model" in a job spec, "" for a config.json file) starts
 * every field path in errs. strict: unknown keys are errors (job spec);
 * otherwise (a config.json) rope_scaling and sliding_window are read too,
 * Hugging Face's keys that leave the model as it is (bos_token_id,
 * use_cache, ...) are ignored, those that change it must hold the value
 * Llama computes (attention_bias false, model_type "llama", "mistral" or
 * "qwen2", the last setting qkv_bias, ...), and any other non-null key is
 * refused by name. Wrong types and
 * out-of-range values are added to errs. Returns 0 or TY_EINVAL. */
int llama_config_from_json(const json_t *obj, llama_config_t *c, const char *field_prefix,
                           bool strict, ty_errlist_t *errs);

/* Checks relations between fields (heads divide hidden_size, kv heads
 * divide heads, every size >= 1, eps > 0, ...), adding to errs. */
int llama_config_validate(const llama_config_t *c, const char *field_prefix, ty_errlist_t *errs);

/* A new config.json-shaped object (the caller owns it), with
 * "architectures": ["LlamaForCausalLM"] and "model_type": "llama" (Qwen2's
 * with qkv_bias, Mistral's with a sliding_window). */
json_t *llama_config_to_json(const llama_config_t *c);

/* The config.json of a model_path into out (n bytes): model_path/config.json
 * for a folder, or the config.json beside model_path when it names one
 * checkpoint file (a .safetensors, .bin, .pt or .pth file). */
void llama_config_path(const char *model_path, char *out, size_t n);

/* The rotary inverse frequency of pair i (0 <= i < HS/2) of a head of HS
 * dims: theta^(-2i/HS), rescaled as s says (NULL: none), in double. The one
 * definition every backend's rotary tables are made from. */
double llama_rope_inv_freq(double theta, int HS, int i, const llama_rope_scaling_t *s);

/* Parameter count of the base model (embeddings, layers, norm, head). */
int64_t llama_config_num_params(const llama_config_t *c);

#endif
