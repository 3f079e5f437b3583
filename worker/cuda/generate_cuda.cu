/* generate_cuda.cu - the decoder's attention on the GPU (generate_cuda.h's
 * gen_cuda_attention): new query rows at an offset into a longer cached key
 * sequence, which the training kernels (attention_cuda.cu: queries and keys
 * the same T rows) do not take. */
#include <math.h>

#include "worker/cuda/backend_cuda_impl.cuh"

extern "C" {
#include "worker/cuda/generate_cuda.h"
}

/* One block per (query row i, head h), blockIdx.x = i * NH + h. Shared:
 * the query row (HS floats) and one tile's probabilities (blockDim.x).
 * attend_row (backend_cuda_impl.cuh) over its visible keys. */
__global__ void k_gen_attn(float *out, const float *q, const float *kc, const float *vc, int p0,
                           int window, int NH, int NKV, int HS) {
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *sp = sh + HS;
  const int i = (int)(blockIdx.x / NH), h = (int)(blockIdx.x % NH), kvh = h / (NH / NKV);
  const int nt = blockDim.x, KVD = NKV * HS, t = p0 + i;
  const int js = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t qo = (size_t)i * NH * HS + (size_t)h * HS;
  const float *kb = kc + (size_t)kvh * HS, *vb = vc + (size_t)kvh * HS;
  for (int d = threadIdx.x; d < HS; d += nt) sq[d] = q[qo + d];
  __syncthreads();
  attend_row(out + qo, sq, sp, kb, vb, js, t, KVD, HS, scale);
}

extern "C" void gen_cuda_attention(cuda_backend_t *b, float *out, const float *q, const float *kc,
                                   const float *vc, int n, int p0, int window, int NH, int NKV,
                                   int HS) {
  (void)b;
  const unsigned blocks = (unsigned)n * (unsigned)NH, nt = 128;
  if (blocks) TY_LAUNCH(k_gen_attn, blocks, nt, (HS + nt) * sizeof(float))
  (out, q, kc, vc, p0, window, NH, NKV, HS);
}
