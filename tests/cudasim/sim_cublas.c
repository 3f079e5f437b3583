/* sim_cublas.c - libcublas.so.99 for the simulated device: Sgemm and GemmEx
 * (fp32 or bf16 operands, fp32 result) queued on the legacy stream and
 * computed by the host's BLAS when the stream runs, operands checked to lie
 * in device memory. bf16 operands are widened to fp32 first, which is what
 * fp32 accumulation of bf16 products computes. */
#include <cblas.h>
#include <stdint.h>
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
  int bf16;
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
  }
  cblas_sgemm(CblasColMajor, g->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
              g->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g->m, g->n, g->k, g->alpha, A,
              g->lda, B, g->ldb, g->beta, g->C, g->ldc);
  free(wa);
  free(wb);
  return 1;
}

static cublasStatus_t queue_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                 float alpha, const void *A, int lda, const void *B, int ldb,
                                 float beta, float *C, int ldc, int bf16) {
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m ||
      lda < 1 || ldb < 1 || ldc < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!m || !n) return CUBLAS_STATUS_SUCCESS;
  size_t esz = bf16 ? 2 : 4;
  size_t na = ta == CUBLAS_OP_N ? span(m, k, lda) : span(k, m, lda);
  size_t nb = tb == CUBLAS_OP_N ? span(k, n, ldb) : span(n, k, ldb);
  if (k) {
    sim_require_device(A, na * esz, "cuBLAS gemm: A");
    sim_require_device(B, nb * esz, "cuBLAS gemm: B");
  }
  sim_require_device(C, span(m, n, ldc) * 4, "cuBLAS gemm: C");
  gemm_t *g = malloc(sizeof *g);
  if (!g) return CUBLAS_STATUS_ALLOC_FAILED;
  *g = (gemm_t){ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, A, B, C, bf16};
  sim_enqueue(NULL, bf16 ? "cublasGemmEx" : "cublasSgemm", gemm_run, g, free);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float *alpha, const float *A, int lda,
                              const float *B, int ldb, const float *beta, float *C, int ldc) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  return queue_gemm(ta, tb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc, 0);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
                            void *C, cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  (void)algo;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (compute != CUBLAS_COMPUTE_32F || Ctype != CUDA_R_32F || Atype != Btype ||
      (Atype != CUDA_R_32F && Atype != CUDA_R_16BF))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return queue_gemm(ta, tb, m, n, k, *(const float *)alpha, A, lda, B, ldb, *(const float *)beta, C,
                    ldc, Atype == CUDA_R_16BF);
}
