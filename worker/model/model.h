/* model.h - the Llama decoder as Hugging Face defines it, on the CPU in
 * fp32: token embedding, L layers of (RMSNorm, grouped-query attention with
 * rotary embeddings and a causal mask, RMSNorm, SwiGLU MLP) on a residual
 * stream, a final RMSNorm, the LM head (tied or not) and the mean
 * next-token cross-entropy. Forward and backward.
 *
 * Dimension letters, used in every shape comment of the worker:
 *   B   sequences per micro-batch          T    tokens per sequence
 *   C   hidden size                        L    layers
 *   NH  query heads                        NKV  key/value heads (NH % NKV == 0)
 *   HS  head size (head_dim)               FF   MLP intermediate size
 *   V   vocabulary size                    R    LoRA rank
 * and N = B*T token rows, QD = NH*HS, KVD = NKV*HS.
 *
 * Memory: every base parameter lives in one allocation (params), in the
 * order of the tensor table below (layer-major: embed_tokens, then each
 * layer's tensors, then norm and an untied lm_head); full training keeps
 * the gradients in a second allocation of the same layout, so an optimizer,
 * an all-reduce or a checkpoint is one flat loop. Activations and gradient
 * scratch are allocated by model_create for at most (B, T) tokens; no step
 * allocates.
 *
 * Sharding: the layer functions take a model_layer_t of weight pointers (and
 * one of gradient pointers), not the model's own buffer, so a caller can
 * point them at a reused buffer holding one all-gathered layer. model_forward
 * and model_backward are the single-rank composition over the model's own
 * buffers. */
#ifndef TY_WORKER_MODEL_H
#define TY_WORKER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/llama_config.h"

typedef struct lora lora_t; /* worker/model/lora.h */

/* The shape, from a llama_config_t. */
typedef struct {
  int C, L, NH, NKV, HS, FF, V;
  float eps;                         /* rms_norm_eps */
  double rope_theta;                 /* rotary base */
  llama_rope_scaling_t rope_scaling; /* rescaled frequencies (Llama 3.1+) */
  bool tied;                         /* lm_head is embed_tokens */
  bool qkv_bias;                     /* Qwen2: the q, k and v projections add a bias */
} model_dims_t;

/* The per-layer tensors in storage order: X(field, Hugging Face name
 * after "model.layers.{i}.", rows, cols), rows and cols being expressions
 * over a `const model_dims_t *d` in scope; cols 0 marks a 1-D tensor.
 * Matrices are row-major (out_features, in_features), as in PyTorch.
 * rows 0: absent from this model (the biases of a model without
 * qkv_bias): no storage, a NULL pointer in model_layer_t. */
#define MODEL_LAYER_TENSORS(X)                                            \
  X(input_layernorm, "input_layernorm.weight", d->C, 0)                   \
  X(q_proj, "self_attn.q_proj.weight", d->NH * d->HS, d->C)               \
  X(k_proj, "self_attn.k_proj.weight", d->NKV * d->HS, d->C)              \
  X(v_proj, "self_attn.v_proj.weight", d->NKV * d->HS, d->C)              \
  X(o_proj, "self_attn.o_proj.weight", d->C, d->NH * d->HS)               \
  X(post_attention_layernorm, "post_attention_layernorm.weight", d->C, 0) \
  X(gate_proj, "mlp.gate_proj.weight", d->FF, d->C)                       \
  X(up_proj, "mlp.up_proj.weight", d->FF, d->C)                           \
  X(down_proj, "mlp.down_proj.weight", d->C, d->FF)                       \
  X(q_bias, "self_attn.q_proj.bias", d->qkv_bias ? d->NH * d->HS : 0, 0)  \
  X(k_bias, "self_attn.k_proj.bias", d->qkv_bias ? d->NKV * d->HS : 0, 0) \
  X(v_bias, "self_attn.v_proj.bias", d->qkv_bias ? d->NKV * d->HS : 0, 0)

