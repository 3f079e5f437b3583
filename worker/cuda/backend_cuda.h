/* backend_cuda.h - the Llama decoder's kernels on an NVIDIA GPU: the same
 * forward/backward pairs as worker/model/cpu_ops.h, with the same shapes, the same
 * gradient rule (parameter gradients +=, activation gradients =) and the
 * same arithmetic up to summation order, so that each can be checked against
 * its CPU twin on the same inputs (tests/gpu).
 *
 * Every pointer below is device memory (cudaMalloc, or a CUDA placement's
 * shard) unless it says host. Activations are fp32. Matrix products go
 * through cuBLAS: fp32 (cublasSgemm, no TF32) or bf16 operands with an fp32
 * result and fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F), and
 * attention's, given a workspace, TF32 ones (cublasGemmBatchedEx). Work is
 * queued on the legacy default stream in call order; cuda_backend_sync waits
 * for it and reports the first error (kernel launches return nothing).
 *
 * Letters as in worker/model/model.h; N = B*T token rows.
 *
 * Profiling (opt-in, cuda_backend_profile): while on, every op below
 * brackets its work with a pair of CUDA events on the default stream and
 * tags the pair with its entry in CUDA_PROFILE_OPS: the op, and for an op
 * that takes a dtype (matmul, bias, embedding) or chooses a path
 * (attention: TF32 products on tensor cores, or fp32 kernels) that too,
 * since those run different kernels; shapes are not told apart (a step's
 * products of one dtype are one row). The events come from a pool: when
 * it is full, the pairs the device has already run are summed and their
 * events reused, and it doubles only where over half of it is still
 * queued, so once a first step has sized it (about twice the ops of a
 * pass, each pass ending in a wait for the device) a profiled step
 * allocates nothing. An event pair measures
 * the device time from the op's first queued work to its last, including
 * any wait for the host between its launches; work between ops (copies
 * the model queues itself, the host's own time) is not an op's: it is the
 * window's span less the ops' sum. Off, an op tests one flag on entry
 * (and a local on return) and calls nothing; results are the same bit for
 * bit either way (tests/gpu/profile_check.sh). */
#ifndef TY_WORKER_BACKEND_CUDA_H
#define TY_WORKER_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/llama_config.h"
#include "common/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_backend cuda_backend_t;

/* A backend on CUDA device `device` (made current): a cuBLAS handle and a
 * small device scratch. Returns 0, or TY_EUNAVAILABLE (no such device: err
 * says why) or TY_EINTERNAL (cuBLAS). *out is the caller's. */
int cuda_backend_create(cuda_backend_t **out, int device, char *err, size_t errlen);
/* Accepts NULL. */
void cuda_backend_free(cuda_backend_t *b);
/* Attention by one block per query row or key (on), as for head sizes
 * over 256, rather than by tiles of rows (off, the default): for checking
 * one path against the other and timing them (tests/gpu). */
void cuda_backend_attention_rows(cuda_backend_t *b, bool on);
/* Loads cuBLAS (dlopen: the worker does not link it, so that a process
 * that never computes on a GPU does not map it); needs no device. Called by
 * cuda_backend_create. 0, or TY_EUNAVAILABLE with the library's name and
 * the loader's reason in err. */
int cuda_backend_blas_check(char *err, size_t errlen);
/* Waits for the queued work; 0, or TY_EINTERNAL naming the first error. */
int cuda_backend_sync(cuda_backend_t *b, char *err, size_t errlen);

/* The ops profiling tells apart, X(ID, "tag"), in the order of this header;
 * each tag names the function (cuda_<tag's op>) and its dtype or path. */
