/* backend_cuda.cu - the CUDA kernels and cuBLAS products of backend_cuda.h.
 * Plain, checkable kernels: one block per row for the row ops (norms,
 * softmaxes), a block per tile of rows for attention, one thread per
 * element otherwise; every reduction is in a fixed order for a fixed
 * launch, so results repeat. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "api/errors.h"
#include "worker/backend_cuda.h"
#include "worker/cpu_ops.h"
#include "worker/mem_cuda.h"
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

struct cuda_backend {
  int device;
  cublasHandle_t blas;
  double *dsum;   /* one device double for reductions */
  bool attn_rows; /* attention by the per-row kernels at every head size */
};

#define CB_THREADS 256

/* ---- cuBLAS, loaded when the first backend is created rather than at
 * program start: mapping libcublas and libcublasLt costs a process some 200
 * MiB of resident memory, which a CPU job or a load should not pay. The
 * worker links only the CUDA runtime. ---- */
/* cublasGemmEx's C entry point (C++ also sees an inline overload). */
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                     int, const void *, const void *, cudaDataType, int,
                                     const void *, cudaDataType, int, const void *, void *,
                                     cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static struct {
  pthread_once_t once;
  char why[512]; /* empty once loaded */
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm_v2) sgemm;
  gemm_ex_fn gemm_ex;
} g_blas = {PTHREAD_ONCE_INIT, "not loaded", NULL, NULL, NULL, NULL, NULL};

/* dlopen of name, or of name beside the CUDA runtime this program uses
 * (the toolkit's lib directory, which the loader's path may not list). */
