/* sim_check.cpp - the simulated device checks what it claims to check
 * (ctest sim/device): block reductions through shuffles and __syncthreads
 * give the right sums; a barrier that only part of a warp reaches, an
 * overrun of a device allocation, a use after free, a host read of device
 * memory and a collective the ranks disagree on each stop the process
 * saying so; work on one stream that another reads without an event, and a
 * pinned buffer read before its copy ran, show stale data; a bad launch
 * and an allocation past the device's memory fail as CUDA's do;
 * CUDA_VISIBLE_DEVICES narrows the devices by CUDA's rule; a batched cuBLAS
 * product reads its pointer arrays when it runs, rounds fp32 operands to
 * TF32 when asked to, and stops the process where two of its results
 * share an element (they would race on a GPU); timing events measure the
 * time their stream spent between them, refuse to be read before they
 * ran, and refuse as CUDA does when unrecorded or made without timing. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <time.h>

#include "cudasim.h"

static int g_failed;
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
      g_failed = 1;                               \
    }                                             \
  } while (0)

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/* out[block] = sum of x over the block's threads, by warps then warp 0. */
__global__ void k_block_sum(float *out, const float *x) {
  __shared__ float part[32];
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  float v = warp_sum(x[i]);
  if (lane == 0) part[w] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
  if (w == 0) v = warp_sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}
/* Half of warp 0 waits at __syncthreads, the other half at a shuffle. */
__global__ void k_split_warp(float *out) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    out[0] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void k_write(float *d, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = 1.0f;
}

/* Runs fn in a child; 1 when it died of `sig` with `msg` in its stderr. */
static int dies(void (*fn)(void), int sig, const char *msg) {
  int fd[2];
  if (pipe(fd)) return 0;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    fn();
    _exit(0);
  }
  close(fd[1]);
  char buf[4096];
  size_t got = 0;
  ssize_t r;
  while (got < sizeof buf - 1 && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0)
    got += (size_t)r;
  buf[got] = '\0';
  close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  int ok = WIFSIGNALED(st) && WTERMSIG(st) == sig && strstr(buf, msg);
  if (!ok) printf("  child: status %d, stderr: %s\n", st, buf);
  return ok;
}

static void split_warp(void) {
  float *d;
  cudaMalloc((void **)&d, 4);
  TY_LAUNCH(k_split_warp, 1, 32, 0)(d);
  cudaDeviceSynchronize();
}
static void overrun(void) {
  float *d;
  cudaMalloc((void **)&d, 4096); /* a whole page: its end is the guard page */
  TY_LAUNCH(k_write, 5, 256, 0)(d, 1025);
  cudaDeviceSynchronize();
}
static void after_free(void) {
  float *d;
  cudaMalloc((void **)&d, 1024);
  cudaFree(d);
  TY_LAUNCH(k_write, 1, 256, 0)(d, 256);
  cudaDeviceSynchronize();
}
static void host_copy_past_end(void) {
  float *d, h[300] = {0};
  cudaMalloc((void **)&d, 1024);
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
}
static void host_reads_device(void) {
  float *d;
  cudaMalloc((void **)&d, 1024);
  volatile float x = d[3];
  (void)x;
}
static ncclUniqueId g_id;
static void mismatched_collective(void) {
  pid_t peer = fork();
  int rank = peer == 0 ? 1 : 0;
  ncclComm_t c;
  float *d;
  cudaMalloc((void **)&d, 64);
  ncclCommInitRank(&c, 2, g_id, rank);
  ncclAllReduce(d, d, rank ? 8 : 4, ncclFloat, ncclSum, c, NULL);
  cudaDeviceSynchronize();
  if (peer == 0) _exit(0);
  waitpid(peer, NULL, 0);
}

/* Two products of one batch: C0 = A0 B and C1 = A1 B, column-major 2 x 2
 * with k = 1 (each C the outer product of a column of A and a row of B);
 * their results at c0, c1. The pointer arrays are written by a copy queued
 * before the product. */
static float *g_mem; /* A0 (2), A1 (2), B (2), then results */
static void batch(cublasHandle_t h, float *c0, float *c1, int ldc, cublasComputeType_t ct) {
  const void *ptrs[6] = {g_mem, g_mem + 2, g_mem + 4, g_mem + 4, c0, c1};
  void **dptrs;
  cudaMalloc((void **)&dptrs, sizeof ptrs);
  cudaMemcpyAsync(dptrs, ptrs, sizeof ptrs, cudaMemcpyHostToDevice, NULL);
  const float one = 1.0f, zero = 0.0f;
  cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, &one, (const void *const *)dptrs,
                      CUDA_R_32F, 2, (const void *const *)(dptrs + 2), CUDA_R_32F, 1, &zero,
                      dptrs + 4, CUDA_R_32F, ldc, 2, ct, CUBLAS_GEMM_DEFAULT);
  cudaDeviceSynchronize();
  cudaFree(dptrs);
}
static void overlapping_batch(void) {
  cublasHandle_t h;
  cublasCreate_v2(&h);
  /* ldc 3: C0 holds [6, 8) and [9, 11), C1 at 9 shares element 9. */
  batch(h, g_mem + 6, g_mem + 9, 3, CUBLAS_COMPUTE_32F);
}

