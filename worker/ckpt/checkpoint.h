/* checkpoint.h - the Hugging Face Llama checkpoint layout: config.json plus
 * safetensors tensors with Hugging Face's names, matched strictly.
 *
 * The tensor table is generated from one list (CKPT_LAYER_TENSORS and
 * CKPT_GLOBAL_TENSORS), each shape stated in the config's dimensions:
 *   C  hidden_size          FF  intermediate_size    V  vocab_size
 *   NH num_attention_heads  NKV num_key_value_heads  HS head_dim
 *   QB 1 when the q/k/v projections have biases (Qwen2), else 0
 * Table order: embed_tokens, then layer 0..L-1 (each in list order), then
 * norm, then lm_head (absent when tie_word_embeddings). Every tensor is 2-D
 * [rows, cols] or 1-D [rows] (cols = 1); rows is dim 0, the sharded one. */
#ifndef TY_WORKER_CHECKPOINT_H
#define TY_WORKER_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/llama_config.h"
#include "worker/ckpt/safetensors.h"

// clang-format off
/* X(id, name within "model.layers.{i}.", rows, cols); cols 0 = 1-D.
 * rows 0: absent from this model. QB is 1 for Qwen2's q/k/v biases
 * (qkv_bias) and 0 otherwise; they come last, so a layer's present tensors
 * are its first per_layer kinds. */
#define CKPT_LAYER_TENSORS(X)                          \
  X(ATTN_NORM, "input_layernorm.weight", C, 0)         \
  X(WQ, "self_attn.q_proj.weight", NH * HS, C)         \
  X(WK, "self_attn.k_proj.weight", NKV * HS, C)        \
  X(WV, "self_attn.v_proj.weight", NKV * HS, C)        \
  X(WO, "self_attn.o_proj.weight", C, NH * HS)         \
  X(MLP_NORM, "post_attention_layernorm.weight", C, 0) \
  X(WGATE, "mlp.gate_proj.weight", FF, C)              \
  X(WUP, "mlp.up_proj.weight", FF, C)                  \
  X(WDOWN, "mlp.down_proj.weight", C, FF)             \
  X(BQ, "self_attn.q_proj.bias", QB * NH * HS, 0)      \
  X(BK, "self_attn.k_proj.bias", QB * NKV * HS, 0)     \
  X(BV, "self_attn.v_proj.bias", QB * NKV * HS, 0)

/* X(id, full name, rows, cols); the table puts EMBED first and the others
 * after the layers. */
#define CKPT_GLOBAL_TENSORS(X)                \
  X(EMBED, "model.embed_tokens.weight", V, C) \
  X(FINAL_NORM, "model.norm.weight", C, 0)    \
  X(LM_HEAD, "lm_head.weight", V, C)

typedef enum {
#define TY_X(id, name, rows, cols) CKPT_##id,
  CKPT_LAYER_TENSORS(TY_X) CKPT_GLOBAL_TENSORS(TY_X)
#undef TY_X
  CKPT_KIND_COUNT
} ckpt_kind_t;
// clang-format on

/* Number of layer kinds: the most tensors a layer has (a model's own count
 * is its layout's per_layer). */
#define CKPT_PER_LAYER ((int)CKPT_EMBED)
#define CKPT_NAME_MAX 96

typedef struct {
  char name[CKPT_NAME_MAX]; /* Hugging Face name */
  ckpt_kind_t kind;
  int layer;          /* 0..L-1, or -1 for embed, norm, lm_head */
  int ndim;           /* 1 or 2 */
  int64_t rows, cols; /* shape [rows, cols] or [rows] (cols = 1) */
  bool is_norm;       /* RMSNorm weight (initialised to 1); a bias is 1-D but not a norm */
} ckpt_tensor_t;

