/* llama_config.c - a Llama-family model shape from a Hugging Face
 * config.json-shaped object; see llama_config.h. One table of keys drives
 * parsing, validation and serialization. */
#include "api/llama_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/jobspec_internal.h"
#include "api/model_acts.h"
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

/* config.json's model_type values: the architectures they name in
 * Hugging Face and, for those trainyard does not run yet, what it lacks.
 * A model_type decides things config.json never states (Qwen2's q/k/v
 * biases), so an unknown one is refused, never read as Llama. */
static const struct {
  const char *model_type, *architecture, *missing;
} g_model_types[] = {
    {"llama", "LlamaForCausalLM", NULL},
    {"mistral", "MistralForCausalLM", NULL}, /* Llama with sliding_window */
    {"qwen2", "Qwen2ForCausalLM", NULL},     /* Llama with q/k/v biases */
};
#define MODEL_TYPES_N (sizeof g_model_types / sizeof g_model_types[0])

/* model_type and architectures: in strict mode (a job spec) only Llama's,
 * so that llama_config_to_json's output parses back; in a config.json the
 * model types above are told apart and refused with what they need. */
static void check_identity(const char *key, const json_t *v, const char *path, bool strict,
                           ty_errlist_t *errs) {
  if (!strcmp(key, "model_type")) {
    const char *t = json_is_string(v) ? json_string_value(v) : NULL;
    size_t k = 0;
    while (t && k < MODEL_TYPES_N && strcmp(g_model_types[k].model_type, t) != 0) k++;
    if (t && k < MODEL_TYPES_N && !g_model_types[k].missing && (!strict || k == 0)) return;
    if (!strict && t && k < MODEL_TYPES_N)
      ty_errlist_add(errs, path, "\"%s\": %s; trainyard trains Llama models (\"llama\")", t,
                     g_model_types[k].missing);
    else
      ty_errlist_add(errs, path,
                     "only \"llama\" is supported, got %s; remove the field or set it to "
                     "\"llama\"",
                     t ? t : ty_json_kind(v));
    return;
  }
  /* architectures: the causal-LM class of a model type (model_type is what
   * refuses the ones not supported, naming why). */
  const char *a =
      json_is_array(v) && json_array_size(v) == 1 ? json_string_value(json_array_get(v, 0)) : NULL;
  for (size_t k = 0; a && k < (strict ? 1 : MODEL_TYPES_N); k++)
    if (!strcmp(a, g_model_types[k].architecture)) return;
  ty_errlist_add(errs, path, "only [\"LlamaForCausalLM\"] is supported; remove the field");
}

/* Hugging Face keys that do not change what the model computes (token
 * ids, generation defaults, bookkeeping, initialisation, pretraining_tp,
 * whose slices of the matrix products sum to the same result): read and
 * ignored. */
static const char *const g_inert_keys[] = {
    "_name_or_path",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "unk_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "use_cache",
    "initializer_range",
    "pretraining_tp",
    "torchscript",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "use_return_dict",
    "id2label",
    "label2id",
    "problem_type",
    "finetuning_task",
    "tokenizer_class",
    "prefix",
    "task_specific_params",
    "auto_map",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "chunk_size_feed_forward",
    "tf_legacy_loss",
    "use_bfloat16",
    "_attn_implementation",
    "attn_implementation",
    "_commit_hash",
    "is_encoder_decoder",
    "is_decoder",
    "add_cross_attention",
    "tie_encoder_decoder",
    "cross_attention_hidden_size",
    "pruned_heads",
    "max_window_layers",
};
#define INERT_N (sizeof g_inert_keys / sizeof g_inert_keys[0])

/* Hugging Face keys outside our table that change what the model computes,
 * with the value our Llama implements (want: a JSON text; null is always
 * accepted as "off") and what to say otherwise. A config.json may carry
 * them only with that value: anything else would load and silently compute
 * a different model. */
