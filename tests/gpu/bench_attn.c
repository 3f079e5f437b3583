/* bench_attn.c - causal GQA attention on one GPU, three paths on the same
 * inputs: the fp32 tiled kernels, the fp32 per-row ones
 * (cuda_backend_attention_rows) and the products on tensor cores (TF32,
 * with the workspace a bf16 model gets: 128 MiB of scores). REPS timed
 * forward passes and REPS backward passes of each after one of each to
 * warm up, timed by the host's clock around them. Prints one JSON line:
 * milliseconds per pass for each path, the tiled path's speed-up over the
 * rows and the tensor-core path's over the tiles, the TFLOP/s of both (the
 * causal half of QK^T and PV forward, 2 products, and backward, 4, at 2
 * FLOPs a multiply-add, as bench_lora counts them: the tensor-core path
 * computes more, whole chunks of keys, but is credited as much), and the
 * largest difference between a path's outputs (out, dq, dk, dv) and the
 * tiled path's, relative to the largest magnitude of each: over 1e-4 for
 * the rows, or 4e-3 for TF32, is a mismatch (exit 1).
 *
 * usage: bench_attn B T NH NKV HS REPS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tests/gpu/gpu_util.h"
#include "worker/cuda/backend_cuda.h"

typedef struct {
  float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *scr;
} attn_bufs_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Milliseconds per forward and per backward pass through one path: one
 * of each to warm up, then the host's clock around REPS queued passes and
 * a wait for them. */
static int time_path(cuda_backend_t *cb, void *ws, size_t wsb, const attn_bufs_t *a, int B, int T,
                     int NH, int NKV, int HS, int reps, double *fwd_ms, double *bwd_ms, char *err,
                     size_t errlen) {
  for (int timed = 0; timed < 2; timed++) {
    const int n = timed ? reps : 1;
    if (cuda_backend_sync(cb, err, errlen)) return 1;
    double t0 = now_s();
    for (int it = 0; it < n; it++)
      if (cuda_attention_forward(cb, ws, wsb, a->out, a->lse, a->q, a->k, a->v, NULL, B, T, NH, NKV,
                                 HS))
        return snprintf(err, errlen, "cuBLAS refused a product of the forward pass"), 1;
    if (cuda_backend_sync(cb, err, errlen)) return 1;
    double t1 = now_s();
    for (int it = 0; it < n; it++)
      if (cuda_attention_backward(cb, ws, wsb, a->dq, a->dk, a->dv, a->scr, a->dout, a->out, a->lse,
                                  a->q, a->k, a->v, NULL, B, T, NH, NKV, HS))
        return snprintf(err, errlen, "cuBLAS refused a product of the backward pass"), 1;
    if (cuda_backend_sync(cb, err, errlen)) return 1;
    *fwd_ms = (t1 - t0) * 1e3 / n, *bwd_ms = (now_s() - t1) * 1e3 / n;
  }
  return 0;
}

