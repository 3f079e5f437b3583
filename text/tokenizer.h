/* tokenizer.h - Hugging Face tokenizer.json tokenizers (tok_*).
 *
 * A tokenizer is the pipeline of tokenizer.json: added tokens are matched
 * first, then each remaining section goes normalizer -> pre-tokenizer ->
 * model (BPE), and the post-processor adds the special tokens; decoding runs
 * the decoder. tokenizer_config.json beside tokenizer.json, when present,
 * supplies BOS/EOS, add_bos_token/add_eos_token, clean_up_tokenization_spaces
 * and the chat template. A component type that is not implemented is refused
 * by name at load, never approximated.
 *
 * Text in and out is UTF-8. Invalid UTF-8 in the input is read as a UTF-8
 * decoder of the WHATWG Encoding standard does (each maximal invalid
 * subsequence becomes U+FFFD), which is what the JavaScript reference
 * (@huggingface/tokenizers) sees after TextDecoder and Rust's
 * String::from_utf8_lossy gives.
 *
 * Errors follow common/errors.h: 0 or a negative TY_E* code, with a message in
 * the caller's buffer err (errlen bytes; may be NULL/0).
 * After tok_load, every function is safe to call from several threads at
 * once on one tok_t (the word cache takes a lock). */
#ifndef TY_TEXT_TOKENIZER_H
#define TY_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_s tok_t;

/* Loads path: a folder holding tokenizer.json (and optionally
 * tokenizer_config.json), or a tokenizer.json file itself (its folder's
 * tokenizer_config.json is read when present). *out is the caller's, freed
 * with tok_free. */
int tok_load(const char *path, tok_t **out, char *err, size_t errlen);
/* The same from memory: len bytes of tokenizer.json and config_len bytes of
 * tokenizer_config.json (config may be NULL: none). */
int tok_load_json(const char *json, size_t len, const char *config, size_t config_len, tok_t **out,
                  char *err, size_t errlen);
void tok_free(tok_t *t); /* accepts NULL */

/* Encodes len bytes of text. add_special: apply the post-processor's (or
 * tokenizer_config.json's add_bos_token/add_eos_token) special tokens.
 * *ids is malloc'd (the caller frees it; NULL when *n is 0). */
int tok_encode(const tok_t *t, const char *text, size_t len, int add_special, uint32_t **ids,
               size_t *n, char *err, size_t errlen);

/* Decodes n ids. skip_special drops special tokens. *text is malloc'd and
 * NUL-terminated (the caller frees it); *len excludes the NUL. An id past
 * the vocabulary is an error (TY_EINVAL). */
int tok_decode(const tok_t *t, const uint32_t *ids, size_t n, int skip_special, char **text,
               size_t *len, char *err, size_t errlen);

int64_t tok_vocab_size(const tok_t *t);    /* largest id + 1, added tokens included */
int64_t tok_bos_id(const tok_t *t);        /* -1 when none */
int64_t tok_eos_id(const tok_t *t);        /* -1 when none */
const char *tok_bos_token(const tok_t *t); /* or NULL; owned by t */
const char *tok_eos_token(const tok_t *t); /* or NULL; owned by t */
/* tokenizer_config.json's chat_template: the string form, or the entry
 * named "default" of the list form; NULL when none. Owned by t. */
const char *tok_chat_template(const tok_t *t);
/* The id of a token string (added tokens first, then the model's vocabulary), or -1. */
int64_t tok_token_to_id(const tok_t *t, const char *token);
/* The string of an id (added token or vocabulary entry), or NULL. Owned by t. */
const char *tok_id_to_token(const tok_t *t, uint32_t id);

#endif