/* An op that keeps its stream busy for 20 ms of host time. */
static int busy_20ms(void *arg) {
  (void)arg;
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
  return 1;
}

/* cudaEventElapsedTime over an op of 20 ms on the legacy stream. */
static void check_event_times(bool lazy) {
  cudaEvent_t a, b, quiet, fresh;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventCreate(&fresh);
  cudaEventCreateWithFlags(&quiet, cudaEventDisableTiming);
  float ms = -1.0f;
  cudaEventRecord(a, NULL);
  sim_enqueue(NULL, "20 ms of work", busy_20ms, NULL, NULL);
  cudaEventRecord(b, NULL);
  cudaEventRecord(quiet, NULL);
  if (lazy)
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorNotReady,
          "the time between events read before their stream ran");
  CHECK(cudaEventElapsedTime(&ms, a, fresh) == cudaErrorInvalidResourceHandle,
        "the time to an event never recorded");
  cudaDeviceSynchronize();
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 19.0f && ms < 2000.0f,
        "20 ms of work between two events measures %g ms", ms);
  float back = 0.0f;
  CHECK(cudaEventElapsedTime(&back, b, a) == cudaSuccess && back == -ms,
        "the events the other way round: %g ms, want %g", back, -ms);
  CHECK(cudaEventElapsedTime(&ms, a, quiet) == cudaErrorInvalidResourceHandle,
        "the time to an event made with cudaEventDisableTiming");
  /* Recorded again: the new record's time, once it ran; an event
   * destroyed with its record queued is freed after it ran. */
  cudaEventRecord(b, NULL);
  if (lazy)
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorNotReady,
          "an event recorded again still gives its earlier time");
  cudaEventRecord(fresh, NULL);
  cudaEventDestroy(fresh);
  cudaEventSynchronize(b);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 19.0f,
        "after recording again: %g ms", ms);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(quiet);
}

/* The device count a fresh process sees with CUDA_VISIBLE_DEVICES=v over
 * TY_SIM_GPUS=gpus (this program run again with "count"). */
