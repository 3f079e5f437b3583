/* llama_config.c - a Llama-family model shape from a Hugging Face
 * config.json-shaped object; see llama_config.h. One table of keys drives
 * parsing, validation and serialization. */
#include "api/llama_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "api/jobspec_internal.h"
#include "common/json_util.h"

typedef enum { LK_I64, LK_F64, LK_BOOL, LK_DTYPE } lk_type_t;

typedef struct {
  const char *key;
  lk_type_t type;
  size_t off;
  double lo, hi; /* inclusive bounds for LK_I64; LK_F64 is (lo, hi] */
} lk_row_t;

#define LK_OFF(f) offsetof(llama_config_t, f)
/* Upper bounds keep every product in llama_config_num_params (and the
 * loader's byte counts) far from int64 overflow. */
static const lk_row_t g_keys[] = {
    {"hidden_size", LK_I64, LK_OFF(hidden_size), 1, 1 << 20},
    {"intermediate_size", LK_I64, LK_OFF(intermediate_size), 1, 1 << 20},
    {"num_hidden_layers", LK_I64, LK_OFF(num_hidden_layers), 1, 1 << 12},
    {"num_attention_heads", LK_I64, LK_OFF(num_attention_heads), 1, 1 << 12},
    {"num_key_value_heads", LK_I64, LK_OFF(num_key_value_heads), 1, 1 << 12},
    {"head_dim", LK_I64, LK_OFF(head_dim), 1, 1 << 12},
    {"vocab_size", LK_I64, LK_OFF(vocab_size), 1, 1 << 24},
    {"max_position_embeddings", LK_I64, LK_OFF(max_position_embeddings), 1, 1 << 24},
    {"rms_norm_eps", LK_F64, LK_OFF(rms_norm_eps), 0, 1},
    {"rope_theta", LK_F64, LK_OFF(rope_theta), 0, 1e12},
    {"tie_word_embeddings", LK_BOOL, LK_OFF(tie_word_embeddings), 0, 0},
    {"torch_dtype", LK_DTYPE, LK_OFF(torch_dtype), 0, 0},
};
#define LK_N (sizeof g_keys / sizeof g_keys[0])

void llama_config_init(llama_config_t *c) {
  memset(c, 0, sizeof *c);
  c->max_position_embeddings = 2048;
  c->rms_norm_eps = 1e-6;
  c->rope_theta = 10000;
  c->tie_word_embeddings = false;
  c->torch_dtype = TY_DTYPE_F32;
}

static void path_of(char *buf, size_t cap, const char *prefix, const char *key) {
  jobspec_path_join(buf, cap, prefix ? prefix : "", key);
}

/* Parses one known key's value into c; problems go to errs. */
static void parse_key(const lk_row_t *r, const json_t *v, llama_config_t *c, const char *path,
                      ty_errlist_t *errs) {
  char *base = (char *)c + r->off;
  switch (r->type) {
    case LK_I64: {
      double d = json_is_real(v) ? json_real_value(v) : 0;
      if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < (json_int_t)r->lo || i > (json_int_t)r->hi) {
          ty_errlist_add(errs, path, "must be between %.0f and %.0f, got %lld", r->lo, r->hi,
                         (long long)i);
          return;
        }
        *(int64_t *)(void *)base = (int64_t)i;
        return;
      }
      if (json_is_real(v) && d == floor(d)) {
        if (d < r->lo || d > r->hi) {
          ty_errlist_add(errs, path, "must be between %.0f and %.0f, got %g", r->lo, r->hi, d);
          return;
        }
        *(int64_t *)(void *)base = (int64_t)d;
        return;
      }
      ty_errlist_add(errs, path, "must be an integer, got %s", ty_json_kind(v));
      return;
    }
    case LK_F64: {
      if (!json_is_number(v)) {
        ty_errlist_add(errs, path, "must be a number, got %s", ty_json_kind(v));
        return;
      }
      double d = json_number_value(v);
      if (!isfinite(d) || d <= r->lo || d > r->hi) {
        ty_errlist_add(errs, path, "must be > %g and <= %g, got %g", r->lo, r->hi, d);
        return;
      }
      *(double *)(void *)base = d;
      return;
    }
    case LK_BOOL:
      if (!json_is_boolean(v)) {
        ty_errlist_add(errs, path, "must be true or false, got %s", ty_json_kind(v));
        return;
      }
      *(bool *)(void *)base = json_is_true(v);
      return;
    case LK_DTYPE: {
      ty_dtype_t t;
      if (!json_is_string(v) || ty_dtype_parse(json_string_value(v), &t) != 0) {
        ty_errlist_add(errs, path, "must be \"float32\", \"bfloat16\" or \"float16\", got %s",
                       json_is_string(v) ? json_string_value(v) : ty_json_kind(v));
        return;
      }
      *(ty_dtype_t *)(void *)base = t;
      return;
    }
  }
}

