/* cpu_ops.h - the CPU kernels of the Llama decoder, in forward/backward
 * pairs, fp32. Matrix products go through OpenBLAS (cblas_sgemm); the other
 * kernels are threaded with OpenMP over rows (or over columns where rows
 * would race, so every result is independent of the thread count).
 *
 * Shapes use the letters of worker/model/model.h; N = B*T is the number of token
 * rows. Gradient rule: parameter gradients are accumulated (+=), activation
 * gradients are written (=). A NULL gradient pointer skips that gradient
 * (frozen weights, or an input that needs none). */
#ifndef TY_WORKER_CPU_OPS_H
#define TY_WORKER_CPU_OPS_H

#include <stddef.h>

#include "api/llama_config.h"

/* out (N, OUT) = beta * out + inp (N, IN) @ weight (OUT, IN)^T.
 * beta 1 adds onto out (a residual already copied there). */
void cpu_matmul_forward(float *out, const float *inp, const float *weight, int N, int IN, int OUT,
                        float beta);
/* dinp (N, IN) = dinp_beta * dinp + dout (N, OUT) @ weight (OUT, IN);
 * dweight (OUT, IN) += dout^T @ inp. Either output may be NULL. */
void cpu_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int IN, int OUT, float dinp_beta);

/* A projection's bias (Qwen2's q/k/v): out (N, OUT) += bias (OUT) on
 * every row. */
void cpu_bias_forward(float *out, const float *bias, int N, int OUT);
/* dbias (OUT) += the column sums of dout (N, OUT), each summed over rows
 * in order (the result is independent of the thread count). The input's
 * gradient is dout itself, so there is none to write. */
void cpu_bias_backward(float *dbias, const float *dout, int N, int OUT);

/* out (N, C) = weight * inp / sqrt(mean(inp^2) + eps); rstd (N) saves the
 * reciprocal root for the backward pass. */
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps);
/* dinp (N, C) = dresid + d(out)/d(inp) . dout, where dresid (N, C) is the
 * gradient arriving through the residual branch (NULL for none; it may
 * alias dinp). dweight (C) += sum over rows of dout * inp * rstd. */
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *dresid,
                          const float *inp, const float *weight, const float *rstd, int N, int C);

/* Rotary tables for positions 0..T-1: cos, sin (T, HS/2), angle
 * pos * inv_freq(i), inv_freq being llama_rope_inv_freq (theta^(-2i/HS),
 * Hugging Face's, rescaled by scaling, which may be NULL for none),
 * computed in double. */
void cpu_rope_tables(float *cos_t, float *sin_t, int T, int HS, double theta,
                     const llama_rope_scaling_t *scaling);
/* In place on x (B, T, NX*HS), NX heads per token, rotate-half convention:
 * x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, x1/x2 the two halves; the
 * angle of token (b, t) is that of position pos[b*T + t] (its place in its
 * document, < T), or of t when pos is NULL. */
void cpu_rope_forward(float *x, const float *cos_t, const float *sin_t, const int *pos, int B,
                      int T, int NX, int HS);
/* The transpose rotation, in place on dx (B, T, NX*HS). */
void cpu_rope_backward(float *dx, const float *cos_t, const float *sin_t, const int *pos, int B,
                       int T, int NX, int HS);

/* Causal grouped-query attention. q (B, T, NH*HS), k and v (B, T, NKV*HS);
 * query head h reads kv head h / (NH/NKV). pos (B, T), or NULL: each
 * token's position in its document (0 at a document's first token, then
 * one more each token), making the mask block-diagonal causal: token t sees
 * keys t - pos[t] .. t, never one of another document packed in the row. out (B, T, NH*HS) receives
 * the mix, lse (B, NH, T) each score row's log-sum-exp: the backward pass rebuilds the
 * probabilities from it, so no (T, T) matrix per head is kept. scratch holds T*T floats. */
void cpu_attention_forward(float *out, float *lse, float *scratch, const float *q, const float *k,
                           const float *v, const int *pos, int B, int T, int NH, int NKV, int HS);
/* dq (B, T, NH*HS), dk and dv (B, T, NKV*HS) are written; scratch holds
 * 2*T*T floats. */
void cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                            const float *lse, const float *q, const float *k, const float *v,
                            const int *pos, int B, int T, int NH, int NKV, int HS);

/* h (n) = silu(gate) * up, elementwise over n = N*FF values. */
void cpu_swiglu_forward(float *h, const float *gate, const float *up, size_t n);
void cpu_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                         const float *up, size_t n);

/* out (N, C) = embed (V, C) rows picked by tokens (N). */
void cpu_embedding_forward(float *out, const int *tokens, const float *embed, int N, int C);
/* dembed (V, C) += dout (N, C) scattered by tokens (N). */
void cpu_embedding_backward(float *dembed, const float *dout, const int *tokens, int N, int C);

/* losses (N) = -log softmax(logits (N, V))[target]; returns their sum,
 * added in double in row order. */
double cpu_crossentropy_forward(float *losses, const float *logits, const int *targets, int N,
                                int V);
/* In place: logits (N, V) become dlogits = (softmax - onehot) * dloss *
 * weights[r], dloss being the gradient of the objective with respect to
 * each counted row's loss; weights (N) 0 or 1 per row, NULL: all 1. */
void cpu_crossentropy_backward(float *logits, const int *targets, const float *weights, int N,
                               int V, float dloss);

#endif
