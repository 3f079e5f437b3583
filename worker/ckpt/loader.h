/* loader.h - a rank's dim-0 shard of every base weight: loaded from a
 * checkpoint by one of two paths, or initialised from scratch.
 *
 * Sharding rule: every tensor is split along dim 0 (rows). With R rows and
 * N ranks, each rank gets R / N rows and the first R % N ranks one more, in
 * rank order (loader_rows). Concatenating all ranks' shards in rank order
 * gives the full tensor; a rank may hold 0 rows of a small tensor.
 *
 * Storage: one placement allocation per rank (base, bytes) holding every
 * shard of the table in checkpoint-table order, each at a 64-byte aligned
 * offset and row-major [rows, cols] in the shard's dtype; views[] describe
 * them. A model module walks a layer with
 *   const loader_view_t *q = loader_view(s, CKPT_WQ, layer);  // (q->rows, cols)
 * and all-gathers a tensor by concatenating the ranks' views in rank order.
 *
 * Paths (DESIGN.md "Loading: the two paths"):
 * - standard: read the whole checkpoint into host memory, convert it into a
 *   full model in placement memory, copy this rank's rows into its shard,
 *   free the rest. Peak: the whole model, on the host and the device.
 * - memory-efficient: shard layout first, one shard allocation, then only
 *   this rank's byte ranges (one contiguous range per tensor, since rows are
 *   row-major) read through ONE host staging bucket of bucket_bytes,
 *   converted and copied into the shard. No full-size buffer anywhere.
 *   Where the placement lends staging buffers (placement.h: the CUDA
 *   placement's pinned ones), chunks are read, or converted from the
 *   bucket, straight into them, and each chunk's copy to the device is
 *   queued while the next is read.
 * - from scratch: the shard layout, then this rank's rows from the
 *   counter-based generator of weightinit.h, through the same bucket; the
 *   full weights are the same whatever the world size, and equal to a
 *   float32 `trainyard mkmodel` checkpoint made with the same seed.
 * The three give bitwise identical shards for the same values: each element
 * goes through the same conversion (file dtype -> fp32 -> shard dtype). */
#ifndef TY_WORKER_LOADER_H
#define TY_WORKER_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/llama_config.h"
#include "common/dtype.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/placement.h"

/* A 4-bit tensor's piece on one rank (QLoRA, loader_q4_t): elements
 * [elem0, elem0 + nelem) of the flattened tensor, whole blocks of
 * Q4_BLOCK (of Q4_BLOCK x Q4_NESTED_BLOCK with double quantization) but
 * for the tensor's last, so that a rank's piece quantizes exactly as the
 * whole tensor does. Its record: the codes (two a byte, element 2j in the
 * high nibble), then the blocks' absmax as float32, or with double
 * quantization as 8-bit codes followed by the float32 absmax of each
 * nested block; each part padded to 4 bytes. */
typedef struct {
  int64_t elem0, nelem;
  size_t nblocks;      /* ceil(nelem / Q4_BLOCK) */
  size_t stats_off;    /* bytes from the record's start: absmax, or the 8-bit codes */
  size_t nested_off;   /* double quantization: the nested absmax; else 0 */
  size_t record_bytes; /* a multiple of 4 */
} loader_q4_piece_t;

typedef struct {
  const ckpt_tensor_t *t; /* name, kind, layer, global [rows, cols] (owned by the shard) */
  int64_t row0, rows;     /* this rank's rows: [row0, row0 + rows) of dim 0 */
  size_t offset;          /* bytes from the shard base, 64-byte aligned */
  size_t nbytes;          /* rows x cols x dtype size, or a 4-bit record's bytes */
  void *data;             /* base + offset, in placement memory */
  bool q4;                /* kept in 4 bits: q (not rows) says which elements */
  loader_q4_piece_t q;
  float q4_offset;     /* double quantization: the mean of the tensor's absmax */
  const float *q4_map; /* double quantization: the [256] code the nested statistics
                          decode with: a 4-bit checkpoint's own; NULL: q4_dynamic_code() */
} loader_view_t;

/* QLoRA (quantization.load_in_4bit): the seven linear projections of each
 * layer are quantized as their bytes arrive, bitsandbytes' way
 * (worker/ckpt/quant4.h); norms, embeddings and the head stay in the
 * shard's dtype. Double quantization needs the mean of a tensor's absmax
 * over every rank's blocks: mean(ctx, numel, absmax, nb, &out) is called
 * by every rank for each 4-bit tensor (of numel elements) in table order
 * with its own nb blocks' absmax (a collective where there are several
 * ranks). */
typedef struct {
  int type; /* q4_type_t */
  bool double_quant;
  ty_dtype_t compute; /* what the passes dequantize into (bnb_4bit_compute_dtype) */
  int (*mean)(void *ctx, int64_t numel, const float *absmax, size_t nb, float *out, char *err,
              size_t errlen);
  void *mean_ctx;
} loader_q4_t;

