/* generate_text.c - a model's tokenizer, end ids and prompts for decoding,
 * and the streamed text of the generated ids (generate_text.h). */
#include "worker/model/generate_text.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/llama_config.h"
#include "common/errors.h"
#include "common/json_util.h"
#include "text/chat_template.h"

void gentext_model_dir(const char *model_path, char *out, size_t n) {
  char cfg[PATH_MAX];
  llama_config_path(model_path, cfg, sizeof cfg);
  const char *slash = strrchr(cfg, '/');
  if (slash)
    snprintf(out, n, "%.*s", (int)(slash - cfg), cfg);
  else
    snprintf(out, n, ".");
}

bool gentext_default_tokenizer(const char *model_path, char *out, size_t n) {
  char dir[PATH_MAX];
  gentext_model_dir(model_path, dir, sizeof dir);
  snprintf(out, n, "%s/tokenizer.json", dir);
  struct stat st;
  return stat(out, &st) == 0 && S_ISREG(st.st_mode);
}

/* eos_token_id of the JSON file dir/name into eos; 1 when the file has
 * one, 0 when the file or the key is missing (or null), TY_EINVAL when it
 * is not a number or a list of numbers. */
static int eos_from(const char *dir, const char *name, int64_t *eos, int max, int *n, char *err,
                    size_t errlen) {
  char path[PATH_MAX + 64], why[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  json_t *j = ty_json_load_file(path, 0, why, sizeof why);
  if (!j) {
    if (errno == ENOENT) return 0;
    return ty_errf(err, errlen, TY_EINVAL, "%s", why);
  }
  const json_t *v = json_object_get(j, "eos_token_id");
  int rc = 0;
  *n = 0;
  if (json_is_integer(v)) {
    eos[(*n)++] = json_integer_value(v);
    rc = 1;
  } else if (json_is_array(v)) {
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) {
      if (!json_is_integer(x)) break;
      if (*n < max) eos[(*n)++] = json_integer_value(x);
    }
    rc = i == json_array_size(v) ? 1 : TY_EINVAL;
  } else if (v && !json_is_null(v)) {
    rc = TY_EINVAL;
  }
  json_decref(j);
  if (rc == TY_EINVAL)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s: eos_token_id must be a token id or a list of token ids", path);
  return rc;
}

int gentext_eos(const char *model_path, const tok_t *tok, int64_t *eos, int max, int *n, char *err,
                size_t errlen) {
  char dir[PATH_MAX];
  gentext_model_dir(model_path, dir, sizeof dir);
  *n = 0;
  int rc = eos_from(dir, "generation_config.json", eos, max, n, err, errlen);
  if (rc == 0) rc = eos_from(dir, "config.json", eos, max, n, err, errlen);
  if (rc < 0) return rc;
  if (rc == 0 && tok && tok_eos_id(tok) >= 0 && max > 0) {
    eos[0] = tok_eos_id(tok);
    *n = 1;
  }
  return 0;
}

/* len bytes of text to int ids. */
static int encode(const tok_t *tok, const char *text, size_t len, int special, int **ids, int *n,
                  char *err, size_t errlen) {
  uint32_t *u = NULL;
  size_t k = 0;
  *ids = NULL;
  *n = 0;
  int rc = tok_encode(tok, text, len, special, &u, &k, err, errlen);
  if (rc) return rc;
  if (k > INT_MAX / 2) {
    free(u);
    return ty_errf(err, errlen, TY_EINVAL, "the prompt is %zu tokens, too many", k);
  }
  int *out = malloc(sizeof(int) * (k ? k : 1));
  if (!out) {
    free(u);
    return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for %zu prompt tokens", k);
  }
  for (size_t i = 0; i < k; i++) out[i] = (int)u[i];
  free(u);
  *ids = out;
  *n = (int)k;
  return 0;
}

int gentext_encode_prompt(const tok_t *tok, const char *text, int **ids, int *n, char *err,
                          size_t errlen) {
  return encode(tok, text, strlen(text), 1, ids, n, err, errlen);
}