static const struct {
  const char *key, *want, *says;
} g_semantic_keys[] = {
    {"hidden_act", "\"silu\"",
     "only \"silu\" (SwiGLU) is supported; this checkpoint is not a Llama model trainyard can "
     "train"},
    {"attention_bias", "false",
     "projection biases are not supported (Llama has none); use a checkpoint with "
     "attention_bias false"},
    {"mlp_bias", "false",
     "projection biases are not supported (Llama has none); use a checkpoint with mlp_bias "
     "false"},
    {"attention_dropout", "0", "attention dropout is not implemented; it must be 0"},
    {"partial_rotary_factor", "1", "rotary embeddings on part of each head are not supported"},
    {"use_sliding_window", "false",
     "sliding-window attention on some layers (Qwen2's use_sliding_window) is not supported"},
    {"use_mrope", "false", "multimodal rotary embeddings (M-RoPE) are not supported"},
};
#define SEMANTIC_N (sizeof g_semantic_keys / sizeof g_semantic_keys[0])

/* A config.json key outside the table: inert keys pass, semantic ones
 * must hold the value implemented, and any other key is refused by name
 * (null excepted): trainyard cannot tell that it leaves the model as it
 * is. */
static void check_foreign(const json_t *obj, const char *key, const json_t *v, const char *path,
                          ty_errlist_t *errs) {
  for (size_t i = 0; i < INERT_N; i++)
    if (!strcmp(key, g_inert_keys[i])) return;
  if (json_is_null(v)) return;
  /* How the weights are stored, not what the model computes: a
   * bitsandbytes 4-bit checkpoint, whose layout and quantization_config
   * worker/ckpt/ckpt_q4 checks tensor by tensor. Other methods' weights
   * (GPTQ, AWQ, ...) would be read as something they are not. */
  if (!strcmp(key, "quantization_config")) {
    const char *m = json_string_value(json_object_get(v, "quant_method"));
    if (!m || strcmp(m, "bitsandbytes") != 0)
      ty_errlist_add(errs, path,
                     "quant_method %s: trainyard reads bitsandbytes' 4-bit checkpoints only "
                     "(quant_method \"bitsandbytes\"); use the unquantized checkpoint",
                     m ? m : "(none)");
    return;
  }
  for (size_t i = 0; i < SEMANTIC_N; i++) {
    if (strcmp(key, g_semantic_keys[i].key) != 0) continue;
    json_t *want = json_loads(g_semantic_keys[i].want, JSON_DECODE_ANY, NULL);
    bool same = json_equal((json_t *)v, want) || (json_is_number(v) && json_is_number(want) &&
                                                  json_number_value(v) == json_number_value(want));
    json_decref(want);
    if (!same) {
      char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
      ty_errlist_add(errs, path, "%s (must be %s, got %.60s)", g_semantic_keys[i].says,
                     g_semantic_keys[i].want, got ? got : ty_json_kind(v));
      free(got);
    }
    return;
  }
  ty_errlist_add(errs, path,
                 "is not a config.json key trainyard knows, so it cannot tell whether it changes "
                 "the model; remove it if it does not");
}

/* The rope_scaling kinds trainyard computes, by their config.json names,
 * and the keys each takes besides rope_type (or its older name, type). */
