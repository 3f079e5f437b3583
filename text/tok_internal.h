/* tok_internal.h - the parts of a tokenizer that its modules share: byte
 * buffers, piece lists, the component interfaces (one per kind, each kind a
 * table from tokenizer.json "type" to a loader) and struct tok_s.
 * Not installed; only text/ includes it (and its unit tests). */
#ifndef TY_TEXT_TOK_INTERNAL_H
#define TY_TEXT_TOK_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "text/tokenizer.h"

/* ---- buffers (tok_util.c) ---- */

/* A growable byte buffer; s is NUL-terminated once anything was appended. */
typedef struct {
  char *s;
  size_t len, cap;
} tok_buf_t;

void tok_buf_append(tok_buf_t *b, const void *p, size_t n);
void tok_buf_free(tok_buf_t *b);

/* A list of byte strings stored back to back: piece i is
 * buf.s[off[i] .. off[i+1]). Appending copies. */
typedef struct {
  tok_buf_t buf;
  size_t *off; /* (n + 1) */
  size_t n, cap;
} tok_pieces_t;

void tok_pieces_clear(tok_pieces_t *p);
void tok_pieces_push(tok_pieces_t *p, const char *s, size_t n);
static inline const char *tok_piece(const tok_pieces_t *p, size_t i, size_t *n) {
  *n = p->off[i + 1] - p->off[i];
  return p->buf.s + p->off[i];
}
void tok_pieces_free(tok_pieces_t *p);

/* A growable list of ids. */
typedef struct {
  uint32_t *v;
  size_t n, cap;
} tok_ids_t;

void tok_ids_push(tok_ids_t *a, uint32_t id);

/* ---- UTF-8 (tok_utf8.c) ---- */

/* Length of the valid UTF-8 character at s (1..4), or 0 when s[0..n) does
 * not start with one. */
size_t tok_utf8_char_len(const unsigned char *s, size_t n);
/* Appends s to out with every maximal invalid subsequence replaced by U+FFFD
 * (WHATWG Encoding standard's decoder; Rust's from_utf8_lossy). */
void tok_utf8_sanitize(const char *s, size_t n, tok_buf_t *out);
/* Decodes one code point of valid UTF-8 at s, setting *len. */
uint32_t tok_utf8_decode(const unsigned char *s, size_t *len);
/* Writes cp as UTF-8 to out (4 bytes of room); returns the length. */
size_t tok_utf8_encode(uint32_t cp, char *out);
/* Unicode White_Space. */
int tok_is_white_space(uint32_t cp);

/* ---- regular expressions (tok_regex.c): PCRE2, UTF + UCP, JIT ---- */

typedef struct tok_regex_s tok_regex_t;
/* Scratch for matching on one thread (match data, JIT stack). */
typedef struct tok_match_s tok_match_t;

/* literal: the pattern is a plain string (tokenizer.json's {"String": ...}). */
int tok_regex_compile(const char *pattern, size_t len, int literal, tok_regex_t **out, char *err,
                      size_t errlen);
void tok_regex_free(tok_regex_t *re);
tok_match_t *tok_match_new(void);
void tok_match_free(tok_match_t *m);
/* Finds the first match in s[start..n): 1 with [*ms, *me), 0 when none, or
 * a negative TY_E* code. s must be valid UTF-8. */
int tok_regex_find(const tok_regex_t *re, tok_match_t *m, const char *s, size_t n, size_t start,
                   size_t *ms, size_t *me, char *err, size_t errlen);
/* Appends s with every match replaced by rep (matches as JavaScript's
 * replaceAll finds them: an empty match advances one character). */
int tok_regex_replace(const tok_regex_t *re, tok_match_t *m, const char *s, size_t n,
                      const char *rep, size_t rep_len, tok_buf_t *out, char *err, size_t errlen);
/* Reads tokenizer.json's pattern object {"String": s} or {"Regex": r}. */
int tok_regex_from_json(json_t *pattern, const char *what, tok_regex_t **out, char *err,
                        size_t errlen);

/* ---- per-call state ---- */

/* What one encode or decode call owns: nothing here is shared. */
typedef struct {
  tok_match_t *match;
  tok_pieces_t pa, pb; /* a section as one piece, and its pre-tokens */
  tok_buf_t nb;        /* normalizer output */
} tok_scratch_t;

/* ---- normalizers (tok_normalizer.c) ---- */

typedef struct tok_normalizer_s tok_normalizer_t;
struct tok_normalizer_s {
  /* Appends the normalized form of s[0..n) to out (cleared by the caller). */
  int (*apply)(const tok_normalizer_t *nz, tok_scratch_t *sc, const char *s, size_t n,
               tok_buf_t *out, char *err, size_t errlen);
  void (*free)(tok_normalizer_t *nz);
};
/* A JSON null gives *out = NULL (no normalizer). */
int tok_normalizer_load(json_t *j, tok_normalizer_t **out, char *err, size_t errlen);
void tok_normalizer_free(tok_normalizer_t *nz);
/* The normalized form of s, into out (cleared first); nz may be NULL. */
int tok_normalize(const tok_normalizer_t *nz, tok_scratch_t *sc, const char *s, size_t n,
                  tok_buf_t *out, char *err, size_t errlen);

/* ---- pre-tokenizers (tok_pretokenizer.c) ---- */

typedef struct tok_pretok_s tok_pretok_t;
struct tok_pretok_s {
  /* Splits every piece of in into out (cleared by the caller). section is
   * the index of the section among the input's added-token splits. */
  int (*apply)(const tok_pretok_t *pt, tok_scratch_t *sc, const tok_pieces_t *in, tok_pieces_t *out,
               size_t section, char *err, size_t errlen);
  void (*free)(tok_pretok_t *pt);
};
int tok_pretok_load(json_t *j, tok_pretok_t **out, char *err, size_t errlen);
void tok_pretok_free(tok_pretok_t *pt);

