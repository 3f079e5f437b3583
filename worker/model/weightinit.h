/* weightinit.h - the deterministic initial weights of a Llama model, shared
 * by `trainyard mkmodel` and the loader's init_from_scratch path.
 *
 * Each element's value depends only on (seed, tensor name, global element
 * index): a counter-based generator, so a tensor can be produced in chunks
 * of any size and any rank can produce just its own rows, and the full
 * weights are the same whatever the chunking or the world size. Matrices
 * get an approximately normal value with std 0.02 (the sum of four 16-bit
 * uniforms, an Irwin-Hall distribution bounded at +-3.46 std, so no outlier
 * needs clipping), as do biases; norm weights are 1. */
#ifndef TY_WORKER_WEIGHTINIT_H
#define TY_WORKER_WEIGHTINIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WINIT_STD 0.02f

/* Whether the tensor called name is an RMSNorm weight (all 1): a 1-D
 * tensor is one unless it is a bias (Qwen2's q/k/v biases get values like
 * a matrix's). */
bool winit_is_norm(const char *tensor_name);

/* The stream of one tensor: a hash of the seed and the tensor's name. */
uint64_t winit_stream(uint64_t seed, const char *tensor_name);

/* dst[i] = value of element (first + i) of the stream, for i < n; all 1.0
 * when ones (norm weights). */
void winit_fill(uint64_t stream, bool ones, uint64_t first, float *dst, size_t n);

#endif