int gentext_encode_messages(const tok_t *tok, const json_t *messages, const char *template_name,
                            int **ids, int *n, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  if (!json_is_array(messages) || json_array_size(messages) == 0)
    return ty_errf(err, errlen, TY_EINVAL,
                   "messages must be a non-empty JSON list of {\"role\": ..., \"content\": ...}");
  size_t i;
  const json_t *m;
  json_array_foreach(messages, i, m) {
    if (!json_is_string(json_object_get(m, "role")) ||
        !json_is_string(json_object_get(m, "content")))
      return ty_errf(err, errlen, TY_EINVAL,
                     "messages[%zu] must be an object with string \"role\" and \"content\"", i);
  }
  const bool named = template_name && template_name[0];
  const char *src = named ? tmpl_builtin(template_name) : tok_chat_template(tok);
  if (!src)
    return named ? ty_errf(err, errlen, TY_EINVAL,
                           "chat template \"%s\" is not built in; use llama3, llama2, chatml or "
                           "mistral",
                           template_name)
                 : ty_errf(err, errlen, TY_EINVAL,
                           "the tokenizer has no chat template (tokenizer_config.json's "
                           "chat_template); name a built-in one: llama3, llama2, chatml or "
                           "mistral");
  tmpl_t *t = NULL;
  char why[512];
  if (tmpl_parse(src, &t, why, sizeof why))
    return ty_errf(err, errlen, TY_EINVAL, "the chat template does not parse: %s", why);
  const char *bos = tok_bos_token(tok), *eos = tok_eos_token(tok);
  json_t *ctx = json_pack("{s:O, s:s, s:s, s:b}", "messages", messages, "bos_token", bos ? bos : "",
                          "eos_token", eos ? eos : "", "add_generation_prompt", 1);
  char *text = NULL;
  int rc = tmpl_render(t, ctx, &text, why, sizeof why);
  json_decref(ctx);
  tmpl_free(t);
  if (rc) return ty_errf(err, errlen, rc, "the chat template: %s", why);
  rc = encode(tok, text, strlen(text), 0, ids, n, err, errlen);
  free(text);
  return rc;
}

static const char replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* The decode of s's ids past s->printed into *piece. */
static int take(gentext_stream_t *s, const tok_t *tok, bool final, char **piece, char *err,
                size_t errlen) {
  char *text = NULL;
  size_t len = 0;
  *piece = NULL;
  int rc = tok_decode(tok, s->ids, s->n, 1, &text, &len, err, errlen);
  if (rc) return rc;
  size_t upto = len;
  if (!final && len >= 3 && !memcmp(text + len - 3, replacement, 3)) upto = len - 3;
  if (upto < s->printed) upto = s->printed; /* an earlier piece no longer decodes alike */
  const size_t k = upto > len ? 0 : upto - s->printed;
  *piece = malloc(k + 1);
  if (!*piece) {
    free(text);
    return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for decoded text");
  }
  if (k) memcpy(*piece, text + s->printed, k);
  (*piece)[k] = '\0';
  s->printed += k;
  free(text);
  return 0;
}

int gentext_stream_push(gentext_stream_t *s, const tok_t *tok, uint32_t id, bool final,
                        char **piece, char *err, size_t errlen) {
  *piece = NULL;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    uint32_t *p = realloc(s->ids, sizeof *p * cap);
    if (!p) return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for generated ids");
    s->ids = p;
    s->cap = cap;
  }
  s->ids[s->n++] = id;
  return take(s, tok, final, piece, err, errlen);
}

int gentext_stream_flush(gentext_stream_t *s, const tok_t *tok, char **piece, char *err,
                         size_t errlen) {
  return take(s, tok, true, piece, err, errlen);
}

void gentext_stream_free(gentext_stream_t *s) {
  free(s->ids);
  memset(s, 0, sizeof *s);
}
