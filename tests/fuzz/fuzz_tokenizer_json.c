/* fuzz_tokenizer_json.c - libFuzzer target for loading tokenizer.json:
 * arbitrary bytes are loaded as a tokenizer.json (with no
 * tokenizer_config.json); input holding a 0x00 byte is split there, the
 * rest read as tokenizer_config.json. Whatever loads must encode a few
 * fixed texts and decode what it produced without crashing; any failure
 * must come with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static const char *const texts[] = {
    "Hello world", "  a\tb\n\nc  ", "<s>x</s><|begin_of_text|>", "\xC3\xA9\xF0\x9F\x98\x80\xFF", "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *json = (const char *)data, *config = NULL;
  size_t len = size, config_len = 0;
  const uint8_t *nul = memchr(data, 0, size);
  if (nul) {
    len = (size_t)(nul - data);
    config = (const char *)nul + 1;
    config_len = size - len - 1;
  }
  char err[512] = "";
  tok_t *t = NULL;
  if (tok_load_json(json, len, config, config_len, &t, err, sizeof err)) {
    if (!err[0] || t) abort(); /* a failure names its reason and returns nothing */
    return 0;
  }
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    for (int special = 0; special < 2; special++) {
      uint32_t *ids;
      size_t n;
      if (tok_encode(t, texts[i], strlen(texts[i]), special, &ids, &n, err, sizeof err)) {
        if (!err[0]) abort();
        continue;
      }
      char *s;
      size_t sl;
      if (tok_decode(t, ids, n, special, &s, &sl, err, sizeof err) == 0) {
        if (strlen(s) > sl) abort(); /* NUL-terminated at len */
        free(s);
      }
      free(ids);
    }
  }
  (void)tok_vocab_size(t);
  (void)tok_bos_token(t);
  (void)tok_chat_template(t);
  (void)tok_token_to_id(t, "a");
  tok_free(t);
  return 0;
}