static void *open_beside_cudart(const char *name) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  Dl_info info;
  if (h || !dladdr((void *)&cudaGetDeviceCount, &info) || !info.dli_fname) return h;
  char path[4096];
  snprintf(path, sizeof path, "%s", info.dli_fname);
  char *slash = strrchr(path, '/');
  if (!slash) return NULL;
  snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "%s", name);
  return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void blas_load(void) {
  char name[64];
  snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
  void *h = open_beside_cudart(name);
  if (!h) {
    snprintf(g_blas.why, sizeof g_blas.why, "cannot load %s (%s)", name, dlerror());
    return;
  }
#define TY_BLAS_SYM(field, sym)                                                               \
  if (!(g_blas.field = (decltype(g_blas.field))dlsym(h, #sym))) {                             \
    snprintf(g_blas.why, sizeof g_blas.why, "%s has no %s (a cuBLAS older than %d.x?)", name, \
             #sym, CUBLAS_VER_MAJOR);                                                         \
    return;                                                                                   \
  }
  TY_BLAS_SYM(create, cublasCreate_v2)
  TY_BLAS_SYM(destroy, cublasDestroy_v2)
  TY_BLAS_SYM(set_math_mode, cublasSetMathMode)
  TY_BLAS_SYM(sgemm, cublasSgemm_v2)
  TY_BLAS_SYM(gemm_ex, cublasGemmEx)
#undef TY_BLAS_SYM
  g_blas.why[0] = '\0'; /* the handle stays open for the process */
}

static int cb_fail(char *err, size_t errlen, int code, const char *what, const char *why) {
  if (err && errlen) snprintf(err, errlen, "cuda backend: %s: %s", what, why);
  return code;
}

static unsigned cb_blocks(size_t n) {
  return (unsigned)((n + CB_THREADS - 1) / CB_THREADS);
}

extern "C" int cuda_backend_blas_check(char *err, size_t errlen) {
  pthread_once(&g_blas.once, blas_load);
  return g_blas.why[0] ? cb_fail(err, errlen, TY_EUNAVAILABLE, "cuBLAS", g_blas.why) : 0;
}

extern "C" int cuda_backend_create(cuda_backend_t **out, int device, char *err, size_t errlen) {
  *out = NULL;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    cudaGetLastError();
    return cb_fail(err, errlen, TY_EUNAVAILABLE, "no CUDA device is visible",
                   e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports 0 devices");
  }
  if (device < 0 || device >= count)
    return cb_fail(err, errlen, TY_EUNAVAILABLE, "device index out of range",
                   "use a device index below the number of visible devices");
  if ((e = cudaSetDevice(device)) != cudaSuccess)
    return cb_fail(err, errlen, TY_EUNAVAILABLE, "cudaSetDevice", cudaGetErrorString(e));
  int rc = cuda_backend_blas_check(err, errlen);
  if (rc) return rc;
  cuda_backend_t *b = (cuda_backend_t *)calloc(1, sizeof *b);
  if (!b) return TY_EEXHAUSTED;
  b->device = device;
  if (g_blas.create(&b->blas) != CUBLAS_STATUS_SUCCESS) {
    free(b);
    return cb_fail(err, errlen, TY_EINTERNAL, "cublasCreate", "failed");
  }
  /* Plain fp32 for Sgemm: no TF32 unless asked for, so fp32 matches the CPU. */
  g_blas.set_math_mode(b->blas, CUBLAS_DEFAULT_MATH);
  if (mem_cuda_alloc((void **)&b->dsum, sizeof(double))) {
    g_blas.destroy(b->blas);
    free(b);
    return cb_fail(err, errlen, TY_EEXHAUSTED, "cudaMalloc", "out of device memory");
  }
  *out = b;
  return 0;
}

extern "C" void cuda_backend_attention_rows(cuda_backend_t *b, bool on) {
  b->attn_rows = on;
}

extern "C" void cuda_backend_free(cuda_backend_t *b) {
  if (!b) return;
  mem_cuda_free(b->dsum);
  g_blas.destroy(b->blas);
  free(b);
}

extern "C" int cuda_backend_sync(cuda_backend_t *b, char *err, size_t errlen) {
  (void)b;
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) return cb_fail(err, errlen, TY_EINTERNAL, "kernel", cudaGetErrorString(e));
  return 0;
}

/* ---- block reductions (blockDim.x a multiple of 32, at most 1024) ---- */

template <typename F>
__device__ F warp_sum(F v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename F>
__device__ F block_sum(F v) {
  __shared__ F sh[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = (int)threadIdx.x < nw ? sh[threadIdx.x] : (F)0;
  if (wid == 0) v = warp_sum(v);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  v = sh[0];
  __syncthreads(); /* sh may be reused by the next call */
  return v;
}
__device__ float block_max(float v) {
  __shared__ float sh[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = (int)threadIdx.x < nw ? sh[threadIdx.x] : -INFINITY;
  if (wid == 0) v = warp_max(v);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  v = sh[0];
  __syncthreads();
  return v;
}

/* ---- conversions ---- */

__global__ void k_f32_to_bf16(__nv_bfloat16 *d, const float *s, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = __float2bfloat16_rn(s[i]);
}
__global__ void k_bf16_to_f32(float *d, const __nv_bfloat16 *s, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = __bfloat162float(s[i]);
}
extern "C" void cuda_f32_to_bf16(cuda_backend_t *b, uint16_t *dst, const float *src, size_t n) {
  (void)b;
  if (n) TY_LAUNCH(k_f32_to_bf16, cb_blocks(n), CB_THREADS, 0)((__nv_bfloat16 *)dst, src, n);
}
extern "C" void cuda_bf16_to_f32(cuda_backend_t *b, float *dst, const uint16_t *src, size_t n) {
  (void)b;
  if (n) TY_LAUNCH(k_bf16_to_f32, cb_blocks(n), CB_THREADS, 0)(dst, (const __nv_bfloat16 *)src, n);
}

/* ---- matrix products (row-major operands seen by column-major cuBLAS:
 * a row-major (R, C) matrix is a column-major (C, R) one) ---- */

/* Column-major C (m, n) = alpha * op(A) op(B) + beta * C, operands of dt. */
static int gemm(cuda_backend_t *b, ty_dtype_t dt, cublasOperation_t ta, cublasOperation_t tb, int m,
                int n, int k, float alpha, const void *A, int lda, const void *B, int ldb,
                float beta, float *C, int ldc) {
  if (m == 0 || n == 0) return 0;
  cublasStatus_t s;
  if (dt == TY_DTYPE_F32)
    s = g_blas.sgemm(b->blas, ta, tb, m, n, k, &alpha, (const float *)A, lda, (const float *)B, ldb,
                     &beta, C, ldc);
  else if (dt == TY_DTYPE_BF16)
    s = g_blas.gemm_ex(b->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                       &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  else
    return TY_EINVAL;
  return s == CUBLAS_STATUS_SUCCESS ? 0 : TY_EINTERNAL;
}

/* out (N, OUT) = alpha * inp (N, IN) @ W (OUT, IN)^T + beta * out. */
static int mm_nt(cuda_backend_t *b, ty_dtype_t dt, float *out, const void *inp, const void *W,
                 int N, int IN, int OUT, float alpha, float beta) {
  return gemm(b, dt, CUBLAS_OP_T, CUBLAS_OP_N, OUT, N, IN, alpha, W, IN, inp, IN, beta, out, OUT);
}
/* dinp (N, IN) = alpha * dout (N, OUT) @ W (OUT, IN) + beta * dinp. */
static int mm_nn(cuda_backend_t *b, ty_dtype_t dt, float *dinp, const void *dout, const void *W,
                 int N, int IN, int OUT, float alpha, float beta) {
  return gemm(b, dt, CUBLAS_OP_N, CUBLAS_OP_N, IN, N, OUT, alpha, W, IN, dout, OUT, beta, dinp, IN);
}
/* dW (OUT, IN) = alpha * dout (N, OUT)^T @ inp (N, IN) + beta * dW. */
static int mm_tn(cuda_backend_t *b, ty_dtype_t dt, float *dW, const void *dout, const void *inp,
                 int N, int IN, int OUT, float alpha, float beta) {
  return gemm(b, dt, CUBLAS_OP_N, CUBLAS_OP_T, IN, OUT, N, alpha, inp, IN, dout, OUT, beta, dW, IN);
}

extern "C" int cuda_matmul_forward(cuda_backend_t *b, float *out, const void *inp,
                                   const void *weight, ty_dtype_t dt, int N, int IN, int OUT,
                                   float beta) {
  return mm_nt(b, dt, out, inp, weight, N, IN, OUT, 1.0f, beta);
}

extern "C" int cuda_matmul_backward(cuda_backend_t *b, float *dinp, float *dweight,
                                    const void *dout, const void *inp, const void *weight,
                                    ty_dtype_t dt, int N, int IN, int OUT, float dinp_beta) {
  int rc = 0;
  if (dinp) rc = mm_nn(b, dt, dinp, dout, weight, N, IN, OUT, 1.0f, dinp_beta);
  if (!rc && dweight) rc = mm_tn(b, dt, dweight, dout, inp, N, IN, OUT, 1.0f, 1.0f);
  return rc;
}

/* ---- RMSNorm ---- */

__global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int C,
                              float eps) {
  const float *x = inp + (size_t)blockIdx.x * C;
  float *y = out + (size_t)blockIdx.x * C;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  ss = block_sum(ss);
  float s = 1.0f / sqrtf(ss / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = w[c] * (x[c] * s);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
}

/* dx = rstd * (w*dy - xhat * mean(w*dy * xhat)) (+ dresid), one row a block. */
__global__ void k_rmsnorm_bwd(float *dinp, const float *dout, const float *dresid, const float *inp,
                              const float *w, const float *rstd, int C) {
  size_t r = blockIdx.x;
  const float *x = inp + r * C, *dy = dout + r * C;
  const float *dres = dresid ? dresid + r * C : NULL;
  float *dx = dinp + r * C;
  float s = rstd[r];
  double dot = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dot += (double)(w[c] * dy[c]) * (x[c] * s);
  dot = block_sum(dot);
  float m = (float)(dot / C);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float g = s * (w[c] * dy[c] - x[c] * s * m);
    dx[c] = dres ? dres[c] + g : g;
  }
}

/* dweight[c] += sum over rows (in order) of dy * x * rstd: one thread a column. */
__global__ void k_rmsnorm_dw(float *dw, const float *dout, const float *inp, const float *rstd,
                             int N, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = dw[c];
  for (int r = 0; r < N; r++) acc += dout[(size_t)r * C + c] * inp[(size_t)r * C + c] * rstd[r];
  dw[c] = acc;
}

extern "C" void cuda_rmsnorm_forward(cuda_backend_t *b, float *out, float *rstd, const float *inp,
                                     const float *weight, int N, int C, float eps) {
  (void)b;
  if (N > 0) TY_LAUNCH(k_rmsnorm_fwd, N, CB_THREADS, 0)(out, rstd, inp, weight, C, eps);
}

extern "C" void cuda_rmsnorm_backward(cuda_backend_t *b, float *dinp, float *dweight,
                                      const float *dout, const float *dresid, const float *inp,
                                      const float *weight, const float *rstd, int N, int C) {
  (void)b;
  if (N <= 0) return;
  /* dweight first: dinp may alias dresid, never dout or inp. */
  if (dweight)
    TY_LAUNCH(k_rmsnorm_dw, cb_blocks((size_t)C), CB_THREADS, 0)(dweight, dout, inp, rstd, N, C);
  TY_LAUNCH(k_rmsnorm_bwd, N, CB_THREADS, 0)(dinp, dout, dresid, inp, weight, rstd, C);
}

/* ---- RoPE (rotate-half) ---- */

__global__ void k_rope(float *x, const float *cs, const float *sn, int T, int NX, int HS,
                       size_t total, float sign) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int half = HS / 2;
  int j = (int)(i % half);
  size_t head = i / half; /* (b*T + t) * NX + h */
  size_t t = (head / NX) % T;
  float *v = x + head * HS;
  float c = cs[t * half + j], s = sign * sn[t * half + j];
  float x1 = v[j], x2 = v[j + half];
  v[j] = x1 * c - x2 * s;
  v[j + half] = x2 * c + x1 * s;
}

extern "C" int cuda_rope_tables(cuda_backend_t *b, float *cos_t, float *sin_t, int T, int HS,
                                double theta) {
  (void)b;
  size_t n = (size_t)T * (HS / 2);
  float *h = (float *)malloc(2 * n * sizeof(float) + 1);
  if (!h) return TY_EEXHAUSTED;
  cpu_rope_tables(h, h + n, T, HS, theta);
  cudaError_t e = cudaMemcpy(cos_t, h, n * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(sin_t, h + n, n * sizeof(float), cudaMemcpyHostToDevice);
  free(h);
  return e == cudaSuccess ? 0 : TY_EINTERNAL;
}

extern "C" void cuda_rope_forward(cuda_backend_t *b, float *x, const float *cos_t,
                                  const float *sin_t, int B, int T, int NX, int HS) {
  (void)b;
  size_t total = (size_t)B * T * NX * (HS / 2);
  if (total)
    TY_LAUNCH(k_rope, cb_blocks(total), CB_THREADS, 0)(x, cos_t, sin_t, T, NX, HS, total, 1.0f);
}

extern "C" void cuda_rope_backward(cuda_backend_t *b, float *dx, const float *cos_t,
                                   const float *sin_t, int B, int T, int NX, int HS) {
  (void)b;
  size_t total = (size_t)B * T * NX * (HS / 2);
  if (total)
    TY_LAUNCH(k_rope, cb_blocks(total), CB_THREADS, 0)(dx, cos_t, sin_t, T, NX, HS, total, -1.0f);
}

/* ---- causal GQA attention ----
 * Without a (T, T) matrix: scores are recomputed from q and k where they
 * are needed, a tile at a time in shared memory. The forward pass keeps
 * only each row's log-sum-exp; the backward pass rebuilds the
 * probabilities from it and keeps only each row's dout . out (B*NH*T
 * floats of scratch). Two paths: the tiled kernels below (k_flash_*) for
 * head sizes up to ATT_MAX_HS, and one block per row (k_attn_*) for any
 * larger head, whose rows would not fit a tile in shared memory. */

static __device__ float dot_hs(const float *a, const float *b, int HS) {
  float s = 0.0f;
  for (int d = 0; d < HS; d++) s += a[d] * b[d];
  return s;
}

/* One block per (b, h, t) query row. Shared: the query row (HS floats)
 * and one tile's probabilities (blockDim.x floats). Pass 1: the row's
 * max and sum (log-sum-exp); pass 2: out = sum_j p_j v_j by tiles, each
 * thread owning its d's of the output row. */
__global__ void k_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                           int T, int NH, int NKV, int HS) {
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *sp = sh + HS;
  size_t row = blockIdx.x;
  int t = (int)(row % T), h = (int)((row / T) % NH);
  size_t bb = row / ((size_t)T * NH);
  int kvh = h / (NH / NKV), QD = NH * HS, KVD = NKV * HS, nt = blockDim.x;
  const float scale = 1.0f / sqrtf((float)HS);
  const float *qt = q + (bb * T + t) * QD + (size_t)h * HS;
  const float *kb = k + bb * T * KVD + (size_t)kvh * HS, *vb = v + bb * T * KVD + (size_t)kvh * HS;
  for (int d = threadIdx.x; d < HS; d += nt) sq[d] = qt[d];
  __syncthreads();
  float mx = -INFINITY, sum = 0.0f;
  for (int j = threadIdx.x; j <= t; j += nt) {
    float s = dot_hs(sq, kb + (size_t)j * KVD, HS) * scale;
    if (s > mx)
      sum = sum * expf(mx - s) + 1.0f, mx = s;
    else
      sum += expf(s - mx);
  }
  float M = block_max(mx);
  float S = block_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - M));
  const float l = M + logf(S);
  if (threadIdx.x == 0) lse[row] = l;
  float *ot = out + (bb * T + t) * QD + (size_t)h * HS;
  for (int d = threadIdx.x; d < HS; d += nt) ot[d] = 0.0f;
  for (int j0 = 0; j0 <= t; j0 += nt) {
    int j = j0 + threadIdx.x, n = t - j0 + 1 < nt ? t - j0 + 1 : nt;
    sp[threadIdx.x] = j <= t ? expf(dot_hs(sq, kb + (size_t)j * KVD, HS) * scale - l) : 0.0f;
    __syncthreads();
    for (int d = threadIdx.x; d < HS; d += nt) {
      float acc = 0.0f;
      for (int jj = 0; jj < n; jj++) acc += sp[jj] * vb[(size_t)(j0 + jj) * KVD + d];
      ot[d] += acc;
    }
    __syncthreads();
  }
}

/* One block per query row: D = dout . out into dsum, then dq = scale *
 * sum_j p_j (dout . v_j - D) k_j by tiles. Shared: the row's query and
 * dout (2 * HS floats) and one tile's score gradients (blockDim.x). */
__global__ void k_attn_bwd_q(float *dq, float *dsum, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v,
                             int T, int NH, int NKV, int HS) {
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *sd = sh + HS, *sds = sh + 2 * HS;
  size_t row = blockIdx.x;
  int t = (int)(row % T), h = (int)((row / T) % NH);
  size_t bb = row / ((size_t)T * NH);
  int kvh = h / (NH / NKV), QD = NH * HS, KVD = NKV * HS, nt = blockDim.x;
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t qo = (bb * T + t) * QD + (size_t)h * HS;
  const float *kb = k + bb * T * KVD + (size_t)kvh * HS, *vb = v + bb * T * KVD + (size_t)kvh * HS;
  float part = 0.0f;
  for (int d = threadIdx.x; d < HS; d += nt) {
    sq[d] = q[qo + d], sd[d] = dout[qo + d];
    part += sd[d] * out[qo + d];
  }
  const float D = block_sum(part), l = lse[row]; /* block_sum's barrier orders sq, sd too */
  if (threadIdx.x == 0) dsum[row] = D;
  float *dqt = dq + qo;
  for (int d = threadIdx.x; d < HS; d += nt) dqt[d] = 0.0f;
  for (int j0 = 0; j0 <= t; j0 += nt) {
    int j = j0 + threadIdx.x, n = t - j0 + 1 < nt ? t - j0 + 1 : nt;
    float ds = 0.0f;
    if (j <= t) {
      float p = expf(dot_hs(sq, kb + (size_t)j * KVD, HS) * scale - l);
      ds = p * (dot_hs(sd, vb + (size_t)j * KVD, HS) - D);
    }
    sds[threadIdx.x] = ds;
    __syncthreads();
    for (int d = threadIdx.x; d < HS; d += nt) {
      float acc = 0.0f;
      for (int jj = 0; jj < n; jj++) acc += sds[jj] * kb[(size_t)(j0 + jj) * KVD + d];
      dqt[d] += acc;
    }
    __syncthreads();
  }
  for (int d = threadIdx.x; d < HS; d += nt) dqt[d] *= scale;
}

/* One block per (b, kv head, key j): dk and dv summed over the query heads
 * of the group and the rows t >= j, as the other kernels do, a tile of
 * blockDim.x (head, row) pairs at a time: each thread a pair's score and
 * dout . v_j, then each thread adds the tile into its d's of dk and dv, in
 * pair order. Shared: k_j and v_j (2 * HS floats), one tile's
 * probabilities and score gradients (2 * blockDim.x). */
__global__ void k_attn_bwd_kv(float *dk, float *dv, const float *dout, const float *dsum,
                              const float *lse, const float *q, const float *k, const float *v,
                              int T, int NH, int NKV, int HS) {
  TY_DYN_SHARED(float, sh);
  const int nt = blockDim.x;
  float *skj = sh, *svj = sh + HS, *sp = sh + 2 * HS, *sds = sh + 2 * HS + nt;
  size_t row = blockIdx.x;
  int j = (int)(row % T), kvh = (int)((row / T) % NKV);
  size_t bb = row / ((size_t)T * NKV);
  const int G = NH / NKV, QD = NH * HS, KVD = NKV * HS, rows = T - j, pairs = G * rows;
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t ko = (bb * T + j) * KVD + (size_t)kvh * HS;
  for (int d = threadIdx.x; d < HS; d += nt) {
    skj[d] = k[ko + d], svj[d] = v[ko + d];
    dk[ko + d] = 0.0f, dv[ko + d] = 0.0f;
  }
  __syncthreads();
  /* Pair x: query head kvh * G + x / rows, row j + x % rows. */
#define PAIR_Q(x) ((bb * T + j + (x) % rows) * QD + (size_t)(kvh * G + (x) / rows) * HS)
  for (int x0 = 0; x0 < pairs; x0 += nt) {
    int x = x0 + threadIdx.x, n = pairs - x0 < nt ? pairs - x0 : nt;
    float p = 0.0f, ds = 0.0f;
    if (x < pairs) {
      const size_t qi = PAIR_Q(x), ri = (bb * NH + kvh * G + x / rows) * (size_t)T + j + x % rows;
      p = expf(dot_hs(q + qi, skj, HS) * scale - lse[ri]);
      ds = p * (dot_hs(dout + qi, svj, HS) - dsum[ri]);
    }
    sp[threadIdx.x] = p, sds[threadIdx.x] = ds;
    __syncthreads();
    for (int d = threadIdx.x; d < HS; d += nt) {
      float ak = 0.0f, av = 0.0f;
      for (int xx = 0; xx < n; xx++) {
        const size_t qi = PAIR_Q(x0 + xx) + d;
        ak += sds[xx] * q[qi], av += sp[xx] * dout[qi];
      }
      dk[ko + d] += ak, dv[ko + d] += av;
    }
    __syncthreads();
  }
#undef PAIR_Q
  for (int d = threadIdx.x; d < HS; d += nt) dk[ko + d] *= scale;
}

/* ---- the tiled path, for head sizes up to 256 (every Llama-family model):
 * FlashAttention's scheme in fp32 on CUDA cores. A block takes a tile of
 * TL query rows of one head (for dk and dv, TL keys of one kv head) with
 * ATT_TPR threads to a row, and walks the other side TL rows at a time
 * through shared memory, so that each k and v row is read from global
 * memory once per tile of queries instead of once per query row. Thread c
 * of a row owns the row's scores at columns c, c + 8, ... of a tile and
 * its output at d = c, c + 8, ... (DPT of them, in registers). Rows in
 * shared memory are 8 * DPT + 1 floats apart: zeros past HS, and an odd
 * stride, so that the eight rows a row's threads read in step lie in
 * distinct banks. Every sum runs in a fixed order, as the row kernels'. */

#define ATT_TPR 8
#define ATT_MAX_HS 256

__host__ __device__ constexpr int att_stride(int dpt) {
  return ATT_TPR * dpt + 1;
}
/* Bytes of shared memory: nbuf row buffers of TL rows, two TL x (TL + 1)
 * tiles of scores and two TL vectors (what the largest kernel uses). */
constexpr size_t att_smem(int dpt, int tl, int nbuf) {
  return ((size_t)nbuf * tl * att_stride(dpt) + 2 * (size_t)tl * (tl + 1) + 2 * (size_t)tl) *
         sizeof(float);
}
/* The largest tile of 32, 16 or 8 rows whose buffers fit CUDA's default
 * 48 KiB of shared memory a block. */
constexpr int att_tile(int dpt, int nbuf) {
  return att_smem(dpt, 32, nbuf) <= (48 << 10)   ? 32
         : att_smem(dpt, 16, nbuf) <= (48 << 10) ? 16
                                                 : 8;
}

/* Rows r0 .. r0 + TL - 1 (of width HS, ld floats apart, T of them) into
 * dst, zero past HS and past T. */
template <int DPT, int TL>
static __device__ void att_load(float *dst, const float *src, size_t ld, int r0, int T, int HS) {
  constexpr int S = att_stride(DPT);
  for (int x = threadIdx.x; x < TL * S; x += TL * ATT_TPR) {
    int rr = x / S, d = x % S;
    dst[x] = d < HS && r0 + rr < T ? src[(size_t)(r0 + rr) * ld + d] : 0.0f;
  }
}

/* s[i] = a . rows[i * ATT_TPR], rows S floats apart (rows already points
 * at this thread's first one). */
template <int DPT, int TL>
static __device__ void att_dots(float *s, const float *a, const float *rows, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR;
  TY_UNROLL
  for (int i = 0; i < KPT; i++) s[i] = 0.0f;
  for (int d = 0; d < HS; d++) {
    const float x = a[d];
    TY_UNROLL
    for (int i = 0; i < KPT; i++) s[i] += x * rows[i * ATT_TPR * S + d];
  }
}

/* acc[i] += sum over jj < n of w[jj] * tile[jj * S + i * ATT_TPR]: a row
 * of weights times a tile (tile already points at this thread's column). */
template <int DPT>
static __device__ void att_accum(float *acc, const float *w, const float *tile, int n) {
  constexpr int S = att_stride(DPT);
  for (int jj = 0; jj < n; jj++) {
    const float x = w[jj], *row = tile + jj * S;
    TY_UNROLL
    for (int i = 0; i < DPT; i++) acc[i] += x * row[i * ATT_TPR];
  }
}

/* dst[c + i * ATT_TPR] = acc[i] * f, for this thread's d below HS. */
template <int DPT>
static __device__ void att_store(float *dst, const float *acc, float f, int c, int HS) {
  TY_UNROLL
  for (int i = 0; i < DPT; i++)
    if (c + i * ATT_TPR < HS) dst[c + i * ATT_TPR] = acc[i] * f;
}

/* Over a row's ATT_TPR threads (adjacent lanes of one warp). */
static __device__ float row_sum(float v) {
  for (int o = ATT_TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ float row_max(float v) {
  for (int o = ATT_TPR / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* The block's place: tile `tile` of TL rows of head-row `hr` (b * NH + h
 * for queries, b * NKV + kvh for keys); this thread's row r and lane c. */
#define ATT_PLACE(nheads, first_longest)                                                   \
  const int ntile = (T + TL - 1) / TL;                                                     \
  const int tile =                                                                         \
      (first_longest) ? ntile - 1 - (int)(blockIdx.x % ntile) : (int)(blockIdx.x % ntile); \
  const size_t hr = blockIdx.x / ntile, bb = hr / (nheads);                                \
  const int r = (int)threadIdx.x / ATT_TPR, c = (int)threadIdx.x % ATT_TPR;                \
  const int QD = NH * HS, KVD = NKV * HS, r0 = tile * TL;                                  \
  const float scale = 1.0f / sqrtf((float)HS)

/* Forward: per key tile, the scores, the row's running max m and sum l
 * (online softmax), then out += p v. Shared: q tile, k then v tile, p. */
template <int DPT, int TL>
__global__ void k_flash_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                            int T, int NH, int NKV, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR, P = TL + 1;
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *skv = sh + TL * S, *sp = sh + 2 * TL * S;
  ATT_PLACE(NH, true); /* the causal rows at the end do the most work */
  const int h = (int)(hr % NH), kvh = h / (NH / NKV), t = r0 + r;
  const size_t kvo = bb * T * KVD + (size_t)kvh * HS;
  const int kend = r0 + TL < T ? r0 + TL : T;
  att_load<DPT, TL>(sq, q + bb * T * QD + (size_t)h * HS, QD, r0, T, HS);
  float m = -INFINITY, l = 0.0f, acc[DPT];
  TY_UNROLL
  for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += TL) {
    __syncthreads(); /* q in; the last tile's v and p read */
    att_load<DPT, TL>(skv, k + kvo, KVD, j0, T, HS);
    __syncthreads();
    float s[KPT], mt = -INFINITY, ls = 0.0f;
    att_dots<DPT, TL>(s, sq + r * S, skv + c * S, HS);
    TY_UNROLL
    for (int i = 0; i < KPT; i++) {
      const int j = j0 + c + i * ATT_TPR;
      s[i] = t < T && j <= t ? s[i] * scale : -INFINITY;
      mt = fmaxf(mt, s[i]);
    }
    const float mn = fmaxf(m, row_max(mt));
    const float alpha = mn == -INFINITY ? 1.0f : expf(m - mn);
    TY_UNROLL
    for (int i = 0; i < KPT; i++) {
      const float p = s[i] == -INFINITY ? 0.0f : expf(s[i] - mn);
      sp[r * P + c + i * ATT_TPR] = p;
      ls += p;
    }
    l = l * alpha + row_sum(ls), m = mn;
    TY_UNROLL
    for (int i = 0; i < DPT; i++) acc[i] *= alpha;
    __syncthreads(); /* k read, p written */
    att_load<DPT, TL>(skv, v + kvo, KVD, j0, T, HS);
    __syncthreads();
    att_accum<DPT>(acc, sp + r * P, skv + c, kend - j0 < TL ? kend - j0 : TL);
  }
  if (t < T) {
    att_store<DPT>(out + (bb * T + t) * QD + (size_t)h * HS, acc, 1.0f / l, c, HS);
    if (c == 0) lse[hr * T + t] = m + logf(l);
  }
}

/* dq = scale * sum_j p_j (dout . v_j - D) k_j over key tiles, and D =
 * dout . out into dsum for k_flash_bwd_kv. Shared: q, dout, k, v tiles and
 * the score gradients. */
template <int DPT, int TL>
__global__ void k_flash_bwd_q(float *dq, float *dsum, const float *dout, const float *out,
                              const float *lse, const float *q, const float *k, const float *v,
                              int T, int NH, int NKV, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR, P = TL + 1;
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *sdo = sh + TL * S, *sk = sh + 2 * TL * S, *sv = sh + 3 * TL * S;
  float *sds = sh + 4 * TL * S;
  ATT_PLACE(NH, true);
  const int h = (int)(hr % NH), kvh = h / (NH / NKV), t = r0 + r;
  const size_t qo = bb * T * QD + (size_t)h * HS, kvo = bb * T * KVD + (size_t)kvh * HS;
  const int kend = r0 + TL < T ? r0 + TL : T;
  att_load<DPT, TL>(sq, q + qo, QD, r0, T, HS);
  att_load<DPT, TL>(sdo, dout + qo, QD, r0, T, HS);
  float D = 0.0f, L = 0.0f, acc[DPT];
  if (t < T) {
    const float *o = out + qo + (size_t)t * QD, *g = dout + qo + (size_t)t * QD;
    for (int d = c; d < HS; d += ATT_TPR) D += g[d] * o[d];
    L = lse[hr * T + t];
  }
  D = row_sum(D);
  if (t < T && c == 0) dsum[hr * T + t] = D;
  TY_UNROLL
  for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += TL) {
    __syncthreads(); /* q, dout in; the last tile's k and ds read */
    att_load<DPT, TL>(sk, k + kvo, KVD, j0, T, HS);
    att_load<DPT, TL>(sv, v + kvo, KVD, j0, T, HS);
    __syncthreads();
    float s[KPT], dp[KPT];
    att_dots<DPT, TL>(s, sq + r * S, sk + c * S, HS);
    att_dots<DPT, TL>(dp, sdo + r * S, sv + c * S, HS);
    TY_UNROLL
    for (int i = 0; i < KPT; i++) {
      const int j = j0 + c + i * ATT_TPR;
      sds[r * P + c + i * ATT_TPR] = t < T && j <= t ? expf(s[i] * scale - L) * (dp[i] - D) : 0.0f;
    }
    __syncthreads();
    att_accum<DPT>(acc, sds + r * P, sk + c, kend - j0 < TL ? kend - j0 : TL);
  }
  if (t < T) att_store<DPT>(dq + qo + (size_t)t * QD, acc, scale, c, HS);
}

/* dk and dv of a tile of TL keys of one kv head, summed over the group's
 * query heads and, by tiles, the rows t >= the tile's first key: dv +=
 * p dout_t, dk += scale * ds q_t. Shared: the keys' k and v, one tile's q
 * and dout, its p and ds, and its rows' lse and D. */
template <int DPT, int TL>
__global__ void k_flash_bwd_kv(float *dk, float *dv, const float *dout, const float *dsum,
                               const float *lse, const float *q, const float *k, const float *v,
                               int T, int NH, int NKV, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR, P = TL + 1;
  TY_DYN_SHARED(float, sh);
  float *sk = sh, *sv = sh + TL * S, *sq = sh + 2 * TL * S, *sdo = sh + 3 * TL * S;
  float *sp = sh + 4 * TL * S, *sds = sp + TL * P, *sl = sds + TL * P, *sd = sl + TL;
  ATT_PLACE(NKV, false); /* the causal keys at the start do the most work */
  const int kvh = (int)(hr % NKV), G = NH / NKV, j = r0 + r;
  const size_t kvo = bb * T * KVD + (size_t)kvh * HS;
  att_load<DPT, TL>(sk, k + kvo, KVD, r0, T, HS);
  att_load<DPT, TL>(sv, v + kvo, KVD, r0, T, HS);
  float ak[DPT], av[DPT];
  TY_UNROLL
  for (int i = 0; i < DPT; i++) ak[i] = 0.0f, av[i] = 0.0f;
  for (int g = 0; g < G; g++) {
    const size_t bh = bb * NH + (size_t)kvh * G + g, qo = bb * T * QD + (bh % NH) * HS;
    for (int q0 = r0; q0 < T; q0 += TL) {
      __syncthreads(); /* k, v in; the last tile's q, dout, p, ds read */
      att_load<DPT, TL>(sq, q + qo, QD, q0, T, HS);
      att_load<DPT, TL>(sdo, dout + qo, QD, q0, T, HS);
      if ((int)threadIdx.x < TL) {
        const int tt = q0 + (int)threadIdx.x;
        sl[threadIdx.x] = tt < T ? lse[bh * T + tt] : 0.0f;
        sd[threadIdx.x] = tt < T ? dsum[bh * T + tt] : 0.0f;
      }
      __syncthreads();
      float s[KPT], dp[KPT];
      att_dots<DPT, TL>(s, sk + r * S, sq + c * S, HS);
      att_dots<DPT, TL>(dp, sv + r * S, sdo + c * S, HS);
      TY_UNROLL
      for (int i = 0; i < KPT; i++) {
        const int x = c + i * ATT_TPR, tt = q0 + x;
        const float p = tt < T && j <= tt ? expf(s[i] * scale - sl[x]) : 0.0f;
        sp[r * P + x] = p, sds[r * P + x] = p * (dp[i] - sd[x]);
      }
      __syncthreads();
      const int n = T - q0 < TL ? T - q0 : TL;
      att_accum<DPT>(av, sp + r * P, sdo + c, n);
      att_accum<DPT>(ak, sds + r * P, sq + c, n);
    }
  }
  if (j < T) {
    att_store<DPT>(dk + kvo + (size_t)j * KVD, ak, scale, c, HS);
    att_store<DPT>(dv + kvo + (size_t)j * KVD, av, 1.0f, c, HS);
  }
}
#undef ATT_PLACE

/* Launches of the tiled kernels for one DPT. */
template <int DPT>
static void flash_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          int B, int T, int NH, int NKV, int HS) {
  constexpr int TL = att_tile(DPT, 2);
  void (*k_fwd)(float *, float *, const float *, const float *, const float *, int, int, int, int) =
      k_flash_fwd<DPT, TL>;
  const size_t blocks = (size_t)(T + TL - 1) / TL * B * NH;
  TY_LAUNCH(k_fwd, (unsigned)blocks, TL * ATT_TPR, att_smem(DPT, TL, 2))
  (out, lse, q, k, v, T, NH, NKV, HS);
}
template <int DPT>
static void flash_backward(float *dq, float *dk, float *dv, float *dsum, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k,
                           const float *v, int B, int T, int NH, int NKV, int HS) {
  constexpr int TL = att_tile(DPT, 4);
  void (*k_bwd_q)(float *, float *, const float *, const float *, const float *, const float *,
                  const float *, const float *, int, int, int, int) = k_flash_bwd_q<DPT, TL>;
  void (*k_bwd_kv)(float *, float *, const float *, const float *, const float *, const float *,
                   const float *, const float *, int, int, int, int) = k_flash_bwd_kv<DPT, TL>;
  const size_t tiles = (size_t)(T + TL - 1) / TL;
  TY_LAUNCH(k_bwd_q, (unsigned)(tiles * B * NH), TL * ATT_TPR, att_smem(DPT, TL, 4))
  (dq, dsum, dout, out, lse, q, k, v, T, NH, NKV, HS);
  TY_LAUNCH(k_bwd_kv, (unsigned)(tiles * B * NKV), TL * ATT_TPR, att_smem(DPT, TL, 4))
  (dk, dv, dout, dsum, lse, q, k, v, T, NH, NKV, HS);
}

/* The tiled kernels' DPT for a head size: the least power of two >=
 * HS / ATT_TPR (at least 2), or 0 for the row kernels (past ATT_MAX_HS,
 * or when the backend asks for them). */
static int flash_dpt(const cuda_backend_t *b, int HS) {
  if (HS > ATT_MAX_HS || b->attn_rows) return 0;
  int dpt = 2;
  while (dpt * ATT_TPR < HS) dpt *= 2;
  return dpt;
}

static unsigned row_threads(int width) {
  unsigned t = (unsigned)((width + 31) / 32 * 32);
  return t < 64 ? 64 : t > 256 ? 256 : t;
}

extern "C" void cuda_attention_forward(cuda_backend_t *b, float *out, float *lse, const float *q,
                                       const float *k, const float *v, int B, int T, int NH,
                                       int NKV, int HS) {
  size_t rows = (size_t)B * NH * T;
  if (!rows) return;
#define FLASH_FWD(dpt) \
  case dpt:            \
    return flash_forward<dpt>(out, lse, q, k, v, B, T, NH, NKV, HS)
  switch (flash_dpt(b, HS)) {
    FLASH_FWD(2);
    FLASH_FWD(4);
    FLASH_FWD(8);
    FLASH_FWD(16);
    FLASH_FWD(32);
  }
#undef FLASH_FWD
  unsigned nt = row_threads(T);
  TY_LAUNCH(k_attn_fwd, (unsigned)rows, nt, (HS + nt) * sizeof(float))
  (out, lse, q, k, v, T, NH, NKV, HS);
}

extern "C" void cuda_attention_backward(cuda_backend_t *b, float *dq, float *dk, float *dv,
                                        float *scratch, const float *dout, const float *out,
                                        const float *lse, const float *q, const float *k,
                                        const float *v, int B, int T, int NH, int NKV, int HS) {
  size_t rows = (size_t)B * NH * T, kvrows = (size_t)B * NKV * T;
  if (!rows) return;
#define FLASH_BWD(dpt) \
  case dpt:            \
    return flash_backward<dpt>(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, HS)
  switch (flash_dpt(b, HS)) {
    FLASH_BWD(2);
    FLASH_BWD(4);
    FLASH_BWD(8);
    FLASH_BWD(16);
    FLASH_BWD(32);
  }
#undef FLASH_BWD
  unsigned nt = row_threads(T);
  TY_LAUNCH(k_attn_bwd_q, (unsigned)rows, nt, (2 * HS + nt) * sizeof(float))
  (dq, scratch, dout, out, lse, q, k, v, T, NH, NKV, HS);
  TY_LAUNCH(k_attn_bwd_kv, (unsigned)kvrows, nt, (2 * HS + 2 * nt) * sizeof(float))
  (dk, dv, dout, scratch, lse, q, k, v, T, NH, NKV, HS);
}

/* ---- SwiGLU ---- */

__global__ void k_swiglu_fwd(float *h, const float *gate, const float *up, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float g = gate[i];
    h[i] = g / (1.0f + expf(-g)) * up[i];
  }
}
__global__ void k_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate,
                             const float *up, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float g = gate[i], s = 1.0f / (1.0f + expf(-g)), d = dh[i];
    dup[i] = d * g * s;
    dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
  }
}
extern "C" void cuda_swiglu_forward(cuda_backend_t *b, float *h, const float *gate, const float *up,
                                    size_t n) {
  (void)b;
  if (n) TY_LAUNCH(k_swiglu_fwd, cb_blocks(n), CB_THREADS, 0)(h, gate, up, n);
}
extern "C" void cuda_swiglu_backward(cuda_backend_t *b, float *dgate, float *dup, const float *dh,
                                     const float *gate, const float *up, size_t n) {
  (void)b;
  if (n) TY_LAUNCH(k_swiglu_bwd, cb_blocks(n), CB_THREADS, 0)(dgate, dup, dh, gate, up, n);
}

