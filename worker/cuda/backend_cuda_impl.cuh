/* backend_cuda_impl.cuh - what worker/cuda/backend_cuda.cu and
 * worker/cuda/attention_cuda.cu share, inside the CUDA backend only: the
 * backend's struct, cuBLAS's entry points (loaded by backend_cuda.cu),
 * the launch macros and the block reductions. */
#ifndef TY_WORKER_BACKEND_CUDA_IMPL_CUH
#define TY_WORKER_BACKEND_CUDA_IMPL_CUH

#include <math.h>
#include <pthread.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/errors.h"
#include "worker/cuda/backend_cuda.h"
}

/* Launches are written TY_LAUNCH(kernel, grid, block, shmem)(args...),
 * dynamic shared memory TY_DYN_SHARED(type, name) and loops to unroll
 * after TY_UNROLL, so that this file also compiles as C++ against the
 * simulated device (TRAINYARD_CUDA=SIM, tests/cudasim), whose headers
 * define all three. */
#ifndef TY_CUDA_SIM
#define TY_LAUNCH(k, grid, block, shmem) k<<<grid, block, shmem>>>
#define TY_DYN_SHARED(type, name) extern __shared__ type name[]
#define TY_UNROLL _Pragma("unroll")
#endif

/* Profiling's state (backend_cuda.h): the window's event pairs not yet
 * summed, and the sums. Pair i is events 2i (start) and 2i + 1 (stop) of
 * ev, tagged op[i]. */
struct cb_profile {
  bool on;
  int used;          /* pairs recorded and not yet summed */
  int nev;           /* events created: the pool holds nev / 2 pairs */
  int grown;         /* times the pool grew in this window */
  cudaEvent_t *ev;   /* (nev), the pool */
  unsigned char *op; /* (nev / 2) each pair's cuda_op_t */
  long calls[CUDA_OP_COUNT];
  double ms[CUDA_OP_COUNT]; /* the window's pairs summed so far */
  cudaEvent_t win[2];       /* the window's start and end, created with the first window */
  bool win_open;            /* win[0] recorded for this window */
  double wall0;             /* host seconds at the window's start */
  char why[256];            /* the window's first failure, empty if none */
};

struct cuda_backend {
  int device;
  cublasHandle_t blas;
  double *dsum;   /* one device double for reductions */
  bool attn_rows; /* attention by the per-row kernels at every head size */
  cb_profile prof;
};

/* Each public op begins with CB_PROFILE(b, CUDA_OP_x): off, a test of
 * b->prof.on; on, an event recorded now and its pair's stop when the op
 * returns (its scope ends), by whichever return. op is evaluated only
 * when on. cb_prof_begin gives the pair's index, or -1 where none could
 * be had (the report then says why). */
int cb_prof_begin(cuda_backend_t *b, int op);
void cb_prof_end(cuda_backend_t *b, int pair);
struct cb_prof_scope {
  cuda_backend_t *b;
  int pair;
  ~cb_prof_scope() {
    if (pair >= 0) cb_prof_end(b, pair);
  }
};
#define CB_PROFILE(b, op) \
  cb_prof_scope cb_prof_scope_ = {(b), (b)->prof.on ? cb_prof_begin((b), (op)) : -1}

#define CB_THREADS 256

/* cublasGemmEx's C entry point (C++ also sees an inline overload). */
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                     int, const void *, const void *, cudaDataType, int,
                                     const void *, cudaDataType, int, const void *, void *,
                                     cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
/* cublasGemmBatchedEx's, likewise. */
typedef cublasStatus_t (*gemm_batched_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                          int, int, const void *, const void *const *, cudaDataType,
                                          int, const void *const *, cudaDataType, int, const void *,
                                          void *const *, cudaDataType, int, int,
                                          cublasComputeType_t, cublasGemmAlgo_t);
/* cuBLAS's calls, from its library once backend_cuda.cu has loaded it
 * (cuda_backend_blas_check; every backend was created after). */
