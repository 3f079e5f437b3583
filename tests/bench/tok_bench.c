/* tok_bench.c - encoding throughput of trainyard's tokenizer: encodes every
 * line of a file (the newline excluded, one tok_encode call per line, as
 * `trainyard tokenize --input` does), after one untimed pass that warms the
 * word cache the same way a long run would. Prints one JSON line:
 * {"bytes", "lines", "ids", "seconds", "mb_per_s"} (MB = 10^6 bytes).
 *
 *   tok_bench TOKENIZER_DIR FILE [PASSES] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tokenizer.h"

static double now(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t encode_lines(const tok_t *t, const char *b, size_t n, size_t *lines) {
  size_t ids_total = 0;
  *lines = 0;
  for (size_t s = 0; s < n;) {
    const char *nl = memchr(b + s, '\n', n - s);
    size_t e = nl ? (size_t)(nl - b) : n;
    uint32_t *ids;
    size_t nids;
    char err[256];
    if (tok_encode(t, b + s, e - s, 0, &ids, &nids, err, sizeof err)) {
      fprintf(stderr, "tok_bench: %s\n", err);
      exit(1);
    }
    free(ids);
    ids_total += nids;
    ++*lines;
    s = e + 1;
  }
  return ids_total;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: tok_bench TOKENIZER_DIR FILE [PASSES]\n");
    return 2;
  }
  int passes = argc > 3 ? atoi(argv[3]) : 1;
  char err[512];
  tok_t *t;
  if (tok_load(argv[1], &t, err, sizeof err)) {
    fprintf(stderr, "tok_bench: %s\n", err);
    return 1;
  }
  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "tok_bench: cannot read %s\n", argv[2]);
    return 1;
  }
  fclose(f);
  size_t lines;
  encode_lines(t, b, (size_t)n, &lines); /* warm-up */
  double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
  size_t ids = 0;
  for (int p = 0; p < passes; p++) ids = encode_lines(t, b, (size_t)n, &lines);
  double dt = now(CLOCK_MONOTONIC) - t0, cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
  printf(
      "{\"bytes\": %ld, \"lines\": %zu, \"ids\": %zu, \"seconds\": %.3f, "
      "\"cpu_seconds\": %.3f, \"mb_per_s\": %.2f}\n",
      n * passes, lines, ids, dt, cpu, (double)n * passes / cpu / 1e6);
  free(b);
  tok_free(t);
  return 0;
}