typedef struct {
  llama_config_t cfg;
  ckpt_tensor_t *tensors; /* table order, see above */
  size_t ntensors;
  int per_layer;    /* tensors of each layer: 9, or 12 with q/k/v biases */
  uint64_t nparams; /* sum of rows x cols */
} ckpt_layout_t;

/* Builds the table for cfg (which must pass llama_config_validate).
 * Release with ckpt_layout_free. Returns 0 or TY_EINVAL for a size that
 * overflows. */
int ckpt_layout_init(ckpt_layout_t *l, const llama_config_t *cfg);
void ckpt_layout_free(ckpt_layout_t *l);
/* Table index of (kind, layer) (layer ignored for global kinds), or -1
 * when the tensor is absent (lm_head when tied, layer out of range). */
int ckpt_layout_index(const ckpt_layout_t *l, ckpt_kind_t kind, int layer);

/* Reads dir/config.json (leniently: llama_config_from_json) and checks
 * it. Returns 0, TY_ENOTFOUND or TY_EINVAL with a message naming the field. */
int ckpt_read_config(const char *dir, llama_config_t *cfg, char *err, size_t errlen);

/* A bitsandbytes 4-bit checkpoint's weights (worker/ckpt/ckpt_q4.h). */
typedef struct ckpt_q4 ckpt_q4_t;

/* An open checkpoint: its layout and, for each layout tensor, the file's. */
typedef struct {
  ckpt_layout_t layout;
  st_ckpt_t *st;
  const st_tensor_t **file_tensor; /* [layout.ntensors]; a 4-bit weight's codes (U8) */
  ckpt_q4_t *q4;                   /* a 4-bit checkpoint's weights; NULL for any other */
} ckpt_t;

/* Opens a checkpoint directory: config.json, then the safetensors files,
 * then the strict match (a missing, extra or mis-shaped tensor fails with
 * its name); a config.json with a quantization_config opens as a
 * bitsandbytes 4-bit checkpoint (c->q4, ckpt_q4.h). *out is the caller's,
 * released with ckpt_close. */
int ckpt_open(const char *dir, ckpt_t **out, char *err, size_t errlen);
void ckpt_close(ckpt_t *c);

/* A fingerprint of the checkpoint in dir, as 16 hex digits in out (17
 * bytes): FNV-1a over config.json, and over each of its safetensors files
 * (as st_open finds them: the index's, or model.safetensors) the file's
 * name, size, header and first 4 KiB of data (of a PyTorch file: its first
 * 4 KiB and its first tensor's first 4 KiB). It tells one base checkpoint
 * from another of the same shape (another seed, a fine-tuned copy) while
 * reading a few KiB a file (training reads it on the first rank only); a
 * copy of the checkpoint elsewhere has the same fingerprint.
 * Returns 0 or the error of reading the files. */
#define CKPT_FINGERPRINT_LEN 17
int ckpt_fingerprint(const char *dir, char *out, char *err, size_t errlen);

/* "[r, c]" (ndim sizes of shape) into buf (n bytes), as load errors name
 * a tensor's shape. */
void ckpt_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

/* The strict match alone, for a layout and an open safetensors set: fills
 * map[i] with the file's tensor for layout tensor i. */
int ckpt_match(const ckpt_layout_t *l, const st_ckpt_t *st, const st_tensor_t **map, char *err,
               size_t errlen);

/* Writes a deterministic, randomly initialised checkpoint of shape cfg
 * into dir (created if missing): config.json (torch_dtype = dtype) and
 * model.safetensors, or with shards > 1 model-0000i-of-0000N.safetensors
 * plus model.safetensors.index.json. Values come from weightinit.h with
 * seed, generated and written in small chunks (a few MiB of memory for a
 * model of any size). bytes_out (may be NULL) receives the tensor bytes. */
int ckpt_write_random(const char *dir, const llama_config_t *cfg, ty_dtype_t dtype, int shards,
                      uint64_t seed, uint64_t *bytes_out, char *err, size_t errlen);

#endif
