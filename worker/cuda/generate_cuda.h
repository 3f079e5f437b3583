/* generate_cuda.h - generate.h's decoder on a GPU: the model's weights
 * (float32 or bfloat16, copied once from the host model at create), the key/value
 * cache and every activation in device memory, a prompt chunk or one new
 * token at a time through backend_cuda.h's kernels, and the logits of the
 * last token copied back to the host for generate.c's choice of the next
 * token.
 *
 * The same order of operations as generate.c's CPU decoder: the q/k/v
 * biases (Qwen2) before the rotation, the rotary tables of cpu_rope_tables
 * at positions len .. len+n-1, a LoRA adapter applied unmerged
 * (cuda_lora_forward: y += scale * (x A^T) B^T), grouped-query attention
 * of the new rows against every cached key up to their own position (and
 * Mistral's sliding window) by gen_cuda_attention below, fp32 on CUDA
 * cores. The weights and the adapter are copied at create: a caller that
 * changes the host's afterwards makes a new decoder. Device memory: the
 * weights, the adapter, 2 * L * S * KVD floats of cache, rotary tables and
 * GEN_CHUNK rows of scratch, all allocated by gen_cuda_create (through
 * mem_cuda_alloc, so RANKENV_CUDA_MEM_LIMIT_MIB caps them); a feed
 * allocates nothing. */
#ifndef TY_WORKER_GENERATE_CUDA_H
#define TY_WORKER_GENERATE_CUDA_H

#include <stddef.h>

#include "worker/cuda/backend_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gen_cuda gen_cuda_t;

#ifndef __cplusplus
#include "worker/model/lora.h"
#include "worker/model/model.h"

/* A decoder on CUDA device `device` for the model of shape d and host
 * weights w (copied; the matrices narrowed to wdt, TY_DTYPE_F32 or
 * TY_DTYPE_BF16, the norms and biases float32), adapter lo (copied,
 * float32; NULL for none), a cache of S tokens, sliding_window 0 for none.
 * Over bf16 matrices each product's input is rounded to bf16 on the way in
 * (cublasGemmEx, fp32 accumulation), as model_cuda.h's training does. 0,
 * TY_EINVAL (another wdt), TY_EUNAVAILABLE (no device, or cuBLAS missing)
 * or TY_EEXHAUSTED (device memory), with the reason in err. device -1:
 * the calling thread's current device (a training rank's GPU). */
int gen_cuda_create(gen_cuda_t **out, const model_dims_t *d, const model_weights_t *w,
                    const lora_t *lo, int S, int sliding_window, ty_dtype_t wdt, int device,
                    char *err, size_t errlen);
void gen_cuda_free(gen_cuda_t *g); /* accepts NULL */

/* Copies adapter lo's current values onto the device again (lo shaped as
 * the one given to gen_cuda_create: a training run's adapters after an
 * optimizer step). 0, TY_EINVAL (another shape, or none was given) or
 * TY_EINTERNAL naming the failed copy. */
int gen_cuda_set_adapter(gen_cuda_t *g, const lora_t *lo, char *err, size_t errlen);

/* Runs tokens (n <= GEN_CHUNK, checked by the caller: ids in [0, V),
 * p0 + n <= S) at positions p0 .. p0+n-1, writing their keys and values
 * into the cache, and with logits non-NULL copies the last token's (V)
 * there. 0, or TY_EINTERNAL naming the failed call. */
int gen_cuda_feed(gen_cuda_t *g, const int *tokens, int n, int p0, float *logits, char *err,
                  size_t errlen);
#endif

/* out (n, NH*HS): attention of query rows q (n, NH*HS) at positions
 * p0 .. p0+n-1 against one layer's cache kc, vc (rows 0 .. p0+n-1 of
 * (S, NKV*HS), the new rows already written): row i sees keys j with
 * j <= p0+i and, window > 0, p0+i - j < window. One block per (row,
 * head), exact fp32 up to summation order. */
void gen_cuda_attention(cuda_backend_t *b, float *out, const float *q, const float *kc,
                        const float *vc, int n, int p0, int window, int NH, int NKV, int HS);

#ifdef __cplusplus
}
#endif

#endif
