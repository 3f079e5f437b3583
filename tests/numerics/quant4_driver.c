/* quant4_driver.c - runs trainyard's 4-bit quantization (worker/ckpt/quant4.h)
 * over float32 values given in a file, for tests/numerics/quant4_ref.py to
 * compare bit for bit with its bitsandbytes reference.
 *
 * usage: quant4_driver quant nf4|fp4 IN OUT CUTS NCUTS
 *   IN holds float32 x[n]. CUTS: "-" or comma-separated block indices where
 *   pieces start (the tensor is then quantized and dequantized piece by
 *   piece through the *_range calls); NCUTS: the same for the nested
 *   quantization, in scales (multiples of 256). OUT receives, with
 *   nb = ceil(n / 64) and nnb = ceil(nb / 256):
 *     f32 quant_map[16], f32 nested_quant_map[256],
 *     u8 codes[(n + 1) / 2], f32 absmax[nb], f32 dequantized[n],
 *     f32 offset, u8 qabsmax[nb], f32 absmax2[nnb], f32 absmax_back[nb],
 *     f32 dequantized_nested[n] (through absmax_back).
 *        quant4_driver nest IN OUT OFFSET [MAP]
 *   IN holds float32 absmax[nb], OFFSET a float (C99 hex form is exact),
 *   MAP float32 [256] to recover the scales with (q4_unnest_with; default
 *   q4_unnest); OUT receives u8 qabsmax[nb], f32 absmax2[nnb],
 *   f32 absmax_back[nb]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ckpt/quant4.h"

/* Whole file -> malloc'd float array (*n floats); NULL on error. */
static float *read_floats(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  *n = size > 0 ? (size_t)size / sizeof(float) : 0;
  float *x = malloc(*n * sizeof *x + 1);
  if (x && fread(x, sizeof *x, *n, f) != *n) {
    free(x);
    x = NULL;
  }
  fclose(f);
  return x;
}

/* "-" or "a,b,c" -> cuts[] (ascending, each > 0 and < limit), framed by 0
 * and limit: bounds[0..*count]. -1 on a bad list. */
static int parse_cuts(const char *s, size_t limit, size_t *bounds, size_t max, size_t *count) {
  size_t k = 0;
  bounds[k++] = 0;
  if (strcmp(s, "-") != 0) {
    for (const char *p = s; *p;) {
      char *end;
      unsigned long long v = strtoull(p, &end, 10);
      if (end == p || v <= bounds[k - 1] || v >= limit || k + 1 >= max) return -1;
      bounds[k++] = (size_t)v;
      p = *end == ',' ? end + 1 : end;
      if (*end && *end != ',') return -1;
    }
  }
  bounds[k] = limit;
  *count = k;
  return 0;
}

static int write_all(FILE *out, const void *p, size_t size, size_t n) {
  return n == 0 || fwrite(p, size, n, out) == n ? 0 : -1;
}

enum { MAX_PIECES = 64 };

