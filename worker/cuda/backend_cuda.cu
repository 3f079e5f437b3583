/* backend_cuda.cu - the CUDA kernels and cuBLAS products of backend_cuda.h,
 * attention's aside (attention_cuda.cu), and the loading of cuBLAS. Plain,
 * checkable kernels: one block per row for the row ops (norms, softmaxes),
 * one thread per element otherwise; every reduction is in a fixed order
 * for a fixed launch, so results repeat. */
#include <dlfcn.h>

#include <algorithm>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/cuda/backend_cuda_impl.cuh"

extern "C" {
#include "worker/model/cpu_ops.h"
#include "worker/cuda/mem_cuda.h"
}

/* ---- cuBLAS, loaded when the first backend is created rather than at
 * program start: mapping libcublas and libcublasLt costs a process some 200
 * MiB of resident memory, which a CPU job or a load should not pay. The
 * worker links only the CUDA runtime. ---- */
cb_blas_t g_blas = {PTHREAD_ONCE_INIT, "not loaded", NULL, NULL, NULL, NULL, NULL, NULL};

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
  TY_BLAS_SYM(gemm_batched, cublasGemmBatchedEx)
#undef TY_BLAS_SYM
  g_blas.why[0] = '\0'; /* the handle stays open for the process */
}

static int cb_fail(char *err, size_t errlen, int code, const char *what, const char *why) {
  if (err && errlen) snprintf(err, errlen, "cuda backend: %s: %s", what, why);
  return code;
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

static void prof_release(cb_profile *p);

extern "C" void cuda_backend_free(cuda_backend_t *b) {
  if (!b) return;
  prof_release(&b->prof);
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

/* ---- profiling (backend_cuda.h) ---- */

static const char *const g_op_tags[CUDA_OP_COUNT] = {
#define TY_X(id, tag) tag,
    CUDA_PROFILE_OPS(TY_X)
#undef TY_X
};

enum {
  PROF_FIRST = 256, /* pairs of the pool's first growth */
  PROF_MAX = 65536  /* pairs at most: past them the window is summed, waiting */
};

static double host_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Keeps the window's first failure for its report. */
static void prof_fail(cb_profile *p, const char *what, const char *why) {
  if (!p->why[0]) snprintf(p->why, sizeof p->why, "%s: %s", what, why);
}

static void prof_release(cb_profile *p) {
  for (int i = 0; i < p->nev; i++) cudaEventDestroy(p->ev[i]);
  for (int i = 0; i < 2; i++)
    if (p->win[i]) cudaEventDestroy(p->win[i]);
  free(p->ev);
  free(p->op);
}

/* Sums the first k recorded pairs (whose events the device has run) into
 * the window's calls and ms, and moves the rest to the front of the pool,
 * the summed pairs' events behind them for reuse. */
static void prof_fold(cb_profile *p, int k) {
  for (int i = 0; i < k; i++) {
    float ms = 0.0f;
    cudaError_t e = cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]);
    if (e != cudaSuccess) prof_fail(p, "cudaEventElapsedTime", cudaGetErrorString(e));
    p->calls[p->op[i]]++;
    p->ms[p->op[i]] += ms;
  }
  std::rotate(p->ev, p->ev + 2 * k, p->ev + 2 * p->used);
  std::rotate(p->op, p->op + k, p->op + p->used);
  p->used -= k;
}

/* How many of the recorded pairs, from the first, the device has run:
 * their events are on one stream, so they complete in order (a binary
 * search by cudaEventQuery, which waits for nothing). */
