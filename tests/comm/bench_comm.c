/* bench_comm.c - shm collective bandwidth beside memcpy bandwidth, in one
 * run on one host (tests/bench/comm.sh runs it).
 *
 *   bench_comm [--ranks N] [--sizes MiB,MiB,...] [--iters K]
 *
 * For each size S (MiB): memcpy of S bytes in one process, then N forked
 * ranks on a shm communicator run all_gather (S bytes gathered per rank, S/N
 * contributed) and reduce_scatter (S bytes in per rank, S/N out). Each
 * figure is the median (and the best) of K timed runs after one warm-up; a
 * collective's time is the slowest rank's. On a busy host the median
 * carries scheduling delays (a barrier waits for a descheduled peer); the
 * best shows what the copies cost when every rank has a core. Bandwidth is S divided by the time
 * (bytes each rank ends up with or puts in), so ratio = memcpy time / collective time: 1.0 would
 * mean the collective costs one memcpy of its buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "worker/dist/comm.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v; returns its median and sets *best to its minimum. */
static double median(double *v, int n, double *best) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  if (best) *best = v[0];
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median seconds of one memcpy of `bytes`; *best gets the fastest. */
static double bench_memcpy(size_t bytes, int iters, double *best) {
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) return -1;
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double *t = calloc((size_t)iters, sizeof *t);
  for (int i = -1; i < iters; i++) {
    double t0 = now_s();
    memcpy(b, a, bytes);
    __asm__ __volatile__("" : : "r"(b) : "memory");
    if (i >= 0) t[i] = now_s() - t0;
  }
  double m = median(t, iters, best);
  free(t);
  free(a);
  free(b);
  return m;
}

/* One rank: times both collectives; rank 0 writes {median, best} of
 * all_gather then of reduce_scatter (seconds) to fd. */
static int rank_main(const char *rdv, int rank, int world, size_t bytes, int iters, int fd) {
  comm_t *c;
  char err[512];
  if (comm_open(&c, rdv, rank, world, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
  }
  size_t total = bytes / sizeof(float);
  size_t *counts = calloc((size_t)world, sizeof *counts);
  for (int r = 0; r < world; r++)
    counts[r] = total / (size_t)world + ((size_t)r < total % (size_t)world);
  size_t mine = counts[rank];
  float *big = malloc(total * sizeof(float)), *small = malloc(mine * sizeof(float));
  for (size_t i = 0; i < total; i++) big[i] = (float)(i % 1000);
  for (size_t i = 0; i < mine; i++) small[i] = 1.0f;
  double *t[2] = {calloc((size_t)iters, sizeof(double)), calloc((size_t)iters, sizeof(double))};
  size_t *ones = calloc((size_t)world, sizeof *ones);
  float *times = calloc((size_t)world, sizeof *times);
  for (int r = 0; r < world; r++) ones[r] = 1;
  int rc = 0;
  for (int op = 0; op < 2 && !rc; op++)
    for (int i = -1; i < iters && !rc; i++) {
      rc = comm_barrier(c);
      double t0 = now_s();
      if (!rc)
        rc = op == 0 ? comm_all_gather(c, small, big, counts)
                     : comm_reduce_scatter(c, big, small, counts);
      float dt = (float)(now_s() - t0);
      if (!rc) rc = comm_all_gather(c, &dt, times, ones); /* the slowest rank's time */
      for (int r = 0; r < world && i >= 0; r++)
        if (times[r] > t[op][i]) t[op][i] = times[r];
    }
  if (rc) fprintf(stderr, "rank %d: %s\n", rank, comm_error(c));
  if (!rc && rank == 0) {
    double out[4];
    out[0] = median(t[0], iters, &out[1]);
    out[2] = median(t[1], iters, &out[3]);
    if (write(fd, out, sizeof out) != (ssize_t)sizeof out) rc = 1;
  }
  free(ones);
  free(times);
  free(t[0]);
  free(t[1]);
  free(big);
  free(small);
  free(counts);
  comm_close(c);
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  int world = 2, iters = 10;
  const char *sizes = "1,16,64";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--ranks"))
      world = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--sizes"))
      sizes = argv[i + 1];
    else if (!strcmp(argv[i], "--iters"))
      iters = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: bench_comm [--ranks N] [--sizes MiB,...] [--iters K]\n");
      return 2;
    }
  }
  if (world < 1 || world > 64 || iters < 1) {
    fprintf(stderr, "bench_comm: --ranks 1..64, --iters >= 1\n");
    return 2;
  }
  printf(
      "# shm collectives, %d ranks; GB/s = 1e9 bytes/s; median (best) of %d runs\n"
      "# ratio = memcpy time / collective time: medians (bests)\n",
      world, iters);
  printf("%5s  %-15s  %-15s  %-11s  %-15s  %-11s\n", "MiB", "memcpy GB/s", "all_gather GB/s",
         "ratio", "red_scat GB/s", "ratio");
  char *list = strdup(sizes);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    size_t mib = (size_t)atol(tok), bytes = mib << 20;
    if (!bytes) continue;
    double tm_best = 0, tm = bench_memcpy(bytes, iters, &tm_best);
    char rdv[128];
    snprintf(rdv, sizeof rdv, "shm:bench-comm-%d-%zu", (int)getpid(), mib);
    int fds[2];
    if (pipe(fds)) return 1;
    pid_t *pids = calloc((size_t)world, sizeof *pids);
    for (int r = 0; r < world; r++) {
      pids[r] = fork();
      if (pids[r] == 0) _exit(rank_main(rdv, r, world, bytes, iters, fds[1]));
    }
    close(fds[1]);
    double m[4] = {0, 0, 0, 0}; /* all_gather median, best; reduce_scatter median, best */
    ssize_t got = read(fds[0], m, sizeof m);
    close(fds[0]);
    int bad = got != (ssize_t)sizeof m;
    for (int r = 0; r < world; r++) {
      int st;
      waitpid(pids[r], &st, 0);
      bad |= !WIFEXITED(st) || WEXITSTATUS(st);
    }
    free(pids);
    if (bad) {
      fprintf(stderr, "bench_comm: %zu MiB failed\n", mib);
      return 1;
    }
    double gb = (double)bytes / 1e9;
    printf("%5zu  %6.2f (%6.2f)  %6.2f (%6.2f)  %4.2f (%4.2f)  %6.2f (%6.2f)  %4.2f (%4.2f)\n", mib,
           gb / tm, gb / tm_best, gb / m[0], gb / m[1], tm / m[0], tm_best / m[1], gb / m[2],
           gb / m[3], tm / m[2], tm_best / m[3]);
    fflush(stdout);
  }
  free(list);
  return 0;
}