static int visible(const char *self, int gpus, const char *v) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    char g[16];
    snprintf(g, sizeof g, "%d", gpus);
    setenv("TY_SIM_GPUS", g, 1);
    if (v)
      setenv("CUDA_VISIBLE_DEVICES", v, 1);
    else
      unsetenv("CUDA_VISIBLE_DEVICES");
    execl(self, self, "count", (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "count")) {
    int n = -1;
    cudaError_t e = cudaGetDeviceCount(&n);
    return e == cudaSuccess ? n : e == cudaErrorNoDevice && n == 0 ? 0 : 100;
  }
  /* Reductions: 1024 threads a block, 3 blocks. */
  const int NB = 3, NT = 1024;
  float *hx = (float *)malloc(NB * NT * sizeof(float)), want[NB] = {0}, got[NB];
  for (int i = 0; i < NB * NT; i++) hx[i] = (float)(i % 7) - 3.0f, want[i / NT] += hx[i];
  float *dx, *dout;
  cudaMalloc((void **)&dx, NB * NT * sizeof(float));
  cudaMalloc((void **)&dout, NB * sizeof(float));
  cudaMemcpy(dx, hx, NB * NT * sizeof(float), cudaMemcpyHostToDevice);
  TY_LAUNCH(k_block_sum, NB, NT, 0)(dout, dx);
  cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost);
  for (int b = 0; b < NB; b++)
    CHECK(got[b] == want[b], "block %d sums to %g, want %g", b, got[b], want[b]);

  CHECK(dies(split_warp, SIGABRT, "a barrier not every thread reaches"), "a split warp");
  CHECK(dies(overrun, SIGSEGV, "device memory fault"), "an overrun");
  CHECK(dies(after_free, SIGSEGV, "device memory fault"), "a use after free");
  CHECK(dies(host_reads_device, SIGSEGV, "host code touched device memory"), "a host read");
  CHECK(dies(host_copy_past_end, SIGABRT, "not inside one live device allocation"), "a long copy");
  CHECK(ncclGetUniqueId(&g_id) == ncclSuccess, "ncclGetUniqueId");
  CHECK(dies(mismatched_collective, SIGABRT, "issued AllReduce(count 8"), "a mismatched call");

  /* A side stream's memset read by the legacy stream: without an event the
   * copy runs first (stale), with one it waits. */
  cudaStream_t s;
  cudaEvent_t ev;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  float *dbuf, h4[4];
  cudaMalloc((void **)&dbuf, sizeof h4);
  cudaMemset(dbuf, 0, sizeof h4);
  cudaMemsetAsync(dbuf, 0x3f, sizeof h4, s); /* 0x3f3f3f3f = 0.747 */
  cudaMemcpy(h4, dbuf, sizeof h4, cudaMemcpyDeviceToHost);
  const char *order = getenv("TY_SIM_ORDER");
  const bool lazy = !order || !*order || !strcmp(order, "lazy"); /* else side streams run at once */
  if (lazy) CHECK(h4[0] == 0.0f, "read without an event saw %g: the side stream ran first", h4[0]);
  cudaMemsetAsync(dbuf, 0, sizeof h4, s);
  cudaEventRecord(ev, s);
  cudaStreamWaitEvent(NULL, ev, 0);
  cudaMemcpy(h4, dbuf, sizeof h4, cudaMemcpyDeviceToHost);
  CHECK(h4[0] == 0.0f, "read after the event saw %g", h4[0]);

  /* A pinned destination is written when its stream runs, not before. */
  float *pin;
  cudaHostAlloc((void **)&pin, sizeof h4, cudaHostAllocDefault);
  pin[0] = 5.0f;
  cudaMemcpyAsync(pin, dbuf, sizeof h4, cudaMemcpyDeviceToHost, s);
  if (lazy) CHECK(pin[0] == 5.0f, "a pinned copy landed before its stream ran");
  cudaStreamSynchronize(s);
  CHECK(pin[0] == 0.0f, "the pinned copy did not land by the sync (%g)", pin[0]);
  cudaFreeHost(pin);

  /* A launch of 2048 threads a block is refused, as on a GPU. */
  cudaGetLastError();
  TY_LAUNCH(k_write, 1, 2048, 0)(dbuf, 4);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "a 2048-thread block ran");
  /* Memory: what cudaMemGetInfo shows, and no more. */
  size_t fr, tot;
  cudaMemGetInfo(&fr, &tot);
  void *big = NULL;
  CHECK(cudaMalloc(&big, tot) == cudaErrorMemoryAllocation, "all of the device's memory again");
  cudaGetLastError();
  size_t fr2;
  CHECK(cudaMalloc(&big, 1 << 20) == cudaSuccess && cudaMemGetInfo(&fr2, &tot) == cudaSuccess &&
            fr - fr2 == 1 << 20,
        "1 MiB allocated shows as %zu bytes", fr - fr2);
  cudaFree(big);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  check_event_times(lazy);
  cudaFree(dbuf);
  cudaFree(dx);
  cudaFree(dout);
  free(hx);

  /* A batched product: results interleaved (ldc 4, C1 in C0's gaps) are
   * allowed; fp32 is exact, TF32 drops the low 13 mantissa bits. */
  {
    cublasHandle_t h;
    CHECK(cublasCreate_v2(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    cudaMalloc((void **)&g_mem, 32 * sizeof(float));
    const float x = 1.0f + 1.0f / 4096; /* 1 + 2^-12: not a TF32 number */
    const float in[6] = {x, 2, 3, 4, 1, 1};
    cudaMemcpy(g_mem, in, sizeof in, cudaMemcpyHostToDevice);
    float out[8];
    for (int tf = 0; tf < 2; tf++) {
      batch(h, g_mem + 8, g_mem + 10, 4, tf ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
      cudaMemcpy(out, g_mem + 8, sizeof out, cudaMemcpyDeviceToHost);
      /* C0 = [x 2; x 2] at 8, 9 and 12, 13; C1 = [3 4; 3 4] at 10, 11, 14, 15. */
      const float a = tf ? 1.0f : x;
      CHECK(out[0] == a && out[1] == 2 && out[4] == a && out[5] == 2 && out[2] == 3 &&
                out[3] == 4 && out[6] == 3 && out[7] == 4,
            "batched product (%s): %g %g %g %g | %g %g %g %g", tf ? "TF32" : "fp32", out[0], out[1],
            out[4], out[5], out[2], out[3], out[6], out[7]);
    }
    cublasDestroy_v2(h);
    CHECK(dies(overlapping_batch, SIGABRT, "share elements"), "overlapping batched results");
    cudaFree(g_mem);
  }

  /* CUDA_VISIBLE_DEVICES: the listed ordinals up to the first bad one. */
  static const struct {
    int gpus;
    const char *v;
    int want;
  } vis[] = {{2, NULL, 2}, {2, "1", 1},     {2, "1,0", 2}, {4, "3,1", 2}, {2, "", 0},
             {2, "2", 0},  {2, "0,5,1", 1}, {2, "1,1", 1}, {3, "x", 0},   {0, "0", 0}};
  for (size_t i = 0; i < sizeof vis / sizeof vis[0]; i++) {
    int n = visible(argv[0], vis[i].gpus, vis[i].v);
    CHECK(n == vis[i].want, "TY_SIM_GPUS=%d CUDA_VISIBLE_DEVICES=%s: %d devices, want %d",
          vis[i].gpus, vis[i].v ? vis[i].v : "(unset)", n, vis[i].want);
  }
  printf("%s sim/device: the simulated device's checks work\n", g_failed ? "FAIL" : "ok");
  return g_failed;
}
