/* data_rows.c - rows of tokenized examples, packed or one a row; see
 * data_rows.h. */
#include "worker/data/data_rows.h"

#include <stdlib.h>

#include "common/errors.h"

struct data_rows_s {
  const examples_t *x;
  int T;
  bool packing;
  int64_t *ex;      /* [n_ex] the examples kept, in order */
  int64_t *start;   /* [n_rows + 1] row i holds ex[start[i] .. start[i+1]) */
  int32_t *counted; /* [n_rows] */
  int64_t n_ex, n_rows, truncated, skipped;
};

/* Counted targets of an example cut to T+1 tokens: tokens 1.. marked. */
static int32_t example_counted(const uint32_t *tok, size_t n, int T) {
  if (n > (size_t)T + 1) n = (size_t)T + 1;
  int32_t c = 0;
  for (size_t k = 1; k < n; k++) c += (tok[k] & EXAMPLES_COUNTED) != 0;
  return c;
}

int data_rows_build(data_rows_t **out, const examples_t *x, int64_t first, int64_t count, int T,
                    bool packing, bool pairs, char *err, size_t errlen) {
  *out = NULL;
  data_rows_t *r = calloc(1, sizeof *r);
  if (r) {
    r->ex = malloc((size_t)(count > 0 ? count : 1) * sizeof *r->ex);
    r->start = malloc((size_t)(count + 1) * sizeof *r->start);
    r->counted = malloc((size_t)(count > 0 ? count : 1) * sizeof *r->counted);
  }
  if (!r || !r->ex || !r->start || !r->counted) {
    data_rows_free(r);
    return ty_errf(err, errlen, TY_EEXHAUSTED, "cannot allocate the row table of %lld examples",
                   (long long)count);
  }
  r->x = x, r->T = T, r->packing = packing && !pairs;
  int64_t used = 0; /* tokens of the row being filled */
  for (int64_t e = first; e < first + count; e++) {
    size_t n;
    const uint32_t *tok = examples_get(x, e, &n);
    const int32_t c = example_counted(tok, n, T);
    if (pairs && e % 2 == first % 2) { /* a pair's first side: both count, or neither stays */
      size_t n2 = 0;
      const uint32_t *tok2 = e + 1 < first + count ? examples_get(x, e + 1, &n2) : NULL;
      if (c == 0 || !tok2 || example_counted(tok2, n2, T) == 0) {
        r->skipped += tok2 ? 2 : 1;
        e++;
        continue;
      }
    }
    if (c == 0) {
      r->skipped++;
      continue;
    }
    if (n > (size_t)T + 1) r->truncated++, n = (size_t)T + 1;
    /* A new row: always without packing, else when this one is full. */
    if (r->n_rows == 0 || !r->packing || used + (int64_t)n > (int64_t)T + 1) {
      r->start[r->n_rows] = r->n_ex;
      r->counted[r->n_rows++] = 0;
      used = 0;
    }
    r->ex[r->n_ex++] = e;
    r->counted[r->n_rows - 1] += c;
    used += (int64_t)n;
  }
  r->start[r->n_rows] = r->n_ex;
  *out = r;
  return 0;
}

void data_rows_free(data_rows_t *r) {
  if (!r) return;
  free(r->ex);
  free(r->start);
  free(r->counted);
  free(r);
}

int64_t data_rows_count(const data_rows_t *r) {
  return r->n_rows;
}
int64_t data_rows_truncated(const data_rows_t *r) {
  return r->truncated;
}
int64_t data_rows_skipped(const data_rows_t *r) {
  return r->skipped;
}
int32_t data_rows_counted(const data_rows_t *r, int64_t i) {
  return r->counted[i];
}

void data_rows_fill(const data_rows_t *r, int64_t i, uint32_t pad, int32_t *tokens, float *weights,
                    int32_t *pos) {
  const int T = r->T;
  int s = 0; /* the next slot of the row's T+1 */
  for (int64_t k = r->start[i]; k < r->start[i + 1]; k++) {
    size_t n;
    const uint32_t *tok = examples_get(r->x, r->ex[k], &n);
    if (n > (size_t)T + 1) n = (size_t)T + 1;
    for (size_t j = 0; j < n; j++, s++) {
      tokens[s] = (int32_t)(tok[j] & EXAMPLES_ID_MAX);
      if (pos && s < T) pos[s] = (int32_t)j;
      /* The target after input s-1 is token j: counted within its example. */
      if (weights && s > 0) weights[s - 1] = j > 0 && (tok[j] & EXAMPLES_COUNTED) ? 1.0f : 0.0f;
    }
  }
  /* Padding: never counted; its positions continue the example's (one a
   * row) or start a document of their own (packed). */
  const int pad0 = s;
  for (; s <= T; s++) {
    tokens[s] = (int32_t)pad;
    if (pos && s < T) pos[s] = r->packing ? s - pad0 : s;
    if (weights && s > 0) weights[s - 1] = 0.0f;
  }
}
