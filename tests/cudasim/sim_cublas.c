/* sim_cublas.c - libcublas.so.99 for the simulated device: Sgemm, GemmEx
 * and GemmBatchedEx (fp32 or bf16 operands, fp32 result) queued on the
 * legacy stream and computed by the host's BLAS when the stream runs,
 * operands checked to lie in device memory (a batch's pointer arrays too,
 * and its operands when it runs, as the device reads them then). bf16
 * operands are widened to fp32 first, which is what fp32 accumulation of
 * bf16 products computes; with CUBLAS_COMPUTE_32F_FAST_TF32, fp32 operands
 * are rounded to TF32 (10 mantissa bits, to nearest) first, as tensor cores
 * take them, so that callers see the precision they would get. */
#include <cblas.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "cudasim.h"

struct cublasContext {
  int math_mode;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  int n;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  /* One BLAS thread: the products are small, and threads spinning between
   * them would only take the cores from the other ranks' processes. */
  openblas_set_num_threads(1);
  *h = calloc(1, sizeof **h);
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  h->math_mode = (int)mode;
  return CUBLAS_STATUS_SUCCESS;
}

typedef struct {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  const void *A, *B;
  float *C;
  int bf16, tf32;
} gemm_t;

static float *widen(const uint16_t *x, size_t n) {
  float *f = malloc((n ? n : 1) * sizeof *f);
  if (!f) sim_fatal("out of host memory");
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)x[i] << 16;
    memcpy(&f[i], &u, sizeof u);
  }
  return f;
}

/* A copy of x (n floats) rounded to TF32: the low 13 mantissa bits
 * dropped, to nearest with ties away from zero; infinities and NaNs kept. */
static float *to_tf32(const float *x, size_t n) {
  float *f = malloc((n ? n : 1) * sizeof *f);
  if (!f) sim_fatal("out of host memory");
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & ~0x1fffu;
    memcpy(&f[i], &u, sizeof u);
  }
  return f;
}

/* Elements spanned by a column-major (rows, cols) operand with leading
 * dimension ld. */
static size_t span(int rows, int cols, int ld) {
  return rows && cols ? (size_t)ld * (size_t)(cols - 1) + (size_t)rows : 0;
}

static int gemm_run(void *arg) {
  gemm_t *g = arg;
  size_t na = g->ta == CUBLAS_OP_N ? span(g->m, g->k, g->lda) : span(g->k, g->m, g->lda);
  size_t nb = g->tb == CUBLAS_OP_N ? span(g->k, g->n, g->ldb) : span(g->n, g->k, g->ldb);
  const float *A = g->A, *B = g->B;
  float *wa = NULL, *wb = NULL;
  if (g->bf16) {
    A = wa = widen(g->A, na);
    B = wb = widen(g->B, nb);
  } else if (g->tf32) {
    A = wa = to_tf32(g->A, na);
    B = wb = to_tf32(g->B, nb);
  }
  cblas_sgemm(CblasColMajor, g->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
              g->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g->m, g->n, g->k, g->alpha, A,
              g->lda, B, g->ldb, g->beta, g->C, g->ldc);
  free(wa);
  free(wb);
  return 1;
}

/* cuBLAS's argument rules for one product's shape. */
static int gemm_args_ok(const gemm_t *g) {
  return g->m >= 0 && g->n >= 0 && g->k >= 0 && g->lda >= (g->ta == CUBLAS_OP_N ? g->m : g->k) &&
         g->ldb >= (g->tb == CUBLAS_OP_N ? g->k : g->n) && g->ldc >= g->m && g->lda >= 1 &&
         g->ldb >= 1 && g->ldc >= 1;
}

/* Fails the process unless g's operands lie in device memory. */
static void gemm_require(const gemm_t *g, const char *what) {
  size_t esz = g->bf16 ? 2 : 4;
  size_t na = g->ta == CUBLAS_OP_N ? span(g->m, g->k, g->lda) : span(g->k, g->m, g->lda);
  size_t nb = g->tb == CUBLAS_OP_N ? span(g->k, g->n, g->ldb) : span(g->n, g->k, g->ldb);
  char w[96];
  if (g->k) {
    snprintf(w, sizeof w, "%s: A", what);
    sim_require_device(g->A, na * esz, w);
    snprintf(w, sizeof w, "%s: B", what);
    sim_require_device(g->B, nb * esz, w);
  }
  snprintf(w, sizeof w, "%s: C", what);
  sim_require_device(g->C, span(g->m, g->n, g->ldc) * 4, w);
}

static cublasStatus_t queue_gemm(const gemm_t *args) {
  if (!gemm_args_ok(args)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!args->m || !args->n) return CUBLAS_STATUS_SUCCESS;
  gemm_require(args, "cuBLAS gemm");
  gemm_t *g = malloc(sizeof *g);
  if (!g) return CUBLAS_STATUS_ALLOC_FAILED;
  *g = *args;
  sim_enqueue(NULL, args->bf16 ? "cublasGemmEx" : "cublasSgemm", gemm_run, g, free);
  return CUBLAS_STATUS_SUCCESS;
}