/* max |x - y| / max |y| over two device arrays of n floats (NaN: infinite). */
static double max_diff(const float *dx, const float *dy, size_t n) {
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  gpu_get(x, dx, n * sizeof(float));
  gpu_get(y, dy, n * sizeof(float));
  double d, m;
  size_t at;
  gpu_worst_diff(x, y, n, &d, &at, &m);
  free(x), free(y);
  return m > 0 ? d / m : d;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: bench_attn B T NH NKV HS REPS\n");
    return 2;
  }
  int B = atoi(argv[1]), T = atoi(argv[2]), NH = atoi(argv[3]), NKV = atoi(argv[4]);
  int HS = atoi(argv[5]), reps = atoi(argv[6]);
  if (B < 1 || T < 1 || NH < 1 || NKV < 1 || NH % NKV || HS < 1 || reps < 1) {
    fprintf(stderr, "bench_attn: B, T, NH, NKV, HS, REPS must be positive, NKV dividing NH\n");
    return 2;
  }
  gpu_require_device("bench_attn");
  char err[512];
  cuda_backend_t *cb;
  if (cuda_backend_create(&cb, 0, err, sizeof err)) {
    fprintf(stderr, "bench_attn: %s\n", err);
    return 1;
  }
  const size_t n = (size_t)B * T, qn = n * NH * HS, kvn = n * NKV * HS, nl = (size_t)B * NH * T;
  float *h = malloc((qn > kvn ? qn : kvn) * sizeof(float));
  attn_bufs_t a[3]; /* tiled, per row, tensor cores: the same inputs */
  for (int p = 0; p < 3; p++) {
    gpu_fill(h, qn, 1, 1), a[p].q = gpu_dup(h, qn * sizeof(float));
    gpu_fill(h, kvn, 2, 1), a[p].k = gpu_dup(h, kvn * sizeof(float));
    gpu_fill(h, kvn, 3, 1), a[p].v = gpu_dup(h, kvn * sizeof(float));
    gpu_fill(h, qn, 4, 1), a[p].dout = gpu_dup(h, qn * sizeof(float));
    a[p].out = gpu_dup(NULL, qn * sizeof(float)), a[p].dq = gpu_dup(NULL, qn * sizeof(float));
    a[p].dk = gpu_dup(NULL, kvn * sizeof(float)), a[p].dv = gpu_dup(NULL, kvn * sizeof(float));
    a[p].lse = gpu_dup(NULL, nl * sizeof(float)), a[p].scr = gpu_dup(NULL, nl * sizeof(float));
  }
  free(h);
  const size_t wsb = cuda_attention_tf32_bytes(B, T, NH, (size_t)128 << 20);
  void *ws = gpu_dup(NULL, wsb);
  double ms[3][2];
  for (int p = 0; p < 3; p++) {
    cuda_backend_attention_rows(cb, p == 1);
    if (time_path(cb, p == 2 ? ws : NULL, wsb, &a[p], B, T, NH, NKV, HS, reps, &ms[p][0], &ms[p][1],
                  err, sizeof err)) {
      fprintf(stderr, "bench_attn: %s\n", err);
      return 1;
    }
  }
  /* The largest difference of path p's outputs from the tiled path's. */
  double diff[3] = {0, 0, 0};
  for (int p = 1; p < 3; p++) {
    const double d[] = {max_diff(a[p].out, a[0].out, qn), max_diff(a[p].dq, a[0].dq, qn),
                        max_diff(a[p].dk, a[0].dk, kvn), max_diff(a[p].dv, a[0].dv, kvn)};
    for (int i = 0; i < 4; i++) diff[p] = d[i] > diff[p] ? d[i] : diff[p];
  }
  const int ok = diff[1] < 1e-4 && diff[2] < 4e-3;
  /* The causal half of T x T, with its diagonal. */
  const double pairs = (double)B * NH * T * (T + 1) / 2, flop = 3 * 2 * 2 * pairs * HS;
  printf(
      "{\"status\":\"%s\",\"B\":%d,\"T\":%d,\"NH\":%d,\"NKV\":%d,\"HS\":%d,\"reps\":%d,"
      "\"tiled_fwd_ms\":%.3f,\"tiled_bwd_ms\":%.3f,\"rows_fwd_ms\":%.3f,\"rows_bwd_ms\":%.3f,"
      "\"tf32_fwd_ms\":%.3f,\"tf32_bwd_ms\":%.3f,\"tf32_workspace_mib\":%.1f,"
      "\"speedup_fwd\":%.2f,\"speedup_bwd\":%.2f,\"tf32_speedup_fwd\":%.2f,"
      "\"tf32_speedup_bwd\":%.2f,\"tiled_tflops\":%.2f,\"tf32_tflops\":%.2f,"
      "\"max_diff\":%.3g,\"tf32_max_diff\":%.3g}\n",
      ok ? "ok" : "mismatch", B, T, NH, NKV, HS, reps, ms[0][0], ms[0][1], ms[1][0], ms[1][1],
      ms[2][0], ms[2][1], (double)wsb / 1048576.0, ms[1][0] / ms[0][0], ms[1][1] / ms[0][1],
      ms[0][0] / ms[2][0], ms[0][1] / ms[2][1], flop / ((ms[0][0] + ms[0][1]) * 1e-3) / 1e12,
      flop / ((ms[2][0] + ms[2][1]) * 1e-3) / 1e12, diff[1], diff[2]);
  for (int p = 0; p < 3; p++) {
    float *ptrs[] = {a[p].q,    a[p].k,  a[p].v,  a[p].out, a[p].lse,
                     a[p].dout, a[p].dq, a[p].dk, a[p].dv,  a[p].scr};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) cudaFree(ptrs[i]);
  }
  cudaFree(ws);
  cuda_backend_free(cb);
  return ok ? 0 : 1;
}
