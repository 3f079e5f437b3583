/* llama_config.h - a Llama-family model shape, as a Hugging Face config.json
 * states it. The job spec's "model" field (init_from_scratch) and every
 * checkpoint's config.json parse into this one struct. */
#ifndef TY_API_LLAMA_CONFIG_H
#define TY_API_LLAMA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "api/errors.h"
#include "common/dtype.h"

typedef struct {
  int64_t hidden_size;             /* C */
  int64_t intermediate_size;       /* FF */
  int64_t num_hidden_layers;       /* L */
  int64_t num_attention_heads;     /* NH */
  int64_t num_key_value_heads;     /* NKV; defaults to NH */
  int64_t head_dim;                /* HS; defaults to C / NH */
  int64_t vocab_size;              /* V */
  int64_t max_position_embeddings; /* default 2048 */
  double rms_norm_eps;             /* default 1e-6 */
  double rope_theta;               /* default 10000 */
  bool tie_word_embeddings;        /* default false */
  ty_dtype_t torch_dtype;          /* default float32 */
  /* rope_scaling of rope_type "llama3" (Llama 3.1 and later; a config.json
   * only, never a job spec's inline model): factor 0 when there is none. */
  struct {
    double factor, low_freq_factor, high_freq_factor;
    int64_t original_max_position_embeddings;
  } rope_llama3;
} llama_config_t;

/* Fills the defaults above; sizes are 0 (unset). */
void llama_config_init(llama_config_t *c);

/* Parses a config.json-shaped object into c (which should hold defaults).
 * field_prefix ("model" in a job spec, "" for a config.json file) starts
 * every field path in errs. strict: unknown keys are errors (job spec);
 * otherwise Hugging Face's other keys (architectures, bos_token_id, ...) are
 * ignored. Wrong types and out-of-range values are added to errs. Returns 0
 * or TY_EINVAL. */
int llama_config_from_json(const json_t *obj, llama_config_t *c, const char *field_prefix,
                           bool strict, ty_errlist_t *errs);

/* Checks relations between fields (heads divide hidden_size, kv heads
 * divide heads, every size >= 1, eps > 0, ...), adding to errs. */
int llama_config_validate(const llama_config_t *c, const char *field_prefix, ty_errlist_t *errs);

/* A new config.json-shaped object (the caller owns it), with
 * "architectures": ["LlamaForCausalLM"] and "model_type": "llama". */
json_t *llama_config_to_json(const llama_config_t *c);

/* Parameter count of the base model (embeddings, layers, norm, head). */
int64_t llama_config_num_params(const llama_config_t *c);

#endif