/* The compute and data types trainyard uses: fp32 results with fp32
 * accumulation of fp32 or bf16 operands (fp32 ones optionally as TF32). */
static int types_ok(cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t c) {
  if (ct != CUDA_R_32F || at != bt || (at != CUDA_R_32F && at != CUDA_R_16BF)) return 0;
  return c == CUBLAS_COMPUTE_32F || (c == CUBLAS_COMPUTE_32F_FAST_TF32 && at == CUDA_R_32F);
}

/* The product of a *Ex call (types checked by types_ok; host scalars). */
static gemm_t ex_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                      int ldb, const void *beta, void *C, int ldc, cublasComputeType_t c) {
  return (gemm_t){.ta = ta,
                  .tb = tb,
                  .m = m,
                  .n = n,
                  .k = k,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = *(const float *)alpha,
                  .beta = *(const float *)beta,
                  .A = A,
                  .B = B,
                  .C = C,
                  .bf16 = at == CUDA_R_16BF,
                  .tf32 = c == CUBLAS_COMPUTE_32F_FAST_TF32};
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float *alpha, const float *A, int lda,
                              const float *B, int ldb, const float *beta, float *C, int ldc) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  return queue_gemm(&(gemm_t){ta, tb, m, n, k, lda, ldb, ldc, *alpha, *beta, A, B, C, 0, 0});
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
                            void *C, cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  (void)algo;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!types_ok(Atype, Btype, Ctype, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  gemm_t g = ex_gemm(ta, tb, m, n, k, alpha, A, Atype, lda, B, ldb, beta, C, ldc, compute);
  return queue_gemm(&g);
}

/* A batch: the shared shape and the device's pointer arrays, read when it
 * runs (work queued before it may have written them). */
typedef struct {
  gemm_t g;
  const void *const *A, *const *B;
  void *const *C;
  int count;
} batch_t;

/* 1 when two column-major (m, n) results with leading dimension ld, d
 * floats apart, share an element: |d| = dc * ld + dr for some |dc| < n,
 * |dr| < m. */
static int results_meet(ptrdiff_t d, int m, int n, int ld) {
  if (d < 0) d = -d;
  ptrdiff_t q = d / ld, r = d % ld;
  return (r < m && q < n) || (ld - r < m && q + 1 < n);
}

static int batch_run(void *arg) {
  batch_t *bt = arg;
  /* The products run in parallel on a GPU: results that share an element
   * race. */
  const gemm_t *s = &bt->g;
  for (int i = 0; i < bt->count; i++)
    for (int j = 0; j < i; j++) {
      ptrdiff_t bytes = (const char *)bt->C[i] - (const char *)bt->C[j];
      if (bytes % 4 ? (size_t)(bytes < 0 ? -bytes : bytes) < span(s->m, s->n, s->ldc) * 4
                    : results_meet(bytes / 4, s->m, s->n, s->ldc))
        sim_fatal("cuBLAS batched gemm: results %d and %d (%p, %p) share elements", j, i, bt->C[j],
                  bt->C[i]);
    }
  for (int i = 0; i < bt->count; i++) {
    gemm_t g = bt->g;
    g.A = bt->A[i], g.B = bt->B[i], g.C = bt->C[i];
    char what[64];
    snprintf(what, sizeof what, "cuBLAS batched gemm %d of %d", i, bt->count);
    gemm_require(&g, what);
    gemm_run(&g);
  }
  return 1;
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha,
                                   const void *const Aarray[], cudaDataType Atype, int lda,
                                   const void *const Barray[], cudaDataType Btype, int ldb,
                                   const void *beta, void *const Carray[], cudaDataType Ctype,
                                   int ldc, int batchCount, cublasComputeType_t compute,
                                   cublasGemmAlgo_t algo) {
  (void)algo;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!types_ok(Atype, Btype, Ctype, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const gemm_t g =
      ex_gemm(ta, tb, m, n, k, alpha, NULL, Atype, lda, NULL, ldb, beta, NULL, ldc, compute);
  if (batchCount < 0 || !gemm_args_ok(&g)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!m || !n || !batchCount) return CUBLAS_STATUS_SUCCESS;
  size_t arr = (size_t)batchCount * sizeof(void *);
  sim_require_device(Aarray, arr, "cuBLAS batched gemm: A's pointer array");
  sim_require_device(Barray, arr, "cuBLAS batched gemm: B's pointer array");
  sim_require_device(Carray, arr, "cuBLAS batched gemm: C's pointer array");
  batch_t *bt = malloc(sizeof *bt);
  if (!bt) return CUBLAS_STATUS_ALLOC_FAILED;
  bt->g = g;
  bt->A = Aarray, bt->B = Barray, bt->C = Carray, bt->count = batchCount;
  sim_enqueue(NULL, "cublasGemmBatchedEx", batch_run, bt, free);
  return CUBLAS_STATUS_SUCCESS;
}
