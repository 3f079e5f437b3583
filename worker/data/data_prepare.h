/* data_prepare.h - a JSONL file's examples tokenized once into an examples
 * file (worker/data/examples.h) that every rank then maps.
 *
 * Each example becomes token ids with the counted ones marked:
 *   text               the tokenizer's encoding with its special tokens (BOS
 *                      and EOS as tokenizer_config.json says); every token
 *                      counts
 *   prompt/completion  the prompt with the special tokens, then the
 *                      completion and EOS; the completion and EOS count
 *   messages           the conversation rendered by the chat template (the
 *                      tokenizer's, or data.chat_template's built-in one);
 *                      each assistant turn's span is where the render of the
 *                      conversation up to that turn goes past the render of
 *                      the turns before it with add_generation_prompt, so it
 *                      holds the turn's content and its end-of-turn token;
 *                      the text is tokenized segment by segment and only
 *                      those spans count
 *   preference pair    (train.objective dpo) two examples: the prompt with
 *                      the chosen response, then with the rejected one, each
 *                      made as prompt/completion or messages are, with only
 *                      the response's turns counted
 * With data.loss_on "all" every token counts. Padding is EOS (or id 0).
 *
 * The file is named by a key over what it is built from: the data file's
 * identity (size, modification time, inode), the tokenizer's files'
 * contents, the template's text and the options. The first rank to take
 * the lock file beside it builds it, writing its progress into the lock
 * file; the others wait, reporting that progress, then map the result. */
#ifndef TY_WORKER_DATA_PREPARE_H
#define TY_WORKER_DATA_PREPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/jobspec.h"

typedef struct {
  const char *path;          /* the JSONL file */
  const char *tokenizer;     /* a folder with tokenizer.json, or the file */
  jobspec_data_kind_t kind;  /* AUTO: by each line's keys */
  const char *chat_template; /* "" or NULL: the tokenizer's; else a built-in name */
  jobspec_loss_on_t loss_on;
  int64_t vocab_size; /* the model's: the tokenizer must fit it; 0: not checked */
  /* 0: the whole file. Else only the lines that start within the first
   * max_bytes (a check of a large file's start; a distinct key, so never
   * taken for the whole file's examples). */
  uint64_t max_bytes;
  /* train.objective dpo: every line is a preference pair (jsonl.h), made
   * into two examples, the prompt with the chosen response and with the
   * rejected one (only a response's tokens count); else a pair is refused. */
  bool pairs;
} data_prepare_t;

/* Called while the file is tokenized (by this rank or another): bytes of
 * the JSONL file done of total. Returns 0 to go on; anything else stops
 * (TY_ECANCELLED). */
typedef int (*data_prepare_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* What a prepared file is. */
typedef struct {
  char path[4096]; /* the examples file */
  uint64_t key;
  uint32_t pad_id;
  int64_t examples;
  bool partial; /* max_bytes stopped it before the end of the file */
} data_prepared_t;

/* Makes sure cache_dir (created when missing) holds p's examples file,
 * building it when missing or stale. 0 with *out filled; TY_EINVAL naming
 * the file and line of a bad example, a template error, or a tokenizer that
 * does not fit the model; TY_ENOTFOUND for a missing file; other codes for
 * I/O errors. Nothing is left half-written. */
int data_prepare(const data_prepare_t *p, const char *cache_dir, data_prepare_progress_fn progress,
                 void *ctx, data_prepared_t *out, char *err, size_t errlen);

#endif
