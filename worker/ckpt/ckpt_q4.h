/* ckpt_q4.h - a bitsandbytes 4-bit checkpoint (config.json's
 * quantization_config; the layout of worker/ckpt/bnb4.h) opened as any
 * other: ckpt_open finds the 4-bit weights and checks each, and readers
 * either take a weight's codes and statistics as they are (the loader, for
 * a QLoRA job: a rank's byte ranges of each) or the float weight they stand
 * for (ckpt_read_f32: eval, generate, merge, a job's float model), as
 * bitsandbytes' dequantize_4bit computes it, rounded through the
 * checkpoint's bnb_4bit_compute_dtype as its products would see it. */
#ifndef TY_WORKER_CKPT_Q4_H
#define TY_WORKER_CKPT_Q4_H

#include <jansson.h>

#include "worker/ckpt/bnb4.h"
#include "worker/ckpt/checkpoint.h"

struct ckpt_q4 {
  bnb4_config_t cfg; /* config.json's quantization_config */
  bnb4_info_t *info; /* [layout.ntensors]: each table tensor as stored */
  size_t nq4;        /* weights stored in 4 bits */
};

/* Opens c->st for the checkpoint in dir whose config.json has the
 * quantization_config qc, and matches it against c->layout (bnb4_match):
 * fills c->q4 and c->file_tensor. 0 or the error naming the key or tensor. */
int ckpt_q4_open(ckpt_t *c, const char *dir, const json_t *qc, char *err, size_t errlen);
void ckpt_q4_free(ckpt_q4_t *q);

/* Table tensor i's 4-bit form, or NULL (a plain tensor, or a checkpoint
 * that is not 4-bit). */
const bnb4_info_t *ckpt_q4_info(const ckpt_t *c, size_t i);

/* Table tensor i whole into dst (its rows x cols floats): a plain tensor
 * converted from its dtype, a 4-bit one dequantized (and rounded through
 * the compute dtype). */
int ckpt_read_f32(const ckpt_t *c, size_t i, float *dst, char *err, size_t errlen);

/* Blocks [b0, b0 + nb) of a 4-bit weight's statistics: its absmax as
 * float32 (nested ones recovered with the file's own nested_quant_map). */
int ckpt_q4_read_absmax(const ckpt_t *c, size_t i, uint64_t b0, size_t nb, float *absmax, char *err,
                        size_t errlen);

/* The weights a 4-bit base computes with, for one quantized from floats
 * as it loads (quantization.load_in_4bit over a float checkpoint): x (n
 * floats of a projection) quantized as the loader does (type, double
 * quantization over the whole tensor), dequantized and rounded through
 * compute, in place. What samples decode with and a merge adds the
 * adapter to. 0, or TY_EEXHAUSTED. */
typedef struct {
  q4_type_t type;
  bool double_quant;
  ty_dtype_t compute;
} ckpt_q4_kind_t;
int ckpt_q4_roundtrip(const ckpt_q4_kind_t *k, float *x, size_t n);

/* Whether the tensor called name is one 4 bits keep ("...q_proj.weight",
 * ... "...down_proj.weight"). */
bool ckpt_q4_projection(const char *name);

#endif