/* The GPT-2 byte-to-character map of ByteLevel: byte b is the UTF-8
 * character ch[b] (len[b] = 1 or 2 bytes); byte_of[cp] is the byte of code
 * point cp < 324, or -1. Built once, shared. */
typedef struct {
  char ch[256][2];
  unsigned char len[256];
  int16_t byte_of[324];
} tok_bytelevel_t;
const tok_bytelevel_t *tok_bytelevel(void);

/* ---- the BPE model (tok_bpe.c) ---- */

typedef struct tok_bpe_s tok_bpe_t;
int tok_bpe_load(json_t *model, tok_bpe_t **out, char *err, size_t errlen);
void tok_bpe_free(tok_bpe_t *m);
/* Appends the ids of one pre-token. */
int tok_bpe_encode(const tok_bpe_t *m, const char *s, size_t n, tok_ids_t *ids, char *err,
                   size_t errlen);
int64_t tok_bpe_lookup(const tok_bpe_t *m, const char *s, size_t n); /* -1 when absent */
const char *tok_bpe_id_to_token(const tok_bpe_t *m, uint32_t id, size_t *n);
uint32_t tok_bpe_vocab_end(const tok_bpe_t *m); /* largest id + 1 */

/* ---- added tokens (tok_added.c) ---- */

typedef struct {
  char *content;
  size_t len;
  char *norm; /* the normalized content it is matched by (normalized: true), or NULL */
  size_t norm_len;
  uint32_t id;
  int special, lstrip, rstrip, normalized;
} tok_added_token_t;

/* Leftmost-longest matcher over a set of added tokens. */
typedef struct tok_added_set_s tok_added_set_t;
tok_added_set_t *tok_added_set_new(void);
/* Adds (content, len) -> token index ti (borrowed; must outlive the set). */
void tok_added_set_add(tok_added_set_t *set, const char *content, size_t len, size_t ti);
void tok_added_set_free(tok_added_set_t *set);
/* The leftmost-longest match in s[start..n): 1 with [*ms, *me) and *ti. */
int tok_added_set_find(const tok_added_set_t *set, const char *s, size_t n, size_t start,
                       size_t *ms, size_t *me, size_t *ti);

/* The token whose content is exactly s[0..n): 1 with *ti. */
int tok_added_set_exact(const tok_added_set_t *set, const char *s, size_t n, size_t *ti);

/* Ids above this are refused at load (they size tables). */
#define TOK_MAX_ID (1u << 24)

/* ---- post-processors (tok_post.c) ---- */

typedef struct tok_post_s tok_post_t;
int tok_post_load(json_t *j, tok_post_t **out, char *err, size_t errlen);
void tok_post_free(tok_post_t *pp);
/* Writes the ids the template puts before and after the sequence. */
void tok_post_specials(const tok_post_t *pp, tok_ids_t *before, tok_ids_t *after);

/* ---- decoders (tok_decoder.c) ---- */

typedef struct tok_decoder_s tok_decoder_t;
struct tok_decoder_s {
  /* Rewrites the list of token strings in (into out, cleared by the caller). */
  int (*apply)(const tok_decoder_t *d, const tok_t *t, tok_scratch_t *sc, const tok_pieces_t *in,
               tok_pieces_t *out, char *err, size_t errlen);
  void (*free)(tok_decoder_t *d);
};
int tok_decoder_load(json_t *j, tok_decoder_t **out, char *err, size_t errlen);
void tok_decoder_free(tok_decoder_t *d);
/* 1 when s[0..n) is the content of an added token of t. */
int tok_is_added_content(const tok_t *t, const char *s, size_t n);

/* ---- the word cache (tok_cache.c): pre-token -> ids, shared, locked ---- */

typedef struct tok_cache_s tok_cache_t;
tok_cache_t *tok_cache_new(void);
void tok_cache_free(tok_cache_t *c);
/* Appends the cached ids of s to ids and returns 1, or returns 0. */
int tok_cache_get(tok_cache_t *c, const char *s, size_t n, tok_ids_t *ids);
void tok_cache_put(tok_cache_t *c, const char *s, size_t n, const uint32_t *ids, size_t nids);

/* ---- the tokenizer ---- */

struct tok_s {
  tok_normalizer_t *normalizer;
  tok_pretok_t *pretok;
  tok_bpe_t *bpe;
  tok_post_t *post;
  tok_decoder_t *decoder;

  tok_added_token_t *added; /* (n_added), in tokenizer.json's order */
  size_t n_added;
  int32_t *added_of;           /* (vocab_end) id -> index in added, or -1 */
  tok_added_set_t *added_raw;  /* tokens matched before normalization */
  tok_added_set_t *added_norm; /* tokens matched after it (normalized: true) */
  tok_added_set_t *added_all;  /* every content, for lookups */
  uint32_t vocab_end;

  /* tokenizer_config.json */
  char *bos_token, *eos_token, *chat_template;
  int64_t bos_id, eos_id;
  int config_specials; /* add_bos_token/add_eos_token given: they decide */
  int add_bos, add_eos;
  int clean_up_spaces;
};

/* FNV-1a over bytes, the hash of every table here. */
static inline uint64_t tok_hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* Refuses a component type by name, listing the supported ones: table is an
 * array of n structs of stride bytes whose first member is the type name.
 * Returns TY_EUNIMPLEMENTED. */
int tok_refuse(char *err, size_t errlen, const char *kind, const char *type, const void *table,
               size_t n, size_t stride);
#define TOK_REFUSE(err, errlen, kind, type, table) \
  tok_refuse(err, errlen, kind, type, table, sizeof table / sizeof *table, sizeof *table)

#endif