static int prof_done(const cb_profile *p) {
  int lo = 0, hi = p->used; /* pairs below lo are done; from hi on, not known to be */
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (cudaEventQuery(p->ev[2 * mid + 1]) == cudaSuccess)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Room for one more pair in a full pool: the pairs the device has run are
 * summed; where that leaves it over half full, the host is that far ahead
 * of the device and the pool doubles (events created), or at its bound
 * every pair is summed, which waits for the device. In steady state (a
 * step's passes each wait for the device at their end) the pool settles
 * at about twice a pass's ops and stops growing. 0, or -1 with the reason
 * kept. */
static int prof_room(cb_profile *p) {
  prof_fold(p, prof_done(p));
  const int pairs = p->nev / 2;
  if (p->used < pairs && 2 * p->used <= pairs) return 0;
  if (pairs >= PROF_MAX) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      prof_fail(p, "waiting to sum a full pool", cudaGetErrorString(e));
      return -1;
    }
    prof_fold(p, p->used);
    return 0;
  }
  int cap = p->nev ? p->nev : PROF_FIRST; /* pairs after: twice as many */
  cudaEvent_t *ev = (cudaEvent_t *)realloc(p->ev, 2 * (size_t)cap * sizeof *ev);
  if (ev) p->ev = ev;
  unsigned char *op = ev ? (unsigned char *)realloc(p->op, (size_t)cap) : NULL;
  if (!op) {
    prof_fail(p, "growing the event pool", "out of host memory");
    return -1;
  }
  p->op = op;
  p->grown++;
  while (p->nev < 2 * cap) {
    cudaError_t e = cudaEventCreate(&p->ev[p->nev]);
    if (e != cudaSuccess) {
      prof_fail(p, "cudaEventCreate", cudaGetErrorString(e));
      break;
    }
    p->nev++;
  }
  return p->used < p->nev / 2 ? 0 : -1;
}

int cb_prof_begin(cuda_backend_t *b, int op) {
  cb_profile *p = &b->prof;
  if (p->used == p->nev / 2 && prof_room(p)) return -1;
  cudaError_t e = cudaEventRecord(p->ev[2 * p->used], 0);
  if (e != cudaSuccess) {
    prof_fail(p, "cudaEventRecord", cudaGetErrorString(e));
    return -1;
  }
  p->op[p->used] = (unsigned char)op;
  return p->used++;
}

void cb_prof_end(cuda_backend_t *b, int pair) {
  cudaError_t e = cudaEventRecord(b->prof.ev[2 * pair + 1], 0);
  if (e != cudaSuccess) prof_fail(&b->prof, "cudaEventRecord", cudaGetErrorString(e));
}

/* Nothing recorded, nothing summed, no failure, no window open. */
static void prof_clear(cb_profile *p) {
  p->used = 0;
  p->grown = 0;
  memset(p->calls, 0, sizeof p->calls);
  memset(p->ms, 0, sizeof p->ms);
  p->why[0] = '\0';
  p->win_open = false;
}

/* A new window: cleared, its start event queued now. The host's clock is
 * read first, so that the device cannot reach the event before it: the
 * span lies within the wall time. */
static void prof_window(cb_profile *p) {
  prof_clear(p);
  p->wall0 = host_s();
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < 2 && e == cudaSuccess; i++)
    if (!p->win[i]) e = cudaEventCreate(&p->win[i]);
  if (e == cudaSuccess) e = cudaEventRecord(p->win[0], 0);
  if (e != cudaSuccess)
    prof_fail(p, "the window's events", cudaGetErrorString(e));
  else
    p->win_open = true;
}

extern "C" void cuda_backend_profile(cuda_backend_t *b, bool on) {
  if (on) prof_window(&b->prof);
  b->prof.on = on;
}

extern "C" int cuda_backend_profile_report(cuda_backend_t *b, cuda_profile_t *out, char *err,
                                           size_t errlen) {
  cb_profile *p = &b->prof;
  memset(out, 0, sizeof *out);
  cudaError_t e = p->win_open ? cudaEventRecord(p->win[1], 0) : cudaSuccess;
  if (e != cudaSuccess)
    prof_fail(p, "the window's events", cudaGetErrorString(e)), p->win_open = false;
  int rc = cuda_backend_sync(b, err, errlen);
  if (rc) return rc;
  const double wall = host_s();
  prof_fold(p, p->used);
  /* Rows by ms, most first; ties in the table's order (insertion sort). */
  for (int op = 0; op < CUDA_OP_COUNT; op++) {
    if (!p->calls[op]) continue;
    cuda_profile_row_t r = {g_op_tags[op], p->calls[op], p->ms[op], 0.0};
    int i = out->n++;
    for (; i > 0 && out->rows[i - 1].ms < r.ms; i--) out->rows[i] = out->rows[i - 1];
    out->rows[i] = r;
    out->calls += r.calls;
    out->ops_ms += r.ms;
  }
  for (int i = 0; i < out->n; i++)
    out->rows[i].share = out->ops_ms > 0.0 ? 100.0 * out->rows[i].ms / out->ops_ms : 0.0;
  if (p->win_open) {
    float span = 0.0f;
    e = cudaEventElapsedTime(&span, p->win[0], p->win[1]);
    if (e != cudaSuccess) prof_fail(p, "cudaEventElapsedTime", cudaGetErrorString(e));
    out->span_ms = span;
    out->wall_ms = (wall - p->wall0) * 1e3;
  }
  out->pool_pairs = p->nev / 2;
  out->pool_grown = p->grown;
  if (p->why[0]) rc = cb_fail(err, errlen, TY_EINTERNAL, "profiling", p->why);
  if (p->on)
    prof_window(p);
  else
    prof_clear(p);
  return rc;
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
  CB_PROFILE(b, CUDA_OP_F32_TO_BF16);
  if (n) TY_LAUNCH(k_f32_to_bf16, cb_blocks(n), CB_THREADS, 0)((__nv_bfloat16 *)dst, src, n);
}
extern "C" void cuda_bf16_to_f32(cuda_backend_t *b, float *dst, const uint16_t *src, size_t n) {
  CB_PROFILE(b, CUDA_OP_BF16_TO_F32);
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
  CB_PROFILE(b, dt == TY_DTYPE_BF16 ? CUDA_OP_MATMUL_FWD_BF16 : CUDA_OP_MATMUL_FWD_F32);
  return mm_nt(b, dt, out, inp, weight, N, IN, OUT, 1.0f, beta);
}

