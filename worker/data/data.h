/* data.h - token data for training and evaluation: windows of T+1 tokens
 * read from one file, shuffled per epoch with a seed, split into disjoint
 * micro-batches per rank, with a held-out tail for evaluation.
 *
 * Formats: text (each byte is a token; the vocabulary must hold 256), u16 and
 * u32 (little-endian token ids). A token id outside the vocabulary is an
 * error that names its byte offset. Files are read with pread into one
 * buffer of one window, so their size is bounded only by the disk.
 *
 * Layout of a file of N tokens, window length T+1 (inputs, then the same
 * shifted by one as targets; consecutive windows share one token):
 *   training windows  i = 0 .. n_train-1: tokens [i*T, i*T + T]
 *   evaluation tail   i = 0 .. n_eval-1:  tokens [E + i*T, E + i*T + T],
 *                     E = N - n_eval*T - 1, and no training window reaches E.
 * n_eval = max(1, floor(W * eval_fraction)) of W = floor((N-1)/T) windows
 * (0 when eval_fraction is 0).
 *
 * Batches: a step consumes G = world_size * micro_batch_size * grad_accum
 * training windows; window g of the run (g = step*G + j) is entry g mod
 * n_train of epoch g / n_train's permutation. Micro-batch a of rank r takes
 * j = (a * world_size + r) * micro_batch_size + b, b < micro_batch_size, so
 * ranks and micro-steps never share a window. A step's windows depend only
 * on (seed, step): the data position to resume from is the step.
 *
 * Format jsonl: the rows of worker/data/data_rows.h over the examples that
 * worker/data/data_prepare.h tokenized into examples_path. The last n_eval =
 * max(1, floor(E * eval_fraction)) of the E examples (none at 0) are held
 * out whole for evaluation; the rest make the training rows, which take
 * the place of the windows above (shuffled and split the same way). Their
 * rows carry loss weights and positions (data_masked).
 *
 * An empty path selects a built-in corpus (2^20 u32 ids of generated
 * "words"; see data.c), so that a spec without data.path still trains end
 * to end (smoke tests, the AReaL-style command line of DESIGN.md). */
#define DATA_BUILTIN_NAME "(built-in corpus)"
#ifndef TY_WORKER_DATA_H
#define TY_WORKER_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/jobspec.h"

typedef struct {
  const char *path; /* borrowed for data_open's duration; "" or
                     * NULL: the built-in corpus */
  jobspec_data_format_t format;
  int64_t vocab_size;   /* V; ids must be < V */
  int seq_len;          /* T >= 1 */
  double eval_fraction; /* in [0, 1) */
  uint64_t seed;        /* shuffling seed */
  int world_size, rank; /* 1, 0 for one rank */
  int micro_batch_size; /* windows per micro-batch per rank */
  int grad_accum;       /* micro-batches per step per rank */
  /* Format jsonl only: */
  const char *examples_path; /* the tokenized examples (examples.h); borrowed */
  uint64_t examples_key;     /* the key they must have been built with */
  bool packing;              /* several examples a row */
  uint32_t pad_id;           /* the id of padding tokens */
  bool eval_all; /* every example is an evaluation row, in the file's order (trainyard eval);
                  * no training rows, no batch to hold */
  /* The examples are (chosen, rejected) pairs (train.objective dpo): the
   * unit of the layout is a pair, so the counts, the global batch and
   * micro_batch_size are pairs, and a batch or evaluation row fills two
   * rows, pair b's chosen response in row 2b and its rejected one in
   * 2b+1. No packing. */
  bool pairs;
} data_config_t;

typedef struct data_s data_t;

/* Opens cfg->path and lays out its windows. Fails (TY_EINVAL, with why and
 * how to fix it in msg) for a vocabulary under 256 with format text, a
 * u16/u32 file whose size is not a whole number of tokens, too few tokens
 * for one training window, or fewer training windows (rows) than one global
 * batch; TY_ENOTFOUND when the file cannot be opened. *out is the caller's,
 * freed with data_free. */
int data_open(data_t **out, const data_config_t *cfg, char *msg, size_t msglen);
/* Accepts NULL. */
void data_free(data_t *d);

