/* generate_text.h - what decoding needs of a model's files and tokenizer
 * (gentext_*): where the tokenizer is, which ids end a generation, a prompt
 * (plain text, or a conversation through the chat template) as token ids,
 * and the generated ids back to text piece by piece, never splitting a
 * multi-byte character. Used by `trainyard generate` and by the samples a
 * training job decodes. */
#ifndef TY_WORKER_GENERATE_TEXT_H
#define TY_WORKER_GENERATE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "text/tokenizer.h"

/* The folder a model_path names: itself, or the folder of a checkpoint
 * file (with config.json beside it), into out (n bytes). */
void gentext_model_dir(const char *model_path, char *out, size_t n);

/* The tokenizer of model_path: tokenizer.json in its folder, into out (n
 * bytes). false when there is none. */
bool gentext_default_tokenizer(const char *model_path, char *out, size_t n);

/* The ids that end a generation, at most max into eos (*n of them):
 * generation_config.json's eos_token_id (a number or a list) in the model's
 * folder, else config.json's, else the tokenizer's EOS (tok may be NULL).
 * *n may be 0 (then only max_new_tokens ends it). 0, or TY_EINVAL naming
 * a file whose eos_token_id is neither a number nor a list of numbers. */
int gentext_eos(const char *model_path, const tok_t *tok, int64_t *eos, int max, int *n, char *err,
                size_t errlen);

/* Plain text as the model's prompt: encoded with the tokenizer's special
 * tokens (Llama 3's <|begin_of_text|>). *ids is malloc'd (caller frees). */
int gentext_encode_prompt(const tok_t *tok, const char *text, int **ids, int *n, char *err,
                          size_t errlen);

/* A conversation (a JSON array of {"role", "content"} objects) rendered
 * through the chat template (template_name: a built-in one, "llama3",
 * "llama2", "chatml" or "mistral"; NULL or "": the tokenizer's own) with
 * add_generation_prompt, then encoded without adding special tokens (the
 * template writes them), as the JSONL data path does. */
int gentext_encode_messages(const tok_t *tok, const json_t *messages, const char *template_name,
                            int **ids, int *n, char *err, size_t errlen);

/* Generated ids to text as they come. */
typedef struct {
  uint32_t *ids; /* every id pushed so far */
  size_t n, cap;
  size_t printed; /* bytes of the decoded text already handed out */
} gentext_stream_t;

/* Adds id and sets *piece (malloc'd, NUL-terminated; the caller frees it;
 * it may be "") to the text not yet handed out: the decode of every id so
 * far (special tokens skipped) past what earlier calls gave, held back
 * while it ends in an incomplete character (U+FFFD) unless final. */
int gentext_stream_push(gentext_stream_t *s, const tok_t *tok, uint32_t id, bool final,
                        char **piece, char *err, size_t errlen);
/* The rest of the text (final), without adding an id. */
int gentext_stream_flush(gentext_stream_t *s, const tok_t *tok, char **piece, char *err,
                         size_t errlen);
void gentext_stream_free(gentext_stream_t *s);

#endif
