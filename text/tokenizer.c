/* tokenizer.c - loading a tokenizer.json (+ tokenizer_config.json), and the
 * encode and decode pipelines that run its components. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

/* ---- loading ---- */

static const struct { const char *type; } model_types[] = {{"BPE"}};

static char *dup_json_string(json_t *v) {
  if (json_is_object(v)) v = json_object_get(v, "content");
  return json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
}

static int load_added(tok_t *t, json_t *arr, tok_scratch_t *sc, char *err, size_t errlen) {
  if (!arr || json_is_null(arr)) arr = NULL;
  if (arr && !json_is_array(arr))
    return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: added_tokens must be an array");
  size_t n = arr ? json_array_size(arr) : 0;
  t->added = xcalloc(n + 1, sizeof *t->added);
  t->added_raw = tok_added_set_new();
  t->added_norm = tok_added_set_new();
  t->added_all = tok_added_set_new();
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(arr, i);
    json_t *c = json_object_get(e, "content"), *id = json_object_get(e, "id");
    if (!json_is_string(c) || json_string_length(c) == 0 || !json_is_integer(id) ||
        json_integer_value(id) < 0 || json_integer_value(id) >= (json_int_t)TOK_MAX_ID)
      return ty_errf(err, errlen, TY_EINVAL,
                     "tokenizer.json: added_tokens[%zu] needs a non-empty content and an id "
                     "in 0..%u",
                     i, TOK_MAX_ID - 1);
    if (json_is_true(json_object_get(e, "single_word")))
      return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                     "tokenizer.json: added token '%s' has \"single_word\": true, which is not "
                     "supported",
                     json_string_value(c));
    tok_added_token_t *a = &t->added[t->n_added++];
    a->len = json_string_length(c);
    a->content = xmalloc(a->len + 1);
    memcpy(a->content, json_string_value(c), a->len + 1);
    a->id = (uint32_t)json_integer_value(id);
    a->special = json_is_true(json_object_get(e, "special"));
    a->lstrip = json_is_true(json_object_get(e, "lstrip"));
    a->rstrip = json_is_true(json_object_get(e, "rstrip"));
    json_t *nz = json_object_get(e, "normalized");
    a->normalized = nz ? json_is_true(nz) : !a->special;
    if (a->id + 1 > t->vocab_end) t->vocab_end = a->id + 1;
  }
  /* Pointers into t->added are taken once it no longer moves. A later
   * entry for an id wins, as in the reference. */
  t->added_of = xmalloc((size_t)t->vocab_end * sizeof *t->added_of + 1);
  for (uint32_t id = 0; id < t->vocab_end; id++) t->added_of[id] = -1;
  for (size_t i = 0; i < t->n_added; i++) {
    tok_added_token_t *a = &t->added[i];
    t->added_of[a->id] = (int32_t)i;
    tok_added_set_add(t->added_all, a->content, a->len, i);
    if (a->normalized && t->normalizer) {
      /* matched in normalized text, by its normalized form */
      tok_buf_t nb = {0};
      int rc = tok_normalize(t->normalizer, sc, a->content, a->len, &nb, err, errlen);
      if (rc) {
        tok_buf_free(&nb);
        return rc;
      }
      a->norm = nb.s ? nb.s : xstrdup("");
      a->norm_len = nb.len;
      tok_added_set_add(t->added_norm, a->norm, a->norm_len, i);
    } else {
      tok_added_set_add(t->added_raw, a->content, a->len, i);
    }
  }
  return 0;
}

/* Reads tokenizer_config.json's object c (may be NULL). */
static void load_config(tok_t *t, json_t *c) {
  if (!json_is_object(c)) return;
  t->bos_token = dup_json_string(json_object_get(c, "bos_token"));
  t->eos_token = dup_json_string(json_object_get(c, "eos_token"));
  json_t *ab = json_object_get(c, "add_bos_token"), *ae = json_object_get(c, "add_eos_token");
  if (json_is_boolean(ab) || json_is_boolean(ae)) {
    t->config_specials = 1;
    t->add_bos = json_is_true(ab);
    t->add_eos = json_is_true(ae);
  }
  t->clean_up_spaces = json_is_true(json_object_get(c, "clean_up_tokenization_spaces"));
  /* additional_special_tokens count as special (skipped on decode) too */
  json_t *extra = json_object_get(c, "additional_special_tokens"), *v;
  size_t k, ti;
  json_array_foreach(extra, k, v) {
    json_t *name = json_is_object(v) ? json_object_get(v, "content") : v;
    if (json_is_string(name) &&
        tok_added_set_exact(t->added_all, json_string_value(name), json_string_length(name), &ti))
      t->added[ti].special = 1;
  }
  json_t *ct = json_object_get(c, "chat_template");
  if (json_is_string(ct)) {
    t->chat_template = xstrdup(json_string_value(ct));
  } else if (json_is_array(ct)) {
    size_t i;
    json_t *e;
    json_array_foreach(ct, i, e) {
      const char *name = json_string_value(json_object_get(e, "name"));
      json_t *tmpl = json_object_get(e, "template");
      if (name && !strcmp(name, "default") && json_is_string(tmpl) && !t->chat_template)
        t->chat_template = xstrdup(json_string_value(tmpl));
    }
  }
}

