/* ckpt_convert.h - a checkpoint of any format trainyard reads (safetensors or
 * PyTorch, single or sharded, a folder or one file with config.json beside
 * it) written again as a Hugging Face safetensors checkpoint, streamed: a
 * tensor is read, converted and written a chunk at a time, so the host
 * holds about one chunk (CONVERT_CHUNK bytes), never a tensor or a file.
 *
 * With quantize, the seven projections of each layer are written in
 * bitsandbytes' 4-bit layout (worker/ckpt/bnb4.h) instead, as transformers
 * saves a model loaded with load_in_4bit: such a weight is read whole into
 * fp32, quantized (quant4.h) and written with its statistics, so the host
 * holds one weight in fp32 and its codes. With double_quant each projection
 * is read and quantized twice: its quant_state holds the mean of its block
 * maxima, and the file's header, written first, holds that JSON's length.
 * With dequantize, a checkpoint in that layout (checked whole by
 * bnb4_match) is written back as floats. */
#ifndef TY_WORKER_CKPT_CONVERT_H
#define TY_WORKER_CKPT_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "worker/ckpt/quant4.h"

#define CONVERT_CHUNK (4u << 20) /* source bytes read per step */

typedef struct {
  bool set_dtype;       /* false: each tensor keeps its file's dtype */
  ty_dtype_t dtype;     /* with set_dtype: every tensor's, and config.json's torch_dtype */
  uint64_t shard_bytes; /* 0: one model.safetensors; else files of at most this
                           (a tensor larger than it gets a file of its own; a
                           4-bit weight's components stay in one file) */
  bool quantize;        /* write the projections 4-bit; the source must not be 4-bit */
  q4_type_t q4_type;    /* with quantize: nf4 or fp4 */
  bool double_quant;    /* with quantize: bnb_4bit_use_double_quant (nested statistics) */
  bool dequantize;      /* the source is 4-bit (bnb4.h): write its weights as floats, in
                           their quant_state's dtype or dtype */
} convert_opts_t;

typedef struct {
  size_t tensors, files;              /* tensors written (a 4-bit weight's components each) */
  uint64_t bytes_read, bytes_written; /* every tensor's */
  size_t q4_weights;                  /* weights quantized (or dequantized) */
  uint64_t q4_float_bytes;            /* their bytes as floats (written, or read back) */
  uint64_t q4_bytes;                  /* their bytes in the 4-bit layout, statistics included */
} convert_stats_t;

/* Converts the checkpoint at src (matched strictly against its config.json,
 * as a job loads it) into the folder out (made if missing; it must hold no
 * checkpoint yet, and must not be src's folder): config.json (the source's,
 * with torch_dtype set when the dtype is, and quantization_config added by
 * quantize, removed by dequantize), model.safetensors or
 * model-0000i-of-0000N.safetensors + model.safetensors.index.json, tensors in
 * the table's order (a 4-bit weight's components in bnb4_comp_t order). A
 * tied head that the source kept as a view of the embedding is written once,
 * as Hugging Face does. A 4-bit source is refused by quantize (naming it),
 * and without dequantize (saying so); dequantize refuses a source with no
 * 4-bit weight. stats may be NULL. */
int ckpt_convert(const char *src, const char *out, const convert_opts_t *o, convert_stats_t *stats,
                 char *err, size_t errlen);

#endif