extern "C" int cuda_matmul_backward(cuda_backend_t *b, float *dinp, float *dweight,
                                    const void *dout, const void *inp, const void *weight,
                                    ty_dtype_t dt, int N, int IN, int OUT, float dinp_beta) {
  CB_PROFILE(b, dt == TY_DTYPE_BF16 ? CUDA_OP_MATMUL_BWD_BF16 : CUDA_OP_MATMUL_BWD_F32);
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
  CB_PROFILE(b, CUDA_OP_RMSNORM_FWD);
  if (N > 0) TY_LAUNCH(k_rmsnorm_fwd, N, CB_THREADS, 0)(out, rstd, inp, weight, C, eps);
}

extern "C" void cuda_rmsnorm_backward(cuda_backend_t *b, float *dinp, float *dweight,
                                      const float *dout, const float *dresid, const float *inp,
                                      const float *weight, const float *rstd, int N, int C) {
  CB_PROFILE(b, CUDA_OP_RMSNORM_BWD);
  if (N <= 0) return;
  /* dweight first: dinp may alias dresid, never dout or inp. */
  if (dweight)
    TY_LAUNCH(k_rmsnorm_dw, cb_blocks((size_t)C), CB_THREADS, 0)(dweight, dout, inp, rstd, N, C);
  TY_LAUNCH(k_rmsnorm_bwd, N, CB_THREADS, 0)(dinp, dout, dresid, inp, weight, rstd, C);
}

/* ---- RoPE (rotate-half) ---- */

__global__ void k_rope(float *x, const float *cs, const float *sn, const int *pos, int T, int NX,
                       int HS, size_t total, float sign) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int half = HS / 2;
  int j = (int)(i % half);
  size_t head = i / half; /* (b*T + t) * NX + h */
  size_t t = pos ? (size_t)pos[head / NX] : (head / NX) % T;
  float *v = x + head * HS;
  float c = cs[t * half + j], s = sign * sn[t * half + j];
  float x1 = v[j], x2 = v[j + half];
  v[j] = x1 * c - x2 * s;
  v[j + half] = x2 * c + x1 * s;
}