static const struct {
  const char *name;
  llama_rope_type_t type;
  const char *keys[4];
} g_rope_types[] = {
    {"default", LLAMA_ROPE_DEFAULT, {NULL}},
    {"linear", LLAMA_ROPE_LINEAR, {"factor"}},
    {"llama3",
     LLAMA_ROPE_LLAMA3,
     {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
};
#define ROPE_TYPES_N (sizeof g_rope_types / sizeof g_rope_types[0])

/* config.json's rope_scaling (null, or an object with rope_type or type)
 * into *rs; values are checked by llama_config_validate. A kind we do not
 * compute (yarn, dynamic, longrope, ...) is refused by name, as is any key
 * its kind does not take: either would load and compute another model. */
static void rope_scaling_parse(const json_t *v, llama_rope_scaling_t *rs, const char *path,
                               ty_errlist_t *errs) {
  char sub[256];
  memset(rs, 0, sizeof *rs);
  if (json_is_null(v)) return;
  if (!json_is_object(v)) {
    ty_errlist_add(errs, path, "must be null or an object with \"rope_type\", got %s",
                   ty_json_kind(v));
    return;
  }
  const char *tkey = json_object_get(v, "rope_type") ? "rope_type" : "type";
  const json_t *tv = json_object_get(v, tkey);
  jobspec_path_join(sub, sizeof sub, path, tkey);
  if (!json_is_string(tv)) {
    ty_errlist_add(errs, tv ? sub : path,
                   "needs \"rope_type\": \"linear\" or \"llama3\" (or rope_scaling null)");
    return;
  }
  size_t k = 0;
  while (k < ROPE_TYPES_N && strcmp(g_rope_types[k].name, json_string_value(tv)) != 0) k++;
  if (k == ROPE_TYPES_N) {
    ty_errlist_add(errs, sub,
                   "\"%s\" rotary scaling is not supported; trainyard computes \"linear\" and "
                   "\"llama3\" (or none: rope_scaling null)",
                   json_string_value(tv));
    return;
  }
  rs->type = g_rope_types[k].type;
  const char *key;
  json_t *x;
  json_object_foreach((json_t *)v, key, x) {
    if (!strcmp(key, "rope_type") || !strcmp(key, "type")) continue;
    jobspec_path_join(sub, sizeof sub, path, key);
    const char *const *keys = g_rope_types[k].keys;
    size_t i = 0;
    while (i < 4 && keys[i] && strcmp(keys[i], key) != 0) i++;
    if (i == 4 || !keys[i]) {
      ty_errlist_add(errs, sub, "is not a key of \"%s\" rotary scaling; remove it",
                     g_rope_types[k].name);
      continue;
    }
    if (!json_is_number(x)) {
      ty_errlist_add(errs, sub, "must be a number, got %s", ty_json_kind(x));
      continue;
    }
    double d = json_number_value(x);
    if (!strcmp(key, "factor"))
      rs->factor = d;
    else if (!strcmp(key, "low_freq_factor"))
      rs->low_freq_factor = d;
    else if (!strcmp(key, "high_freq_factor"))
      rs->high_freq_factor = d;
    else if (d != floor(d) || d < 1 || d > (1 << 24))
      ty_errlist_add(errs, sub, "must be an integer between 1 and %d, got %g", 1 << 24, d);
    else
      rs->original_max_position_embeddings = (int64_t)d;
  }
  for (const char *const *kk = g_rope_types[k].keys; kk < g_rope_types[k].keys + 4 && *kk; kk++)
    if (!json_object_get(v, *kk)) {
      jobspec_path_join(sub, sizeof sub, path, *kk);
      ty_errlist_add(errs, sub, "is required by \"%s\" rotary scaling", g_rope_types[k].name);
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
    if (!r && !strcmp(key, "dtype") && !strict) {
      if (have_torch_dtype) continue; /* torch_dtype is read */
      r = row_find("torch_dtype");    /* newer transformers write "dtype" */
    }
    if (!r) {
      if (!strcmp(key, "model_type") || !strcmp(key, "architectures")) {
        check_identity(key, v, path, strict, errs);
        /* Qwen2's q/k/v biases follow from its model type alone. */
        if (!strict && !strcmp(key, "model_type") && json_is_string(v) &&
            !strcmp(json_string_value(v), "qwen2"))
          c->qkv_bias = true;
        continue;
      }
      if (!strict && !strcmp(key, "rope_scaling")) {
        rope_scaling_parse(v, &c->rope_scaling, path, errs);
        continue;
      }
      if (!strict && !strcmp(key, "sliding_window")) {
        /* Qwen2 writes a window it does not use: use_sliding_window false,
         * Hugging Face's default for a qwen2 model_type (true is refused). */
        const json_t *mt = json_object_get(obj, "model_type");
        bool qwen2 = json_is_string(mt) && !strcmp(json_string_value(mt), "qwen2");
        if (json_is_null(v) || json_is_false(json_object_get(obj, "use_sliding_window")) ||
            (qwen2 && !json_object_get(obj, "use_sliding_window")))
          continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 24))
          ty_errlist_add(errs, path, "must be null or an integer between 1 and %d, got %s", 1 << 24,
                         ty_json_kind(v));
        else
          c->sliding_window = (int64_t)json_integer_value(v);
        continue;
      }
      if (!strict) {
        check_foreign(obj, key, v, path, errs);
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

/* The values of a parsed (or built) rope_scaling, as Hugging Face's
 * _validate_*_rope_parameters wants them, made errors: a zero factor or
 * low_freq_factor >= high_freq_factor would divide by zero. */
static void rope_scaling_validate(const llama_rope_scaling_t *rs, const char *field_prefix,
                                  ty_errlist_t *errs) {
  char path[256], sub[256];
  path_of(path, sizeof path, field_prefix, "rope_scaling");
  if (rs->type == LLAMA_ROPE_DEFAULT) return;
  if (rs->type != LLAMA_ROPE_LINEAR && rs->type != LLAMA_ROPE_LLAMA3) {
    ty_errlist_add(errs, path, "has an unknown rotary scaling kind");
    return;
  }
  jobspec_path_join(sub, sizeof sub, path, "factor");
  if (!isfinite(rs->factor) || !(rs->factor > 0) || rs->factor > 1e6)
    ty_errlist_add(errs, sub, "must be > 0 and <= 1e6 (1 leaves the frequencies), got %g",
                   rs->factor);
  if (rs->type != LLAMA_ROPE_LLAMA3) return;
  jobspec_path_join(sub, sizeof sub, path, "low_freq_factor");
  if (!isfinite(rs->low_freq_factor) || !(rs->low_freq_factor > 0))
    ty_errlist_add(errs, sub, "must be > 0, got %g", rs->low_freq_factor);
  jobspec_path_join(sub, sizeof sub, path, "high_freq_factor");
  if (!isfinite(rs->high_freq_factor) || !(rs->high_freq_factor > rs->low_freq_factor))
    ty_errlist_add(errs, sub, "must be greater than low_freq_factor (%g), got %g",
                   rs->low_freq_factor, rs->high_freq_factor);
  jobspec_path_join(sub, sizeof sub, path, "original_max_position_embeddings");
  if (rs->original_max_position_embeddings < 1 || rs->original_max_position_embeddings > (1 << 24))
    ty_errlist_add(errs, sub, "must be between 1 and %d, got %lld", 1 << 24,
                   (long long)rs->original_max_position_embeddings);
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
  rope_scaling_validate(&c->rope_scaling, field_prefix, errs);
  if ((int)c->torch_dtype < 0 || c->torch_dtype >= TY_DTYPE_COUNT) {
    path_of(path, sizeof path, field_prefix, "torch_dtype");
    ty_errlist_add(errs, path, "must be \"float32\", \"bfloat16\" or \"float16\"");
  }
  return errs->len > before ? TY_EINVAL : 0;
}

json_t *llama_config_to_json(const llama_config_t *c) {
  json_t *o = json_object();
  /* A window makes it Mistral's (Hugging Face's Llama has none), q/k/v
   * biases Qwen2's. */
  bool mistral = c->sliding_window > 0 && !c->qkv_bias;
  const char *arch = c->qkv_bias ? "Qwen2ForCausalLM"
                     : mistral   ? "MistralForCausalLM"
                                 : "LlamaForCausalLM";
  json_object_set_new(o, "architectures", json_pack("[s]", arch));
  json_object_set_new(o, "model_type",
                      json_string(c->qkv_bias ? "qwen2"
                                  : mistral   ? "mistral"
                                              : "llama"));
  if (c->qkv_bias) json_object_set_new(o, "use_sliding_window", json_false());
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
  if (c->sliding_window > 0)
    json_object_set_new(o, "sliding_window", json_integer((json_int_t)c->sliding_window));
  const llama_rope_scaling_t *rs = &c->rope_scaling;
  if (rs->type == LLAMA_ROPE_LINEAR)
    json_object_set_new(o, "rope_scaling",
                        json_pack("{s:s,s:f}", "rope_type", "linear", "factor", rs->factor));
  else if (rs->type == LLAMA_ROPE_LLAMA3)
    json_object_set_new(
        o, "rope_scaling",
        json_pack("{s:s,s:f,s:f,s:f,s:I}", "rope_type", "llama3", "factor", rs->factor,
                  "low_freq_factor", rs->low_freq_factor, "high_freq_factor", rs->high_freq_factor,
                  "original_max_position_embeddings",
                  (json_int_t)rs->original_max_position_embeddings));
  return o;
}

/* Hugging Face's _compute_default_rope_parameters, then _compute_linear_
 * or _compute_llama3_parameters for pair i. */
double llama_rope_inv_freq(double theta, int HS, int i, const llama_rope_scaling_t *s) {
  double inv_freq = 1.0 / pow(theta, (2.0 * i) / HS);
  if (!s || s->type == LLAMA_ROPE_DEFAULT) return inv_freq;
  if (s->type == LLAMA_ROPE_LINEAR) return inv_freq / s->factor;
  /* llama3: wavelengths longer than the original context / low_freq_factor
   * are slowed by factor, those shorter than context / high_freq_factor
   * kept, and the band between interpolated smoothly. */
  const double pi = 3.14159265358979323846;
  double old_ctx = (double)s->original_max_position_embeddings;
  double low_wavelen = old_ctx / s->low_freq_factor, high_wavelen = old_ctx / s->high_freq_factor;
  double wavelen = 2 * pi / inv_freq;
  if (wavelen > low_wavelen) return inv_freq / s->factor;
  if (wavelen < high_wavelen) return inv_freq;
  double smooth =
      (old_ctx / wavelen - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
  return (1 - smooth) * inv_freq / s->factor + smooth * inv_freq;
}

int64_t llama_config_num_params(const llama_config_t *c) {
  int64_t C = c->hidden_size, FF = c->intermediate_size, L = c->num_hidden_layers;
  int64_t NH = c->num_attention_heads, NKV = c->num_key_value_heads, HS = c->head_dim;
  int64_t V = c->vocab_size;
  int64_t attn = C * NH * HS * 2 + C * NKV * HS * 2; /* q, o; k, v */
  int64_t mlp = 3 * C * FF;                          /* gate, up, down */
  int64_t layer = attn + mlp + 2 * C;                /* + two RMSNorm weights */
  if (c->qkv_bias) layer += NH * HS + 2 * NKV * HS;  /* Qwen2's q, k, v biases */
  int64_t total = V * C + L * layer + C;             /* embeddings, layers, final norm */
  if (!c->tie_word_embeddings) total += V * C;       /* lm_head */
  return total;
}

void llama_config_path(const char *model_path, char *out, size_t n) {
  struct stat st;
  const char *slash = strrchr(model_path, '/');
  if (stat(model_path, &st) == 0 && S_ISREG(st.st_mode))
    snprintf(out, n, "%.*sconfig.json", slash ? (int)(slash + 1 - model_path) : 0, model_path);
  else
    snprintf(out, n, "%s/config.json", model_path);
}

int64_t llama_head_rows(int64_t rows, int64_t V) {
  int64_t hc = (int64_t)(MODEL_HEAD_BYTES / ((size_t)V * sizeof(float)));
  if (hc > rows) hc = rows;
  return hc < 1 ? 1 : hc;
}

uint64_t llama_activation_bytes(const llama_config_t *c, int64_t B, int64_t T, bool backward,
                                bool recompute, int64_t head_rows) {
  const uint64_t C = (uint64_t)c->hidden_size, NH = (uint64_t)c->num_attention_heads;
  const uint64_t NKV = (uint64_t)c->num_key_value_heads, FF = (uint64_t)c->intermediate_size;
  const uint64_t HS = (uint64_t)c->head_dim;
  const uint64_t V = (uint64_t)c->vocab_size, L = (uint64_t)c->num_hidden_layers;
  const uint64_t N = (uint64_t)(B * T);
  const uint64_t LS = backward && !recompute ? L : 1, RS = backward ? L + 1 : 2;
  const uint64_t HC = (uint64_t)(head_rows > 0 ? head_rows : llama_head_rows(B * T, c->vocab_size));
  uint64_t floats = 0;
  (void)T;
#define TY_X(field, n, bw) \
  if (!(bw) || backward) floats += (uint64_t)(n);
  MODEL_ACTS(TY_X)
#undef TY_X
  return floats * sizeof(float) + MODEL_ACTS_ROW_BYTES * N;
}

uint64_t llama_device_activation_bytes(const llama_config_t *c, int64_t B, int64_t T,
                                       bool recompute, int64_t lora_rank, uint64_t lora_params,
                                       int64_t head_rows) {
  const uint64_t C = (uint64_t)c->hidden_size, NH = (uint64_t)c->num_attention_heads;
  const uint64_t NKV = (uint64_t)c->num_key_value_heads, FF = (uint64_t)c->intermediate_size;
  const uint64_t HS = (uint64_t)c->head_dim, QD = NH * HS, KVD = NKV * HS;
  const uint64_t V = (uint64_t)c->vocab_size, L = (uint64_t)c->num_hidden_layers;
  const uint64_t N = (uint64_t)(B * T), LS = recompute ? 1 : L, TC = JOBSPEC_TARGET_COUNT;
  const uint64_t R = (uint64_t)lora_rank, NP = lora_params;
  const uint64_t HC = (uint64_t)(head_rows > 0 ? head_rows : llama_head_rows(B * T, c->vocab_size));
  uint64_t floats = 0;
#define TY_X(field, n) floats += (uint64_t)(n);
  MODEL_ACTS_CUDA(TY_X)
#undef TY_X
  return floats * sizeof(float) + MODEL_ACTS_CUDA_ROW_BYTES * N +
         llama_device_scratch_elems(c, B * T, (int64_t)HC) * sizeof(uint16_t);
}

uint64_t llama_device_scratch_elems(const llama_config_t *c, int64_t N, int64_t HC) {
  uint64_t widest = (uint64_t)c->hidden_size;
  const uint64_t QD = (uint64_t)c->num_attention_heads * (uint64_t)c->head_dim;
  if (QD > widest) widest = QD;
  if ((uint64_t)c->intermediate_size > widest) widest = (uint64_t)c->intermediate_size;
  const uint64_t rows = (uint64_t)N * widest, head = (uint64_t)HC * (uint64_t)c->vocab_size;
  return head > rows ? head : rows;
}

uint64_t llama_lora_params(const llama_config_t *c, int64_t R, unsigned targets) {
  const uint64_t C = (uint64_t)c->hidden_size, FF = (uint64_t)c->intermediate_size;
  const uint64_t QD = (uint64_t)c->num_attention_heads * (uint64_t)c->head_dim;
  const uint64_t KVD = (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim;
  /* in + out of q, k, v, o, gate, up, down (jobspec.h's target order) */
  const uint64_t io[JOBSPEC_TARGET_COUNT] = {C + QD, C + KVD, C + KVD, QD + C,
                                             C + FF, C + FF,  FF + C};
  uint64_t per_layer = 0;
  for (int t = 0; t < JOBSPEC_TARGET_COUNT; t++)
    if (targets >> t & 1u) per_layer += (uint64_t)R * io[t];
  return per_layer * (uint64_t)c->num_hidden_layers;
}
