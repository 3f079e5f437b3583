/* model_acts.h - the activation buffers of one CPU rank's model, as one
 * table: the worker allocates from it (worker/model/model_internal.h) and
 * the memory rules at submit count from it (llama_activation_bytes), so the
 * two cannot disagree.
 *
 * X(field, floats, needed_for): sizes are expressions over the model's
 * sizes C (hidden), NH, NKV (heads), HS (head size), FF (intermediate), V
 * (vocabulary), the allocated rows N = B*T, T, the layer slots LS, the
 * residual slots RS and the head's chunk HC (rows of logits the output head
 * computes at once); needed_for 0 = always, 1 = only with a backward pass.
 * The shapes below are for training (LS = L, RS = L + 1): the backward pass
 * needs every layer's activations. With activation checkpointing
 * (gradient_checkpointing) LS = 1: each layer runs forward again from its
 * input, residual slot l, before its backward. Forward only keeps one
 * layer's (LS = 1) and two residual slots used in turn (RS = 2). */
#ifndef TY_API_MODEL_ACTS_H
#define TY_API_MODEL_ACTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/llama_config.h"

/* clang-format off */
#define MODEL_ACTS(X)                                                 \
  X(res, RS * N * C, 0)           /* (L+1, B, T, C) residual stream */ \
  X(ln1, N * LS * C, 0)           /* (L, B, T, C) */                   \
  X(rstd1, N * LS, 0)             /* (L, B, T) */                      \
  X(q, N * LS * NH * HS, 0)       /* (L, B, T, QD) after rotary */     \
  X(k, N * LS * NKV * HS, 0)      /* (L, B, T, KVD) after rotary */    \
  X(v, N * LS * NKV * HS, 0)      /* (L, B, T, KVD) */                 \
  X(lse, N * LS * NH, 0)          /* (L, B, NH, T) score log-sum-exp */ \
  X(atty, N * LS * NH * HS, 0)    /* (L, B, T, QD) */                  \
  X(mid, N * LS * C, 0)           /* (L, B, T, C) after attention */   \
  X(ln2, N * LS * C, 0)           /* (L, B, T, C) */                   \
  X(rstd2, N * LS, 0)             /* (L, B, T) */                      \
  X(gate, N * LS * FF, 0)         /* (L, B, T, FF) */                  \
  X(up, N * LS * FF, 0)           /* (L, B, T, FF) */                  \
  X(h, N * LS * FF, 0)            /* (L, B, T, FF) silu(gate)*up */    \
  X(lnf, N * C, 0)                /* (B, T, C) */                      \
  X(rstdf, N, 0)                  /* (B, T) */                         \
  X(logits, HC * V, 0)            /* (HC, V) one chunk of the head */  \
  X(losses, N, 0)                 /* (B, T) */                         \
  X(rope_cos, T * (HS / 2), 0)    /* (T, HS/2) */                      \
  X(rope_sin, T * (HS / 2), 0)    /* (T, HS/2) */                      \
  X(scores, T * T, 0)             /* (T, T) one head's scratch */      \
  X(dres, N * C, 1)               /* (B, T, C) */                      \
  X(dmid, N * C, 1)               /* (B, T, C) */                      \
  X(dln, N * C, 1)                /* (B, T, C) */                      \
  X(dlnf, HC < N ? N * C : 0, 1)  /* (B, T, C) fused head's, chunked */ \
  X(datty, N * NH * HS, 1)        /* (B, T, QD) */                     \
  X(dq, N * NH * HS, 1)           /* (B, T, QD) */                     \
  X(dk, N * NKV * HS, 1)          /* (B, T, KVD) */                    \
  X(dv, N * NKV * HS, 1)          /* (B, T, KVD) */                    \
  X(dh, N * FF, 1)                /* (B, T, FF) */                     \
  X(dgate, N * FF, 1)             /* (B, T, FF) */                     \
  X(dup, N * FF, 1)               /* (B, T, FF) */                     \
  X(dscores, 2 * T * T, 1)        /* (2, T, T) one head's scratch */
/* clang-format on */

/* Besides the floats: tokens, targets, loss weights, positions and the
 * weights scaled by their row (model_set_row_scales), one int (or float)
 * each per row. */
#define MODEL_ACTS_ROW_BYTES (5 * sizeof(int))

/* The output head runs over a batch's tokens in chunks, so that the
 * (tokens, vocabulary) logits are never whole when they would take more
 * than this (Llama 3's 128,256 entries make them a step's largest buffer). */
#define MODEL_HEAD_BYTES ((size_t)256 << 20)

/* Rows of a head chunk by default: what MODEL_HEAD_BYTES holds, at most
 * rows, at least 1. */