extern "C" int cuda_rope_tables(cuda_backend_t *b, float *cos_t, float *sin_t, int T, int HS,
                                double theta, const llama_rope_scaling_t *scaling) {
  CB_PROFILE(b, CUDA_OP_ROPE_TABLES);
  size_t n = (size_t)T * (HS / 2);
  float *h = (float *)malloc(2 * n * sizeof(float) + 1);
  if (!h) return TY_EEXHAUSTED;
  cpu_rope_tables(h, h + n, T, HS, theta, scaling);
  cudaError_t e = cudaMemcpy(cos_t, h, n * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(sin_t, h + n, n * sizeof(float), cudaMemcpyHostToDevice);
  free(h);
  return e == cudaSuccess ? 0 : TY_EINTERNAL;
}

extern "C" void cuda_rope_forward(cuda_backend_t *b, float *x, const float *cos_t,
                                  const float *sin_t, const int *pos, int B, int T, int NX,
                                  int HS) {
  CB_PROFILE(b, CUDA_OP_ROPE_FWD);
  size_t total = (size_t)B * T * NX * (HS / 2);
  if (total) TY_LAUNCH(k_rope, cb_blocks(total), CB_THREADS, 0)
  (x, cos_t, sin_t, pos, T, NX, HS, total, 1.0f);
}

extern "C" void cuda_rope_backward(cuda_backend_t *b, float *dx, const float *cos_t,
                                   const float *sin_t, const int *pos, int B, int T, int NX,
                                   int HS) {
  CB_PROFILE(b, CUDA_OP_ROPE_BWD);
  size_t total = (size_t)B * T * NX * (HS / 2);
  if (total) TY_LAUNCH(k_rope, cb_blocks(total), CB_THREADS, 0)
  (dx, cos_t, sin_t, pos, T, NX, HS, total, -1.0f);
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
  CB_PROFILE(b, CUDA_OP_SWIGLU_FWD);
  if (n) TY_LAUNCH(k_swiglu_fwd, cb_blocks(n), CB_THREADS, 0)(h, gate, up, n);
}
extern "C" void cuda_swiglu_backward(cuda_backend_t *b, float *dgate, float *dup, const float *dh,
                                     const float *gate, const float *up, size_t n) {
  CB_PROFILE(b, CUDA_OP_SWIGLU_BWD);
  if (n) TY_LAUNCH(k_swiglu_bwd, cb_blocks(n), CB_THREADS, 0)(dgate, dup, dh, gate, up, n);
}

__global__ void k_add(float *dst, const float *src, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}
extern "C" void cuda_add(cuda_backend_t *b, float *dst, const float *src, size_t n) {
  CB_PROFILE(b, CUDA_OP_ADD);
  if (n) TY_LAUNCH(k_add, cb_blocks(n), CB_THREADS, 0)(dst, src, n);
}

__global__ void k_scale(float *dst, const float *src, float s, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] * s;
}
extern "C" void cuda_scale(cuda_backend_t *b, float *dst, const float *src, float s, size_t n) {
  CB_PROFILE(b, CUDA_OP_SCALE);
  if (n) TY_LAUNCH(k_scale, cb_blocks(n), CB_THREADS, 0)(dst, src, s, n);
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
  CB_PROFILE(b, dt == TY_DTYPE_BF16 ? CUDA_OP_EMBED_FWD_BF16 : CUDA_OP_EMBED_FWD_F32);
  size_t n = (size_t)N * C;
  if (!n) return;
  if (dt == TY_DTYPE_BF16) TY_LAUNCH(k_embed_fwd<__nv_bfloat16>, cb_blocks(n), CB_THREADS, 0)
  (out, tokens, (const __nv_bfloat16 *)embed, C, n);
  else TY_LAUNCH(k_embed_fwd<float>, cb_blocks(n), CB_THREADS, 0)(out, tokens, (const float *)embed,
                                                                  C, n);
}
extern "C" void cuda_embedding_backward(cuda_backend_t *b, float *dembed, const float *dout,
                                        const int *tokens, int N, int C) {
  CB_PROFILE(b, CUDA_OP_EMBED_BWD);
  if (N > 0 && C > 0)
    TY_LAUNCH(k_embed_bwd, cb_blocks((size_t)C), CB_THREADS, 0)(dembed, dout, tokens, N, C);
}

/* ---- projection biases (Qwen2's q/k/v) ---- */

template <typename W>
__global__ void k_bias_fwd(float *out, const W *bias, int OUT, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += to_f32(bias[i % OUT]);
}
/* One thread per column, rows in order: a fixed summation order. */
__global__ void k_bias_bwd(float *dbias, const float *dout, int N, int OUT) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OUT) return;
  float acc = dbias[c];
  for (int r = 0; r < N; r++) acc += dout[(size_t)r * OUT + c];
  dbias[c] = acc;
}
extern "C" void cuda_bias_forward(cuda_backend_t *b, float *out, const void *bias, ty_dtype_t dt,
                                  int N, int OUT) {
  CB_PROFILE(b, dt == TY_DTYPE_BF16 ? CUDA_OP_BIAS_FWD_BF16 : CUDA_OP_BIAS_FWD_F32);
  size_t n = (size_t)N * OUT;
  if (!n) return;
  if (dt == TY_DTYPE_BF16) TY_LAUNCH(k_bias_fwd<__nv_bfloat16>, cb_blocks(n), CB_THREADS, 0)
  (out, (const __nv_bfloat16 *)bias, OUT, n);
  else TY_LAUNCH(k_bias_fwd<float>, cb_blocks(n), CB_THREADS, 0)(out, (const float *)bias, OUT, n);
}
extern "C" void cuda_bias_backward(cuda_backend_t *b, float *dbias, const float *dout, int N,
                                   int OUT) {
  CB_PROFILE(b, CUDA_OP_BIAS_BWD);
  if (N > 0 && OUT > 0)
    TY_LAUNCH(k_bias_bwd, cb_blocks((size_t)OUT), CB_THREADS, 0)(dbias, dout, N, OUT);
}

