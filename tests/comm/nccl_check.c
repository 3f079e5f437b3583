/* nccl_check.c - the NCCL backend on real GPUs (ctest label gpu): one rank
 * per visible device (at most 4), each collective with uneven counts on
 * device buffers, results copied back and checked exactly; an all-reduce
 * of a device buffer still being written by work queued on the compute
 * stream; an all-reduce of a host buffer (staged through the device); and,
 * with the device full, that all-reduce fails saying what to change. Exits
 * 77 (ctest skip) where no CUDA device is visible. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "common/errors.h"
#include "worker/dist/comm.h"

#define SKIP 77

/* Exact in fp32: small integers whose sums over 4 ranks stay below 2^24. */
static float val(int rank, size_t i) {
  return (float)((rank * 7919 + (long)i * 31) % 4099);
}

#define CHECK(cond, ...)                           \
  do {                                             \
    if (!(cond)) {                                 \
      fprintf(stderr, "nccl_check rank %d: ", me); \
      fprintf(stderr, __VA_ARGS__);                \
      fputc('\n', stderr);                         \
      return 1;                                    \
    }                                              \
  } while (0)

static int run_rank(const char *rdv, int me, int world) {
  comm_t *c;
  char err[512];
  if (comm_open(&c, rdv, me, world, err, sizeof err)) {
    fprintf(stderr, "nccl_check rank %d: %s\n", me, err);
    return 1;
  }
  CHECK(!strcmp(comm_backend(c), "nccl"), "backend %s", comm_backend(c));
  const size_t rows = 100003, re = 3, total = rows * re;
  size_t counts[4], first, n;
  comm_shard_counts(rows, re, world, counts);
  comm_shard_rows(rows, world, me, &first, &n);
  size_t mine = n * re;
  float *h = malloc(total * sizeof(float)), *d_all, *d_mine;
  CHECK(cudaMalloc((void **)&d_all, total * sizeof(float)) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc((void **)&d_mine, mine * sizeof(float)) == cudaSuccess, "cudaMalloc");

  /* all_gather */
  for (size_t i = 0; i < mine; i++) h[i] = val(0, first * re + i);
  cudaMemcpy(d_mine, h, mine * sizeof(float), cudaMemcpyHostToDevice);
  CHECK(comm_all_gather(c, d_mine, d_all, counts) == 0, "all_gather: %s", comm_error(c));
  cudaMemcpy(h, d_all, total * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < total; i++) CHECK(h[i] == val(0, i), "all_gather [%zu] = %g", i, h[i]);

  /* reduce_scatter */
  for (size_t i = 0; i < total; i++) h[i] = val(me, i);
  cudaMemcpy(d_all, h, total * sizeof(float), cudaMemcpyHostToDevice);
  CHECK(comm_reduce_scatter(c, d_all, d_mine, counts) == 0, "reduce_scatter: %s", comm_error(c));
  cudaMemcpy(h, d_mine, mine * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < mine; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += val(r, first * re + i);
    CHECK(h[i] == want, "reduce_scatter [%zu] = %g, want %g", i, h[i], want);
  }

  /* all_reduce, broadcast, barrier */
  for (size_t i = 0; i < total; i++) h[i] = val(me, i);
  cudaMemcpy(d_all, h, total * sizeof(float), cudaMemcpyHostToDevice);
  CHECK(comm_all_reduce(c, d_all, total) == 0, "all_reduce: %s", comm_error(c));
  cudaMemcpy(h, d_all, total * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < total; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += val(r, i);
    CHECK(h[i] == want, "all_reduce [%zu] = %g, want %g", i, h[i], want);
  }
  int root = world - 1;
  for (size_t i = 0; i < total; i++) h[i] = me == root ? val(9, i) : -1.0f;
  cudaMemcpy(d_all, h, total * sizeof(float), cudaMemcpyHostToDevice);
  CHECK(comm_broadcast(c, d_all, total, root) == 0, "broadcast: %s", comm_error(c));
  cudaMemcpy(h, d_all, total * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < total; i++) CHECK(h[i] == val(9, i), "broadcast [%zu] = %g", i, h[i]);
  CHECK(comm_barrier(c) == 0, "barrier: %s", comm_error(c));

  /* A device buffer whose contents are still being written by work queued
   * on the compute (legacy) stream when the collective is called: the
   * collective, on NCCL's own stream, must wait for that work. */
  float *pin;
  CHECK(cudaMallocHost((void **)&pin, total * sizeof(float)) == cudaSuccess, "cudaMallocHost");
  for (size_t i = 0; i < total; i++) pin[i] = val(me + 1, i);
  CHECK(cudaMemsetAsync(d_all, 0, total * sizeof(float), 0) == cudaSuccess &&
            cudaMemcpyAsync(d_all, pin, total * sizeof(float), cudaMemcpyHostToDevice, 0) ==
                cudaSuccess,
        "queueing the copy");
  CHECK(comm_all_reduce(c, d_all, total) == 0, "all_reduce after queued work: %s", comm_error(c));
  cudaMemcpy(h, d_all, total * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < total; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += val(r + 1, i);
    CHECK(h[i] == want, "all_reduce after queued work [%zu] = %g, want %g", i, h[i], want);
  }
  cudaFreeHost(pin);

  /* all_reduce of a host buffer: staged through device memory. */
  for (size_t i = 0; i < total; i++) h[i] = val(me, i);
  CHECK(comm_all_reduce(c, h, total) == 0, "host all_reduce: %s", comm_error(c));
  for (size_t i = 0; i < total; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += val(r, i);
    CHECK(h[i] == want, "host all_reduce [%zu] = %g, want %g", i, h[i], want);
  }
  cudaFree(d_all);
  cudaFree(d_mine);

  /* The device full: a larger host buffer cannot be staged, and the error
   * says so and what to change. Last: it breaks the communicator. */
  void *fill[4096];
  int nfill = 0;
  for (size_t chunk = (size_t)1 << 30; chunk >= ((size_t)1 << 20); chunk >>= 4)
    while (nfill < 4096 && cudaMalloc(&fill[nfill], chunk) == cudaSuccess) nfill++;
  cudaGetLastError();
  size_t big = (size_t)4 << 20;
  float *hb = calloc(big, sizeof(float));
  CHECK(hb, "calloc");
  int rc = comm_all_reduce(c, hb, big);
  const char *msg = comm_error(c);
  CHECK(rc == TY_EEXHAUSTED &&
            strstr(msg, "out of device memory staging 16.0 MiB of host buffers") &&
            strstr(msg, "lower the micro-batch"),
        "host all_reduce on a full device: rc %d: %s", rc, msg);
  if (me == 0) printf("nccl_check: full device: %s\n", msg);
  for (int i = 0; i < nfill; i++) cudaFree(fill[i]);
  free(hb);
  free(h);
  comm_close(c);
  return 0;
}

int main(void) {
  /* The simulated device's memory (a real one ignores this): small, so
   * that filling it is quick. */
  setenv("TY_SIM_MEM_MIB", "64", 0);
  /* Count devices in a child: CUDA must not be initialised before fork. */
  pid_t probe = fork();
  if (probe == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 4 ? 4 : n);
  }
  int st, world = 0;
  if (probe > 0 && waitpid(probe, &st, 0) == probe && WIFEXITED(st)) world = WEXITSTATUS(st);
  if (world < 1) {
    printf("nccl_check: skipped: no CUDA device visible\n");
    return SKIP;
  }
  char dir[] = "/tmp/ty-nccl-check-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char rdv[128];
  snprintf(rdv, sizeof rdv, "nccl:file:%s/id", dir);
  pid_t pids[4];
  fflush(stdout); /* or each child would print it again */
  for (int r = 0; r < world; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      int failed = run_rank(rdv, r, world);
      fflush(stdout); /* _exit would drop what a pipe (ctest) has not taken yet */
      _exit(failed);
    }
  }
  int bad = 0;
  for (int r = 0; r < world; r++)
    bad |= waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st);
  rmdir(dir);
  printf("nccl_check: %d rank%s: %s\n", world, world == 1 ? "" : "s", bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
