/* data_rows.h - rows of T+1 tokens made of tokenized examples
 * (worker/data/examples.h), with each target's loss weight and each input's
 * position in its document, for data.format jsonl.
 *
 * Without packing each example is one row: cut to T+1 tokens when longer
 * (counted as truncated) and padded after its end; padding is never a
 * counted target and continues the example's positions (so that, as a
 * single document, the row needs no document mask). With packing, examples
 * (each cut to T+1 tokens) fill rows in order while they fit, each a
 * document of its own whose positions restart at 0; what is left of a row
 * is padding, a document of its own too. In both, the first token of an
 * example is never a target (nothing of its document precedes it), and a
 * later token is counted when the example marks it so (examples.h).
 * Examples with no counted target are left out. */
#ifndef TY_WORKER_DATA_ROWS_H
#define TY_WORKER_DATA_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/data/examples.h"

typedef struct data_rows_s data_rows_t;

/* Rows of examples [first, first + count) of x, T >= 1. *out is the
 * caller's (data_rows_free); x must outlive it. 0 or TY_EEXHAUSTED.
 * pairs (never with packing): the examples are (chosen, rejected) pairs,
 * first even, each a row, rows 2p and 2p+1 pair p; a pair either of whose
 * sides counts no target is left out whole (both counted as skipped). */
int data_rows_build(data_rows_t **out, const examples_t *x, int64_t first, int64_t count, int T,
                    bool packing, bool pairs, char *err, size_t errlen);
void data_rows_free(data_rows_t *r);

int64_t data_rows_count(const data_rows_t *r);
/* Examples cut to T+1 tokens, and examples left out (no counted target). */
int64_t data_rows_truncated(const data_rows_t *r);
int64_t data_rows_skipped(const data_rows_t *r);
/* Counted targets of row i. */
int32_t data_rows_counted(const data_rows_t *r, int64_t i);

/* Row i into tokens [T+1] (ids; padding id pad), weights [T] (0/1, the
 * target after each input) and pos [T]; weights and pos may be NULL. */
void data_rows_fill(const data_rows_t *r, int64_t i, uint32_t pad, int32_t *tokens, float *weights,
                    int32_t *pos);

#endif