/* Builds a tokenizer from parsed tokenizer.json j and tokenizer_config.json
 * c (may be NULL); both stay the caller's. */
static int load_parsed(json_t *j, json_t *c, tok_t **out, char *err, size_t errlen) {
  int rc = 0;
  tok_t *t = xcalloc(1, sizeof *t);
  t->bos_id = t->eos_id = -1;
  tok_scratch_t sc = {0};
  sc.match = tok_match_new();
  if (!json_is_object(j)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: not a JSON object");
    goto done;
  }
  static const char *const refused[] = {"truncation", "padding"};
  for (size_t i = 0; i < 2; i++) {
    json_t *v = json_object_get(j, refused[i]);
    if (v && !json_is_null(v)) {
      rc = ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                   "tokenizer.json: %s is not supported (it must be null)", refused[i]);
      goto done;
    }
  }
  json_t *model = json_object_get(j, "model");
  if (!json_is_object(model)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: no \"model\" object");
    goto done;
  }
  const char *mtype = json_string_value(json_object_get(model, "type"));
  if (!mtype && json_object_get(model, "merges")) mtype = "BPE"; /* older files omit it */
  if (!mtype || strcmp(mtype, "BPE")) {
    rc = TOK_REFUSE(err, errlen, "model", mtype ? mtype : "(none)", model_types);
    goto done;
  }
  if ((rc = tok_bpe_load(model, &t->bpe, err, errlen)) ||
      (rc = tok_normalizer_load(json_object_get(j, "normalizer"), &t->normalizer, err, errlen)) ||
      (rc = tok_pretok_load(json_object_get(j, "pre_tokenizer"), &t->pretok, err, errlen)) ||
      (rc = tok_post_load(json_object_get(j, "post_processor"), &t->post, err, errlen)) ||
      (rc = tok_decoder_load(json_object_get(j, "decoder"), &t->decoder, err, errlen)))
    goto done;
  t->vocab_end = tok_bpe_vocab_end(t->bpe);
  if ((rc = load_added(t, json_object_get(j, "added_tokens"), &sc, err, errlen))) goto done;
  load_config(t, c);
  /* BOS and EOS: tokenizer_config.json's, else the template's first and last. */
  tok_ids_t before = {0}, after = {0};
  tok_post_specials(t->post, &before, &after);
  if (t->bos_token)
    t->bos_id = tok_token_to_id(t, t->bos_token);
  else if (before.n)
    t->bos_id = before.v[0];
  if (t->eos_token)
    t->eos_id = tok_token_to_id(t, t->eos_token);
  else if (after.n)
    t->eos_id = after.v[after.n - 1];
  if (!t->bos_token && t->bos_id >= 0 && tok_id_to_token(t, (uint32_t)t->bos_id))
    t->bos_token = xstrdup(tok_id_to_token(t, (uint32_t)t->bos_id));
  if (!t->eos_token && t->eos_id >= 0 && tok_id_to_token(t, (uint32_t)t->eos_id))
    t->eos_token = xstrdup(tok_id_to_token(t, (uint32_t)t->eos_id));
  free(before.v);
  free(after.v);