__global__ void k_add(float *dst, const float *src, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}
extern "C" void cuda_add(cuda_backend_t *b, float *dst, const float *src, size_t n) {
  (void)b;
  if (n) TY_LAUNCH(k_add, cb_blocks(n), CB_THREADS, 0)(dst, src, n);
}

/* ---- embedding ---- */

template <typename W>
__device__ float to_f32(W w);
template <>
__device__ float to_f32<float>(float w) {
  return w;
}
template <>
__device__ float to_f32<__nv_bfloat16>(__nv_bfloat16 w) {
  return __bfloat162float(w);
}
template <typename W>
__global__ void k_embed_fwd(float *out, const int *tokens, const W *embed, int C, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = to_f32(embed[(size_t)tokens[i / C] * C + i % C]);
}
/* One thread per column, rows in order: no atomics, a fixed summation order. */
__global__ void k_embed_bwd(float *dembed, const float *dout, const int *tokens, int N, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = 0; r < N; r++) dembed[(size_t)tokens[r] * C + c] += dout[(size_t)r * C + c];
}
extern "C" void cuda_embedding_forward(cuda_backend_t *b, float *out, const int *tokens,
                                       const void *embed, ty_dtype_t dt, int N, int C) {
  (void)b;
  size_t n = (size_t)N * C;
  if (!n) return;
  if (dt == TY_DTYPE_BF16) TY_LAUNCH(k_embed_fwd<__nv_bfloat16>, cb_blocks(n), CB_THREADS, 0)
  (out, tokens, (const __nv_bfloat16 *)embed, C, n);
  else TY_LAUNCH(k_embed_fwd<float>, cb_blocks(n), CB_THREADS, 0)(out, tokens, (const float *)embed,
                                                                  C, n);
}
extern "C" void cuda_embedding_backward(cuda_backend_t *b, float *dembed, const float *dout,
                                        const int *tokens, int N, int C) {
  (void)b;
  if (N > 0 && C > 0)
    TY_LAUNCH(k_embed_bwd, cb_blocks((size_t)C), CB_THREADS, 0)(dembed, dout, tokens, N, C);
}

