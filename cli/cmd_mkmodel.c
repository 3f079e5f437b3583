/* cmd_mkmodel.c - trainyard mkmodel: writes a deterministic, randomly
 * initialised Llama checkpoint (Hugging Face layout) of any size, streamed,
 * for tests, benchmarks and the demo. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/llama_config.h"
#include "cli/commands.h"
#include "cli/model_configs.h"
#include "common/json_util.h"
#include "common/numbers.h"
#include "worker/ckpt/checkpoint.h"

static void mkmodel_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard mkmodel --out DIR --hidden-size H --intermediate-size I --layers L\n"
          "                         --heads A --kv-heads K --vocab-size V [--head-dim D]\n"
          "                         [--tie-embeddings] [--dtype f32|bf16|f16] [--shards N]\n"
          "                         [--seed S]\n"
          "       trainyard mkmodel --like NAME [--layers L] [--dtype f32|bf16|f16] [--out DIR]\n"
          "                         [--shards N] [--seed S]\n"
          "Writes DIR/config.json and DIR/model.safetensors (or N shards and\n"
          "model.safetensors.index.json) into a folder that holds no checkpoint yet.\n"
          "Matrices ~ normal(0, 0.02) from a counter-based generator, norms = 1; the same\n"
          "seed gives the same weights. Defaults: dtype f32, shards 1, seed 1234 (the job\n"
          "spec's default train.seed).\n"
          "--like writes NAME's published config.json (with L layers if --layers is given;\n"
          "torch_dtype and the weights in --dtype, by default the published torch_dtype)\n"
          "into DIR (default ./NAME). NAME is one of:");
  for (size_t i = 0; i < mkmodel_configs_n; i++) fprintf(f, " %s", mkmodel_configs[i].name);
  fprintf(f, "\n");
}

/* NAME's published config.json with num_hidden_layers = layers (0: as
 * published) and torch_dtype = *dtype (NULL: as published, and *dtype_out
 * receives it), parsed into cfg. Returns the object (the caller's) or NULL
 * after printing why: an unknown NAME, or a configuration trainyard cannot
 * train (each refused key named). */
static json_t *mkmodel_like(const char *name, int64_t layers, const ty_dtype_t *dtype,
                            llama_config_t *cfg, ty_dtype_t *dtype_out) {
  const mkmodel_config_t *mc = NULL;
  for (size_t i = 0; i < mkmodel_configs_n && !mc; i++)
    if (!strcmp(mkmodel_configs[i].name, name)) mc = &mkmodel_configs[i];
  if (!mc) {
    fprintf(stderr, "trainyard mkmodel: --like '%s' is not a model mkmodel knows; one of:", name);
    for (size_t i = 0; i < mkmodel_configs_n; i++) fprintf(stderr, " %s", mkmodel_configs[i].name);
    fprintf(stderr, "\n");
    return NULL;
  }
  json_error_t jerr;
  json_t *j = json_loads(mc->json, 0, &jerr);
  if (!j) { /* cannot happen: the build embeds files the tests parse */
    fprintf(stderr, "trainyard mkmodel: --like %s: embedded config.json: %s\n", name, jerr.text);
    return NULL;
  }
  if (layers) json_object_set_new(j, "num_hidden_layers", json_integer((json_int_t)layers));
  if (dtype) json_object_set_new(j, "torch_dtype", json_string(ty_dtype_name(*dtype)));
  ty_errlist_t errs = TY_ERRLIST_INIT;
  llama_config_init(cfg);
  if (llama_config_from_json(j, cfg, "", false, &errs) || llama_config_validate(cfg, "", &errs)) {
    for (size_t i = 0; i < errs.len; i++)
      fprintf(stderr, "trainyard mkmodel: --like %s: %s: %s\n", name, errs.items[i].field,
              errs.items[i].message);
    fprintf(stderr,
            "trainyard mkmodel: --like %s: trainyard cannot train this configuration yet, so "
            "mkmodel does not write it\n",
            name);
    ty_errlist_clear(&errs);
    json_decref(j);
    return NULL;
  }
  *dtype_out = cfg->torch_dtype;
  return j;
}

/* The first file of dir that a checkpoint is made of (config.json, a
 * .safetensors file or its index) into name, or false: writing over one
 * would destroy it, or leave files of the old one beside the new (a
 * model.safetensors beside new shards is what Hugging Face loads first). */
static bool holds_checkpoint(const char *dir, char *name, size_t size) {
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
    size_t n = strlen(e->d_name);
    found = !strcmp(e->d_name, "config.json") ||
            !strcmp(e->d_name, "model.safetensors.index.json") ||
            (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors"));
    if (found) snprintf(name, size, "%s", e->d_name);
  }
  closedir(d);
  return found;
}

/* An integer flag value in [lo, hi], or an error naming the flag. */
static int parse_i64(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
  long x;
  if (!ty_parse_long(v, (long)lo, (long)hi, &x)) {
    fprintf(stderr, "trainyard mkmodel: %s wants a whole number in [%lld, %lld], got '%s'\n", flag,
            (long long)lo, (long long)hi, v);
    return -1;
  }
  *out = x;
  return 0;
}

