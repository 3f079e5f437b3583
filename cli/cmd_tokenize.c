/* cmd_tokenize.c - trainyard tokenize: text to token ids, or ids to text,
 * with a model's Hugging Face tokenizer (text/tokenizer.h).
 *
 * Encoding prints one JSON array of ids per input: --text is one input,
 * --input FILE one per line (the newline excluded). --decode reads JSON
 * arrays of ids the same way and prints each decoded text as a JSON string. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/commands.h"
#include "common/xalloc.h"
#include "text/tokenizer.h"

static void tokenize_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard tokenize (--model_path DIR | --tokenizer PATH)\n"
          "                          (--text STRING | --input FILE) [--add_special]\n"
          "                          [--decode [--skip_special]]\n"
          "Encodes: prints one JSON array of token ids per input (--text: one; --input: one\n"
          "per line of FILE, the newline excluded). --add_special adds the tokenizer's\n"
          "special tokens (BOS/EOS as tokenizer_config.json or the post-processor say).\n"
          "--decode reads JSON arrays of ids (--text, or one per line of FILE) and prints\n"
          "each decoded text as a JSON string; --skip_special leaves special tokens out.\n"
          "--model_path DIR reads DIR/tokenizer.json (and DIR/tokenizer_config.json);\n"
          "--tokenizer PATH is a tokenizer.json or the folder that holds it.\n");
}

/* The whole of path, malloc'd into *buf (NUL-terminated), or -1 after a message. */
static int read_all(const char *path, char **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "trainyard tokenize: %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  char *b = xmalloc(cap);
  size_t got;
  while ((got = fread(b + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (cap - n - 1 == 0) b = xrealloc(b, cap *= 2);
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    fprintf(stderr, "trainyard tokenize: %s: read error\n", path);
    free(b);
    return -1;
  }
  b[n] = '\0';
  *buf = b;
  *len = n;
  return 0;
}

static int encode_one(const tok_t *t, const char *s, size_t n, int add_special) {
  char err[512];
  uint32_t *ids;
  size_t nids;
  if (tok_encode(t, s, n, add_special, &ids, &nids, err, sizeof err)) {
    fprintf(stderr, "trainyard tokenize: %s\n", err);
    return 1;
  }
  putchar('[');
  for (size_t i = 0; i < nids; i++) printf(i ? ", %u" : "%u", ids[i]);
  puts("]");
  free(ids);
  return 0;
}

static int decode_one(const tok_t *t, const char *s, size_t n, int skip_special) {
  json_error_t je;
  json_t *arr = json_loadb(s, n, 0, &je);
  int rc = 1;
  uint32_t *ids = NULL;
  if (!json_is_array(arr)) {
    fprintf(stderr, "trainyard tokenize: --decode wants a JSON array of ids, got '%.*s'\n",
            (int)(n > 80 ? 80 : n), s);
    goto done;
  }
  size_t nids = json_array_size(arr);
  ids = xmalloc((nids + 1) * sizeof *ids);
  for (size_t i = 0; i < nids; i++) {
    json_t *v = json_array_get(arr, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > (json_int_t)UINT32_MAX) {
      fprintf(stderr, "trainyard tokenize: --decode: entry %zu is not a token id\n", i);
      goto done;
    }
    ids[i] = (uint32_t)json_integer_value(v);
  }
  char err[512], *text;
  size_t len;
  if (tok_decode(t, ids, nids, skip_special, &text, &len, err, sizeof err)) {
    fprintf(stderr, "trainyard tokenize: %s\n", err);
    goto done;
  }
  json_t *js = json_stringn(text, len);
  char *out = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
  if (out) puts(out);
  free(out);
  json_decref(js);
  free(text);
  rc = out ? 0 : 1;
done:
  free(ids);
  json_decref(arr);
  return rc;
}

int cmd_tokenize(int argc, char **argv) {
  const char *path = NULL, *text = NULL, *input = NULL;
  int add_special = 0, decode = 0, skip_special = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      tokenize_usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--add_special")) {
      add_special = 1;
      continue;
    }
    if (!strcmp(a, "--decode")) {
      decode = 1;
      continue;
    }
    if (!strcmp(a, "--skip_special")) {
      skip_special = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "trainyard tokenize: %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--model_path") || !strcmp(a, "--tokenizer")) {
      if (path) {
        fprintf(stderr, "trainyard tokenize: give one of --model_path and --tokenizer\n");
        return 2;
      }
      path = v;
    } else if (!strcmp(a, "--text")) {
      text = v;
    } else if (!strcmp(a, "--input")) {
      input = v;
    } else {
      fprintf(stderr, "trainyard tokenize: unknown option %s\n", a);
      tokenize_usage(stderr);
      return 2;
    }
  }
  if (!path || !text == !input) {
    fprintf(stderr,
            "trainyard tokenize: needs --model_path or --tokenizer, and one of --text "
            "and --input\n");
    tokenize_usage(stderr);
    return 2;
  }
  char err[512];
  tok_t *t;
  if (tok_load(path, &t, err, sizeof err)) {
    fprintf(stderr, "trainyard tokenize: %s\n", err);
    return 1;
  }
  int rc = 0;
  if (text) {
    rc = decode ? decode_one(t, text, strlen(text), skip_special)
                : encode_one(t, text, strlen(text), add_special);
  } else {
    char *buf;
    size_t len;
    if (read_all(input, &buf, &len)) {
      tok_free(t);
      return 1;
    }
    for (size_t s = 0; s < len && rc == 0;) {
      const char *nl = memchr(buf + s, '\n', len - s);
      size_t e = nl ? (size_t)(nl - buf) : len;
      rc = decode ? decode_one(t, buf + s, e - s, skip_special)
                  : encode_one(t, buf + s, e - s, add_special);
      s = e + 1;
    }
    free(buf);
  }
  tok_free(t);
  return rc;
}