int64_t llama_head_rows(int64_t rows, int64_t V);

/* Bytes of activations one CPU rank's model holds for micro-batches of
 * B x T tokens, head chunks of head_rows rows (0: llama_head_rows's):
 * training (backward) keeps every layer's, or one layer's with recompute
 * (activation checkpointing); forward only, one layer's. */
uint64_t llama_activation_bytes(const llama_config_t *c, int64_t B, int64_t T, bool backward,
                                bool recompute, int64_t head_rows);

/* The GPU rank's buffers (worker/cuda/model_cuda.c), the same way:
 * X(field, floats) over the sizes above plus L (layers), QD = NH * HS,
 * KVD = NKV * HS, TC (the LoRA target slots of a layer, all of them), R
 * (LoRA rank, 0 for full training) and NP (the adapters' parameters). Per
 * layer as MODEL_ACTS (LS = L, or 1 with gradient_checkpointing; res keeps
 * every layer's input either way); the d* buffers one layer's gradients;
 * xa each adapted product's x @ A^T for the backward pass; lp, lg the
 * adapters and their gradients. */
/* clang-format off */
#define MODEL_ACTS_CUDA(X)                                              \
  X(res, (L + 1) * N * C)         /* (L+1, B, T, C) */                  \
  X(ln1, LS * N * C)              /* (LS, B, T, C) */                   \
  X(rstd1, LS * N)                                                      \
  X(q, LS * N * QD)                                                     \
  X(k, LS * N * KVD)                                                    \
  X(v, LS * N * KVD)                                                    \
  X(lse, LS * N * NH)                                                   \
  X(atty, LS * N * QD)                                                  \
  X(mid, LS * N * C)                                                    \
  X(ln2, LS * N * C)                                                    \
  X(rstd2, LS * N)                                                      \
  X(gate, LS * N * FF)                                                  \
  X(up, LS * N * FF)                                                    \
  X(h, LS * N * FF)                                                     \
  X(lnf, N * C)                                                         \
  X(rstdf, N)                                                           \
  X(logits, HC * V)               /* (HC, V) one chunk of the head */   \
  X(losses, N)                                                          \
  X(rope_cos, T * (HS / 2))                                             \
  X(rope_sin, T * (HS / 2))                                             \
  X(normw, (2 * L + 1) * C)       /* the norms' gains in fp32 */        \
  X(dres, N * C)                                                        \
  X(dmid, N * C)                                                        \
  X(dln, N * C)                                                         \
  X(dlnf, HC < N ? N * C : 0)                                           \
  X(datty, N * QD)                                                      \
  X(dq, N * QD)                                                         \
  X(dk, N * KVD)                                                        \
  X(dv, N * KVD)                                                        \
  X(dh, N * FF)                                                         \
  X(dgate, N * FF)                                                      \
  X(dup, N * FF)                                                        \
  X(attscr, N * NH)               /* each row's dout . out */           \
  X(xa, L * TC * N * R)                                                 \
  X(dxa, N * R)                                                         \
  X(lp, NP)                                                             \
  X(lg, NP)
/* clang-format on */

/* Besides the floats, a GPU rank holds per row a token, a target, a
 * position (ints) and a loss weight (a float), and a bf16 scratch for the
 * products' operands: the widest activation (C, QD or FF a row) or a head
 * chunk's logits, whichever is more. */
#define MODEL_ACTS_CUDA_ROW_BYTES (3 * sizeof(int) + sizeof(float))
/* Elements of that scratch for N rows and head chunks of HC rows. */
uint64_t llama_device_scratch_elems(const llama_config_t *c, int64_t N, int64_t HC);

/* Bytes of what one GPU rank's model allocates for micro-batches of B x T
 * tokens besides its weights (and, training every weight, their gradients
 * and moments): the MODEL_ACTS_CUDA buffers, the rows and the bf16 scratch,
 * for LoRA of rank lora_rank with lora_params parameters (both 0: every
 * weight), head chunks of head_rows rows (0: llama_head_rows's), one
 * layer's activations with recompute. Attention's optional tensor-core
 * workspace and a sharded base's unit slots are not in it. */
uint64_t llama_device_activation_bytes(const llama_config_t *c, int64_t B, int64_t T,
                                       bool recompute, int64_t lora_rank, uint64_t lora_params,
                                       int64_t head_rows);

/* Parameters of LoRA adapters of rank R on the targets (a bit per
 * projection, as jobspec.h's target_modules) of every layer: R * (in +
 * out) for each adapted product. */
uint64_t llama_lora_params(const llama_config_t *c, int64_t R, unsigned targets);

#endif