#define CUDA_PROFILE_OPS(X)                   \
  X(F32_TO_BF16, "f32_to_bf16")               \
  X(BF16_TO_F32, "bf16_to_f32")               \
  X(MATMUL_FWD_F32, "matmul_forward f32")     \
  X(MATMUL_FWD_BF16, "matmul_forward bf16")   \
  X(MATMUL_BWD_F32, "matmul_backward f32")    \
  X(MATMUL_BWD_BF16, "matmul_backward bf16")  \
  X(RMSNORM_FWD, "rmsnorm_forward")           \
  X(RMSNORM_BWD, "rmsnorm_backward")          \
  X(ROPE_TABLES, "rope_tables")               \
  X(ROPE_FWD, "rope_forward")                 \
  X(ROPE_BWD, "rope_backward")                \
  X(ATTN_FWD_F32, "attention_forward f32")    \
  X(ATTN_FWD_TF32, "attention_forward tf32")  \
  X(ATTN_BWD_F32, "attention_backward f32")   \
  X(ATTN_BWD_TF32, "attention_backward tf32") \
  X(SWIGLU_FWD, "swiglu_forward")             \
  X(SWIGLU_BWD, "swiglu_backward")            \
  X(BIAS_FWD_F32, "bias_forward f32")         \
  X(BIAS_FWD_BF16, "bias_forward bf16")       \
  X(BIAS_BWD, "bias_backward")                \
  X(EMBED_FWD_F32, "embedding_forward f32")   \
  X(EMBED_FWD_BF16, "embedding_forward bf16") \
  X(EMBED_BWD, "embedding_backward")          \
  X(CE_FWD, "crossentropy_forward")           \
  X(CE_BWD, "crossentropy_backward")          \
  X(LORA_FWD, "lora_forward")                 \
  X(LORA_BWD, "lora_backward")                \
  X(ADAMW, "adamw_step")                      \
  X(ADD, "add")                               \
  X(SCALE, "scale")                           \
  X(SUM, "sum")                               \
  X(SUMSQ, "sumsq")

typedef enum {
#define TY_X(id, tag) CUDA_OP_##id,
  CUDA_PROFILE_OPS(TY_X)
#undef TY_X
      CUDA_OP_COUNT
} cuda_op_t;

/* One op's row of a report. */
typedef struct {
  const char *op; /* its tag in CUDA_PROFILE_OPS (static) */
  long calls;
  double ms;    /* the calls' event time summed, milliseconds */
  double share; /* ms over all ops' ms, percent */
} cuda_profile_row_t;

/* A window's report: from profiling turned on, or the previous report, to
 * this one. rows: the ops called, by ms, most first (n of them); calls and
 * ops_ms: their calls and ms summed; span_ms: device time from the
 * window's start to the report, by a pair of events around it (ops_ms /
 * span_ms is how much of it the ops account for); wall_ms: host time
 * (CLOCK_MONOTONIC) over the same window; pool_pairs: the event pairs the
 * pool holds; pool_grown: how often it grew in the window (0 in steady
 * state). */
typedef struct {
  cuda_profile_row_t rows[CUDA_OP_COUNT];
  int n;
  long calls;
  double ops_ms, span_ms, wall_ms;
  int pool_pairs, pool_grown;
} cuda_profile_t;

/* Profiling on (a new window begins: what was recorded and not reported
 * is dropped) or off (ops stop recording; what they recorded stays for the
 * report). */
void cuda_backend_profile(cuda_backend_t *b, bool on);
/* Waits for the queued work, sums the window's event pairs by op into
 * *out and begins the next window. 0, or TY_EINTERNAL (a kernel's error,
 * or events the runtime would not create or time; err says which). Where
 * the host runs over 32768 ops ahead of the device (the pool's bound of
 * 65536 pairs over half queued), the pool is summed by waiting for the
 * device, in the middle of that op's caller. */
int cuda_backend_profile_report(cuda_backend_t *b, cuda_profile_t *out, char *err, size_t errlen);

/* --- Conversions (round to nearest even, NaN stays NaN, as common/dtype.h). */
void cuda_f32_to_bf16(cuda_backend_t *b, uint16_t *dst, const float *src, size_t n);
void cuda_bf16_to_f32(cuda_backend_t *b, float *dst, const uint16_t *src, size_t n);

/* --- Matrix products. dt is TY_DTYPE_F32 (operands float) or TY_DTYPE_BF16
 * (inp, weight and dout uint16_t bf16); results and dweight are fp32.
 * Return 0, TY_EINVAL (another dtype) or TY_EINTERNAL (cuBLAS). --- */