static const lk_row_t *row_find(const char *key) {
  for (size_t i = 0; i < LK_N; i++)
    if (!strcmp(g_keys[i].key, key)) return &g_keys[i];
  return NULL;
}

/* Keys llama_config_to_json writes that carry no shape: accepted in strict
 * mode when they name Llama, so that the output parses back. */
static void check_identity(const char *key, const json_t *v, const char *path, ty_errlist_t *errs) {
  if (!strcmp(key, "model_type")) {
    if (!json_is_string(v) || strcmp(json_string_value(v), "llama") != 0)
      ty_errlist_add(errs, path,
                     "only \"llama\" is supported; remove the field or set it to "
                     "\"llama\"");
    return;
  }
  /* architectures */
  if (!json_is_array(v) || json_array_size(v) != 1 || !json_is_string(json_array_get(v, 0)) ||
      strcmp(json_string_value(json_array_get(v, 0)), "LlamaForCausalLM") != 0)
    ty_errlist_add(errs, path, "only [\"LlamaForCausalLM\"] is supported; remove the field");
}

/* Hugging Face keys outside our table that change what the model computes.
 * A config.json may carry them only with the value our Llama implements;
 * anything else would load and silently compute a different model. */
/* rope_scaling: null, or Llama 3.1's "llama3" rotary scaling into c. */
static void parse_rope_scaling(const json_t *v, llama_config_t *c, const char *path,
                               ty_errlist_t *errs) {
  if (json_is_null(v)) return;
  json_t *type = json_object_get(v, "rope_type");
  if (!type) type = json_object_get(v, "type");
  if (!json_is_object(v) || !json_is_string(type) || strcmp(json_string_value(type), "llama3")) {
    ty_errlist_add(errs, path,
                   "rotary scaling %s%s%s is not supported (trainyard implements rope_type "
                   "\"llama3\" of Llama 3.1 and later); use a checkpoint whose rope_scaling is "
                   "null or of rope_type llama3",
                   json_is_string(type) ? "\"" : "",
                   json_is_string(type) ? json_string_value(type) : "without a rope_type",
                   json_is_string(type) ? "\"" : "");
    return;
  }
  const char *keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings"};
  double x[4];
  for (int i = 0; i < 4; i++) {
    json_t *f = json_object_get(v, keys[i]);
    x[i] = json_is_number(f) ? json_number_value(f) : NAN;
    if (!(x[i] > 0) || !isfinite(x[i])) {
      ty_errlist_add(errs, path, "rope_scaling.%s must be a positive number (rope_type llama3)",
                     keys[i]);
      return;
    }
  }
  if (!(x[2] > x[1])) {
    ty_errlist_add(errs, path,
                   "rope_scaling.high_freq_factor (%g) must be above low_freq_factor (%g)", x[2],
                   x[1]);
    return;
  }
  c->rope_llama3.factor = x[0];
  c->rope_llama3.low_freq_factor = x[1];
  c->rope_llama3.high_freq_factor = x[2];
  c->rope_llama3.original_max_position_embeddings = (int64_t)x[3];
}

