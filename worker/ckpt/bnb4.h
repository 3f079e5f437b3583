/* bnb4.h - bitsandbytes' 4-bit checkpoint layout, as transformers saves a
 * model loaded with load_in_4bit (bitsandbytes/nn/modules.py
 * Linear4bit._save_to_state_dict, bitsandbytes/functional.py
 * QuantState.as_dict(packed=True)): names, the quant_state JSON, the
 * validation of a weight so stored, and config.json's quantization_config.
 *
 * A weight W of shape [out, in] (original dtype D, n = out * in elements,
 * nb = ceil(n / 64) blocks) is stored as these tensors:
 *   W                                 U8  [(n + 1) / 2, 1]  codes, two a byte, high nibble first
 *   W.absmax                          F32 [nb]              block maxima; U8 [nb] when nested
 *   W.quant_map                       F32 [16]              the 4-bit code (q4_code)
 *   W.nested_absmax                   F32 [ceil(nb / 256)]  nested only
 *   W.nested_quant_map                F32 [256]             nested only (q4_dynamic_code)
 *   W.quant_state.bitsandbytes__nf4   U8  [len]             (or __fp4) the JSON below, UTF-8
 * The JSON is Python's json.dumps of {"quant_type", "blocksize", "dtype",
 * "shape"} and, nested, {"nested_blocksize", "nested_dtype",
 * "nested_offset"}, in that order:
 *   {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [64, 32],
 *    "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0123}
 * (one line). Nested, the block maxima are absmax[i] =
 * nested_quant_map[W.absmax[i]] * nested_absmax[i / 256] + nested_offset.
 * Everything else (embeddings, norms, lm_head, biases) stays as it was.
 *
 * Errors: 0 or a negative TY_E* code with a message naming the tensor and
 * the component or key into err (errlen bytes; err may be NULL). */
#ifndef TY_WORKER_BNB4_H
#define TY_WORKER_BNB4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/dtype.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/quant4.h"
#include "worker/ckpt/safetensors.h"

/* The tensors transformers quantizes in a Llama layout: the seven
 * projections of each layer (every nn.Linear but lm_head, which it skips). */
bool bnb4_quantized_kind(ckpt_kind_t k);

/* The components of one weight, in the order the convert writer puts them. */
typedef enum {
  BNB4_CODES = 0,
  BNB4_ABSMAX,
  BNB4_QUANT_MAP,
  BNB4_NESTED_ABSMAX,
  BNB4_NESTED_QUANT_MAP,
  BNB4_QUANT_STATE,
  BNB4_NCOMP
} bnb4_comp_t;

#define BNB4_NAME_MAX (CKPT_NAME_MAX + 48)
#define BNB4_STATE_MAX 512 /* bytes of a quant_state JSON we read or write */

/* The name of component c of weight (of type t, which only the quant_state
 * name depends on) into buf (n bytes, BNB4_NAME_MAX is enough): "W" for the
 * codes, "W.absmax", ..., "W.quant_state.bitsandbytes__nf4". Returns false
 * when it does not fit. */
bool bnb4_name(char *buf, size_t n, const char *weight, bnb4_comp_t c, q4_type_t t);

/* What a quant_state says about its weight. */
typedef struct {
  q4_type_t type;
  int blocksize;    /* Q4_BLOCK */
  ty_dtype_t dtype; /* the weight's dtype before quantization */
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  bool nested;
  int nested_blocksize; /* Q4_NESTED_BLOCK, when nested */
  float offset;         /* nested_offset (q4_mean of the block maxima), when nested */
} bnb4_state_t;

/* The quant_state JSON, byte for byte as bitsandbytes packs it (Python's
 * json.dumps; nested_offset as Python's repr of the float32 mean widened to
 * a double), into buf (n bytes, NUL-terminated). Returns its length without
 * the NUL, or 0 when it does not fit. */
size_t bnb4_state_json(const bnb4_state_t *s, char *buf, size_t n);

/* Parses the len bytes of a quant_state read from the tensor named tensor
 * (its quant_type must be the one the name ends with). Refuses anything
 * that is not the JSON transformers writes: not JSON, a key missing, unknown
 * or of the wrong kind, a blocksize other than 64 (nested: 256), a dtype
 * not float32/bfloat16/float16 (nested: float32); TY_EINVAL naming tensor
 * and key. */
int bnb4_state_parse(const char *tensor, const char *json, size_t len, bnb4_state_t *s, char *err,
                     size_t errlen);

/* A weight as an open checkpoint stores it. */
typedef struct {
  bool q4;                             /* stored 4-bit; false: as one plain tensor (or absent) */
  bnb4_state_t state;                  /* q4: the parsed quant_state */
  uint64_t nelem;                      /* q4: elements of the weight (product of state.shape) */
  uint64_t nblocks;                    /* q4: ceil(nelem / 64) */
  uint64_t nnested;                    /* q4 and nested: ceil(nblocks / 256), else 0 */
  const st_tensor_t *comp[BNB4_NCOMP]; /* q4: the component tensors (nested ones NULL
                                          unless nested); borrowed from the checkpoint */
} bnb4_info_t;

/* Whether weight is stored 4-bit in ck (opened with ST_OPEN_U8), and if so
 * checks all of it: every component present, with the dtype and size the
 * quant_state's shape implies; no other "W.*" tensor; the quant_state parsed
 * and naming the type its name does; quant_map (and nested_quant_map)
 * bitsandbytes' own code, within 1e-6. Reads the quant_state and the maps
 * (a few KiB). Fills *info (info->q4 false when W is stored plainly: then
 * nothing else is set and nothing checked; the caller checks the plain
 * tensor). */
int bnb4_find(const st_ckpt_t *ck, const char *weight, bnb4_info_t *info, char *err, size_t errlen);

/* bnb4_find for every tensor of layout l: map[i] is the file's tensor of
 * table entry i (its codes when info[i].q4), with the shape config.json
 * implies (the quant_state's for a 4-bit one), a plain one of a float
 * dtype; no tensor of ck is left over. map and info have l->ntensors
 * entries. Fills *nq4 (may be NULL) with the count of 4-bit weights. */
int bnb4_match(const ckpt_layout_t *l, const st_ckpt_t *ck, const st_tensor_t **map,
               bnb4_info_t *info, size_t *nq4, char *err, size_t errlen);

/* config.json's quantization_config of a bitsandbytes 4-bit model. */
typedef struct {
  q4_type_t type;           /* bnb_4bit_quant_type */
  bool double_quant;        /* bnb_4bit_use_double_quant */
  ty_dtype_t compute_dtype; /* bnb_4bit_compute_dtype (float32 when null or absent) */
} bnb4_config_t;

/* quantization_config as transformers writes it (BitsAndBytesConfig.to_dict,
 * keys sorted as in config.json; bnb_4bit_quant_storage "uint8",
 * llm_int8_skip_modules null, which transformers reads as "skip lm_head").
 * A new reference. */
json_t *bnb4_config_json(const bnb4_config_t *c);
/* Reads one (qc: config.json's "quantization_config"). Refuses another
 * quant_method, load_in_8bit, load_in_4bit not true, a storage other than
 * uint8, an unknown key; TY_EINVAL or TY_EUNIMPLEMENTED naming the key. */
int bnb4_config_parse(const json_t *qc, bnb4_config_t *c, char *err, size_t errlen);

#endif