/* out (N, OUT) = beta * out + inp (N, IN) @ weight (OUT, IN)^T. */
int cuda_matmul_forward(cuda_backend_t *b, float *out, const void *inp, const void *weight,
                        ty_dtype_t dt, int N, int IN, int OUT, float beta);
/* dinp (N, IN) = dinp_beta * dinp + dout (N, OUT) @ weight (OUT, IN);
 * dweight (OUT, IN) += dout^T @ inp. Either output may be NULL. */
int cuda_matmul_backward(cuda_backend_t *b, float *dinp, float *dweight, const void *dout,
                         const void *inp, const void *weight, ty_dtype_t dt, int N, int IN, int OUT,
                         float dinp_beta);

/* --- Elementwise and row kernels, fp32 (see cpu_ops.h for the math). --- */

void cuda_rmsnorm_forward(cuda_backend_t *b, float *out, float *rstd, const float *inp,
                          const float *weight, int N, int C, float eps);
/* dresid may be NULL or alias dinp; dweight may be NULL. */
void cuda_rmsnorm_backward(cuda_backend_t *b, float *dinp, float *dweight, const float *dout,
                           const float *dresid, const float *inp, const float *weight,
                           const float *rstd, int N, int C);

/* Uploads the rotary tables of cpu_rope_tables (computed on the host in
 * double) into cos_t, sin_t (T, HS/2). Returns 0 or TY_EINTERNAL. */
int cuda_rope_tables(cuda_backend_t *b, float *cos_t, float *sin_t, int T, int HS, double theta,
                     const llama_rope_scaling_t *scaling);
/* pos (B*T) device ints or NULL, as cpu_rope_forward's. */
void cuda_rope_forward(cuda_backend_t *b, float *x, const float *cos_t, const float *sin_t,
                       const int *pos, int B, int T, int NX, int HS);
void cuda_rope_backward(cuda_backend_t *b, float *dx, const float *cos_t, const float *sin_t,
                        const int *pos, int B, int T, int NX, int HS);

/* Causal GQA attention, as cpu_attention_forward (pos (B*T) device ints or
 * NULL: the block-diagonal mask of documents packed in a row): out (B, T, NH*HS) and
 * lse (B, NH, T), each scaled score row's log-sum-exp, from which the
 * backward pass rebuilds the probabilities. Two paths:
 *  - fp32 on CUDA cores (ws NULL), exact up to summation order: tiles of
 *    query rows for head sizes up to 256 (unless
 *    cuda_backend_attention_rows), one block per row for larger heads; no
 *    (T, T) matrix is ever held, in a layer or across them;
 *  - the products on tensor cores (ws, ws_bytes: device memory of at
 *    least cuda_attention_tf32_bytes for B, T and NH): cublasGemmBatchedEx
 *    with TF32 operands (10 mantissa bits, so scores and gradients agree
 *    with fp32 to about 1e-3 relative) and fp32 accumulation, over chunks
 *    of query rows whose scores fit ws, the rows' softmax in fp32.
 * A ws too small for this call's B and T takes the fp32 path. Return 0, or
 * TY_EINTERNAL (cuBLAS refused a product). */
int cuda_attention_forward(cuda_backend_t *b, void *ws, size_t ws_bytes, float *out, float *lse,
                           const float *q, const float *k, const float *v, const int *pos, int B,
                           int T, int NH, int NKV, int HS);
/* dq, dk, dv written from dout and the forward's out and lse (the same
 * path's); scratch holds B*NH*T floats (each row's dout . out). dk and dv
 * are summed without atomics, in a fixed order. */
int cuda_attention_backward(cuda_backend_t *b, void *ws, size_t ws_bytes, float *dq, float *dk,
                            float *dv, float *scratch, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v,
                            const int *pos, int B, int T, int NH, int NKV, int HS);