int cmd_mkmodel(int argc, char **argv) {
  llama_config_t cfg;
  llama_config_init(&cfg);
  const char *out = NULL, *like = NULL, *shape_flag = NULL;
  bool dtype_given = false;
  ty_dtype_t dtype = TY_DTYPE_F32;
  int64_t shards = 1, seed = 1234;
  static const struct {
    const char *flag;
    size_t off;
  } sizes[] = {
      {"--hidden-size", offsetof(llama_config_t, hidden_size)},
      {"--intermediate-size", offsetof(llama_config_t, intermediate_size)},
      {"--layers", offsetof(llama_config_t, num_hidden_layers)},
      {"--heads", offsetof(llama_config_t, num_attention_heads)},
      {"--kv-heads", offsetof(llama_config_t, num_key_value_heads)},
      {"--vocab-size", offsetof(llama_config_t, vocab_size)},
      {"--head-dim", offsetof(llama_config_t, head_dim)},
  };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      mkmodel_usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--tie-embeddings")) {
      cfg.tie_word_embeddings = true;
      shape_flag = a;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "trainyard mkmodel: %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    bool known = false;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && !known; k++) {
      if (strcmp(a, sizes[k].flag)) continue;
      known = true;
      if (strcmp(a, "--layers") != 0) shape_flag = a;
      if (parse_i64(a, v, 1, INT32_MAX, (int64_t *)(void *)((char *)&cfg + sizes[k].off))) return 2;
    }
    if (known) continue;
    if (!strcmp(a, "--out")) {
      out = v;
    } else if (!strcmp(a, "--like")) {
      like = v;
    } else if (!strcmp(a, "--dtype")) {
      dtype_given = true;
      if (ty_dtype_parse(v, &dtype)) {
        fprintf(stderr, "trainyard mkmodel: --dtype wants f32, bf16 or f16, got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--shards")) {
      if (parse_i64(a, v, 1, 99999, &shards)) return 2;
    } else if (!strcmp(a, "--seed")) {
      if (parse_i64(a, v, 0, INT64_MAX, &seed)) return 2;
    } else {
      fprintf(stderr, "trainyard mkmodel: unknown flag '%s'\n\n", a);
      mkmodel_usage(stderr);
      return 2;
    }
  }
  json_t *like_json = NULL;
  if (like) {
    if (shape_flag) {
      fprintf(stderr,
              "trainyard mkmodel: %s cannot be combined with --like (the shape is %s's); --like "
              "takes --layers, --dtype, --out, --shards and --seed\n",
              shape_flag, like);
      return 2;
    }
    if (!(like_json =
              mkmodel_like(like, cfg.num_hidden_layers, dtype_given ? &dtype : NULL, &cfg, &dtype)))
      return 2;
    if (!out) out = like;
  }
  if (!out) {
    fprintf(stderr, "trainyard mkmodel: --out DIR is required\n\n");
    mkmodel_usage(stderr);
    return 2;
  }
  if (!cfg.num_key_value_heads) cfg.num_key_value_heads = cfg.num_attention_heads;
  if (!cfg.head_dim && cfg.num_attention_heads && cfg.hidden_size % cfg.num_attention_heads == 0)
    cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  cfg.torch_dtype = dtype;
  ty_errlist_t errs = TY_ERRLIST_INIT;
  if (llama_config_validate(&cfg, "", &errs)) {
    /* Name the flag, not the config.json field it sets. */
    static const char *const field_flag[][2] = {
        {"hidden_size", "--hidden-size"},
        {"intermediate_size", "--intermediate-size"},
        {"num_hidden_layers", "--layers"},
        {"num_attention_heads", "--heads"},
        {"num_key_value_heads", "--kv-heads"},
        {"vocab_size", "--vocab-size"},
        {"head_dim", "--head-dim"},
    };
    for (size_t i = 0; i < errs.len; i++) {
      const char *flag = errs.items[i].field;
      for (size_t k = 0; k < sizeof field_flag / sizeof field_flag[0]; k++)
        if (!strcmp(flag, field_flag[k][0])) flag = field_flag[k][1];
      fprintf(stderr, "trainyard mkmodel: %s: %s\n", flag, errs.items[i].message);
    }
    ty_errlist_clear(&errs);
    json_decref(like_json);
    return 2;
  }
  char err[1024], found[256];
  if (holds_checkpoint(out, found, sizeof found)) {
    fprintf(stderr,
            "trainyard mkmodel: --out %s already holds a checkpoint (%s); mkmodel never writes "
            "over one: remove it, or give another --out\n",
            out, found);
    json_decref(like_json);
    return 1;
  }
  uint64_t bytes = 0;
  int rc =
      ckpt_write_random(out, &cfg, dtype, (int)shards, (uint64_t)seed, &bytes, err, sizeof err);
  if (!rc && like_json) { /* the published text, not llama_config_to_json's subset */
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", out);
    if (ty_json_dump_file(like_json, path, JSON_INDENT(2)))
      rc = snprintf(err, sizeof err, "%s: cannot write: %s", path, strerror(errno));
  }
  json_decref(like_json);
  if (rc) {
    fprintf(stderr, "trainyard mkmodel: %s\n", err);
    return 1;
  }
  printf("wrote %s: %" PRId64 " parameters, %.1f MiB of %s in %d file%s\n", out,
         llama_config_num_params(&cfg), (double)bytes / 1048576.0, ty_dtype_st_name(dtype),
         (int)shards, shards > 1 ? "s (+ index)" : "");
  return 0;
}
