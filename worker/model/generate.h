/* generate.h - autoregressive decoding on the CPU (gen_*): the Llama
 * decoder of model.h run one token (or one prompt chunk) at a time over a
 * key/value cache, and the choice of the next token (greedy, or top-p
 * sampling with a seeded generator).
 *
 * The decoder borrows a model's weights as a model_weights_t view (a whole
 * model's own buffer, model_io.h's load or a training model's parameters)
 * and optionally a LoRA adapter, applied unmerged:
 *   y = x W^T + scale * (x A^T) B^T.
 * It uses the model's rotary tables (rope_theta and rope_scaling, through
 * cpu_rope_tables), grouped-query attention, a tied or untied head, and
 * Mistral's sliding window (a token at position p sees keys p-W+1 .. p,
 * Hugging Face's sliding_window mask) when the config has one.
 *
 * Shapes use model.h's letters; S is the cache's capacity in tokens (the
 * prompt and every generated token, at most max_position_embeddings). The
 * cache holds each layer's keys (after the rotation) and values, (S, KVD)
 * each: 2 * L * S * KVD floats. All buffers are allocated by gen_create;
 * gen_feed allocates nothing. */
#ifndef TY_WORKER_GENERATE_H
#define TY_WORKER_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

typedef struct gen gen_t;

/* Prompt tokens are run GEN_CHUNK at a time (bounds the scratch buffers). */
#define GEN_CHUNK 64

/* A decoder's scratch for a chunk of up to CH = GEN_CHUNK rows, floats
 * laid out one after another in this order by the CPU decoder and the GPU
 * decoder alike (each declares a float pointer per field): X(field,
 * floats) over CH, C, QD = NH * HS, FF, R (the adapter's rank, 0 for none)
 * and V. */
/* clang-format off */
#define GEN_SCRATCH(X)                                         \
  X(x, CH * C)      /* (CH, C) residual stream */              \
  X(ln, CH * C)     /* (CH, C) normalised input of a sublayer */ \
  X(rstd, CH)       /* (CH) */                                 \
  X(q, CH * QD)     /* (CH, QD) */                             \
  X(att, CH * QD)   /* (CH, QD) attention output */            \
  X(gate, CH * FF)  /* (CH, FF) */                             \
  X(up, CH * FF)    /* (CH, FF) */                             \
  X(xa, CH * R)     /* (CH, R) x @ A^T of an adapter */        \
  X(logits, V)      /* (V) the last row's */
/* clang-format on */

/* A decoder for the model of shape d and weights w (borrowed, and read at
 * every gen_feed: they must outlive the decoder and may change between
 * calls, as a training model's do), with adapter lo (borrowed; NULL for
 * none) and a cache of S tokens. sliding_window 0: none. The caller owns
 * *out (gen_free). 0, TY_EINVAL (S < 1) or TY_EEXHAUSTED, with the reason
 * in err. */
int gen_create(gen_t **out, const model_dims_t *d, const model_weights_t *w, const lora_t *lo,
               int S, int sliding_window, char *err, size_t errlen);
void gen_free(gen_t *g); /* accepts NULL */

/* Where a decoder runs. */
typedef enum { GEN_DEVICE_CPU = 0, GEN_DEVICE_CUDA = 1 } gen_device_t;

/* name "cpu", "cuda" or "auto" (cuda where this build has the CUDA
 * backend and a GPU is visible, else cpu) into *dev. 0, or TY_EINVAL (another
 * name) or TY_EUNAVAILABLE (cuda asked for in a build without CUDA, or with
 * no GPU visible), saying what to do. */
int gen_device_pick(const char *name, gen_device_t *dev, char *err, size_t errlen);
const char *gen_device_name(gen_device_t dev);

/* gen_create on dev. GEN_DEVICE_CUDA (worker/cuda/generate_cuda.h, the
 * thread's current CUDA device: 0 unless set): the weights and the adapter are copied to the GPU
 * here (so, unlike the CPU decoder's, later changes to them are not seen), the matrices as wdt
 * (TY_DTYPE_F32: gen_feed returns the CPU's logits up to summation order; TY_DTYPE_BF16: half the
 * memory, each product's input rounded to bf16 too), and the cache and scratch live in device
 * memory. The CPU decoder ignores wdt. TY_EUNAVAILABLE in a build without CUDA or with no GPU;
 * TY_EINVAL for another wdt; TY_EEXHAUSTED for device memory. */
int gen_create_on(gen_t **out, gen_device_t dev, const model_dims_t *d, const model_weights_t *w,
                  const lora_t *lo, int S, int sliding_window, ty_dtype_t wdt, char *err,
                  size_t errlen);

/* A GPU decoder takes its adapter's current values again (a training
 * run's, after an optimizer step; the CPU decoder reads them at every
 * gen_feed: nothing to do). 0, or gen_cuda_set_adapter's error. */
int gen_refresh_adapter(gen_t *g, char *err, size_t errlen);

/* Empties the cache (the next gen_feed starts at position 0). */
void gen_reset(gen_t *g);

/* Tokens in the cache: the position the next fed token takes. */
int gen_len(const gen_t *g);

/* Runs n tokens (ids in [0, V)) at the next n positions, appending their
 * keys and values to the cache, and leaves the logits (V) of the last one
 * in gen_logits. 0, or TY_EINVAL (an id outside [0, V), n < 1, or the
 * cache would pass S tokens) naming the problem. */
int gen_feed(gen_t *g, const int *tokens, int n, char *err, size_t errlen);

/* The logits (V) of the last token fed; valid until the next gen_feed. */
const float *gen_logits(const gen_t *g);

/* The next token from logits (V): the first largest one when temperature
 * is 0 (greedy); otherwise softmax(logits / temperature) restricted to the
 * nucleus (the most probable tokens, in order, while the probability of
 * those before them is below top_p: always at least one), renormalised and
 * sampled with one draw of rng (*rng is splitmix64 state, advanced).
 * scratch holds V floats and idx V ints (rng, scratch and idx are not
 * touched, and may be NULL, when temperature is 0). */
int gen_sample(const float *logits, int V, float temperature, float top_p, uint64_t *rng,
               float *scratch, int *idx);

#endif