struct cb_blas_t {
  pthread_once_t once;
  char why[512]; /* empty once loaded */
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm_v2) sgemm;
  gemm_ex_fn gemm_ex;
  gemm_batched_fn gemm_batched;
};
extern cb_blas_t g_blas;

static inline unsigned cb_blocks(size_t n) {
  return (unsigned)((n + CB_THREADS - 1) / CB_THREADS);
}

/* ---- block reductions (blockDim.x a multiple of 32, at most 1024): a
 * sum, or a max, of every thread's v, in a fixed order ---- */

struct red_sum {
  template <typename F>
  __device__ F operator()(F a, F b) const {
    return a + b;
  }
};
struct red_max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Over a warp's 32 lanes, every lane receiving the result. */
template <typename F, typename Op>
static __device__ F warp_reduce(F v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Over the block: each warp's result into shared memory, then warp 0's
 * reduction of them (`none` for the lanes past the block's warps). */
template <typename F, typename Op>
static __device__ F block_reduce(F v, F none, Op op) {
  __shared__ F sh[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = (int)threadIdx.x < nw ? sh[threadIdx.x] : none;
  if (wid == 0) v = warp_reduce(v, op);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  v = sh[0];
  __syncthreads(); /* sh may be reused by the next call */
  return v;
}

template <typename F>
static __device__ F warp_sum(F v) {
  return warp_reduce(v, red_sum());
}
template <typename F>
static __device__ F block_sum(F v) {
  return block_reduce(v, (F)0, red_sum());
}
static __device__ float block_max(float v) {
  return block_reduce(v, -INFINITY, red_max());
}

/* ---- one query row's attention, by a block (the per-row kernels of
 * attention_cuda.cu and the decoder's of generate_cuda.cu) ---- */

static __device__ float dot_hs(const float *a, const float *b, int HS) {
  float s = 0.0f;
  for (int d = 0; d < HS; d++) s += a[d] * b[d];
  return s;
}

/* dst[d] += sum over jj < n of w[jj] * rows[jj * ld + d], for this
 * thread's d's of HS (d = threadIdx.x, + blockDim.x, ...). */
static __device__ void row_accum(float *dst, const float *w, const float *rows, size_t ld, int n,
                                 int HS) {
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (int jj = 0; jj < n; jj++) acc += w[jj] * rows[(size_t)jj * ld + d];
    dst[d] += acc;
  }
}

/* Query row t (its HS floats in shared sq, loaded and synced by the
 * caller) against keys js..t (rows of kb and vb, KVD apart): pass 1 the
 * row's max and sum of exp(scale * q.k), pass 2 out (HS, device) = sum_j
 * p_j v_j by tiles of blockDim.x keys, their probabilities in shared sp
 * (blockDim.x floats), each thread owning its d's of out. Returns the
 * row's log-sum-exp. Every thread of the block calls it. */
static __device__ inline float attend_row(float *out, const float *sq, float *sp, const float *kb,
                                          const float *vb, int js, int t, int KVD, int HS,
                                          float scale) {
  const int nt = blockDim.x;
  float mx = -INFINITY, sum = 0.0f;
  for (int j = js + threadIdx.x; j <= t; j += nt) {
    float s = dot_hs(sq, kb + (size_t)j * KVD, HS) * scale;
    if (s > mx)
      sum = sum * expf(mx - s) + 1.0f, mx = s;
    else
      sum += expf(s - mx);
  }
  const float M = block_max(mx);
  const float S = block_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - M));
  const float l = M + logf(S);
  for (int d = threadIdx.x; d < HS; d += nt) out[d] = 0.0f;
  for (int j0 = js; j0 <= t; j0 += nt) {
    const int j = j0 + threadIdx.x, n = t - j0 + 1 < nt ? t - j0 + 1 : nt;
    const float p = j <= t ? expf(dot_hs(sq, kb + (size_t)j * KVD, HS) * scale - l) : 0.0f;
    __syncthreads(); /* every thread's reads of sq and of the last tile's sp done */
    sp[threadIdx.x] = p;
    __syncthreads();
    row_accum(out, sp, vb + (size_t)j0 * KVD, KVD, n, HS);
  }
  return l;
}

#endif
