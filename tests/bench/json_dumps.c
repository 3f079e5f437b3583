/* json_dumps.c - what writing reals in their shortest form costs: one
 * document shaped like a long job's metrics answer (steps, loss,
 * tokens/s), written by jansson alone (17 digits) and by ty_json_dumps, in
 * turns in one run; prints each one's time and size and their ratio.
 *   json_dumps [POINTS] [ROUNDS]      (default 100000 points, 5 rounds) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/json_util.h"

int main(int argc, char **argv) {
  const int points = argc > 1 ? atoi(argv[1]) : 100000, rounds = argc > 2 ? atoi(argv[2]) : 5;
  json_t *doc = json_array();
  for (int i = 0; i < points; i++)
    json_array_append_new(doc, json_pack("{s:i,s:f,s:f,s:f}", "step", i + 1, "loss",
                                         5.5 * (1.0 - 0.3 * i / points) + 0.01 * (i % 7), "lr",
                                         3e-4, "tokens_per_s", 1800.0 + 37.0 * (i % 11) / 3.0));
  double best_j = 1e9, best_t = 1e9;
  size_t len_j = 0, len_t = 0;
  for (int r = 0; r < rounds; r++) {
    double t0 = ty_mono_s();
    char *a = json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(17));
    double t1 = ty_mono_s();
    char *b = ty_json_dumps(doc, JSON_COMPACT);
    double t2 = ty_mono_s();
    if (t1 - t0 < best_j) best_j = t1 - t0;
    if (t2 - t1 < best_t) best_t = t2 - t1;
    len_j = strlen(a), len_t = strlen(b);
    free(a);
    free(b);
  }
  printf("json_dumps: %d points x 3 reals, best of %d rounds\n", points, rounds);
  printf("  jansson (17 digits)  %.3f s  %zu bytes\n", best_j, len_j);
  printf("  ty_json_dumps        %.3f s  %zu bytes\n", best_t, len_t);
  printf("  ratio (ty / jansson) time %.2f, size %.2f\n", best_t / best_j,
         (double)len_t / (double)len_j);
  json_decref(doc);
  return 0;
}
