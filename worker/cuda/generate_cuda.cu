/* generate_cuda.cu - the decoder's attention on the GPU (generate_cuda.h's
 * gen_cuda_attention): new query rows at an offset into a longer cached key
 * sequence, which the training kernels (attention_cuda.cu: queries and keys
 * the same T rows) do not take. */
#include <math.h>

#include "worker/cuda/backend_cuda_impl.cuh"

extern "C" {
#include "worker/cuda/generate_cuda.h"
}

static __device__ float gen_dot(const float *a, const float *b, int HS) {
  float s = 0.0f;
  for (int d = 0; d < HS; d++) s += a[d] * b[d];
  return s;
}

/* One block per (query row i, head h), blockIdx.x = i * NH + h. Shared:
 * the query row (HS floats) and one tile's probabilities (blockDim.x).
 * Pass 1: the row's max and sum over its visible keys; pass 2: out =
 * sum_j p_j v_j by tiles of keys, each thread owning its d's of the
 * output row. */
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
  float mx = -INFINITY, sum = 0.0f;
  for (int j = js + threadIdx.x; j <= t; j += nt) {
    float s = gen_dot(sq, kb + (size_t)j * KVD, HS) * scale;
    if (s > mx)
      sum = sum * expf(mx - s) + 1.0f, mx = s;
    else
      sum += expf(s - mx);
  }
  const float M = block_max(mx);
  const float S = block_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - M));
  const float l = M + logf(S);
  float *ot = out + qo;
  for (int d = threadIdx.x; d < HS; d += nt) ot[d] = 0.0f;
  for (int j0 = js; j0 <= t; j0 += nt) {
    const int j = j0 + threadIdx.x, n = t - j0 + 1 < nt ? t - j0 + 1 : nt;
    const float p = j <= t ? expf(gen_dot(sq, kb + (size_t)j * KVD, HS) * scale - l) : 0.0f;
    __syncthreads(); /* every thread's reads of the last tile's sp done */
    sp[threadIdx.x] = p;
    __syncthreads();
    for (int d = threadIdx.x; d < HS; d += nt) {
      float acc = 0.0f;
      for (int jj = 0; jj < n; jj++) acc += sp[jj] * vb[(size_t)(j0 + jj) * KVD + d];
      ot[d] += acc;
    }
  }
}

extern "C" void gen_cuda_attention(cuda_backend_t *b, float *out, const float *q, const float *kc,
                                   const float *vc, int n, int p0, int window, int NH, int NKV,
                                   int HS) {
  (void)b;
  const unsigned blocks = (unsigned)n * (unsigned)NH, nt = 128;
  if (blocks) TY_LAUNCH(k_gen_attn, blocks, nt, (HS + nt) * sizeof(float))
  (out, q, kc, vc, p0, window, NH, NKV, HS);
}
