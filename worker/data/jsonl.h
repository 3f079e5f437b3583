/* jsonl.h - training examples from a JSONL file, one JSON object a line,
 * read as a stream (one line in memory at a time, so the file's size is
 * bounded only by the disk).
 *
 * An example's kind comes from its keys, or is forced by data.kind:
 *   {"text": "..."}                                   a document
 *   {"prompt": "...", "completion": "..."}            a prompt and its answer
 *   {"messages": [{"role": "...", "content": "..."}]} a conversation, roles
 *                                                     system, user, assistant
 *   {"prompt": "...", "chosen": "...", "rejected": "..."}
 *                                   a preference pair (train.objective dpo);
 *   {"prompt": [msgs], "chosen": [msgs], "rejected": [msgs]}
 *                                   TRL's conversational form, or without
 *                                   "prompt" the two conversations' shared
 *                                   leading turns are the prompt; the prompt
 *                                   ends with a user turn, each response
 *                                   starts with the assistant's
 * Other keys are ignored (data sets carry ids and sources). Blank lines are
 * skipped. Every refusal names the file and the line and says how to fix
 * it: "data.jsonl line 12: \"messages\"[2] has role \"bot\"; roles are
 * system, user and assistant". */
#ifndef TY_WORKER_JSONL_H
#define TY_WORKER_JSONL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "api/jobspec.h"

/* One parsed line. The strings and messages are borrowed from root, which
 * the caller releases with json_decref after use. */
typedef struct {
  jobspec_data_kind_t kind; /* never AUTO */
  const char *text;         /* TEXT */
  size_t text_len;
  const char *prompt, *completion; /* PROMPT_COMPLETION */
  size_t prompt_len, completion_len;
  json_t *messages; /* MESSAGES: an array of {role, content} objects, at least one
                     * assistant turn */
  /* PREFERENCE, a pair of responses to one prompt. Strings: prompt and
   * side[0] (chosen), side[1] (rejected). Messages (conv true): conv[0]
   * and conv[1], the whole conversations, whose first prompt_turns turns
   * are the shared prompt and the rest the response. */
  const char *side[2];
  size_t side_len[2];
  bool conv_form;
  json_t *conv[2];
  size_t prompt_turns;
  json_t *root; /* holds the line's object and what was made of it: the caller's reference */
} jsonl_example_t;

/* Parses one line (len bytes, no newline) of file `path`, line number
 * lineno, as an example of kind `want` (AUTO: by its keys). 0 with *ex
 * filled; 1 for a blank line (nothing in *ex); TY_EINVAL with the reason in
 * err, naming path and lineno. */
int jsonl_parse(const char *line, size_t len, jobspec_data_kind_t want, const char *path,
                int64_t lineno, jsonl_example_t *ex, char *err, size_t errlen);

/* A stream of a file's lines. */
typedef struct jsonl_reader_s jsonl_reader_t;

/* Opens path. TY_ENOTFOUND or TY_EUNAVAILABLE with the reason. */
int jsonl_open(jsonl_reader_t **out, const char *path, char *err, size_t errlen);
/* The next line: *line (borrowed until the next call; NUL-terminated, no
 * newline), *len, *lineno (from 1). 0, 1 at the end of the file, or
 * TY_EDATALOSS for a read error. */
int jsonl_next(jsonl_reader_t *r, const char **line, size_t *len, int64_t *lineno, char *err,
               size_t errlen);
/* Bytes read so far, and the file's size. */
uint64_t jsonl_offset(const jsonl_reader_t *r);
uint64_t jsonl_size(const jsonl_reader_t *r);
void jsonl_close(jsonl_reader_t *r); /* accepts NULL */

#endif
