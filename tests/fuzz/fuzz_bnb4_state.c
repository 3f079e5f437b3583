/* fuzz_bnb4_state.c - libFuzzer target for the readers of a bitsandbytes
 * 4-bit checkpoint's own words: the quant_state JSON of a weight
 * (bnb4_state_parse) and config.json's quantization_config
 * (bnb4_config_parse). Any input either parses into a state that
 * bnb4_state_json writes back and that parses to the same state again, or
 * fails with a message: never crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "worker/ckpt/bnb4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256] = "";
  bnb4_state_t s, again;
  const char *text = (const char *)data;
  if (bnb4_state_parse("w.quant_state.bitsandbytes__nf4", text, size, &s, err, sizeof err) == 0) {
    char buf[BNB4_STATE_MAX];
    size_t n = bnb4_state_json(&s, buf, sizeof buf);
    if (n) {
      char err2[256];
      if (bnb4_state_parse("w.quant_state.bitsandbytes__nf4", buf, n, &again, err2, sizeof err2))
        abort(); /* what we write, we read */
      if (again.type != s.type || again.nested != s.nested || again.ndim != s.ndim) abort();
    }
  } else if (!err[0]) {
    abort(); /* every failure explains itself */
  }
  json_t *j = json_loadb(text, size, 0, NULL);
  if (j) {
    bnb4_config_t c;
    err[0] = '\0';
    if (bnb4_config_parse(j, &c, err, sizeof err) != 0 && !err[0]) abort();
    json_decref(j);
  }
  return 0;
}