/* ---- cross-entropy ---- */

/* weights (N) or NULL: a row of weight 0 gets loss 0 (its logits are not
 * read past the max and sum, which every row computes alike). */
__global__ void k_ce_fwd(float *losses, const float *logits, const int *targets,
                         const float *weights, int V) {
  const float *l = logits + (size_t)blockIdx.x * V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx);
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(l[j] - mx);
  sum = block_sum(sum);
  if (threadIdx.x == 0)
    losses[blockIdx.x] = weights && weights[blockIdx.x] == 0.0f
                             ? 0.0f
                             : (float)(log(sum) + mx - l[targets[blockIdx.x]]);
}
__global__ void k_ce_bwd(float *logits, const int *targets, const float *weights, int V,
                         float dloss) {
  if (weights) dloss *= weights[blockIdx.x];
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
                                         const int *targets, const float *weights, int N, int V,
                                         double *sum) {
  CB_PROFILE(b, CUDA_OP_CE_FWD);
  if (N <= 0) {
    if (sum) *sum = 0.0;
    return 0;
  }
  TY_LAUNCH(k_ce_fwd, N, CB_THREADS, 0)(losses, logits, targets, weights, V);
  return sum ? fetch_sum(b, losses, (size_t)N, 0, sum) : 0;
}
extern "C" void cuda_crossentropy_backward(cuda_backend_t *b, float *logits, const int *targets,
                                           const float *weights, int N, int V, float dloss) {
  CB_PROFILE(b, CUDA_OP_CE_BWD);
  if (N > 0) TY_LAUNCH(k_ce_bwd, N, CB_THREADS, 0)(logits, targets, weights, V, dloss);
}
extern "C" int cuda_sum(cuda_backend_t *b, const float *x, size_t n, double *out) {
  CB_PROFILE(b, CUDA_OP_SUM);
  return fetch_sum(b, x, n, 0, out);
}
extern "C" int cuda_sumsq(cuda_backend_t *b, const float *x, size_t n, double *out) {
  CB_PROFILE(b, CUDA_OP_SUMSQ);
  return fetch_sum(b, x, n, 1, out);
}

/* ---- LoRA ---- */

extern "C" int cuda_lora_forward(cuda_backend_t *b, float *out, float *xa, const float *x,
                                 const float *A, const float *B, int n, int IN, int OUT, int R,
                                 float scale) {
  CB_PROFILE(b, CUDA_OP_LORA_FWD);
  int rc = mm_nt(b, TY_DTYPE_F32, xa, x, A, n, IN, R, 1.0f, 0.0f);
  if (!rc) rc = mm_nt(b, TY_DTYPE_F32, out, xa, B, n, R, OUT, scale, 1.0f);
  return rc;
}

extern "C" int cuda_lora_backward(cuda_backend_t *b, float *dx, float *dA, float *dB, float *dxa,
                                  const float *dout, const float *x, const float *xa,
                                  const float *A, const float *B, int n, int IN, int OUT, int R,
                                  float scale) {
  CB_PROFILE(b, CUDA_OP_LORA_BWD);
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
  CB_PROFILE(b, CUDA_OP_ADAMW);
  if (!n) return;
  /* The host-side factors exactly as optim_step computes them. */
  double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
  float decay = decay_on ? (float)(1.0 - c->lr * c->weight_decay) : 1.0f;
  TY_LAUNCH(k_adamw, cb_blocks(n), CB_THREADS, 0)
  (p, g, m, v, n, (float)c->beta1, (float)c->beta2, (float)(1.0 - c->beta1),
   (float)(1.0 - c->beta2), (float)c->eps, decay, (float)grad_scale, (float)(c->lr / bc1),
   (float)sqrt(bc2));
}