static void check_semantics(const char *key, const json_t *v, const char *path,
                            ty_errlist_t *errs) {
  if (!strcmp(key, "hidden_act")) {
    if (!json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "silu") != 0))
      ty_errlist_add(errs, path,
                     "only \"silu\" (SwiGLU) is supported, got %s; this checkpoint is not a "
                     "Llama model trainyard can train",
                     json_is_string(v) ? json_string_value(v) : ty_json_kind(v));
  } else if (!strcmp(key, "attention_bias") || !strcmp(key, "mlp_bias")) {
    if (json_is_true(v))
      ty_errlist_add(errs, path,
                     "projection biases are not supported (Llama has none); use a checkpoint "
                     "with %s false",
                     key);
  }
}

int llama_config_from_json(const json_t *obj, llama_config_t *c, const char *field_prefix,
                           bool strict, ty_errlist_t *errs) {
  size_t before = errs->len;
  char path[256];
  if (!json_is_object(obj)) {
    ty_errlist_add(errs, field_prefix ? field_prefix : "",
                   "must be an object of Llama config.json fields, got %s", ty_json_kind(obj));
    return TY_EINVAL;
  }
  const char *key;
  json_t *v;
  bool have_torch_dtype = json_object_get(obj, "torch_dtype") != NULL;
  json_object_foreach((json_t *)obj, key, v) {
    path_of(path, sizeof path, field_prefix, key);
    const lk_row_t *r = row_find(key);
    if (!r && !strcmp(key, "dtype") && !strict && !have_torch_dtype)
      r = row_find("torch_dtype"); /* newer transformers write "dtype" */
    if (!r) {
      if (!strcmp(key, "model_type") || !strcmp(key, "architectures")) {
        if (strict) check_identity(key, v, path, errs);
        continue;
      }
      if (!strict && !strcmp(key, "rope_scaling")) {
        parse_rope_scaling(v, c, path, errs);
        continue;
      }
      if (!strict) {
        check_semantics(key, v, path, errs);
        continue;
      }
      const char *names[LK_N];
      for (size_t i = 0; i < LK_N; i++) names[i] = g_keys[i].key;
      const char *near = jobspec_closest(key, names, LK_N);
      if (near)
        ty_errlist_add(errs, path, "unknown field; did you mean \"%s\"?", near);
      else
        ty_errlist_add(errs, path,
                       "unknown field; a model takes the Llama config.json fields "
                       "(hidden_size, num_hidden_layers, ...)");
      continue;
    }
    if (json_is_null(v)) {
      /* config.json files write null for "not set"; a spec must omit it. */
      if (strict) ty_errlist_add(errs, path, "must not be null; remove it to use the default");
      continue;
    }
    parse_key(r, v, c, path, errs);
  }
  /* Defaults that follow from other fields. */
  if (c->num_key_value_heads == 0) c->num_key_value_heads = c->num_attention_heads;
  if (c->head_dim == 0 && c->num_attention_heads > 0 &&
      c->hidden_size % c->num_attention_heads == 0)
    c->head_dim = c->hidden_size / c->num_attention_heads;
  return errs->len > before ? TY_EINVAL : 0;
}