/* One layer's weights (or gradients): input_layernorm (C), q_proj (QD, C),
 * k_proj (KVD, C), v_proj (KVD, C), o_proj (C, QD), post_attention_layernorm
 * (C), gate_proj (FF, C), up_proj (FF, C), down_proj (C, FF), and with
 * qkv_bias q_bias (QD), k_bias (KVD), v_bias (KVD) (else NULL). */
typedef struct {
#define TY_X(field, name, rows, cols) float *field;
  MODEL_LAYER_TENSORS(TY_X)
#undef TY_X
} model_layer_t;

/* All weights (or all gradients) of a model. */
typedef struct {
  float *embed_tokens;   /* (V, C) */
  model_layer_t *layers; /* [L] */
  float *norm;           /* (C) */
  float *lm_head;        /* (V, C); the same pointer as embed_tokens when tied */
} model_weights_t;

/* One entry of the tensor table: a named tensor in the parameter buffer. */
typedef struct {
  char name[96]; /* Hugging Face name, "model.layers.3.mlp.up_proj.weight" */
  int ndim;      /* 1 or 2 */
  int64_t shape[2];
  size_t numel;
  size_t offset; /* in floats, from the start of params (and of grads) */
  int layer;     /* its layer, or -1 */
  float *data;   /* params + offset */
  float *grad;   /* grads + offset, NULL unless MODEL_TRAIN_FULL */
} model_tensor_t;

typedef enum {
  MODEL_EVAL = 0,   /* forward only */
  MODEL_TRAIN_LORA, /* backward into adapters only: no base-weight gradients */
  MODEL_TRAIN_FULL, /* backward into every weight */
} model_mode_t;

typedef struct model_acts model_acts_t; /* private to model.c */

typedef struct {
  model_dims_t d;
  int B, T; /* the largest micro-batch the buffers hold */
  model_mode_t mode;
  float *params; /* n_params floats, one allocation */
  float *grads;  /* n_params floats, same layout; NULL unless MODEL_TRAIN_FULL */
  size_t n_params;
  model_weights_t w;  /* views into params */
  model_weights_t dw; /* views into grads (all NULL without grads) */
  model_tensor_t *tensors;
  int n_tensors;
  model_acts_t *acts;
  float *logits; /* (head_rows, V): the last forward's logits, all of them when its b*t
                  * tokens fit one chunk of the head (else the last chunk's, or in LoRA
                  * training their gradient); model_backward turns them into dlogits */
  int head_rows; /* rows of logits the output head computes at once (model_head_rows) */
  int b, t;      /* the shape of the last forward */
  double loss;   /* mean loss of the last forward with targets */
} model_t;

/* The output head (final norm's output times lm_head) runs over a batch's
 * tokens in chunks of *out rows, so that the (tokens, vocabulary) logits are
 * never whole when they would take more than MODEL_HEAD_BYTES
 * (api/model_acts.h; Llama 3's 128,256 entries make them a step's largest
 * buffer): a chunk's loss and its gradient come from its own logits.
 * Training LoRA, the head's backward runs in the forward pass while each
 * chunk's logits are at hand; training every weight, the backward pass
 * computes each chunk's logits again (unless all rows fit one chunk). rows:
 * the batch's tokens; RANKENV_HEAD_ROWS sets the chunk (CPU and CUDA).
 * Returns 0, or TY_EINVAL for a bad RANKENV_HEAD_ROWS (err says why). */
int model_head_rows(size_t rows, int V, int *out, char *err, size_t errlen);

/* Checks that cfg describes a model this code runs (positive sizes, NH a
 * multiple of NKV, an even head size, sizes that fit an int) and fills d.
 * Returns 0 or TY_EINVAL with the reason in err (may be NULL). */
int model_dims_from_config(model_dims_t *d, const llama_config_t *cfg, char *err, size_t errlen);

/* Fills m with a model's shape only (dimensions, B, T, mode; every pointer
 * NULL, nothing allocated, so not for model_free): what adapters
 * (lora_create) and the training loop read of a model whose weights live
 * elsewhere, such as on a GPU. Returns 0 or TY_EINVAL with the reason. */