/* Whether tensor kind k is one that QLoRA keeps in 4 bits. */
bool loader_q4_kind(int kind);
/* Rank's piece of a tensor of numel elements over world ranks. */
void loader_q4_piece(int64_t numel, int rank, int world, bool double_quant, loader_q4_piece_t *p);

typedef struct {
  ckpt_layout_t layout; /* the table and its config */
  ty_dtype_t dtype;     /* element type of every shard */
  int rank, world_size;
  placement_t *pl; /* borrowed; must outlive the shard */
  bool has_q4;     /* some views are 4-bit (q4 says how) */
  loader_q4_t q4;
  float *q4_maps; /* [layout.ntensors][256]: the nested codes read from a 4-bit checkpoint */
  void *base;     /* the one placement allocation */
  size_t bytes;
  loader_view_t *views; /* [layout.ntensors], table order */
} loader_shard_t;

/* Where a load's bytes and time went; peaks are filled by loader_*. */
typedef struct {
  uint64_t bytes_read;        /* bytes read from checkpoint files */
  uint64_t bytes_total;       /* bytes this rank had to read */
  uint64_t shard_bytes;       /* this rank's shard in placement memory */
  uint64_t host_peak_bytes;   /* VmHWM of the process after the load */
  uint64_t device_peak_bytes; /* the placement's high-water mark */
  double load_seconds;
} loader_stats_t;

/* progress(ctx, bytes_done, bytes_total) is called after each tensor. */
typedef void (*loader_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* For a progress callback that reports: whether a report of (done, total)
 * is due, at most one a second (*last: ty_mono_s() of the last, updated
 * when one is due) and none for the end, which the load's own report says. */
bool loader_progress_due(double *last, uint64_t done, uint64_t total);

typedef struct {
  int rank, world_size;        /* 0 <= rank < world_size */
  ty_dtype_t dtype;            /* shard dtype (the job's dtype) */
  bool memory_efficient;       /* fsdp.memory_efficient_load */
  size_t bucket_bytes;         /* fsdp.bucket_mb x 2^20; the staging bucket */
  uint64_t seed;               /* from-scratch init (train.seed) */
  placement_t *pl;             /* where the shard goes */
  const loader_q4_t *q4;       /* NULL: every tensor in dtype; else the projections in 4 bits
                                  (host placements only) */
  loader_progress_fn progress; /* may be NULL */
  void *progress_ctx;
} loader_opts_t;

/* Rows [*row0, *row0 + *count) of R rows for rank of world. */
void loader_rows(int64_t R, int rank, int world, int64_t *row0, int64_t *count);

/* Loads this rank's shard of the checkpoint in dir (config.json +
 * safetensors, matched strictly) by the path o->memory_efficient picks.
 * *out is the caller's (loader_shard_free); stats may be NULL. Errors name
 * the file and tensor. Like every loader_* below that places bytes, it
 * returns after the placement's completion point (placement_finish): the
 * shard's bytes are in placement memory, and on an error no copy is left
 * in flight. */
int loader_load(const char *dir, const loader_opts_t *o, loader_shard_t **out,
                loader_stats_t *stats, char *err, size_t errlen);

/* This rank's shard of a freshly initialised model of shape cfg. */
int loader_init_scratch(const llama_config_t *cfg, const loader_opts_t *o, loader_shard_t **out,
                        loader_stats_t *stats, char *err, size_t errlen);

/* A copy of src (a shard in host memory: a CPU placement's) in placement
 * pl: the same layout, one allocation of src->bytes in pl, the bytes
 * copied in (pl's copy_in). For a shard that lives on the host and on a
 * device at once (full training over GPUs: the device's copy is trained,
 * the host's receives it for checkpoints and the outputs). *out is the
 * caller's (loader_shard_free); TY_EINVAL
 * when src is not in host memory, TY_EEXHAUSTED when pl has no room. */
int loader_shard_upload(const loader_shard_t *src, placement_t *pl, loader_shard_t **out, char *err,
                        size_t errlen);

/* Bytes of rank's shard of a model of shape cfg in dtype (what
 * loader_load / loader_init_scratch will allocate), without loading or
 * allocating anything. 0 for a config or rank out of range. */
uint64_t loader_shard_bytes(const llama_config_t *cfg, int rank, int world, ty_dtype_t dtype);
/* The same with q4 (NULL: as loader_shard_bytes): what a QLoRA rank's
 * shard takes. */
uint64_t loader_shard_bytes_q4(const llama_config_t *cfg, int rank, int world, ty_dtype_t dtype,
                               const loader_q4_t *q4);

/* The view of (kind, layer) (layer ignored for global kinds), or NULL when
 * absent (lm_head of a tied model). */
const loader_view_t *loader_view(const loader_shard_t *s, ckpt_kind_t kind, int layer);

/* The view of the tensor named `name` (the checkpoint's name), or NULL. */
const loader_view_t *loader_view_by_name(const loader_shard_t *s, const char *name);

/* Releases the shard's placement memory and the shard. Accepts NULL. */
void loader_shard_free(loader_shard_t *s);

#endif
