/* test_text_tokenizer.c - the tokenizer's components on small hand-written
 * tokenizer.json files: BPE merge order and ties, byte fallback, unknown
 * tokens, the lossy UTF-8 reading, added tokens and their flags, each
 * normalizer, pre-tokenizer, post-processor and decoder, the
 * tokenizer_config.json fields, loading by folder and by file, threads, and
 * the refusal by name of every construct in tests/text/refuse/. (Exactness
 * on real tokenizers against the reference: tests/text/exact.sh.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <cmocka.h>

#include "common/errors.h"
#include "text/tok_internal.h"
#include "text/tokenizer.h"

#include "tmpdir_testutil.h"

/* ids:  a 0, b 1, c 2, ab 3, bc 4, abc 5, ▁ 6, ▁a 7, <0xC3> 8, <0xA9> 9, <unk> 10,
 * " " 11, x 12, y 13, ▁b 14, <0xE2> 15, <0x82> 16, <0xAC> 17 */
#define VOCAB                                                                            \
  "{\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"\\u2581\": 6, "    \
  "\"\\u2581a\": 7, \"<0xC3>\": 8, \"<0xA9>\": 9, \"<unk>\": 10, \" \": 11, \"x\": 12, " \
  "\"y\": 13, \"\\u2581b\": 14, \"<0xE2>\": 15, \"<0x82>\": 16, \"<0xAC>\": 17}"

/* A tokenizer from its parts (JSON fragments; NULL: null / none). */
static tok_t *mk(const char *merges, const char *model_extra, const char *added,
                 const char *normalizer, const char *pretok, const char *post, const char *decoder,
                 const char *config) {
  char json[8192];
  snprintf(json, sizeof json,
           "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [%s],"
           " \"normalizer\": %s, \"pre_tokenizer\": %s, \"post_processor\": %s, \"decoder\": %s,"
           " \"model\": {\"type\": \"BPE\", \"vocab\": " VOCAB ", \"merges\": [%s]%s}}",
           added ? added : "", normalizer ? normalizer : "null", pretok ? pretok : "null",
           post ? post : "null", decoder ? decoder : "null", merges ? merges : "",
           model_extra ? model_extra : "");
  char err[512] = "";
  tok_t *t = NULL;
  int rc =
      tok_load_json(json, strlen(json), config, config ? strlen(config) : 0, &t, err, sizeof err);
  if (rc) fprintf(stderr, "load: %s\n", err);
  assert_int_equal(rc, 0);
  return t;
}

/* Encodes text and checks the ids (n of them, then -1 ends the list). */
static void expect_ids(const tok_t *t, const char *text, int add_special, ...) {
  uint32_t *ids;
  size_t n;
  char err[256];
  assert_int_equal(tok_encode(t, text, strlen(text), add_special, &ids, &n, err, sizeof err), 0);
  va_list ap;
  va_start(ap, add_special);
  size_t i = 0;
  for (int want; (want = va_arg(ap, int)) >= 0; i++) {
    if (i >= n) fail_msg("'%s': %zu ids, wanted more", text, n);
    if (ids[i] != (uint32_t)want) fail_msg("'%s': id %zu is %u, wanted %d", text, i, ids[i], want);
  }
  va_end(ap);
  if (i != n) fail_msg("'%s': %zu ids, wanted %zu", text, n, i);
  free(ids);
}

static void expect_decode(const tok_t *t, const uint32_t *ids, size_t n, int skip,
                          const char *want) {
  char *s, err[256];
  size_t len;
  assert_int_equal(tok_decode(t, ids, n, skip, &s, &len, err, sizeof err), 0);
  assert_int_equal(len, strlen(want));
  assert_string_equal(s, want);
  free(s);
}

static void bpe_merge_order(void **state) {
  /* (b c) ranks first: a + bc, and no merge makes abc from those */
  tok_t *t = mk("\"b c\", \"a b\"", NULL, NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "abc", 0, 0, 4, -1);
  tok_free(t);
  t = mk("\"a b\", \"b c\"", NULL, NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "abc", 0, 3, 2, -1);
  tok_free(t);
  /* the array form of merges, and a merge of merges */
  t = mk("[\"b\", \"c\"], [\"a\", \"bc\"]", NULL, NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "abcabc", 0, 5, 5, -1);
  expect_ids(t, "cab", 0, 2, 0, 1, -1);
  tok_free(t);
}