int model_init_shape(model_t *m, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                     char *err, size_t errlen);

/* Allocates the parameters (zeroed), the gradients for MODEL_TRAIN_FULL and
 * the activations for micro-batches of up to B x T tokens. The caller owns
 * *out and frees it with model_free. Returns 0, TY_EINVAL (bad config or
 * B, T) or TY_EEXHAUSTED (out of memory), with the reason in err. */
int model_create(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                 char *err, size_t errlen);
void model_free(model_t *m);

/* The parameters and (for MODEL_TRAIN_FULL) gradients only, no activations
 * (B and T are recorded for the training loop's checks): the host's copy
 * of weights that are trained on a device (worker/cuda/train_cuda.h), brought
 * up to date for checkpoints and the outputs, which are written from it.
 * No pass runs on it. */
int model_create_weights(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                         char *err, size_t errlen);

/* The same without the parameter and gradient buffers (params, grads, the
 * views in w and dw and each tensor's data and grad are NULL; offsets still
 * describe the full layout): for a rank that holds only its shards and
 * hands every weight to the stage functions below (FSDP). model_forward,
 * model_backward, model_fill and model_init_random need the buffers. */
int model_create_unowned(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                         char *err, size_t errlen);

/* The tensor table alone: neither weights nor activations (the shape and
 * layout of a model whose shards live in an fsdp span and whose passes run
 * on a device). No pass runs on it. */
int model_create_table(model_t **out, const llama_config_t *cfg, int B, int T, model_mode_t mode,
                       char *err, size_t errlen);

/* Floats of one layer's tensors, and views of a buffer holding them
 * contiguously in MODEL_LAYER_TENSORS order (the order they have inside
 * params): a reused buffer for one all-gathered layer, or its gradients. */
size_t model_layer_floats(const model_dims_t *d);
void model_layer_views(const model_dims_t *d, float *base, model_layer_t *w);
/* Tensors of each layer in the table: 9, or 12 with qkv_bias. */
int model_layer_tensors(const model_dims_t *d);

/* Activation checkpointing (the job's gradient_checkpointing): keeps one
 * layer's activations instead of L, beside every layer's input (the
 * residual stream), and model_layer_backward runs the layer's forward
 * again first; a training model's buffers are allocated anew. Costs one
 * more forward of every layer a step. 0, or TY_EEXHAUSTED with the
 * activations as they were. */
int model_recompute_layers(model_t *m, char *err, size_t errlen);

/* Bytes of the activation and scratch buffers (for memory reports). */
size_t model_activation_bytes(const model_t *m);

/* The tensor called name, or NULL. */
const model_tensor_t *model_find_tensor(const model_t *m, const char *name);

/* Source of weights for model_fill: copies tensor t (t->numel floats, of
 * shape t->shape) into dst. Returns 0 or a negative TY_E* code with a
 * message in err. */
typedef int (*model_fill_fn)(void *ctx, const model_tensor_t *t, float *dst, char *err,
                             size_t errlen);
/* Fills every tensor of the table, in storage order, from fn. Stops at
 * the first failure and returns its code; err then names the tensor. */
int model_fill(model_t *m, model_fill_fn fn, void *ctx, char *err, size_t errlen);

/* Initial weights for training from scratch: worker/model/weightinit.h's values
 * (what the loader's init_from_scratch path and `trainyard mkmodel` give
 * for the same seed), matrices scaled to standard deviation std (0.02 is
 * Hugging Face's initializer_range), norm weights 1. */
void model_init_random(model_t *m, uint64_t seed, float std);

/* Zeroes the gradient buffer (no-op without one). */
void model_zero_grad(model_t *m);

/* One micro-batch. weights and pos are what real training data adds to
 * the token windows: a loss mask (prompt and padding targets count 0) and,
 * for several documents packed in one row, each token's position in its
 * document, which both restarts the rotary angle and confines attention to
 * the token's own document. */