/* Bytes of workspace for the tensor-core path at up to B x T tokens: its
 * pointer arrays and two buffers of scores, together about `budget` bytes
 * (the more, the fewer and larger the chunks), but at least 16 query rows'
 * worth (or T's), so that any budget gives a workspace that works. */
size_t cuda_attention_tf32_bytes(int B, int T, int NH, size_t budget);

void cuda_swiglu_forward(cuda_backend_t *b, float *h, const float *gate, const float *up, size_t n);
void cuda_swiglu_backward(cuda_backend_t *b, float *dgate, float *dup, const float *dh,
                          const float *gate, const float *up, size_t n);

/* A projection's bias (Qwen2's q/k/v): out (N, OUT) += bias (OUT, of dt:
 * F32 or BF16 as the base lies) on every row; dbias (OUT) += the column
 * sums of dout (N, OUT), in row order. */
void cuda_bias_forward(cuda_backend_t *b, float *out, const void *bias, ty_dtype_t dt, int N,
                       int OUT);
void cuda_bias_backward(cuda_backend_t *b, float *dbias, const float *dout, int N, int OUT);

/* tokens (N) device ints in [0, V); embed (V, C) of dt (F32 or BF16: a
 * loader shard's table as it lies on the device). */
void cuda_embedding_forward(cuda_backend_t *b, float *out, const int *tokens, const void *embed,
                            ty_dtype_t dt, int N, int C);
void cuda_embedding_backward(cuda_backend_t *b, float *dembed, const float *dout, const int *tokens,
                             int N, int C);

/* losses (N) = -log softmax(logits)[target], 0 where weights (N device
 * floats, 0 or 1; NULL: all 1) is 0. With sum (host) non-NULL, waits and
 * stores the sum of the losses (in double); returns 0 or TY_EINTERNAL. */
int cuda_crossentropy_forward(cuda_backend_t *b, float *losses, const float *logits,
                              const int *targets, const float *weights, int N, int V, double *sum);
/* dlogits = (softmax - onehot) * dloss * weights[r] (NULL: 1), in place. */
void cuda_crossentropy_backward(cuda_backend_t *b, float *logits, const int *targets,
                                const float *weights, int N, int V, float dloss);

/* --- LoRA (PEFT): out (n, OUT) += scale * (x (n, IN) @ A^T) @ B^T, with
 * A (R, IN), B (OUT, R); xa (n, R) saves x @ A^T for the backward pass. */
int cuda_lora_forward(cuda_backend_t *b, float *out, float *xa, const float *x, const float *A,
                      const float *B, int n, int IN, int OUT, int R, float scale);
/* dB += scale * dout^T @ xa; dxa = scale * dout @ B (scratch, n x R);
 * dA += dxa^T @ x; dx (may be NULL) += dxa @ A. */
int cuda_lora_backward(cuda_backend_t *b, float *dx, float *dA, float *dB, float *dxa,
                       const float *dout, const float *x, const float *xa, const float *A,
                       const float *B, int n, int IN, int OUT, int R, float scale);

/* --- AdamW (worker/model/optim.h's arithmetic) over n elements: p, m, v updated
 * in place, g read only. t is the step count after this step (>= 1);
 * decay_on 0 for a no-decay span (norm gains). */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
} cuda_adamw_cfg_t;
void cuda_adamw_step(cuda_backend_t *b, float *p, const float *g, float *m, float *v, size_t n,
                     const cuda_adamw_cfg_t *c, int64_t t, double grad_scale, int decay_on);

/* dst[n] += src[n]. */
void cuda_add(cuda_backend_t *b, float *dst, const float *src, size_t n);
/* dst[n] = src[n] * s. */
void cuda_scale(cuda_backend_t *b, float *dst, const float *src, float s, size_t n);

/* Sum of x (n) in double, one fixed tree (a batch's token losses); waits. */
int cuda_sum(cuda_backend_t *b, const float *x, size_t n, double *out);
/* Sum of squares of x (n) in double, for gradient clipping; waits. */
int cuda_sumsq(cuda_backend_t *b, const float *x, size_t n, double *out);

#ifdef __cplusplus
}
#endif

#endif
