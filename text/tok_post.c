/* tok_post.c - tokenizer.json post-processors: TemplateProcessing (its
 * "single" template), ByteLevel (offsets only: no change to the ids) and
 * Sequence of these. Each reduces to the special ids that go before and
 * after the sequence. */
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"
#include "text/tok_internal.h"

struct tok_post_s {
  tok_ids_t before, after;
};

static int load_into(json_t *j, tok_post_t *pp, char *err, size_t errlen);

static int load_template(json_t *j, tok_post_t *pp, char *err, size_t errlen) {
  json_t *single = json_object_get(j, "single");
  json_t *specials = json_object_get(j, "special_tokens");
  if (!json_is_array(single))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: post_processor TemplateProcessing needs a \"single\" array");
  int seen_a = 0;
  size_t i;
  json_t *item;
  json_array_foreach(single, i, item) {
    json_t *sp = json_object_get(item, "SpecialToken");
    json_t *seq = json_object_get(item, "Sequence");
    if (seq) {
      const char *id = json_string_value(json_object_get(seq, "id"));
      if (!id || strcmp(id, "A") || seen_a)
        return ty_errf(err, errlen, TY_EINVAL,
                       "tokenizer.json: TemplateProcessing's single template must hold "
                       "sequence A once");
      seen_a = 1;
      continue;
    }
    const char *name = json_string_value(json_object_get(sp, "id"));
    json_t *st = name ? json_object_get(specials, name) : NULL;
    json_t *ids = json_object_get(st, "ids");
    if (!json_is_array(ids))
      return ty_errf(err, errlen, TY_EINVAL,
                     "tokenizer.json: TemplateProcessing: special token '%s' is not in "
                     "special_tokens",
                     name ? name : "(none)");
    size_t k;
    json_t *v;
    json_array_foreach(ids, k, v) {
      json_int_t id = json_integer_value(v);
      if (!json_is_integer(v) || id < 0 || id > (json_int_t)UINT32_MAX - 1)
        return ty_errf(err, errlen, TY_EINVAL,
                       "tokenizer.json: TemplateProcessing: special token '%s' has a bad id", name);
      tok_ids_push(seen_a ? &pp->after : &pp->before, (uint32_t)id);
    }
  }
  if (!seen_a)
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: TemplateProcessing's single template has no sequence A");
  return 0;
}

static int load_bytelevel(json_t *j, tok_post_t *pp, char *err, size_t errlen) {
  return 0;
}

static int load_sequence(json_t *j, tok_post_t *pp, char *err, size_t errlen) {
  json_t *arr = json_object_get(j, "processors");
  if (!json_is_array(arr))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tokenizer.json: post_processor Sequence needs a \"processors\" array");
  size_t i;
  json_t *v;
  json_array_foreach(arr, i, v) {
    tok_post_t one = {0};
    int rc = load_into(v, &one, err, errlen);
    /* the later processor wraps what the earlier produced */
    tok_ids_t before = {0};
    for (size_t k = 0; k < one.before.n; k++) tok_ids_push(&before, one.before.v[k]);
    for (size_t k = 0; k < pp->before.n; k++) tok_ids_push(&before, pp->before.v[k]);
    for (size_t k = 0; k < one.after.n; k++) tok_ids_push(&pp->after, one.after.v[k]);
    free(pp->before.v);
    pp->before = before;
    free(one.before.v);
    free(one.after.v);
    if (rc) return rc;
  }
  return 0;
}

static const struct {
  const char *type;
  int (*load)(json_t *j, tok_post_t *pp, char *err, size_t errlen);
} post_types[] = {
    {"TemplateProcessing", load_template},
    {"ByteLevel", load_bytelevel},
    {"Sequence", load_sequence},
};

static int load_into(json_t *j, tok_post_t *pp, char *err, size_t errlen) {
  if (!j || json_is_null(j)) return 0;
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return ty_errf(err, errlen, TY_EINVAL, "tokenizer.json: a post_processor has no type");
  for (size_t i = 0; i < sizeof post_types / sizeof *post_types; i++)
    if (!strcmp(type, post_types[i].type)) return post_types[i].load(j, pp, err, errlen);
  return TOK_REFUSE(err, errlen, "post_processor", type, post_types);
}

int tok_post_load(json_t *j, tok_post_t **out, char *err, size_t errlen) {
  tok_post_t *pp = xcalloc(1, sizeof *pp);
  int rc = load_into(j, pp, err, errlen);
  if (rc) {
    tok_post_free(pp);
    return rc;
  }
  *out = pp;
  return 0;
}

void tok_post_free(tok_post_t *pp) {
  if (!pp) return;
  free(pp->before.v);
  free(pp->after.v);
  free(pp);
}

void tok_post_specials(const tok_post_t *pp, tok_ids_t *before, tok_ids_t *after) {
  for (size_t k = 0; k < pp->before.n; k++) tok_ids_push(before, pp->before.v[k]);
  for (size_t k = 0; k < pp->after.n; k++) tok_ids_push(after, pp->after.v[k]);
}
