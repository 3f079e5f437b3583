/* tok_exact.c - compares trainyard's tokenizer with the reference's results
 * (reference.cjs): for every case, the ids without and with special tokens
 * must be equal, and decoding the reference's ids (keeping and skipping
 * special tokens) must give the reference's text, byte for byte.
 *
 *   tok_exact TOKENIZER_DIR CASES.json REFERENCE.json
 *
 * Exits 0 when every case agrees, 1 otherwise, naming each disagreement
 * with the first differing position and the ids around it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/tokenizer.h"

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0, got;
  unsigned char *b = malloc(cap);
  while (b && (got = fread(b + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) b = realloc(b, cap *= 2);
  }
  fclose(f);
  *n = len;
  return b;
}

/* The case's bytes, malloc'd. */
static unsigned char *case_bytes(json_t *c, size_t *n) {
  json_t *text = json_object_get(c, "text"), *hex = json_object_get(c, "hex");
  if (json_is_string(text)) {
    *n = json_string_length(text);
    unsigned char *b = malloc(*n + 1);
    memcpy(b, json_string_value(text), *n);
    return b;
  }
  if (json_is_string(hex)) {
    const char *h = json_string_value(hex);
    *n = strlen(h) / 2;
    unsigned char *b = malloc(*n + 1);
    for (size_t i = 0; i < *n; i++) sscanf(h + 2 * i, "%2hhx", &b[i]);
    return b;
  }
  return read_file(json_string_value(json_object_get(c, "file")), n);
}

static void print_ids(const char *label, const uint32_t *v, size_t n, size_t at) {
  size_t a = at > 4 ? at - 4 : 0, b = at + 5 < n ? at + 5 : n;
  fprintf(stderr, "    %s[%zu..%zu):", label, a, b);
  for (size_t i = a; i < b; i++) fprintf(stderr, " %u", v[i]);
  fprintf(stderr, " (of %zu)\n", n);
}

/* Compares our ids with the reference's JSON array; 0 when equal. */
static int compare_ids(const char *name, const char *what, const uint32_t *ours, size_t n,
                       json_t *ref) {
  size_t m = json_array_size(ref);
  uint32_t *r = malloc((m + 1) * sizeof *r);
  for (size_t i = 0; i < m; i++) r[i] = (uint32_t)json_integer_value(json_array_get(ref, i));
  size_t i = 0;
  while (i < n && i < m && ours[i] == r[i]) i++;
  int bad = i < n || i < m;
  if (bad) {
    fprintf(stderr, "MISMATCH %s (%s): first difference at id %zu\n", name, what, i);
    print_ids("ours", ours, n, i);
    print_ids("reference", r, m, i);
  }
  free(r);
  return bad;
}

static int compare_decode(const tok_t *t, const char *name, json_t *ref_ids, int skip,
                          json_t *ref_text) {
  size_t m = json_array_size(ref_ids);
  uint32_t *ids = malloc((m + 1) * sizeof *ids);
  for (size_t i = 0; i < m; i++) ids[i] = (uint32_t)json_integer_value(json_array_get(ref_ids, i));
  char err[512], *text;
  size_t len;
  int bad = 0;
  if (tok_decode(t, ids, m, skip, &text, &len, err, sizeof err)) {
    fprintf(stderr, "MISMATCH %s (decode, skip_special=%d): %s\n", name, skip, err);
    free(ids);
    return 1;
  }
  size_t rl = json_string_length(ref_text);
  const char *rs = json_string_value(ref_text);
  if (len != rl || memcmp(text, rs, len)) {
    size_t i = 0;
    while (i < len && i < rl && text[i] == rs[i]) i++;
    size_t a = i > 20 ? i - 20 : 0;
    fprintf(stderr,
            "MISMATCH %s (decode, skip_special=%d): first difference at byte %zu\n"
            "    ours:      '%.*s'\n    reference: '%.*s'\n",
            name, skip, i, (int)(len - a < 60 ? len - a : 60), text + a,
            (int)(rl - a < 60 ? rl - a : 60), rs + a);
    bad = 1;
  }
  free(text);
  free(ids);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: tok_exact TOKENIZER_DIR CASES.json REFERENCE.json\n");
    return 2;
  }
  char err[512];
  tok_t *t;
  if (tok_load(argv[1], &t, err, sizeof err)) {
    fprintf(stderr, "tok_exact: %s\n", err);
    return 2;
  }
  json_error_t je;
  json_t *cases = json_load_file(argv[2], JSON_ALLOW_NUL, &je),
         *ref = json_load_file(argv[3], JSON_ALLOW_NUL, &je);
  if (!json_is_array(cases) || !json_is_array(ref) ||
      json_array_size(cases) != json_array_size(ref)) {
    fprintf(stderr, "tok_exact: cases and reference must be arrays of one length (%s)\n", je.text);
    return 2;
  }
  int failed = 0;
  size_t ncase = json_array_size(cases), total_ids = 0;
  for (size_t k = 0; k < ncase; k++) {
    json_t *c = json_array_get(cases, k), *r = json_array_get(ref, k);
    const char *name = json_string_value(json_object_get(c, "name"));
    size_t n;
    unsigned char *bytes = case_bytes(c, &n);
    if (!bytes) {
      fprintf(stderr, "tok_exact: case %s: cannot read its text\n", name);
      return 2;
    }
    int bad = 0;
    for (int special = 0; special < 2; special++) {
      uint32_t *ids;
      size_t nids;
      if (tok_encode(t, (const char *)bytes, n, special, &ids, &nids, err, sizeof err)) {
        fprintf(stderr, "MISMATCH %s: encode failed: %s\n", name, err);
        bad = 1;
        continue;
      }
      total_ids += nids;
      bad |= compare_ids(name, special ? "add_special" : "no special", ids, nids,
                         json_object_get(r, special ? "ids_special" : "ids"));
      free(ids);
    }
    bad |= compare_decode(t, name, json_object_get(r, "ids_special"), 0,
                          json_object_get(r, "decoded"));
    bad |= compare_decode(t, name, json_object_get(r, "ids_special"), 1,
                          json_object_get(r, "decoded_skip"));
    failed += bad;
    free(bytes);
  }
  printf("tok_exact %s: %zu cases, %zu ids compared; %d disagree\n", argv[1], ncase, total_ids,
         failed);
  json_decref(cases);
  json_decref(ref);
  tok_free(t);
  return failed ? 1 : 0;
}
