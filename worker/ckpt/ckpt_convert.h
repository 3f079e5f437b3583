/* ckpt_convert.h - a checkpoint of any format trainyard reads (safetensors or
 * PyTorch, single or sharded, a folder or one file with config.json beside
 * it) written again as a Hugging Face safetensors checkpoint, streamed: a
 * tensor is read, converted and written a chunk at a time, so the host
 * holds about one chunk (CONVERT_CHUNK bytes), never a tensor or a file. */
#ifndef TY_WORKER_CKPT_CONVERT_H
#define TY_WORKER_CKPT_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

#define CONVERT_CHUNK (4u << 20) /* source bytes read per step */

typedef struct {
  bool set_dtype;       /* false: each tensor keeps its file's dtype */
  ty_dtype_t dtype;     /* with set_dtype: every tensor's, and config.json's torch_dtype */
  uint64_t shard_bytes; /* 0: one model.safetensors; else files of at most this
                           (a tensor larger than it gets a file of its own) */
} convert_opts_t;

typedef struct {
  size_t tensors, files;
  uint64_t bytes_read, bytes_written;
} convert_stats_t;

/* Converts the checkpoint at src (matched strictly against its config.json,
 * as a job loads it) into the folder out (made if missing; it must hold no
 * checkpoint yet, and must not be src's folder): config.json (the source's,
 * with torch_dtype set when the dtype is), model.safetensors or
 * model-0000i-of-0000N.safetensors + model.safetensors.index.json, tensors in
 * the table's order. A tied head that the source kept as a view of the
 * embedding is written once, as Hugging Face does. stats may be NULL. */
int ckpt_convert(const char *src, const char *out, const convert_opts_t *o, convert_stats_t *stats,
                 char *err, size_t errlen);

#endif