int64_t data_num_tokens(const data_t *d);
/* jsonl: examples in the file, those cut to seq_len + 1 tokens, and those
 * left out for counting no target (0 for token files). */
int64_t data_num_examples(const data_t *d);
int64_t data_num_truncated(const data_t *d);
int64_t data_num_skipped(const data_t *d);
int64_t data_num_train_windows(const data_t *d);
int64_t data_num_eval_windows(const data_t *d);
/* G, windows per global step. */
int64_t data_global_batch(const data_t *d);

/* T, the tokens a row feeds the model (rows hold T+1). */
int data_seq_len(const data_t *d);
/* Whether rows carry loss weights and document positions (data_train_batch,
 * data_eval_row fill them): examples of a JSONL file; token windows of a
 * text, u16 or u32 file count every target of one document a row. */
bool data_masked(const data_t *d);
/* The counted targets of step's whole global batch (all ranks, all
 * micro-batches), which every rank knows without a collective: the
 * denominator of the step's mean loss. G*T for unmasked data. */
int64_t data_step_count(data_t *d, int64_t step);

/* Reads this rank's micro-batch `micro` of `step` as data_train_micro_batch
 * does, and where data_masked, each target's loss weight into weights [B,
 * T] (0 or 1) and each input's position in its document into pos [B, T];
 * weights and pos are not touched otherwise (and may then be NULL). */
int data_train_batch(data_t *d, int64_t step, int micro, int32_t *tokens, float *weights,
                     int32_t *pos, char *msg, size_t msglen);
/* Evaluation row i (< data_num_eval_windows) into tokens [T+1], with
 * weights and pos [T] as data_train_batch's (filled when non-NULL: 1 and
 * 0..T-1 for unmasked data). */
int data_eval_row(data_t *d, int64_t i, int32_t *tokens, float *weights, int32_t *pos, char *msg,
                  size_t msglen);

/* Whether the layout is of pairs (data_config_t.pairs). */
bool data_pairs(const data_t *d);
/* The training item (window, row or pair: what data_num_train_windows
 * counts) that entry b of this rank's micro-batch `micro` of `step` is. */
int64_t data_train_item(data_t *d, int64_t step, int micro, int b);

/* Training item i (< data_num_train_windows) of a JSONL file's examples,
 * by its index (not shuffled), as data_eval_row fills an evaluation row:
 * one row, or two for a pair. */
int data_train_row(data_t *d, int64_t i, int32_t *tokens, float *weights, int32_t *pos,
                   char *msg, size_t msglen);

/* Reads this rank's micro-batch `micro` (0 .. grad_accum-1) of `step` into
 * tokens [micro_batch_size, T+1]. Returns 0, TY_EINVAL for an id outside
 * the vocabulary, TY_EDATALOSS for a read error or a file that shrank. */
int data_train_micro_batch(data_t *d, int64_t step, int micro, int32_t *tokens, char *msg,
                           size_t msglen);
/* Reads evaluation window i (< data_num_eval_windows) into tokens [T+1]. */
int data_eval_window(data_t *d, int64_t i, int32_t *tokens, char *msg, size_t msglen);
/* Reads the T+1 tokens starting at token index first into tokens [T+1]. */
int data_read_window(data_t *d, int64_t first, int32_t *tokens, char *msg, size_t msglen);

/* What a checkpoint stores to resume the data stream, and what must agree
 * on resume for the windows to be the same ones. */
typedef struct {
  int64_t step; /* the next step to run */
  uint64_t seed;
  int64_t num_tokens;
  int64_t num_train_windows;
  int64_t global_batch;
  int seq_len;
} data_position_t;

/* The position before `step`. */
void data_position_at(const data_t *d, int64_t step, data_position_t *pos);
/* Checks that pos was written for this file and layout (TY_EPRECONDITION,
 * naming the field that differs, otherwise). */
int data_position_check(const data_t *d, const data_position_t *pos, char *msg, size_t msglen);

/* Rows [b, T+1] as the model's inputs and targets [b, T]: each row's
 * tokens and the same shifted by one. */
void data_split_rows(const int32_t *rows, int b, int T, int *inputs, int *targets);

/* Token ids of a byte string in format text (for tests and tools): out[i] =
 * (unsigned char)s[i]. */
void data_text_tokens(const char *s, size_t n, int32_t *out);

#endif