int llama_config_validate(const llama_config_t *c, const char *field_prefix, ty_errlist_t *errs) {
  size_t before = errs->len;
  char path[256];
  for (size_t i = 0; i < LK_N; i++) {
    const lk_row_t *r = &g_keys[i];
    path_of(path, sizeof path, field_prefix, r->key);
    if (r->type == LK_I64) {
      int64_t x = *(const int64_t *)(const void *)((const char *)c + r->off);
      if (x < (int64_t)r->lo || x > (int64_t)r->hi) {
        if (x == 0 && strcmp(r->key, "head_dim") != 0 &&
            strcmp(r->key, "num_key_value_heads") != 0) /* both follow from the heads */
          ty_errlist_add(errs, path, "is required (an integer >= 1)");
        else if (x != 0)
          ty_errlist_add(errs, path, "must be between %.0f and %.0f, got %lld", r->lo, r->hi,
                         (long long)x);
      }
    } else if (r->type == LK_F64) {
      double x = *(const double *)(const void *)((const char *)c + r->off);
      if (!isfinite(x) || x <= r->lo || x > r->hi)
        ty_errlist_add(errs, path, "must be > %g and <= %g, got %g", r->lo, r->hi, x);
    }
  }
  int64_t nh = c->num_attention_heads, nkv = c->num_key_value_heads;
  if (nh > 0 && nkv > 0 && nh % nkv != 0) {
    path_of(path, sizeof path, field_prefix, "num_key_value_heads");
    ty_errlist_add(errs, path,
                   "must divide num_attention_heads (%lld), got %lld; pick a divisor such as "
                   "%lld or 1",
                   (long long)nh, (long long)nkv, (long long)nh);
  }
  if (c->head_dim == 0 && nh > 0 && c->hidden_size > 0) {
    path_of(path, sizeof path, field_prefix, "head_dim");
    ty_errlist_add(errs, path,
                   "not given, and hidden_size (%lld) is not divisible by num_attention_heads "
                   "(%lld); give head_dim or make hidden_size a multiple of the head count",
                   (long long)c->hidden_size, (long long)nh);
  }
  if ((int)c->torch_dtype < 0 || c->torch_dtype >= TY_DTYPE_COUNT) {
    path_of(path, sizeof path, field_prefix, "torch_dtype");
    ty_errlist_add(errs, path, "must be \"float32\", \"bfloat16\" or \"float16\"");
  }
  return errs->len > before ? TY_EINVAL : 0;
}

json_t *llama_config_to_json(const llama_config_t *c) {
  json_t *o = json_object();
  json_object_set_new(o, "architectures", json_pack("[s]", "LlamaForCausalLM"));
  json_object_set_new(o, "model_type", json_string("llama"));
  for (size_t i = 0; i < LK_N; i++) {
    const lk_row_t *r = &g_keys[i];
    const void *p = (const char *)c + r->off;
    json_t *v = NULL;
    switch (r->type) {
      case LK_I64:
        v = json_integer((json_int_t) * (const int64_t *)p);
        break;
      case LK_F64:
        v = json_real(*(const double *)p);
        break;
      case LK_BOOL:
        v = json_boolean(*(const bool *)p);
        break;
      case LK_DTYPE:
        v = json_string(ty_dtype_name(*(const ty_dtype_t *)p));
        break;
    }
    json_object_set_new(o, r->key, v);
  }
  if (c->rope_llama3.factor > 0)
    json_object_set_new(
        o, "rope_scaling",
        json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor",
                  c->rope_llama3.factor, "low_freq_factor", c->rope_llama3.low_freq_factor,
                  "high_freq_factor", c->rope_llama3.high_freq_factor,
                  "original_max_position_embeddings",
                  (json_int_t)c->rope_llama3.original_max_position_embeddings));
  return o;
}

int64_t llama_config_num_params(const llama_config_t *c) {
  int64_t C = c->hidden_size, FF = c->intermediate_size, L = c->num_hidden_layers;
  int64_t NH = c->num_attention_heads, NKV = c->num_key_value_heads, HS = c->head_dim;
  int64_t V = c->vocab_size;
  int64_t attn = C * NH * HS * 2 + C * NKV * HS * 2; /* q, o; k, v */
  int64_t mlp = 3 * C * FF;                          /* gate, up, down */
  int64_t layer = attn + mlp + 2 * C;                /* + two RMSNorm weights */
  int64_t total = V * C + L * layer + C;             /* embeddings, layers, final norm */
  if (!c->tie_word_embeddings) total += V * C;       /* lm_head */
  return total;
}