typedef struct {
  const int *tokens;    /* (b, t) input ids */
  const int *targets;   /* (b, t) next-token ids, or NULL (logits only) */
  const float *weights; /* (b, t) each target's loss weight, 0 or 1; NULL: every target counts */
  const int *pos;       /* (b, t) 0 at a document's first token, then +1 a token; NULL:
                         * 0 .. t-1 in every row (one document a row) */
  int b, t;
} model_batch_t;

/* Checks a batch's shape against buffers of B x T tokens, its ids against
 * [0, V), its weights (0 or 1) and positions (0, or the previous token's
 * + 1); 0 or TY_EINVAL naming the row and position. */
int model_batch_check(const model_batch_t *batch, int B, int T, int V, char *err, size_t errlen);

/* Counted targets of a batch: the sum of its weights, or b*t. */
int64_t model_batch_count(const model_batch_t *batch);

/* --- Sums over rows, for objectives over whole sequences (DPO). --- */

/* Each row's summed loss over its counted targets in the last forward with
 * targets (sums [b]): minus the log-probability of the row's counted tokens
 * (0 for a forward without targets). Works over the stages (FSDP) too. */
void model_row_losses(const model_t *m, double *sums);
/* Makes the next backward (model_backward, or model_head_backward over the
 * stages) the gradient of sum_i scales[i] * (row i's summed loss) instead
 * of loss_scale times the mean: scales [b] borrowed until then; a forward
 * clears them. */
void model_set_row_scales(model_t *m, const float *scales);

/* --- Single-rank forward and backward over the model's own buffers. --- */

/* tokens, targets (b, t) row-major token ids; targets may be NULL (logits
 * only). lora may be NULL. Writes m->logits (b, t, V) and, with targets,
 * *loss (may be NULL) = m->loss = the mean of the b*t next-token losses.
 * Returns 0, TY_EINVAL when b, t exceed the allocation or an id is outside
 * [0, V) (err names its position), or TY_EPRECONDITION for an unowned
 * model. lora must have been created for this model. One thread at a time
 * per model (and per lora). */
int model_forward(model_t *m, const int *tokens, const int *targets, int b, int t, lora_t *lora,
                  double *loss, char *err, size_t errlen);
/* The same for a batch with loss weights and positions: the loss is the
 * mean over the counted targets (0 when none counts). */
int model_forward_batch(model_t *m, const model_batch_t *batch, lora_t *lora, double *loss,
                        char *err, size_t errlen);
/* Backward of loss_scale * (mean loss over the counted targets) of the
 * last forward (which must have had targets): adds into m->grads (MODEL_TRAIN_FULL) and into the
 * adapters' gradients (lora, when given and the mode is not MODEL_EVAL).
 * loss_scale is 1 for one micro-batch; 1/k to average k accumulated ones.
 * m->logits is overwritten with dlogits. */
void model_backward(model_t *m, lora_t *lora, float loss_scale);

/* --- The stages, for a caller that supplies the weights itself (a layer
 * gathered from shards). The order is: embed, layer 0..L-1, head forward;
 * then head backward, layer L-1..0 backward, embed backward. Gradient
 * pointers may be NULL (frozen). --- */

int model_embed_forward(model_t *m, const float *embed_tokens, const int *tokens,
                        const int *targets, int b, int t, char *err, size_t errlen);
int model_embed_forward_batch(model_t *m, const float *embed_tokens, const model_batch_t *batch,
                              char *err, size_t errlen);
void model_layer_forward(model_t *m, int l, const model_layer_t *w, lora_t *lora);
/* Final norm, LM head and (with targets) the loss; returns the mean loss
 * over the counted targets (0 without targets or counted targets). */
double model_head_forward(model_t *m, const float *norm, const float *lm_head);
void model_head_backward(model_t *m, const float *norm, const float *lm_head, float *dnorm,
                         float *dlm_head, float loss_scale);
/* dw may be NULL (LoRA: base weights frozen), or hold NULL pointers. */
void model_layer_backward(model_t *m, int l, const model_layer_t *w, const model_layer_t *dw,
                          lora_t *lora);
void model_embed_backward(model_t *m, float *dembed_tokens);

#endif
