/* data_check.h - a job's data before any weight is read: a JSONL file's
 * examples tokenized (once, for every rank), and whether the data holds a
 * global batch for this rank's layout, so that a job that cannot train
 * fails in a moment. The rule data-holds-a-batch of the job spec for a
 * JSONL file is train_jsonl_check (installed into api/jobspec.h's hook by
 * jsonl_rule.c in the programs that link it). */
#ifndef TY_WORKER_DATA_CHECK_H
#define TY_WORKER_DATA_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "api/jobspec.h"
#include "common/errors.h"
#include "worker/data/data.h"
#include "worker/data/data_prepare.h"

/* The data layout of spec s for rank of world over a vocabulary of V;
 * prep: train_data_prepare's result for jsonl (else NULL). */
data_config_t train_data_config(const jobspec_t *s, const data_prepared_t *prep, int64_t V,
                                int rank, int world);

/* For data.format jsonl: s's examples tokenized into cache_dir (NULL:
 * <output_dir>/tokenized) with the tokenizer of data.tokenizer, else of
 * model_path (data_prepare; progress while it runs, here or in another
 * rank). For a token file there is nothing to do: out->path is "". */
int train_data_prepare(const jobspec_t *s, int64_t vocab_size, const char *cache_dir,
                       data_prepare_progress_fn progress, void *ctx, data_prepared_t *out,
                       char *err, size_t errlen);

/* Rule data-holds-a-batch for a JSONL file (jobspec_jsonl_check's value in
 * the programs that validate with paths): the examples tokenized into a
 * scratch folder that is removed afterwards, with the model's vocabulary
 * (spec.model's, or model_path's config.json), and laid out as rank 0
 * would: each problem (a bad line, a template error, a tokenizer that does
 * not fit, too few rows for a global batch) is added to errs under
 * data.path. Nothing is left behind. Only the lines starting within the
 * first DATA_CHECK_PREFIX_KIB KiB (DATA_CHECK_PREFIX_ENV sets it; 0: the
 * whole file) are tokenized when their examples already hold a global
 * batch, so that validating a large file (trainyardd's submit, inside the
 * HTTP request) takes about as long as a small one's; the ranks tokenize
 * the whole file, and a bad line further on fails the job there, naming
 * the file and line. */
#define DATA_CHECK_PREFIX_KIB (16L << 10)
#define DATA_CHECK_PREFIX_ENV "TRAINYARD_JSONL_CHECK_KIB"
void train_jsonl_check(const jobspec_t *s, ty_errlist_t *errs);

/* Whether spec s's data can train a model of vocab_size tokens as rank of
 * world: what train_run's data_open checks (the file, its format, a whole
 * global batch of windows or rows), without a model, so that a rank can
 * fail before it loads one. prep: train_data_prepare's result for jsonl
 * (else NULL). 0, or the reason in err. note (may be NULL) receives, for
 * JSONL examples, what the rows are made of: examples, rows, examples cut
 * to seq_len + 1 tokens, examples left out. */
int train_data_check(const jobspec_t *s, const data_prepared_t *prep, int64_t vocab_size, int rank,
                     int world, char *note, size_t notelen, char *err, size_t errlen);

#endif
