/* merge.h - a LoRA adapter merged into its base checkpoint: a Hugging Face
 * checkpoint whose every adapted projection is
 *   W' = W + (lora_alpha / r) * B @ A        (PEFT's merge_and_unload)
 * and every other tensor (norms, embeddings, Qwen2's q/k/v biases, the
 * projections the adapter leaves alone) the base's, copied.
 *
 * Written tensor by tensor, in the checkpoint table's order, into one
 * model.safetensors, or into files of at most shard_bytes each with
 * Hugging Face's model.safetensors.index.json: an adapted tensor is read whole into one fp32 buffer
 * (the product needs all of it), the others stream through CONVERT_CHUNK
 * buffers, so the host holds about the largest adapted tensor in fp32 and
 * the adapter, never the model. The base is read through the tensor table
 * (ckpt_open: safetensors or PyTorch files, matched strictly against
 * config.json); config.json and the tokenizer files beside it are copied.
 *
 * The output folder is made as "<out>.partial" and renamed onto out only
 * when every file is whole, so a reader never sees half a merged model;
 * every file is opened beneath the roots (common/beneath.h). */
#ifndef TY_WORKER_MERGE_H
#define TY_WORKER_MERGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "worker/ckpt/ckpt_q4.h"
#include "worker/model/lora.h"

typedef struct {
  bool set_dtype;           /* false: each tensor keeps the base file's dtype */
  ty_dtype_t dtype;         /* with set_dtype: every tensor's, and config.json's torch_dtype */
  bool replace;             /* an existing out is replaced (a job's output_dir/merged from an
                             * earlier attempt); false: an existing out is an error */
  uint64_t shard_bytes;     /* 0: one model.safetensors; else files of at most this (a larger
                             * tensor alone in its file) and their index */
  const ckpt_q4_kind_t *q4; /* a QLoRA job's float base: its projections as the job's 4 bits
                               kept them (ckpt_q4_roundtrip), then merged; NULL: as they are */
} merge_opts_t;

/* The files a job's merge_adapter writes, and trainyard merge's default:
 * at most 5 GiB each, as Hugging Face's save_pretrained cuts them. */
#define MERGE_SHARD_BYTES ((uint64_t)5 << 30)

typedef struct {
  size_t tensors, merged;  /* tensors written; of them, adapted ones */
  size_t files_copied;     /* config.json and tokenizer files */
  size_t files;            /* safetensors files written */
  uint64_t bytes_written;  /* tensor bytes */
  uint64_t largest_tensor; /* fp32 bytes of the largest adapted tensor (the buffer) */
  bool dequantized;        /* the base was 4-bit (bitsandbytes): merged into floats */
} merge_stats_t;

/* Merges lo (adapters created for the model at model_path: its layers and
 * projection shapes) into model_path's weights, writing the checkpoint to
 * out (see above). stats may be NULL. Returns 0, or TY_EINVAL (an adapter
 * of another shape, a bad checkpoint), TY_EEXISTS (out exists, without
 * replace), TY_ENOTFOUND, TY_EEXHAUSTED or an I/O error, with err naming
 * the path or tensor; nothing is left at out on failure. */
int ckpt_merge(const char *model_path, const lora_t *lo, const char *out, const merge_opts_t *o,
               merge_stats_t *stats, char *err, size_t errlen);

/* The same with the adapter read from adapter_dir (PEFT's
 * adapter_config.json + adapter_model.safetensors, as a LoRA job writes
 * them), checked against model_path's config.json: an adapter for a model
 * of another shape is refused naming the tensor. */
int ckpt_merge_dir(const char *model_path, const char *adapter_dir, const char *out,
                   const merge_opts_t *o, merge_stats_t *stats, char *err, size_t errlen);

/* A LoRA job's merge_adapter: lo merged into model_path's checkpoint as
 * output_dir/merged/ (MERGE_OUTPUT_DIR), each tensor in the base's dtype,
 * in files of MERGE_SHARD_BYTES at most; a merged folder of an earlier
 * attempt of the job is replaced. q4 (NULL: none): a QLoRA job's 4 bits,
 * the base it trained over. */
#define MERGE_OUTPUT_DIR "merged"
int merge_write_outputs(const char *output_dir, const lora_t *lo, const char *model_path,
                        const ckpt_q4_kind_t *q4, char *err, size_t errlen);

#endif
