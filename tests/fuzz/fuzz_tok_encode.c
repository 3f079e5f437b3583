/* fuzz_tok_encode.c - libFuzzer target for encoding and decoding. The first
 * byte picks one of two built-in tokenizers and whether special tokens are
 * added; the rest is the text (any bytes, invalid UTF-8 included).
 *   - byte-level (Llama 3's split expression, ByteLevel, every byte in the
 *     vocabulary, a few merges, added tokens): decoding the ids must give
 *     back the text exactly as the tokenizer reads it (invalid UTF-8 as
 *     U+FFFD), special tokens included.
 *   - sentencepiece style (Prepend/Replace normalizer, byte_fallback, the
 *     Llama 2 decoder): encoding and decoding must succeed, every id
 *     inside the vocabulary. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/tok_internal.h"
#include "text/tokenizer.h"

static tok_t *g_bytelevel, *g_sp;

static const char split_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *added(int id, const char *content) {
  return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                   "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static tok_t *load(json_t *j) {
  char *text = json_dumps(j, 0), err[512];
  tok_t *t = NULL;
  if (tok_load_json(text, strlen(text), NULL, 0, &t, err, sizeof err)) {
    fprintf(stderr, "fuzz_tok_encode: %s\n", err);
    abort();
  }
  free(text);
  json_decref(j);
  return t;
}

static tok_t *make_bytelevel(void) {
  const tok_bytelevel_t *bl = tok_bytelevel();
  json_t *vocab = json_object(), *merges = json_array();
  for (int b = 0; b < 256; b++) {
    char s[3] = {bl->ch[b][0], bl->len[b] == 2 ? bl->ch[b][1] : 0, 0};
    json_object_set_new(vocab, s, json_integer(b));
  }
  static const char *const m[][2] = {{"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"},
                                     {"i", "n"},        {"a", "n"}, {"an", "d"}};
  for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
    char both[16];
    snprintf(both, sizeof both, "%s%s", m[i][0], m[i][1]);
    json_object_set_new(vocab, both, json_integer(256 + (int)i));
    json_array_append_new(merges, json_pack("[s,s]", m[i][0], m[i][1]));
  }
  json_t *j = json_pack(
      "{s:[o,o], s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]},"
      " s:{s:s, s:[{s:o}]}, s:{s:s},"
      " s:{s:s, s:o, s:o, s:b}}",
      "added_tokens", added(300, "<|begin_of_text|>"), added(301, "<|eot_id|>"), "normalizer",
      "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
      split_regex, "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
      "use_regex", 0, "post_processor", "type", "TemplateProcessing", "single", "SpecialToken",
      json_pack("{s:s, s:i}", "id", "<|begin_of_text|>", "type_id", 0), "decoder", "type",
      "ByteLevel", "model", "type", "BPE", "vocab", vocab, "merges", merges, "ignore_merges", 1);
  /* the template's sequence and its special token table */
  json_t *single = json_object_get(json_object_get(j, "post_processor"), "single");
  json_array_append_new(single, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "A", "type_id", 0));
  json_object_set_new(json_object_get(j, "post_processor"), "special_tokens",
                      json_pack("{s:{s:s, s:[i], s:[s]}}", "<|begin_of_text|>", "id",
                                "<|begin_of_text|>", "ids", 300, "tokens", "<|begin_of_text|>"));
  return load(j);
}

static tok_t *make_sentencepiece(void) {
  json_t *vocab = json_object(), *merges = json_array();
  int id = 0;
  json_object_set_new(vocab, "<unk>", json_integer(id++));
  json_object_set_new(vocab, "<s>", json_integer(id++));
  json_object_set_new(vocab, "</s>", json_integer(id++));
  for (int b = 0; b < 256; b++) {
    char s[8];
    snprintf(s, sizeof s, "<0x%02X>", b);
    json_object_set_new(vocab, s, json_integer(id++));
  }
  static const char *const pieces[] = {"\xE2\x96\x81",
                                       "a",
                                       "b",
                                       "t",
                                       "h",
                                       "e",
                                       "\xE2\x96\x81t",
                                       "he",
                                       "\xE2\x96\x81the",
                                       "\xE2\x96\x81"
                                       "a",
                                       "ab"};
  for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
    json_object_set_new(vocab, pieces[i], json_integer(id++));
  static const char *const m[][2] = {{"\xE2\x96\x81", "t"},
                                     {"h", "e"},
                                     {"\xE2\x96\x81t", "he"},
                                     {"\xE2\x96\x81", "a"},
                                     {"a", "b"}};
  for (size_t i = 0; i < sizeof m / sizeof *m; i++)
    json_array_append_new(merges, json_pack("[s,s]", m[i][0], m[i][1]));
  json_t *j = json_pack(
      "{s:[o,o,o],"
      " s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n,"
      " s:{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}},"
      " s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]},"
      " s:{s:s, s:o, s:o, s:s, s:b, s:b}}",
      "added_tokens", added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"), "normalizer", "type",
      "Sequence", "normalizers", "type", "Prepend", "prepend", "\xE2\x96\x81", "type", "Replace",
      "pattern", "String", " ", "content", "\xE2\x96\x81", "pre_tokenizer", "post_processor",
      "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", 0, "Sequence",
      "id", "A", "type_id", 0, "special_tokens", "<s>", "id", "<s>", "ids", 1, "tokens", "<s>",
      "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
      "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
      "content", " ", "start", 1, "stop", 0, "model", "type", "BPE", "vocab", vocab, "merges",
      merges, "unk_token", "<unk>", "byte_fallback", 1, "fuse_unk", 1);
  return load(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (!g_bytelevel) {
    g_bytelevel = make_bytelevel();
    g_sp = make_sentencepiece();
  }
  int which = data[0] & 1, special = (data[0] >> 1) & 1;
  const char *text = (const char *)data + 1;
  size_t n = size - 1;
  const tok_t *t = which ? g_sp : g_bytelevel;
  uint32_t *ids;
  size_t nids;
  char err[512];
  if (tok_encode(t, text, n, special, &ids, &nids, err, sizeof err)) abort();
  for (size_t i = 0; i < nids; i++)
    if (ids[i] >= (uint32_t)tok_vocab_size(t)) abort();
  char *back;
  size_t blen;
  if (tok_decode(t, ids, nids, 0, &back, &blen, err, sizeof err)) abort();
  if (!which) {
    /* byte-level: the text comes back as the tokenizer read it */
    tok_buf_t want = {0};
    if (special) tok_buf_append(&want, "<|begin_of_text|>", 17);
    tok_utf8_sanitize(text, n, &want);
    if (blen != want.len || (blen && memcmp(back, want.s, blen))) abort();
    tok_buf_free(&want);
  }
  free(back);
  free(ids);
  return 0;
}