done:
  tok_match_free(sc.match);
  if (rc) {
    tok_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

/* tokenizer_config.json holds numbers such as model_max_length = 1e30 that
 * do not fit an integer. */
#define CONFIG_FLAGS JSON_DECODE_INT_AS_REAL

int tok_load_json(const char *json, size_t len, const char *config, size_t config_len, tok_t **out,
                  char *err, size_t errlen) {
  *out = NULL;
  json_error_t je;
  json_t *j = json_loadb(json, len, 0, &je);
  if (!j) return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: line %d: %s", je.line, je.text);
  json_t *c = NULL;
  if (config) {
    c = json_loadb(config, config_len, CONFIG_FLAGS, &je);
    if (!json_is_object(c)) {
      json_decref(j);
      json_decref(c);
      return ty_errf(err, errlen, TY_EINVAL, "tokenizer_config.json: line %d: %s", je.line,
                     c ? "not a JSON object" : je.text);
    }
  }
  int rc = load_parsed(j, c, out, err, errlen);
  json_decref(j);
  json_decref(c);
  return rc;
}

int tok_load(const char *path, tok_t **out, char *err, size_t errlen) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0)
    return ty_errf(err, errlen, TY_ENOTFOUND, "%s: no such file or folder", path);
  char *file, *config;
  if (S_ISDIR(st.st_mode)) {
    size_t n = strlen(path) + 32;
    file = xmalloc(n);
    config = xmalloc(n);
    snprintf(file, n, "%s/tokenizer.json", path);
    snprintf(config, n, "%s/tokenizer_config.json", path);
  } else {
    file = xstrdup(path);
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 1;
    config = xmalloc(dl + 32);
    snprintf(config, dl + 32, "%.*s/tokenizer_config.json", (int)dl, slash ? path : ".");
  }
  json_error_t je;
  json_t *j = NULL, *c = NULL;
  int rc = 0;
  if (!(j = json_load_file(file, 0, &je))) {
    rc = ty_errf(err, errlen, stat(file, &st) ? TY_ENOTFOUND : TY_EINVAL, "%s: line %d: %s", file,
                 je.line, je.text);
    goto done;
  }
  if (stat(config, &st) == 0) { /* optional */
    c = json_load_file(config, CONFIG_FLAGS, &je);
    if (!json_is_object(c)) {
      rc = ty_errf(err, errlen, TY_EINVAL, "%s: line %d: %s", config, je.line,
                   c ? "not a JSON object" : je.text);
      goto done;
    }
  }
  rc = load_parsed(j, c, out, err, errlen);
done:
  json_decref(j);
  json_decref(c);
  free(file);
  free(config);
  return rc;
}

void tok_free(tok_t *t) {
  if (!t) return;
  tok_normalizer_free(t->normalizer);
  tok_pretok_free(t->pretok);
  tok_bpe_free(t->bpe);
  tok_post_free(t->post);
  tok_decoder_free(t->decoder);
  for (size_t i = 0; i < t->n_added; i++) {
    free(t->added[i].content);
    free(t->added[i].norm);
  }
  free(t->added);
  free(t->added_of);
  tok_added_set_free(t->added_raw);
  tok_added_set_free(t->added_norm);
  tok_added_set_free(t->added_all);
  free(t->bos_token);
  free(t->eos_token);
  free(t->chat_template);
  free(t);
}

/* ---- lookups ---- */

int64_t tok_vocab_size(const tok_t *t) {
  return t->vocab_end;
}
int64_t tok_bos_id(const tok_t *t) {
  return t->bos_id;
}
int64_t tok_eos_id(const tok_t *t) {
  return t->eos_id;
}
const char *tok_bos_token(const tok_t *t) {
  return t->bos_token;
}
const char *tok_eos_token(const tok_t *t) {
  return t->eos_token;
}
const char *tok_chat_template(const tok_t *t) {
  return t->chat_template;
}

static const tok_added_token_t *added_by_id(const tok_t *t, uint32_t id) {
  return id < t->vocab_end && t->added_of[id] >= 0 ? &t->added[t->added_of[id]] : NULL;
}

int64_t tok_token_to_id(const tok_t *t, const char *token) {
  size_t n = strlen(token), ti;
  if (tok_added_set_exact(t->added_all, token, n, &ti)) return t->added[ti].id;
  return tok_bpe_lookup(t->bpe, token, n);
}

const char *tok_id_to_token(const tok_t *t, uint32_t id) {
  const tok_added_token_t *a = added_by_id(t, id);
  if (a) return a->content;
  size_t n;
  return tok_bpe_id_to_token(t->bpe, id, &n);
}

int tok_is_added_content(const tok_t *t, const char *s, size_t n) {
  size_t ti;
  return tok_added_set_exact(t->added_all, s, n, &ti);
}