static int run_quant(q4_type_t t, const char *in, const char *outp, const char *cuts,
                     const char *ncuts) {
  size_t n;
  float *x = read_floats(in, &n);
  if (!x) return fprintf(stderr, "quant4_driver: cannot read %s\n", in), 1;
  size_t nb = q4_blocks(n), nnb = q4_nested_blocks(nb);
  size_t bounds[MAX_PIECES + 1], nbounds[MAX_PIECES + 1], pieces, npieces;
  if (parse_cuts(cuts, nb, bounds, MAX_PIECES, &pieces) ||
      parse_cuts(ncuts, nb, nbounds, MAX_PIECES, &npieces)) {
    free(x);
    return fprintf(stderr, "quant4_driver: bad cuts\n"), 2;
  }
  uint8_t *codes = malloc(q4_code_bytes(n) + 1), *qabsmax = malloc(nb + 1);
  float *absmax = malloc(nb * sizeof *absmax + 1), *back = malloc(nb * sizeof *back + 1);
  float *absmax2 = malloc(nnb * sizeof *absmax2 + 1), *deq = malloc(n * sizeof *deq + 1);
  float *deqn = malloc(n * sizeof *deqn + 1);
  int rc = 1;
  if (!codes || !qabsmax || !absmax || !back || !absmax2 || !deq || !deqn) goto done;
  for (size_t p = 0; p < pieces; p++) {
    size_t first = bounds[p], count = bounds[p + 1] - first;
    if (q4_quantize_range(t, n, first, count, x + first * Q4_BLOCK, codes, absmax) ||
        q4_dequantize_range(t, n, first, count, codes, absmax, deq + first * Q4_BLOCK))
      goto done;
  }
  float offset = q4_mean(absmax, nb);
  for (size_t p = 0; p < npieces; p++)
    if (q4_nest_range(nb, nbounds[p], nbounds[p + 1] - nbounds[p], absmax, offset, qabsmax,
                      absmax2))
      goto done;
  q4_unnest(qabsmax, absmax2, nb, offset, back);
  for (size_t p = 0; p < pieces; p++) {
    size_t first = bounds[p];
    if (q4_dequantize_range(t, n, first, bounds[p + 1] - first, codes, back,
                            deqn + first * Q4_BLOCK))
      goto done;
  }
  FILE *out = fopen(outp, "wb");
  if (!out) goto done;
  int w = write_all(out, q4_code(t), sizeof(float), 16) ||
          write_all(out, q4_dynamic_code(), sizeof(float), 256) ||
          write_all(out, codes, 1, q4_code_bytes(n)) || write_all(out, absmax, sizeof(float), nb) ||
          write_all(out, deq, sizeof(float), n) || write_all(out, &offset, sizeof(float), 1) ||
          write_all(out, qabsmax, 1, nb) || write_all(out, absmax2, sizeof(float), nnb) ||
          write_all(out, back, sizeof(float), nb) || write_all(out, deqn, sizeof(float), n);
  rc = fclose(out) || w ? 1 : 0;
done:
  if (rc) fprintf(stderr, "quant4_driver: quant %s failed\n", in);
  free(x);
  free(codes);
  free(qabsmax);
  free(absmax);
  free(back);
  free(absmax2);
  free(deq);
  free(deqn);
  return rc;
}

static int run_nest(const char *in, const char *outp, const char *offset_s, const char *mapp) {
  size_t nb, nmap = 0;
  float *absmax = read_floats(in, &nb), *map = mapp ? read_floats(mapp, &nmap) : NULL;
  if (!absmax || (mapp && (!map || nmap != 256))) {
    free(absmax);
    free(map);
    return fprintf(stderr, "quant4_driver: cannot read %s or its map\n", in), 1;
  }
  float offset = strtof(offset_s, NULL);
  size_t nnb = q4_nested_blocks(nb);
  uint8_t *q = malloc(nb + 1);
  float *absmax2 = malloc(nnb * sizeof *absmax2 + 1), *back = malloc(nb * sizeof *back + 1);
  int rc = 1;
  if (q && absmax2 && back) {
    q4_nest(absmax, nb, offset, q, absmax2);
    if (map)
      q4_unnest_with(map, q, absmax2, nb, offset, back);
    else
      q4_unnest(q, absmax2, nb, offset, back);
    FILE *out = fopen(outp, "wb");
    if (out) {
      int w = write_all(out, q, 1, nb) || write_all(out, absmax2, sizeof(float), nnb) ||
              write_all(out, back, sizeof(float), nb);
      rc = fclose(out) || w ? 1 : 0;
    }
  }
  if (rc) fprintf(stderr, "quant4_driver: nest %s failed\n", in);
  free(absmax);
  free(map);
  free(q);
  free(absmax2);
  free(back);
  return rc;
}

int main(int argc, char **argv) {
  q4_type_t t;
  if (argc == 7 && strcmp(argv[1], "quant") == 0 && q4_type_parse(argv[2], &t) == 0)
    return run_quant(t, argv[3], argv[4], argv[5], argv[6]);
  if ((argc == 5 || argc == 6) && strcmp(argv[1], "nest") == 0)
    return run_nest(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL);
  fprintf(stderr,
          "usage: quant4_driver quant nf4|fp4 IN OUT CUTS NCUTS\n"
          "       quant4_driver nest IN OUT OFFSET [MAP]\n");
  return 2;
}