static void bpe_ties_leftmost(void **state) {
  /* "bcbc": (b c) twice at rank 0, leftmost first; both merge */
  tok_t *t = mk("\"b c\"", NULL, NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "bcbc", 0, 4, 4, -1);
  expect_ids(t, "bbc", 0, 1, 4, -1);
  tok_free(t);
}

static void bpe_ignore_merges(void **state) {
  /* with ignore_merges a word in the vocabulary is one token, whatever the merges say */
  tok_t *t = mk("\"b c\"", ", \"ignore_merges\": true", NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "abc", 0, 5, -1);
  tok_free(t);
  t = mk("\"b c\"", ", \"ignore_merges\": false", NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "abc", 0, 0, 4, -1);
  tok_free(t);
}

static void bpe_byte_fallback_and_unk(void **state) {
  tok_t *t = mk("", ", \"byte_fallback\": true, \"unk_token\": \"<unk>\"", NULL, NULL, NULL, NULL,
                "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, "
                "{\"type\": \"Fuse\"}]}",
                NULL);
  expect_ids(t, "a\xC3\xA9", 0, 0, 8, 9, -1);       /* é: its two byte tokens */
  expect_ids(t, "\xE2\x82\xAC", 0, 15, 16, 17, -1); /* € */
  expect_ids(t, "z", 0, 10, -1);                    /* no <0x7A>: unk */
  uint32_t e[] = {0, 8, 9}, half[] = {8, 0}, euro_cut[] = {15, 16, 1};
  expect_decode(t, e, 3, 0, "a\xC3\xA9");
  expect_decode(t, half, 2, 0,
                "\xEF\xBF\xBD"
                "a"); /* a cut character: U+FFFD */
  expect_decode(t, euro_cut, 3, 0,
                "\xEF\xBF\xBD"
                "b"); /* one U+FFFD per maximal subpart */
  tok_free(t);
  t = mk("", ", \"unk_token\": \"<unk>\", \"fuse_unk\": true", NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "zzaz", 0, 10, 0, 10, -1);
  tok_free(t);
  t = mk("", ", \"unk_token\": \"<unk>\", \"fuse_unk\": false", NULL, NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "zzaz", 0, 10, 10, 0, 10, -1);
  tok_free(t);
  t = mk("", NULL, NULL, NULL, NULL, NULL, NULL, NULL); /* no unk: dropped */
  expect_ids(t, "zaz", 0, 0, -1);
  tok_free(t);
}

