/* fuzz_chat_template.c - libFuzzer target for chat templates, parse and
 * render. Input: the template text, then optionally a NUL byte and a JSON
 * object to render it with (else a small conversation). Any input must
 * render, or fail with a message: never crash, leak or run away (the limits
 * of text/chat_template.h bound every render). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"

static const char *kConversation =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true,"
    " \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi {{ there }}\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"function\":"
    " {\"name\": \"f\", \"arguments\": {\"x\": 1, \"y\": [1.5, null, true]}}}]}],"
    " \"tools\": [{\"name\": \"f\"}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *src = malloc(size + 1);
  memcpy(src, data, size);
  src[size] = 0;
  size_t tlen = strlen(src); /* the template ends at the first NUL */
  json_t *ctx = NULL;
  if (tlen < size) ctx = json_loadb(src + tlen + 1, size - tlen - 1, 0, NULL);
  if (!json_is_object(ctx)) {
    json_decref(ctx);
    ctx = json_loads(kConversation, 0, NULL);
  }
  tmpl_t *t = NULL;
  char err[256] = "";
  char *out = NULL;
  if (tmpl_parse(src, &t, err, sizeof err) == 0) {
    if (!t) abort();
    err[0] = 0;
    if (tmpl_render(t, ctx, &out, err, sizeof err) == 0) {
      if (!out || strlen(out) > TMPL_MAX_OUTPUT) abort();
    } else if (out || !err[0]) {
      abort(); /* a failed render gives no text and explains itself */
    }
  } else if (t || !err[0]) {
    abort();
  }
  free(out);
  tmpl_free(t);
  json_decref(ctx);
  free(src);
  return 0;
}