/* ---- cross-entropy ---- */

__global__ void k_ce_fwd(float *losses, const float *logits, const int *targets, int V) {
  const float *l = logits + (size_t)blockIdx.x * V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx);
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(l[j] - mx);
  sum = block_sum(sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = (float)(log(sum) + mx - l[targets[blockIdx.x]]);
}
__global__ void k_ce_bwd(float *logits, const int *targets, int V, float dloss) {
  float *l = logits + (size_t)blockIdx.x * V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx);
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(l[j] - mx);
  sum = block_sum(sum);
  float inv = (float)(1.0 / sum) * dloss;
  int tg = targets[blockIdx.x];
  for (int j = threadIdx.x; j < V; j += blockDim.x)
    l[j] = expf(l[j] - mx) * inv - (j == tg ? dloss : 0.0f);
}
/* One block: the sum of x (n) in double, threads striding, a fixed tree. */
__global__ void k_sum(double *out, const float *x, size_t n, int squares) {
  double acc = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) acc += squares ? (double)x[i] * x[i] : x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}
static int fetch_sum(cuda_backend_t *b, const float *x, size_t n, int squares, double *out) {
  if (!n) {
    *out = 0.0;
    return 0;
  }
  TY_LAUNCH(k_sum, 1, 1024, 0)(b->dsum, x, n, squares);
  cudaError_t e = cudaMemcpy(out, b->dsum, sizeof(double), cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? 0 : TY_EINTERNAL;
}
extern "C" int cuda_crossentropy_forward(cuda_backend_t *b, float *losses, const float *logits,
                                         const int *targets, int N, int V, double *sum) {
  if (N <= 0) {
    if (sum) *sum = 0.0;
    return 0;
  }
  TY_LAUNCH(k_ce_fwd, N, CB_THREADS, 0)(losses, logits, targets, V);
  return sum ? fetch_sum(b, losses, (size_t)N, 0, sum) : 0;
}
extern "C" void cuda_crossentropy_backward(cuda_backend_t *b, float *logits, const int *targets,
                                           int N, int V, float dloss) {
  (void)b;
  if (N > 0) TY_LAUNCH(k_ce_bwd, N, CB_THREADS, 0)(logits, targets, V, dloss);
}
extern "C" int cuda_sum(cuda_backend_t *b, const float *x, size_t n, double *out) {
  return fetch_sum(b, x, n, 0, out);
}
extern "C" int cuda_sumsq(cuda_backend_t *b, const float *x, size_t n, double *out) {
  return fetch_sum(b, x, n, 1, out);
}

/* ---- LoRA ---- */

extern "C" int cuda_lora_forward(cuda_backend_t *b, float *out, float *xa, const float *x,
                                 const float *A, const float *B, int n, int IN, int OUT, int R,
                                 float scale) {
  int rc = mm_nt(b, TY_DTYPE_F32, xa, x, A, n, IN, R, 1.0f, 0.0f);
  if (!rc) rc = mm_nt(b, TY_DTYPE_F32, out, xa, B, n, R, OUT, scale, 1.0f);
  return rc;
}

extern "C" int cuda_lora_backward(cuda_backend_t *b, float *dx, float *dA, float *dB, float *dxa,
                                  const float *dout, const float *x, const float *xa,
                                  const float *A, const float *B, int n, int IN, int OUT, int R,
                                  float scale) {
  int rc = mm_tn(b, TY_DTYPE_F32, dB, dout, xa, n, R, OUT, scale, 1.0f);
  if (!rc) rc = mm_nn(b, TY_DTYPE_F32, dxa, dout, B, n, R, OUT, scale, 0.0f);
  if (!rc) rc = mm_tn(b, TY_DTYPE_F32, dA, dxa, x, n, IN, R, 1.0f, 1.0f);
  if (!rc && dx) rc = mm_nn(b, TY_DTYPE_F32, dx, dxa, A, n, IN, R, 1.0f, 1.0f);
  return rc;
}

/* ---- AdamW ---- */

__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float b1, float b2,
                        float one_b1, float one_b2, float eps, float decay, float gs,
                        float step_size, float bc2_sqrt) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gi = g[i] * gs;
  float pi = p[i] * decay;
  float mi = m[i] * b1 + one_b1 * gi;
  float vi = v[i] * b2 + one_b2 * gi * gi;
  float denom = sqrtf(vi) / bc2_sqrt + eps;
  p[i] = pi - step_size * (mi / denom);
  m[i] = mi;
  v[i] = vi;
}

extern "C" void cuda_adamw_step(cuda_backend_t *b, float *p, const float *g, float *m, float *v,
                                size_t n, const cuda_adamw_cfg_t *c, int64_t t, double grad_scale,
                                int decay_on) {
  (void)b;
  if (!n) return;
  /* The host-side factors exactly as optim_step computes them. */
  double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
  float decay = decay_on ? (float)(1.0 - c->lr * c->weight_decay) : 1.0f;
  TY_LAUNCH(k_adamw, cb_blocks(n), CB_THREADS, 0)
  (p, g, m, v, n, (float)c->beta1, (float)c->beta2, (float)(1.0 - c->beta1),
   (float)(1.0 - c->beta2), (float)c->eps, decay, (float)grad_scale, (float)(c->lr / bc1),
   (float)sqrt(bc2));
}