static void utf8_lossy(void **state) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"a\x80"
       "b",
       "a\xEF\xBF\xBD"
       "b"},
      {"\xE2\x82", "\xEF\xBF\xBD"}, /* truncated: one U+FFFD */
      {"\xE2\x82"
       "a",
       "\xEF\xBF\xBD"
       "a"},
      {"\xF0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* overlong: each byte */
      {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* a surrogate */
      {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xF0\x9F\x98", "\xEF\xBF\xBD"},
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},
      {"\xFF\xFE", "\xEF\xBF\xBD\xEF\xBF\xBD"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    tok_buf_t b = {0};
    tok_utf8_sanitize(cases[i].in, strlen(cases[i].in), &b);
    assert_int_equal(b.len, strlen(cases[i].out));
    assert_memory_equal(b.s, cases[i].out, b.len);
    tok_buf_free(&b);
  }
}

/* 1 when pattern finds a match in s (as tokenizer.json's Regex). */
static int regex_hits(const char *pattern, const char *s) {
  tok_regex_t *re;
  char err[256];
  assert_int_equal(tok_regex_compile(pattern, strlen(pattern), 0, &re, err, sizeof err), 0);
  tok_match_t *m = tok_match_new();
  size_t ms, me;
  int rc = tok_regex_find(re, m, s, strlen(s), 0, &ms, &me, err, sizeof err);
  assert_true(rc >= 0);
  tok_match_free(m);
  tok_regex_free(re);
  return rc;
}

/* Patterns keep Oniguruma's meaning of \s, \w and \h (the reference's),
 * not PCRE2's. */
static void regex_oniguruma(void **state) {
  const char *mvs = "\xE1\xA0\x8E", *nel = "\xC2\x85"; /* U+180E, U+0085 */
  assert_int_equal(regex_hits("\\s", mvs), 0);         /* PCRE2's \s would take it */
  assert_int_equal(regex_hits("\\s", nel), 1);
  assert_int_equal(regex_hits("\\s", "\xC2\xA0"), 1);
  assert_int_equal(regex_hits("[^\\s\\p{L}]", mvs), 1);
  assert_int_equal(regex_hits("\\S", mvs), 1);
  assert_int_equal(regex_hits("\\w", "\xC2\xB2"), 1); /* ² */
  assert_int_equal(regex_hits("\\w", "-"), 0);
  assert_int_equal(regex_hits("\\h", "f"), 1);
  assert_int_equal(regex_hits("\\h", " "), 0);
  assert_int_equal(regex_hits("[]s]", "]"), 1); /* a first ']' is literal */
  assert_int_equal(regex_hits("\\Q\\s\\E", "\\s"), 1);
  assert_int_equal(regex_hits("\\\\s", "\\s"), 1); /* an escaped backslash, then s */
  tok_regex_t *re;
  char err[256];
  assert_int_equal(tok_regex_compile("[\\W]", 5, 0, &re, err, sizeof err), TY_EUNIMPLEMENTED);
  assert_non_null(strstr(err, "\\W inside a character class"));
}

#define ADDED(id, content, flags) \
  "{\"id\": " #id ", \"content\": \"" content "\", \"single_word\": false, " flags "}"

static void added_tokens(void **state) {
  /* <m> strips the white space around it; <n> does not; <s> is special */
  tok_t *t = mk(
      "", NULL,
      ADDED(
          20, "<m>",
          "\"lstrip\": true, \"rstrip\": true, \"normalized\": false, "
          "\"special\": false") ", " ADDED(21, "<n>",
                                           "\"lstrip\": false, \"rstrip\": false, "
                                           "\"normalized\": false, "
                                           "\"special\": false") ", " ADDED(22, "<s>",
                                                                            "\"lstrip\": "
                                                                            "false, "
                                                                            "\"rstrip\": "
                                                                            "false, "
                                                                            "\"normalized\": "
                                                                            "false, "
                                                                            "\"special\": "
                                                                            "true") ", " ADDED(23,
                                                                                               "<s>"
                                                                                               "x",
                                                                                               "\"l"
                                                                                               "str"
                                                                                               "ip"
                                                                                               "\":"
                                                                                               " fa"
                                                                                               "lse"
                                                                                               ", "
                                                                                               "\"r"
                                                                                               "str"
                                                                                               "ip"
                                                                                               "\":"
                                                                                               " fa"
                                                                                               "lse"
                                                                                               ", "
                                                                                               "\"n"
                                                                                               "orm"
                                                                                               "ali"
                                                                                               "zed"
                                                                                               "\":"
                                                                                               " fa"
                                                                                               "lse"
                                                                                               ", "
                                                                                               "\"s"
                                                                                               "pec"
                                                                                               "ial"
                                                                                               "\":"
                                                                                               " fa"
                                                                                               "ls"
                                                                                               "e"),
      NULL, NULL, NULL, NULL, NULL);
  expect_ids(t, "a <m> b", 0, 0, 20, 1, -1);
  expect_ids(t, "a\t <m>\n b", 0, 0, 20, 1, -1);
  expect_ids(t, "a <n> b", 0, 0, 11, 21, 11, 1, -1);
  expect_ids(t, "<s><s>x<s>", 0, 22, 23, 22, -1); /* longest match wins */
  expect_ids(t, "<s", 0, -1);                     /* '<' and 's' are not in the vocabulary */
  assert_int_equal(tok_vocab_size(t), 24);
  assert_int_equal(tok_token_to_id(t, "<m>"), 20);
  assert_int_equal(tok_token_to_id(t, "ab"), 3);
  assert_int_equal(tok_token_to_id(t, "nope"), -1);
  assert_string_equal(tok_id_to_token(t, 22), "<s>");
  uint32_t ids[] = {22, 0, 20, 22};
  expect_decode(t, ids, 4, 0, "<s> a <m> <s>"); /* no decoder: joined by spaces */
  expect_decode(t, ids, 4, 1, "a <m>");
  uint32_t bad[] = {0, 99};
  char *s, err[256];
  size_t len;
  assert_int_equal(tok_decode(t, bad, 2, 0, &s, &len, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "99"));
  tok_free(t);
}

static void normalizers(void **state) {
  /* sentencepiece style: Prepend ▁, spaces to ▁; an added token matched in
   * normalized text by its normalized form ("a b" -> "▁a▁b"... here "b c"). */
  const char *norm =
      "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
      "\"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": "
      "{\"String\": \" \"}, \"content\": \"\\u2581\"}]}";
  tok_t *t = mk("\"\\u2581 a\", \"\\u2581 b\"", NULL,
                ADDED(30, "b c",
                      "\"lstrip\": false, \"rstrip\": false, \"normalized\": true, "
                      "\"special\": false"),
                norm, NULL, NULL, NULL, NULL);
  expect_ids(t, "a b", 0, 7, 14, -1);
  expect_ids(t, "a b c", 0, 7, 30, -1); /* "▁a▁b▁c": the token is "▁b▁c" once normalized */
  expect_ids(t, "ab c", 0, 7, 1, 6, 2, -1); /* "▁ab▁c" does not hold it */
  expect_ids(t, "", 0, -1);                 /* Prepend leaves empty text empty */
  tok_free(t);
  /* the Unicode normalization forms: e + U+0301 composes to é (C3 A9, two
   * byte tokens); NFD takes é apart (neither part is in the vocabulary);
   * NFKC folds the fullwidth a (U+FF41) to a */
  t = mk("", ", \"byte_fallback\": true", NULL, "{\"type\": \"NFC\"}", NULL, NULL, NULL, NULL);
  expect_ids(t, "ae\xCC\x81", 0, 0, 8, 9, -1);
  tok_free(t);
  t = mk("", ", \"byte_fallback\": true", NULL, "{\"type\": \"NFD\"}", NULL, NULL, NULL, NULL);
  expect_ids(t, "\xC3\xA9", 0, -1);
  tok_free(t);
  t = mk("", NULL, NULL, "{\"type\": \"NFKC\"}", NULL, NULL, NULL, NULL);
  expect_ids(t,
             "\xEF\xBD\x81"
             "b",
             0, 0, 1, -1);
  tok_free(t);
  /* Replace with a regular expression */
  t = mk("", NULL, NULL,
         "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"[xy]+\"}, \"content\": \"c\"}", NULL,
         NULL, NULL, NULL);
  expect_ids(t, "axyxb", 0, 0, 2, 1, -1);
  tok_free(t);
}

static void pre_tokenizers(void **state) {
  /* Split (Isolated): words never merge across pieces */
  tok_t *t = mk("\"a b\"", NULL, NULL, NULL,
                "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}\"}, \"behavior\": "
                "\"Isolated\", \"invert\": false}",
                NULL, NULL, NULL);
  expect_ids(t, "ab ab", 0, 0, 1, 11, 0, 1, -1);
  tok_free(t);
  /* Removed drops the matches */
  t = mk("\"a b\"", NULL, NULL, NULL,
         "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Removed\", "
         "\"invert\": false}",
         NULL, NULL, NULL);
  expect_ids(t, "ab  ab ", 0, 3, 3, -1);
  tok_free(t);
  /* a pattern that matches empty strings splits there too */
  t = mk("\"a b\"", NULL, NULL, NULL,
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x*\"}, \"behavior\": \"Isolated\", "
         "\"invert\": false}",
         NULL, NULL, NULL);
  expect_ids(t, "abxxab", 0, 0, 1, 12, 12, 0, 1, -1);
  tok_free(t);
  /* Metaspace: spaces become ▁, one prepended, split before each ▁ */
  t = mk("\"\\u2581 a\", \"\\u2581 b\"", NULL, NULL, NULL,
         "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\", "
         "\"split\": true}",
         NULL,
         "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": "
         "\"always\", \"split\": true}",
         NULL);
  expect_ids(t, "a b", 0, 7, 14, -1);
  uint32_t ids[] = {7, 14, 6, 0};
  expect_decode(t, ids, 4, 0, "a b a");
  tok_free(t);
}

/* Split's five behaviors on "a-b--c" split by "-" (and inverted). */
static void split_behaviors(void **state) {
  static const struct {
    const char *behavior;
    int invert;
    const char *want; /* the pieces, joined by '|' */
  } cases[] = {
      {"Isolated", 0, "a|-|b|-|-|c"},         {"Removed", 0, "a|b|c"},
      {"MergedWithPrevious", 0, "a-|b-|-|c"}, {"MergedWithNext", 0, "a|-b|-|-c"},
      {"Contiguous", 0, "a|-|b|--|c"},        {"Removed", 1, "-|-|-"},
      {"Isolated", 1, "a|-|b|-|-|c"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char json[256], err[256];
    snprintf(json, sizeof json,
             "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\", "
             "\"invert\": %s}",
             cases[i].behavior, cases[i].invert ? "true" : "false");
    json_t *j = json_loads(json, 0, NULL);
    tok_pretok_t *pt;
    assert_int_equal(tok_pretok_load(j, &pt, err, sizeof err), 0);
    tok_scratch_t sc = {0};
    sc.match = tok_match_new();
    tok_pieces_t in = {0}, out = {0};
    tok_pieces_push(&in, "a-b--c", 6);
    tok_pieces_clear(&out);
    assert_int_equal(pt->apply(pt, &sc, &in, &out, 0, err, sizeof err), 0);
    char got[64] = "";
    for (size_t k = 0; k < out.n; k++) {
      size_t len;
      const char *p = tok_piece(&out, k, &len);
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%.*s", k ? "|" : "", (int)len, p);
    }
    if (strcmp(got, cases[i].want))
      fail_msg("%s%s: '%s', wanted '%s'", cases[i].behavior, cases[i].invert ? " inverted" : "",
               got, cases[i].want);
    tok_pieces_free(&in);
    tok_pieces_free(&out);
    tok_match_free(sc.match);
    tok_pretok_free(pt);
    json_decref(j);
  }
}

static void byte_level(void **state) {
  /* ByteLevel maps every byte to a character: the vocabulary of a GPT-2
   * style tokenizer. A space is "Ġ" (U+0120), 0xC3 "Ã" (U+00C3), 0xA9 "©". */
  char json[4096];
  snprintf(json, sizeof json,
           "{\"added_tokens\": [{\"id\": 9, \"content\": \"<|e|>\", \"special\": true, "
           "\"normalized\": false}],"
           " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
           "\"use_regex\": true},"
           " \"decoder\": {\"type\": \"ByteLevel\"}, \"post_processor\": {\"type\": "
           "\"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
           " {\"SpecialToken\": {\"id\": \"<|e|>\", \"type_id\": 0}}], \"special_tokens\": "
           "{\"<|e|>\": {\"id\": \"<|e|>\", \"ids\": [9], \"tokens\": [\"<|e|>\"]}}},"
           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"\\u0120\": 1, \"\\u0120a\": 2,"
           " \"\\u00c3\": 3, \"\\u00a9\": 4, \"\\u00c3\\u00a9\": 5, \"b\": 6, \"'\": 7, \"s\": 8},"
           " \"merges\": [\"\\u0120 a\", \"\\u00c3 \\u00a9\"]}}");
  char err[256];
  tok_t *t;
  assert_int_equal(tok_load_json(json, strlen(json), NULL, 0, &t, err, sizeof err), 0);
  expect_ids(t, "a a\xC3\xA9", 0, 0, 2, 5, -1);
  expect_ids(t, "a a", 1, 0, 2, 9, -1);
  expect_ids(t, "b's", 0, 6, 7, 8, -1);
  assert_int_equal(tok_eos_id(t), 9); /* from the template, without a config */
  assert_string_equal(tok_eos_token(t), "<|e|>");
  assert_int_equal(tok_bos_id(t), -1);
  uint32_t ids[] = {0, 2, 9, 5, 3};
  expect_decode(t, ids, 5, 0, "a a<|e|>\xC3\xA9\xEF\xBF\xBD");
  expect_decode(t, ids, 5, 1, "a a\xC3\xA9\xEF\xBF\xBD");
  tok_free(t);
}

static void decoders(void **state) {
  tok_t *t = mk("", NULL, NULL, NULL, NULL, NULL,
                "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
                "{\"String\": \"\\u2581\"}, \"content\": \" \"}, {\"type\": \"Fuse\"}, "
                "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}",
                NULL);
  uint32_t ids[] = {7, 14, 6, 6};
  expect_decode(t, ids, 4, 0, "a b  ");
  uint32_t two[] = {6, 6, 0};
  expect_decode(t, two, 3, 0, " a"); /* Strip takes one leading space only */
  expect_decode(t, NULL, 0, 0, "");
  tok_free(t);
  /* no decoder: tokens joined by spaces */
  t = mk("", NULL, NULL, NULL, NULL, NULL, NULL, NULL);
  uint32_t abc[] = {0, 1, 2};
  expect_decode(t, abc, 3, 0, "a b c");
  tok_free(t);
}

static void config(void **state) {
#define PLAIN "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
  const char *added = ADDED(20, "<s>", PLAIN "\"special\": true") ", " ADDED(
      21, "</s>", PLAIN "\"special\": true") ", " ADDED(22, "<n>", PLAIN "\"special\": false");
#undef PLAIN
  const char *post =
      "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
      "\"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
      " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [20], \"tokens\":"
      " [\"<s>\"]}}}";
  /* the template alone */
  tok_t *t = mk("", NULL, added, NULL, NULL, post, NULL, NULL);
  expect_ids(t, "a", 1, 20, 0, -1);
  expect_ids(t, "a", 0, 0, -1);
  assert_null(tok_chat_template(t));
  tok_free(t);
  /* add_bos_token/add_eos_token decide when given; tokens as strings or objects */
  t = mk("", NULL, added, NULL, NULL, post, NULL,
         "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
         " \"add_bos_token\": false, \"add_eos_token\": true, \"additional_special_tokens\":"
         " [\"<n>\"], \"model_max_length\": "
         "1000000000000000019884624838656, \"chat_template\": [{\"name\": \"tool_use\", "
         "\"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}");
  expect_ids(t, "a", 1, 0, 21, -1);
  uint32_t with_n[] = {22, 0};
  expect_decode(t, with_n, 2, 1, "a"); /* <n>: special through additional_special_tokens */
  assert_int_equal(tok_bos_id(t), 20);
  assert_int_equal(tok_eos_id(t), 21);
  assert_string_equal(tok_bos_token(t), "<s>");
  assert_string_equal(tok_eos_token(t), "</s>");
  assert_string_equal(tok_chat_template(t), "D");
  tok_free(t);
  /* clean_up_tokenization_spaces */
  t = mk("", NULL, NULL, NULL, NULL, NULL, NULL,
         "{\"clean_up_tokenization_spaces\": true, \"chat_template\": \"{{ x }}\"}");
  uint32_t ids[] = {0, 11, 1};
  expect_decode(t, ids, 3, 0, "a   b"); /* joined with spaces: "a" " " "b" */
  assert_string_equal(tok_chat_template(t), "{{ x }}");
  tok_free(t);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void load_paths(void **state) {
  char dir[512], file[600], cfg[600], err[512];
  snprintf(dir, sizeof dir, "%s/model", g_dir);
  snprintf(file, sizeof file, "%s/tokenizer.json", dir);
  snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
  tok_t *t;
  assert_int_equal(tok_load(dir, &t, err, sizeof err), TY_ENOTFOUND);
  assert_int_equal(system(NULL) != 0, 1);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(tok_load(dir, &t, err, sizeof err), TY_ENOTFOUND);
  write_file(file,
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
             "\"merges\": []}, \"added_tokens\": [{\"id\": 2, \"content\": \"<e>\", "
             "\"special\": true}]}");
  assert_int_equal(tok_load(dir, &t, err, sizeof err), 0);
  assert_int_equal(tok_eos_id(t), -1);
  tok_free(t);
  write_file(cfg, "{\"eos_token\": \"<e>\"}");
  assert_int_equal(tok_load(file, &t, err, sizeof err), 0); /* the file: its folder's config */
  assert_int_equal(tok_eos_id(t), 2);
  tok_free(t);
  write_file(cfg, "{\"eos_token\": ");
  assert_int_equal(tok_load(dir, &t, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "tokenizer_config.json"));
  write_file(file, "[1, 2]");
  assert_int_equal(tok_load(file, &t, err, sizeof err), TY_EINVAL);
  tok_free(NULL);
}

typedef struct {
  const tok_t *t;
  const char *text;
  uint32_t *ids;
  size_t n;
} job_t;

static void *encode_job(void *arg) {
  job_t *j = arg;
  char err[256];
  for (int k = 0; k < 50; k++) {
    free(j->ids);
    if (tok_encode(j->t, j->text, strlen(j->text), 1, &j->ids, &j->n, err, sizeof err)) return arg;
  }
  return NULL;
}

static void threads(void **state) {
  tok_t *t = mk("\"a b\", \"b c\"", NULL, NULL, NULL,
                "{\"type\": \"Split\", \"pattern\": {\"Regex\": \" \"}, \"behavior\": "
                "\"Isolated\", \"invert\": false}",
                NULL, NULL, NULL);
  char text[8192];
  size_t k = 0;
  for (int i = 0; k + 8 < sizeof text; i++) {
    static const char *w[] = {"abc", "cab", "bca", "ab", "ccc", "b"};
    k += (size_t)snprintf(text + k, sizeof text - k, "%s ", w[i % 6]);
  }
  uint32_t *want;
  size_t nwant;
  char err[256];
  assert_int_equal(tok_encode(t, text, strlen(text), 1, &want, &nwant, err, sizeof err), 0);
  pthread_t th[4];
  job_t jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (job_t){t, text, NULL, 0};
    assert_int_equal(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(th[i], &r);
    assert_null(r);
    assert_int_equal(jobs[i].n, nwant);
    assert_memory_equal(jobs[i].ids, want, nwant * sizeof *want);
    free(jobs[i].ids);
  }
  free(want);
  tok_free(t);
}

/* Every file of tests/text/refuse is refused, naming the construct. */
static void refusals(void **state) {
  static const struct {
    const char *file, *names;
  } cases[] = {
      {"pre_tokenizer_whitespace.json", "pre_tokenizer type 'Whitespace' is not supported"},
      {"normalizer_bert.json", "normalizer type 'BertNormalizer' is not supported"},
      {"normalizer_lowercase_in_sequence.json", "normalizer type 'Lowercase'"},
      {"model_wordpiece.json", "model type 'WordPiece' is not supported (supported: BPE)"},
      {"model_unigram.json", "model type 'Unigram'"},
      {"post_processor_roberta.json", "post_processor type 'RobertaProcessing'"},
      {"decoder_wordpiece.json", "decoder type 'WordPiece'"},
      {"split_behavior.json", "Split behavior 'Shuffled' is not supported"},
      {"bpe_dropout.json", "BPE option 'dropout'"},
      {"bpe_continuing_subword_prefix.json", "BPE option 'continuing_subword_prefix'"},
      {"added_single_word.json", "\"single_word\": true"},
      {"truncation.json", "truncation is not supported"},
      {"metaspace_prepend_scheme.json", "prepend_scheme 'sometimes'"},
  };
  const char *src = getenv("TRAINYARD_SRC_DIR");
  assert_non_null(src);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/tests/text/refuse/%s", src, cases[i].file);
    tok_t *t = NULL;
    int rc = tok_load(path, &t, err, sizeof err);
    if (rc == 0 || !strstr(err, cases[i].names))
      fail_msg("%s: rc %d, message '%s', wanted '%s'", cases[i].file, rc, err, cases[i].names);
    assert_null(t);
  }
  /* and the supported list is named */
  char path[1024], err[512];
  snprintf(path, sizeof path, "%s/tests/text/refuse/pre_tokenizer_whitespace.json", src);
  tok_t *t;
  assert_int_equal(tok_load(path, &t, err, sizeof err), TY_EUNIMPLEMENTED);
  assert_non_null(strstr(err, "(supported: Sequence, Split, ByteLevel, Metaspace)"));
}

static void malformed(void **state) {
  static const char *bad[] = {
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"unk_token\": "
      "\"<u>\"}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\":"
      " {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\":"
      " [{\"id\": 1}]}",
      "{\"model\": 3}",
      "{}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tok_t *t = NULL;
    char err[512] = "";
    int rc = tok_load_json(bad[i], strlen(bad[i]), NULL, 0, &t, err, sizeof err);
    if (rc == 0) fail_msg("case %zu loaded", i);
    assert_true(strlen(err) > 0);
    assert_null(t);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bpe_merge_order),
      cmocka_unit_test(bpe_ties_leftmost),
      cmocka_unit_test(bpe_ignore_merges),
      cmocka_unit_test(bpe_byte_fallback_and_unk),
      cmocka_unit_test(utf8_lossy),
      cmocka_unit_test(regex_oniguruma),
      cmocka_unit_test(added_tokens),
      cmocka_unit_test(normalizers),
      cmocka_unit_test(pre_tokenizers),
      cmocka_unit_test(split_behaviors),
      cmocka_unit_test(byte_level),
      cmocka_unit_test(decoders),
      cmocka_unit_test(config),
      cmocka_unit_test(load_paths),
      cmocka_unit_test(threads),
      cmocka_unit_test(refusals),
      cmocka_unit_test(malformed),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
