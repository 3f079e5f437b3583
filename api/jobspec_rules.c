/* jobspec_rules.c - the validation rules of the job spec: one table (id,
 * fields, stage, why, check) and jobspec_validate, which runs it; the
 * server-side checks are in jobspec_server.c. See jobspec.h. */
#include "api/jobspec.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "api/jobspec_internal.h"
#include "common/beneath.h"
#include "common/json_util.h"

/* ---- allocation_mode: "static" or AReaL's training form "fsdp:d<N>" ---- */

typedef struct {
  int d, p, t, c, e; /* degrees; d == 0 for static */
} alloc_t;

static const struct {
  char letter;
  const char *what;
} g_degrees[] = {
    {'d', "data-parallel"},  {'p', "pipeline"}, {'t', "tensor"},
    {'m', "tensor (model)"}, {'c', "context"},  {'e', "expert"},
};

/* Parses m into a. errs may be NULL (resolution only). Returns 0 or -1. */
static int alloc_parse(const char *m, alloc_t *a, ty_errlist_t *errs) {
  const char *F = "allocation_mode";
  memset(a, 0, sizeof *a);
  if (!strcmp(m, "static")) return 0;
  if (!*m) {
    if (errs) ty_errlist_add(errs, F, "must not be empty; use \"static\" or \"fsdp:d<N>\"");
    return -1;
  }
  if (strchr(m, '+')) {
    if (errs)
      ty_errlist_add(errs, F,
                     "\"%s\" combines several allocations; trainyard trains and runs "
                     "no inference engine: keep only the training part, e.g. "
                     "\"fsdp:d2\"",
                     m);
    return -1;
  }
  const char *deg = m, *colon = strchr(m, ':');
  if (colon) {
    if ((size_t)(colon - m) != 4 || strncmp(m, "fsdp", 4) != 0) {
      if (errs)
        ty_errlist_add(errs, F,
                       "backend \"%.*s\" is not supported; use \"fsdp:d<N>\" or "
                       "\"static\"",
                       (int)(colon - m), m);
      return -1;
    }
    deg = colon + 1;
  }
  int seen[6] = {0}, vals[6] = {0};
  for (const char *p = deg; *p;) {
    int k = -1;
    for (int i = 0; i < 6; i++)
      if (g_degrees[i].letter == *p) k = i;
    if (k < 0 || !isdigit((unsigned char)p[1])) {
      if (errs)
        ty_errlist_add(errs, F,
                       "cannot read \"%s\" at \"%s\": expected \"static\" or "
                       "\"fsdp:d<N>\" (degrees d, p, t, c, e each followed by a "
                       "number)",
                       m, p);
      return -1;
    }
    long v = 0;
    for (p++; isdigit((unsigned char)*p); p++)
      if (v <= 100000) v = v * 10 + (*p - '0');
    if (seen[k]++ || v < 1 || v > 4096) {
      if (errs)
        ty_errlist_add(errs, F, "%s degree in \"%s\" must be given once, between 1 and 4096",
                       g_degrees[k].what, m);
      return -1;
    }
    vals[k] = (int)v;
  }
  if (!seen[0]) {
    if (errs) ty_errlist_add(errs, F, "\"%s\" has no data-parallel degree; write \"fsdp:d<N>\"", m);
    return -1;
  }
  a->d = vals[0];
  a->p = vals[1];
  a->t = vals[2] > vals[3] ? vals[2] : vals[3];
  a->c = vals[4];
  a->e = vals[5];
  int bad = 0;
  for (int i = 1; i < 6; i++)
    if (vals[i] > 1) {
      bad = -1;
      if (errs)
        ty_errlist_add(errs, F,
                       "%s degree %c%d is not supported: FSDP here is data-parallel "
                       "only; use %c1 or drop it (\"fsdp:d%d\")",
                       g_degrees[i].what, g_degrees[i].letter, vals[i], g_degrees[i].letter, a->d);
    }
  return bad;
}

/* ---- the rules ---- */

typedef struct {
  const jobspec_t *s;
  bool check_paths;
} vctx_t;

typedef void (*check_fn)(const vctx_t *v, ty_errlist_t *errs);

static void check_name(const vctx_t *v, ty_errlist_t *errs) {
  const char *n = v->s->name;
  bool ok = *n && *n != '.' && *n != '-';
  for (const char *p = n; ok && *p; p++)
    ok = isalnum((unsigned char)*p) || *p == '.' || *p == '_' || *p == '-';
  if (!ok)
    ty_errlist_add(errs, "name",
                   "\"%s\" is not a valid name: use letters, digits, '.', '_' "
                   "and '-', starting with a letter or digit",
                   n);
}

static void check_mel_scratch(const vctx_t *v, ty_errlist_t *errs) {
  if (v->s->fsdp.memory_efficient_load && v->s->init_from_scratch)
    ty_errlist_add(errs, "fsdp.memory_efficient_load",
                   "cannot be true together with init_from_scratch: true (memory-efficient loading "
                   "stages a pretrained "
                   "checkpoint; from scratch there is none); drop one of the two: set "
                   "fsdp.memory_efficient_load to false, or init_from_scratch to false and give "
                   "model_path");
}

static void check_model_path(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  if (!s->init_from_scratch && !s->model_path[0])
    ty_errlist_add(errs, "model_path",
                   "is required: the directory of a pretrained checkpoint "
                   "(config.json + *.safetensors or pytorch_model*.bin), or one checkpoint "
                   "file with config.json beside it, unless init_from_scratch is true");
  if (s->init_from_scratch && s->model_path[0])
    ty_errlist_add(errs, "model_path",
                   "is not used with init_from_scratch: true (the weights are "
                   "random, the shape comes from \"model\"); remove "
                   "model_path or set init_from_scratch to false");
}

static void check_model_iff_scratch(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  if (s->init_from_scratch && !s->has_model)
    ty_errlist_add(errs, "model",
                   "is required with init_from_scratch: true: give the Llama "
                   "config.json fields (hidden_size, intermediate_size, "
                   "num_hidden_layers, num_attention_heads, vocab_size, ...)");
  if (!s->init_from_scratch && s->has_model)
    ty_errlist_add(errs, "model",
                   "is only for init_from_scratch: the shape of a pretrained "
                   "model comes from its config.json; remove \"model\"");
}

static void check_model_shape(const vctx_t *v, ty_errlist_t *errs) {
  if (v->s->has_model) llama_config_validate(&v->s->model, "model", errs);
}

static void check_lora_scratch(const vctx_t *v, ty_errlist_t *errs) {
  if (v->s->use_lora && v->s->init_from_scratch)
    ty_errlist_add(errs, "use_lora",
                   "cannot be true together with init_from_scratch: true "
                   "(adapters over random weights train nothing useful); "
                   "set use_lora to false to train every weight, or load a "
                   "pretrained model_path");
}

static void check_merge_lora(const vctx_t *v, ty_errlist_t *errs) {
  if (v->s->merge_adapter && !v->s->use_lora)
    ty_errlist_add(errs, "merge_adapter",
                   "is true but use_lora is false: training every weight writes the whole "
                   "model to output_dir already, with no adapter to merge; remove "
                   "merge_adapter, or set use_lora to true");
}

/* Options set where they mean nothing (each field and whether it is set):
 * each refused, "applies to <what> only; <fix> or remove <field>". */
typedef struct {
  const char *field;
  bool set;
} opt_use_t;
static void refuse_unused(const opt_use_t *opts, size_t n, const char *what, const char *fix,
                          ty_errlist_t *errs) {
  for (size_t i = 0; i < n; i++)
    if (opts[i].set)
      ty_errlist_add(errs, opts[i].field, "applies to %s only; %s or remove %s", what, fix,
                     opts[i].field);
}

/* A bitsandbytes 4-bit checkpoint's quantization_config (model_path's
 * config.json, where paths are checked) against the job's: its codes are
 * read as they are, so the job keeps them in 4 bits of the same kind. */
static void check_quantized_checkpoint(const jobspec_t *s, ty_errlist_t *errs) {
  char path[JOBSPEC_PATH_MAX + 16];
  llama_config_path(s->model_path, path, sizeof path);
  json_t *cfg = ty_json_load_file(path, 0, NULL, 0);
  const json_t *qc = json_object_get(cfg, "quantization_config");
  const char *type = json_string_value(json_object_get(qc, "bnb_4bit_quant_type"));
  const bool dq = json_is_true(json_object_get(qc, "bnb_4bit_use_double_quant"));
  if (json_is_true(json_object_get(qc, "load_in_4bit")) && type) {
    const char *ours = s->quantization.bnb_4bit_quant_type == JOBSPEC_QUANT_FP4 ? "fp4" : "nf4";
    if (!s->quantization.load_in_4bit)
      ty_errlist_add(errs, "quantization.load_in_4bit",
                     "is false, and %s is a bitsandbytes 4-bit checkpoint (%s%s): set "
                     "quantization.load_in_4bit true (with use_lora: QLoRA), or write a float copy "
                     "first (trainyard convert --dequantize)",
                     s->model_path, type, dq ? ", double quantization" : "");
    else if (strcmp(type, ours) != 0)
      ty_errlist_add(errs, "quantization.bnb_4bit_quant_type",
                     "is \"%s\", and %s stores %s codes, which are read as they are; set it to "
                     "\"%s\"",
                     ours, s->model_path, type, type);
    else if (dq != s->quantization.bnb_4bit_use_double_quant)
      ty_errlist_add(errs, "quantization.bnb_4bit_use_double_quant",
                     "is %s, and %s stores its statistics %s; set it to %s", dq ? "false" : "true",
                     s->model_path, dq ? "double-quantized" : "in float32", dq ? "true" : "false");
  }
  json_decref(cfg);
}

/* QLoRA (quantization.*): a 4-bit base is frozen, so it takes adapters;
 * it is quantized from a pretrained checkpoint as it loads; its options
 * mean nothing without load_in_4bit. */
static void check_quantization(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  if (v->check_paths && s->model_path[0] && !s->init_from_scratch)
    check_quantized_checkpoint(s, errs);
  if (!s->quantization.load_in_4bit) {
    const opt_use_t opts[] = {
        {"quantization.bnb_4bit_quant_type",
         s->quantization.bnb_4bit_quant_type != JOBSPEC_QUANT_NF4},
        {"quantization.bnb_4bit_use_double_quant", s->quantization.bnb_4bit_use_double_quant},
        {"quantization.bnb_4bit_compute_dtype",
         s->quantization.bnb_4bit_compute_dtype != TY_DTYPE_F32},
    };
    refuse_unused(opts, sizeof opts / sizeof opts[0], "a 4-bit base",
                  "set quantization.load_in_4bit to true,", errs);
    return;
  }
  if (!s->use_lora)
    ty_errlist_add(errs, "quantization.load_in_4bit",
                   "needs use_lora: true: a 4-bit base is frozen (its codes cannot take an "
                   "optimizer's updates), so only adapters over it train; set use_lora to true "
                   "(QLoRA), or set quantization.load_in_4bit to false to train every weight");
  if (s->init_from_scratch)
    ty_errlist_add(errs, "quantization.load_in_4bit",
                   "cannot be true together with init_from_scratch: true (4 bits quantize a "
                   "pretrained checkpoint's weights as they load; from scratch there is none); "
                   "set init_from_scratch to false and give model_path, or drop "
                   "quantization.load_in_4bit");
  if (s->device == JOBSPEC_DEVICE_CUDA)
    ty_errlist_add(errs, "quantization.load_in_4bit",
                   "a 4-bit base trains on CPU ranks in this version (GPU ranks hold the base in "
                   "the job's dtype); set device to \"cpu\", or drop quantization.load_in_4bit and "
                   "keep the base in bfloat16 on the GPUs");
}

/* Preference tuning (train.objective dpo): pairs of a JSONL file, each
 * pair's two rows in one micro-batch, summed over each response's own
 * tokens; its options mean nothing for the next-token objective. */
static void check_dpo(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  if (s->train.objective != JOBSPEC_OBJECTIVE_DPO) {
    const opt_use_t opts[] = {
        {"dpo.beta", s->dpo.beta != 0.1},
        {"dpo.loss_type", s->dpo.loss_type != JOBSPEC_DPO_SIGMOID},
        {"dpo.label_smoothing", s->dpo.label_smoothing != 0},
        {"data.kind", s->data.kind == JOBSPEC_KIND_PREFERENCE},
    };
    refuse_unused(opts, sizeof opts / sizeof opts[0], "preference tuning",
                  "set train.objective to \"dpo\",", errs);
    return;
  }
  if (s->data.format != JOBSPEC_DATA_JSONL)
    ty_errlist_add(errs, "data.format",
                   "is not jsonl, and train.objective \"dpo\" learns from pairs of responses: set "
                   "data.format to jsonl and give lines of {\"prompt\", \"chosen\", "
                   "\"rejected\"} (strings or lists of messages)");
  else if (s->data.kind != JOBSPEC_KIND_AUTO && s->data.kind != JOBSPEC_KIND_PREFERENCE)
    ty_errlist_add(errs, "data.kind",
                   "names examples of one text each, and train.objective \"dpo\" takes pairs: set "
                   "data.kind to preference (or auto)");
  if (s->data.packing)
    ty_errlist_add(errs, "data.packing",
                   "cannot be true with train.objective \"dpo\": each response of a pair is one "
                   "row of its own, whose log-probability is summed alone; set data.packing to "
                   "false");
  if (s->data.loss_on == JOBSPEC_LOSS_ON_ALL)
    ty_errlist_add(errs, "data.loss_on",
                   "is all, and train.objective \"dpo\" compares the responses' own tokens (the "
                   "prompt is the same on both sides); set data.loss_on to completion");
  if (s->dpo.label_smoothing != 0 && s->dpo.loss_type != JOBSPEC_DPO_SIGMOID)
    ty_errlist_add(errs, "dpo.label_smoothing",
                   "applies to dpo.loss_type sigmoid only (conservative DPO); set dpo.loss_type "
                   "to sigmoid or remove dpo.label_smoothing");
}

static void check_ranges(const vctx_t *v, ty_errlist_t *errs) {
  for (size_t i = 0; i < jobspec_nfields; i++) {
    const jobspec_field_t *f = &jobspec_fields[i];
    if (!f->has_range) continue;
    const void *p = (const char *)v->s + f->off;
    double x = f->type == JF_INT ? *(const int *)p : *(const double *)p;
    bool ok = isfinite(x) && x <= f->hi && (f->lo_open ? x > f->lo : x >= f->lo);
    if (ok) continue;
    if (!isfinite(x))
      ty_errlist_add(errs, f->path, "must be a finite number");
    else
      ty_errlist_add(errs, f->path, "must be %s %.15g and <= %.15g, got %.15g",
                     f->lo_open ? ">" : ">=", f->lo, f->hi, x);
  }
}

static void check_alloc(const vctx_t *v, ty_errlist_t *errs) {
  alloc_t a;
  alloc_parse(v->s->allocation_mode, &a, errs);
}

static void check_dist_device(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  const jobspec_dist_backend_t b = s->dist.backend;
  if (b == JOBSPEC_DIST_NCCL && s->device != JOBSPEC_DEVICE_CUDA)
    ty_errlist_add(errs, "dist.backend",
                   "\"nccl\" connects GPU ranks, and device is \"%s\"; set device to \"cuda\", "
                   "or dist.backend to \"auto\"",
                   s->device == JOBSPEC_DEVICE_CPU ? "cpu" : "auto");
  if ((b == JOBSPEC_DIST_SHM || b == JOBSPEC_DIST_GLOO) && s->device != JOBSPEC_DEVICE_CPU)
    ty_errlist_add(errs, "dist.backend",
                   "\"%s\" connects CPU ranks, and device is \"%s\"; set device to \"cpu\", "
                   "or dist.backend to \"auto\"",
                   b == JOBSPEC_DIST_SHM ? "shm" : "gloo",
                   s->device == JOBSPEC_DEVICE_CUDA ? "cuda" : "auto");
}

/* resources: world_size is nodes x ranks_per_node (ranks_per_node 0 was
 * left unset and, where world_size divides, resolved by jobspec_validate). */
static void check_resources(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  const int n = s->resources.nodes, r = s->resources.ranks_per_node;
  if (n > 1 && s->dist.backend == JOBSPEC_DIST_SHM)
    ty_errlist_add(errs, "dist.backend",
                   "\"shm\" connects ranks through one host's shared memory, and resources asks "
                   "for %d nodes; use \"gloo\" (or \"auto\"), or resources.nodes 1",
                   n);
  if (n < 1 || r < 0 || s->world_size < 1 || s->world_size > 4096) return; /* ranges says so */
  if (r == 0)
    ty_errlist_add(errs, "resources.nodes",
                   "world_size %d does not spread evenly over %d nodes; give a world_size that "
                   "is a multiple of resources.nodes, or resources.ranks_per_node",
                   s->world_size, n);
  else if ((int64_t)n * r != s->world_size)
    ty_errlist_add(errs, "resources.ranks_per_node",
                   "resources asks for %d nodes x %d ranks = %lld ranks, and world_size is %d; "
                   "make world_size %lld, or change resources to match it",
                   n, r, (long long)n * r, s->world_size, (long long)n * r);
}

static void check_alloc_world(const vctx_t *v, ty_errlist_t *errs) {
  alloc_t a;
  if (alloc_parse(v->s->allocation_mode, &a, NULL) != 0 || a.d == 0) return;
  if (v->s->world_size != a.d)
    ty_errlist_add(errs, "world_size",
                   "is %d but allocation_mode \"%s\" asks for %d "
                   "data-parallel ranks; make them agree, or drop "
                   "world_size",
                   v->s->world_size, v->s->allocation_mode, a.d);
}

static void check_targets(const vctx_t *v, ty_errlist_t *errs) {
  if (v->s->use_lora && (v->s->target_modules & JOBSPEC_TARGET_ALL_LINEAR) == 0)
    ty_errlist_add(errs, "target_modules",
                   "is empty but use_lora is true; list modules such "
                   "as [\"q_proj\", \"v_proj\"], or \"all-linear\"");
}

static void check_warmup(const vctx_t *v, ty_errlist_t *errs) {
  if (v->s->train.warmup_steps > v->s->train.steps)
    ty_errlist_add(errs, "train.warmup_steps",
                   "is %d, more than train.steps (%d); lower it "
                   "or raise train.steps",
                   v->s->train.warmup_steps, v->s->train.steps);
}

/* The checkpoint's max_position_embeddings, from model_path's config.json;
 * 0 where it cannot be read or gives none (loading says what is wrong with
 * a checkpoint; this rule only compares). */
static int64_t checkpoint_max_positions(const char *model_path) {
  char path[JOBSPEC_PATH_MAX + 16];
  llama_config_path(model_path, path, sizeof path);
  json_t *cfg = ty_json_load_file(path, 0, NULL, 0);
  json_t *v = json_object_get(cfg, "max_position_embeddings");
  int64_t n = json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
  json_decref(cfg);
  return n;
}

/* The checkpoint's sliding_window (Mistral), from model_path/config.json
 * read as the worker reads it; 0 where there is none or it cannot be
 * read. */
static int64_t checkpoint_sliding_window(const char *model_path) {
  char path[JOBSPEC_PATH_MAX + 16];
  llama_config_path(model_path, path, sizeof path);
  json_t *cfg = ty_json_load_file(path, 0, NULL, 0);
  llama_config_t c;
  llama_config_init(&c);
  ty_errlist_t ignored = TY_ERRLIST_INIT;
  if (cfg) llama_config_from_json(cfg, &c, "", false, &ignored);
  ty_errlist_clear(&ignored);
  json_decref(cfg);
  return c.sliding_window;
}

static void check_seq_len(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  if (s->has_model && s->model.max_position_embeddings > 0 &&
      s->data.seq_len > s->model.max_position_embeddings)
    ty_errlist_add(errs, "data.seq_len",
                   "is %d, longer than model.max_position_embeddings "
                   "(%lld); shorten it or raise the model's limit",
                   s->data.seq_len, (long long)s->model.max_position_embeddings);
  /* A checkpoint's limit is its config.json's, read where paths are. */
  if (s->has_model || !v->check_paths || !s->model_path[0]) return;
  char cfg_path[JOBSPEC_PATH_MAX + 16];
  llama_config_path(s->model_path, cfg_path, sizeof cfg_path);
  int64_t max = checkpoint_max_positions(s->model_path);
  if (max > 0 && s->data.seq_len > max)
    ty_errlist_add(errs, "data.seq_len",
                   "is %d, longer than the checkpoint's max_position_embeddings (%lld, in "
                   "%s); shorten it, or raise the limit in config.json if the model "
                   "was trained for longer sequences",
                   s->data.seq_len, (long long)max, cfg_path);
  int64_t window = checkpoint_sliding_window(s->model_path);
  if (window > 0 && s->data.seq_len > window)
    ty_errlist_add(errs, "data.seq_len",
                   "is %d, longer than the checkpoint's sliding_window (%lld, in "
                   "%s); trainyard has no sliding-window attention, so a Mistral "
                   "model trains only on sequences within its window: set data.seq_len to at "
                   "most %lld",
                   s->data.seq_len, (long long)window, cfg_path, (long long)window);
}

size_t jobspec_data_token_bytes(jobspec_data_format_t f) {
  return f == JOBSPEC_DATA_U32 ? 4 : f == JOBSPEC_DATA_U16 ? 2 : 1;
}

static const char *format_name(jobspec_data_format_t f) {
  return f == JOBSPEC_DATA_U32 ? "u32" : f == JOBSPEC_DATA_U16 ? "u16" : "text";
}

/* Sizes a split can be made of: whole windows and batches, a tail that
 * leaves a part to train on. */
static bool layout_ok(const jobspec_data_layout_t *l) {
  return l->seq_len >= 1 && l->world_size >= 1 && l->micro_batch_size >= 1 && l->grad_accum >= 1 &&
         l->eval_fraction >= 0 && l->eval_fraction < 1;
}

int jobspec_data_split(const jobspec_data_layout_t *l, const char *path, uint64_t size,
                       jobspec_data_split_t *split, char *msg, size_t msglen) {
  const size_t elem = jobspec_data_token_bytes(l->format);
  if (!layout_ok(l)) {
    snprintf(msg, msglen,
             "data layout out of range: seq_len %d, micro_batch_size %d, grad_accum %d, "
             "world_size %d, eval_fraction %g (need seq_len, batch sizes >= 1 and eval_fraction "
             "in [0, 1))",
             l->seq_len, l->micro_batch_size, l->grad_accum, l->world_size, l->eval_fraction);
    return TY_EINVAL;
  }
  if (size % elem != 0) {
    snprintf(msg, msglen,
             "data file %s has %llu bytes, not a whole number of %s tokens (%zu bytes each): "
             "the last %llu bytes are a partial token; check data.format",
             path, (unsigned long long)size, format_name(l->format), elem,
             (unsigned long long)(size % elem));
    return TY_EINVAL;
  }
  const int64_t T = l->seq_len, N = (int64_t)(size / elem);
  const int64_t W = N >= T + 1 ? (N - 1) / T : 0;
  int64_t n_eval = 0;
  if (l->eval_fraction > 0 && W > 0) {
    n_eval = (int64_t)((double)W * l->eval_fraction);
    if (n_eval < 1) n_eval = 1;
  }
  const int64_t E = n_eval ? N - n_eval * T - 1 : N;
  const int64_t n_train = E >= T + 1 ? (E - 1) / T : 0;
  const int64_t G = (int64_t)l->world_size * l->micro_batch_size * l->grad_accum;
  if (n_train < 1 || n_train < G || n_train > UINT32_MAX) {
    snprintf(msg, msglen,
             "data file %s holds %lld tokens: %lld training windows of seq_len+1 = %lld tokens "
             "(after a held-out tail of %lld windows), %s one global batch of %lld windows "
             "(world_size %d x micro_batch_size %d x grad_accum %d); use more data or a "
             "smaller seq_len or batch",
             path, (long long)N, (long long)n_train, (long long)(T + 1), (long long)n_eval,
             n_train > UINT32_MAX ? "more than 2^32 windows, beyond" : "fewer than", (long long)G,
             l->world_size, l->micro_batch_size, l->grad_accum);
    return TY_EINVAL;
  }
  if (split) *split = (jobspec_data_split_t){N, n_eval, E, n_train};
  return 0;
}

/* stat(2) of path, inside the process's roots where it has them
 * (common/beneath.h): 0, -1 where it does not exist or cannot be reached,
 * 1 where it lies outside the roots or leads out of them (the rule
 * paths-in-roots names that, with the root). */
static int path_stat(const char *path, struct stat *st) {
  if (ty_beneath_stat(path, st, NULL, 0) == 0) return 0;
  return errno == EXDEV || errno == ELOOP ? 1 : -1;
}

/* Whether this process may read path (inside the roots where it has them). */
static bool readable(const char *path) {
  int fd = ty_beneath_open(path, O_RDONLY, 0, NULL, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

/* The data file, where paths are checked, holds a global batch: a job that
 * could not take one step is refused at validate and submit, not when its
 * ranks start. */
static void check_data_batch(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  struct stat st;
  if (!v->check_paths || !s->data.path[0] || path_stat(s->data.path, &st) != 0 ||
      !S_ISREG(st.st_mode))
    return; /* paths-exist names a missing file; no path: the built-in corpus */
  if (s->data.format == JOBSPEC_DATA_JSONL) {
    if (jobspec_jsonl_check) jobspec_jsonl_check(s, errs); /* the examples, tokenized */
    return;
  }
  const jobspec_data_layout_t l = {s->data.format, s->data.seq_len,           s->data.eval_fraction,
                                   s->world_size,  s->train.micro_batch_size, s->train.grad_accum};
  if (!layout_ok(&l)) return; /* rule ranges names the number */
  char msg[1024];
  if (jobspec_data_split(&l, s->data.path, (uint64_t)st.st_size, NULL, msg, sizeof msg))
    ty_errlist_add(errs, "data.path", "%s", msg);
}

/* A file model_path may name: one checkpoint file, config.json beside it. */
static bool checkpoint_file(const char *path) {
  static const char *const ext[] = {".safetensors", ".bin", ".pt", ".pth"};
  size_t n = strlen(path);
  for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
    if (n > strlen(ext[i]) && !strcmp(path + n - strlen(ext[i]), ext[i])) return true;
  return false;
}

/* JSONL options: only with format jsonl, and a chat template that is one
 * of the built-in ones when named. */
static void check_jsonl_options(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  static const char *const templates[] = {"llama3", "llama2", "chatml", "mistral"};
  if (s->data.chat_template[0]) {
    bool known = false;
    for (size_t i = 0; i < 4; i++) known |= !strcmp(s->data.chat_template, templates[i]);
    if (!known)
      ty_errlist_add(errs, "data.chat_template",
                     "\"%s\" is not a built-in chat template; use llama3, llama2, chatml or "
                     "mistral, or leave it unset for the tokenizer's own",
                     s->data.chat_template);
  }
  if (s->data.format == JOBSPEC_DATA_JSONL) return;
  const opt_use_t opts[] = {
      {"data.packing", s->data.packing},
      /* The samples' tokenizer, for any format (rule sample-tokenizer). */
      {"data.tokenizer", s->data.tokenizer[0] != '\0' && !s->train.sample_prompts[0][0]},
      {"data.kind", s->data.kind != JOBSPEC_KIND_AUTO},
      {"data.chat_template", s->data.chat_template[0] != '\0'},
      {"data.loss_on", s->data.loss_on != JOBSPEC_LOSS_ON_COMPLETION}};
  refuse_unused(opts, sizeof opts / sizeof opts[0], "examples of a JSONL file",
                "set data.format to jsonl", errs);
}

/* train.sample_prompts are decoded on rank 0's CPU with weights it holds
 * whole (a frozen base it can read again): not from full training's
 * shards, nor from the weights full training updates on GPUs. */
static void check_samples(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  if (!s->train.sample_prompts[0][0]) return;
  if (!s->use_lora && s->device == JOBSPEC_DEVICE_CUDA)
    ty_errlist_add(errs, "train.sample_prompts",
                   "training every weight on GPUs keeps the weights on the device, and samples "
                   "are decoded on rank 0's CPU; use use_lora true (the base is frozen, rank 0 "
                   "reads it whole), device cpu, or remove train.sample_prompts and run "
                   "trainyard generate on the outputs");
  else if (!s->use_lora && s->world_size > 1)
    ty_errlist_add(errs, "train.sample_prompts",
                   "training every weight on %d ranks shards the weights, and samples need them "
                   "whole on rank 0; use world_size 1, or use_lora true (the base is frozen, "
                   "rank 0 reads it whole), or remove train.sample_prompts",
                   s->world_size);
}

/* The samples' tokenizer: data.tokenizer, else tokenizer.json in
 * model_path's folder. */
static void check_sample_tokenizer(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  struct stat st;
  if (!s->train.sample_prompts[0][0]) return;
  if (s->data.tokenizer[0]) {
    if (v->check_paths && path_stat(s->data.tokenizer, &st) < 0)
      ty_errlist_add(errs, "data.tokenizer",
                     "%s does not exist; give the tokenizer.json (or its folder) that "
                     "train.sample_prompts are encoded with",
                     s->data.tokenizer);
    return;
  }
  if (s->init_from_scratch || !s->model_path[0]) {
    ty_errlist_add(errs, "train.sample_prompts",
                   "need a tokenizer, and a model initialised from scratch has no folder to "
                   "find one in; set data.tokenizer to a tokenizer.json or its folder");
    return;
  }
  if (!v->check_paths) return;
  char cfg[JOBSPEC_PATH_MAX + 16], tok[JOBSPEC_PATH_MAX + 32];
  llama_config_path(s->model_path, cfg, sizeof cfg);
  const char *slash = strrchr(cfg, '/');
  snprintf(tok, sizeof tok, "%.*stokenizer.json", slash ? (int)(slash + 1 - cfg) : 0, cfg);
  if (path_stat(tok, &st) < 0)
    ty_errlist_add(errs, "train.sample_prompts",
                   "need a tokenizer, and %s does not exist; put the model's tokenizer.json "
                   "there or set data.tokenizer",
                   tok);
}

static void check_paths_exist(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  struct stat st;
  if (!v->check_paths) return;
  if (s->model_path[0]) {
    int rc = path_stat(s->model_path, &st);
    if (rc == 1) {
      /* outside the roots: paths-in-roots says so */
    } else if (rc != 0)
      ty_errlist_add(errs, "model_path", "%s does not exist; give the checkpoint's directory",
                     s->model_path);
    else if (!S_ISDIR(st.st_mode) && !(S_ISREG(st.st_mode) && checkpoint_file(s->model_path)))
      ty_errlist_add(errs, "model_path",
                     "%s is neither a directory nor a checkpoint file; give the directory "
                     "holding config.json and the *.safetensors or pytorch_model*.bin files, or "
                     "one .safetensors, .bin, .pt or .pth file with config.json beside it",
                     s->model_path);
  }
  if (s->data.path[0]) {
    int rc = path_stat(s->data.path, &st);
    if (rc == 1) {
      /* outside the roots: paths-in-roots says so */
    } else if (rc != 0)
      ty_errlist_add(errs, "data.path", "%s does not exist", s->data.path);
    else if (!S_ISREG(st.st_mode) || !readable(s->data.path))
      ty_errlist_add(errs, "data.path", "%s is not a readable file", s->data.path);
  }
  /* output_dir, or the nearest part of it that exists, must be a folder:
   * a file there would fail the job only when its ranks start. */
  char part[JOBSPEC_PATH_MAX];
  snprintf(part, sizeof part, "%s", s->output_dir);
  for (char *slash; part[0];) {
    int rc = path_stat(part, &st);
    if (rc == 1) break; /* outside the roots: paths-in-roots says so */
    if (rc == 0) {
      if (!S_ISDIR(st.st_mode))
        ty_errlist_add(errs, "output_dir",
                       "%s cannot be a folder: %s is a file; give a folder that exists or can "
                       "be made",
                       s->output_dir, part);
      break;
    }
    if (!(slash = strrchr(part, '/')) || slash == part) break;
    *slash = '\0';
  }
}

/* Training every weight writes config.json and model.safetensors into
 * output_dir; into model_path they would replace the checkpoint it starts
 * from (and a resume would start from the replacement). */
static void check_output_not_model(const vctx_t *v, ty_errlist_t *errs) {
  const jobspec_t *s = v->s;
  if (!v->check_paths || s->use_lora || s->init_from_scratch || !s->model_path[0]) return;
  char model[PATH_MAX], out[PATH_MAX];
  if (!realpath(s->model_path, model) || jobspec_resolve_path(s->output_dir, NULL, out)) return;
  struct stat st;
  char *slash = strrchr(model, '/');
  if (stat(model, &st) == 0 && S_ISREG(st.st_mode) && slash) /* a file: its folder */
    *(slash == model ? slash + 1 : slash) = '\0';
  if (strcmp(model, out)) return;
  ty_errlist_add(errs, "output_dir",
                 "%s is model_path's folder: training every weight writes config.json and "
                 "model.safetensors there, over the checkpoint it trains from; give another "
                 "output_dir (LoRA adapters may share the base's folder)",
                 s->output_dir);
}

typedef struct {
  const char *id, *fields, *stage, *why;
  check_fn check; /* NULL: checked elsewhere (stage submit or load) */
} rule_t;

static const rule_t g_rules[] = {
    {"name-safe", "name", "spec",
     "the name becomes the default output directory runs/<name>, so it must be one safe path "
     "component",
     check_name},
    {"scratch-no-memory-efficient-load", "fsdp.memory_efficient_load, init_from_scratch", "spec",
     "memory-efficient loading stages a pretrained checkpoint; from scratch there is none. The "
     "message says to drop one of the two",
     check_mel_scratch},
    {"model-path-required", "model_path, init_from_scratch", "spec",
     "nothing to load without it; with init_from_scratch it would be silently ignored",
     check_model_path},
    {"model-iff-scratch", "model, init_from_scratch", "spec",
     "from scratch the shape must be given; otherwise it comes from the checkpoint's "
     "config.json",
     check_model_iff_scratch},
    {"model-shape", "model.*", "spec",
     "sizes >= 1, heads divide evenly (num_key_value_heads divides num_attention_heads, "
     "head_dim given or hidden_size divisible by the heads), eps > 0",
     check_model_shape},
    {"scratch-no-lora", "use_lora, init_from_scratch", "spec",
     "adapters over random weights train nothing useful", check_lora_scratch},
    {"merge-needs-lora", "merge_adapter, use_lora", "spec",
     "merging writes the base with the trained adapter folded in; training every weight "
     "writes the whole model already and has no adapter",
     check_merge_lora},
    {"qlora", "quantization.*, use_lora, init_from_scratch, device", "spec",
     "a 4-bit base (quantization.load_in_4bit, QLoRA) is frozen, so it trains adapters only "
     "(use_lora: true), and it is quantized from a pretrained checkpoint while it loads, so not "
     "with init_from_scratch; it runs on CPU ranks; the bnb_4bit_* options need load_in_4bit; "
     "a bitsandbytes 4-bit checkpoint (config.json's quantization_config, checked where paths "
     "are) is read as it is, so its job sets load_in_4bit with the checkpoint's quant type and "
     "double quantization",
     check_quantization},
    {"dpo", "train.objective, dpo.*, data.format, data.kind, data.packing, data.loss_on",
     "spec",
     "train.objective \"dpo\" learns from JSONL pairs (data.kind preference: a prompt, a chosen "
     "and a rejected response), each response a row of its own whose counted tokens are summed, "
     "so not with data.packing or data.loss_on all; the reference is the frozen base (under "
     "LoRA, the adapters switched off; training every weight, a pass before the first step); "
     "dpo.label_smoothing applies to loss_type sigmoid; the dpo.* options "
     "and data.kind preference need train.objective \"dpo\"",
     check_dpo},
    {"ranges",
     "world_size, lora_rank, lora_alpha, fsdp.bucket_mb, data.*, train.*, "
     "max_restarts",
     "spec",
     "world_size >= 1, lora_rank >= 1, train.lr > 0, train.steps >= 1, data.seq_len >= 1, "
     "finite numbers only ('validate --fields' lists every bound)",
     check_ranges},
    {"allocation-mode", "allocation_mode", "spec",
     "\"static\" or AReaL's \"fsdp:d<N>\"; pipeline, tensor, context or expert degrees above 1 "
     "are rejected, naming the degree: FSDP here is data-parallel",
     check_alloc},
    {"allocation-world-size", "allocation_mode, world_size", "spec",
     "d<N> is the number of ranks; when both are given they must agree (world_size defaults "
     "to N)",
     check_alloc_world},
    {"dist-backend-device", "dist.backend, device", "spec",
     "shm and gloo move CPU ranks' tensors, nccl GPU ranks'; a backend named for the other kind "
     "of device (or for device auto, which may become either) cannot connect the ranks",
     check_dist_device},
    {"resources-world-size", "resources.nodes, resources.ranks_per_node, world_size", "spec",
     "the ranks are nodes x ranks_per_node: when both that and world_size are given they must "
     "agree; given alone, ranks_per_node sets world_size, and world_size alone spreads evenly "
     "over the nodes; shm cannot reach ranks on another node",
     check_resources},
    {"nodes-dispatcher", "resources.nodes", "submit",
     "ranks on more than one node need a dispatcher that reaches other hosts (trainyardd "
     "--dispatcher slurm); the local dispatcher, and trainyard train, refuse them by name",
     NULL},
    {"lora-targets", "target_modules, use_lora", "spec",
     "a LoRA job with no target module has nothing to train", check_targets},
    {"warmup-within-steps", "train.warmup_steps, train.steps", "spec",
     "a warm-up longer than the run never reaches the set learning rate", check_warmup},
    {"seq-len-within-model",
     "data.seq_len, model.max_position_embeddings or model_path's config.json", "spec",
     "positions beyond the model's limit have no meaning; a checkpoint's limit is read from its "
     "config.json where paths are checked, and so is Mistral's sliding_window, which data.seq_len "
     "must not exceed (no sliding-window attention: within the window the model is Llama's)",
     check_seq_len},
    {"jsonl-options", "data.packing, data.tokenizer, data.kind, data.chat_template, data.loss_on",
     "spec",
     "the options of JSONL examples mean nothing for a token file; a named chat template must "
     "be one trainyard has built in",
     check_jsonl_options},
    {"sample-prompts", "train.sample_prompts, device, use_lora, world_size", "spec",
     "samples are decoded on rank 0's CPU with the weights it holds whole (under LoRA the "
     "frozen base, read whole again where the ranks shard it or GPUs hold it): a job training "
     "every weight on several ranks (sharded) or on GPUs cannot make them",
     check_samples},
    {"sample-tokenizer", "train.sample_prompts, data.tokenizer, model_path, init_from_scratch",
     "paths",
     "train.sample_prompts are encoded and their samples decoded with a tokenizer: "
     "data.tokenizer (allowed for any data format when there are samples), else tokenizer.json "
     "beside the model; a model from scratch has none of its own",
     check_sample_tokenizer},
    {"paths-exist", "model_path, data.path, output_dir", "paths",
     "fail early, not in a worker: model_path is a directory or one checkpoint file (.safetensors, "
     ".bin, .pt, .pth), data.path a readable file, "
     "output_dir a folder or one that can be made (no file in its way)",
     check_paths_exist},
    {"data-holds-a-batch",
     "data.path, data.format, data.seq_len, data.eval_fraction, world_size, "
     "train.micro_batch_size, train.grad_accum",
     "paths",
     "a job whose data file is a partial token short, or holds fewer training windows than one "
     "global batch, could not take a step: refused before it is stored, and again by each rank "
     "before it loads a weight. A JSONL file is tokenized (where the program links the "
     "tokenizer: trainyard and trainyardd): it needs a tokenizer whose vocabulary fits the "
     "model's, and a malformed line, a missing key, an unknown role or a template error is "
     "refused naming the file and the line (of a large file the lines within its first 16 MiB, "
     "TRAINYARD_JSONL_CHECK_KIB, where they hold a global batch: the ranks tokenize the rest, "
     "and fail the job naming a bad line there)",
     check_data_batch},
    {"output-not-model", "output_dir, model_path, use_lora", "paths",
     "training every weight writes config.json and model.safetensors into output_dir: into "
     "model_path's folder they would overwrite the checkpoint the job trains from",
     check_output_not_model},
    {"paths-in-roots", "model_path, data.path, output_dir", "submit",
     "no reading or writing outside the server's configured roots (symbolic links and .. "
     "followed; the paths are stored resolved); a file of the model folder, or an entry of the "
     "output folder down to checkpoints/step-N's files, that is a link leading out of its root "
     "is refused too, as its ranks, which open every file beneath the roots, would fail",
     NULL},
    {"output-dir-free", "output_dir", "submit",
     "no two unfinished jobs write one output folder: they would overwrite each other's "
     "checkpoints and outputs, and the later would resume from the other's checkpoint",
     NULL},
    {"host-memory",
     "model_path, model, fsdp.memory_efficient_load, world_size, use_lora, dtype, "
     "gradient_checkpointing, train.micro_batch_size, data.seq_len, train.sample_prompts",
     "submit",
     "CPU ranks on one host must fit its memory (trainyardd: --host_mem_mib, else MemTotal; "
     "trainyard train and load: MemTotal): the weights in float32 (a load alone: the job's "
     "dtype), placed whole by each rank on the standard load path, for full training the "
     "gradients and AdamW moments, each training rank's activations (every layer's, or one "
     "layer's with gradient_checkpointing), and with train.sample_prompts under LoRA on several "
     "ranks rank 0's whole copy of the base; a job over that can never start, and the message "
     "says when fsdp.memory_efficient_load or gradient_checkpointing would fit",
     NULL},
    {"device-memory",
     "model_path, model, fsdp.memory_efficient_load, world_size, use_lora, dtype, device, "
     "gradient_checkpointing, train.micro_batch_size, data.seq_len, lora_rank, target_modules",
     "submit",
     "GPU ranks must fit their GPU (trainyardd: the largest GPU NVML reports, or "
     "--gpu_mem_limit_mib where smaller): the rank's shard in the job's dtype, placed beside the "
     "whole model on the standard load path, for full training the float32 shard's "
     "gradients and AdamW moments, the rank's activations (every layer's, or one layer's with "
     "gradient_checkpointing) and adapters, and over several ranks the slots units are gathered "
     "into; a job over that can never start, and the message says when "
     "fsdp.memory_efficient_load or gradient_checkpointing would fit",
     NULL},
    {"cuda-gpus", "device, world_size", "submit",
     "device cuda needs one GPU per rank on the host; fail at submit, not in a worker", NULL},
    {"checkpoint-matches-config", "model_path", "load",
     "a checkpoint whose tensors do not match its config.json, or miss or add a tensor, fails "
     "the job at load with the tensor's name: never train on silently random weights",
     NULL},
};
#define NRULES (sizeof g_rules / sizeof g_rules[0])

void jobspec_rules_each(jobspec_rule_fn fn, void *ctx) {
  for (size_t i = 0; i < NRULES; i++) fn(g_rules[i].id, g_rules[i].fields, g_rules[i].why, ctx);
}

const char *jobspec_rule_stage(const char *id) {
  for (size_t i = 0; i < NRULES; i++)
    if (!strcmp(g_rules[i].id, id)) return g_rules[i].stage;
  return NULL;
}

void (*jobspec_jsonl_check)(const jobspec_t *s, ty_errlist_t *errs);

int jobspec_validate(jobspec_t *s, bool check_paths, ty_errlist_t *errs) {
  size_t before = errs->len;
  /* Defaults that depend on other fields, before the rules look. */
  alloc_t a;
  if (alloc_parse(s->allocation_mode, &a, NULL) == 0) {
    s->dp_degree = a.d;
    if (a.d > 0) {
      char canon[JOBSPEC_MODE_MAX];
      snprintf(canon, sizeof canon, "fsdp:d%d", a.d);
      jobspec_copy_str(s->allocation_mode, sizeof s->allocation_mode, canon);
      if (!s->world_size_given) s->world_size = a.d;
    }
  }
  const int nodes = s->resources.nodes, rpn = s->resources.ranks_per_node;
  if (!s->world_size_given && a.d == 0 && nodes >= 1 && rpn >= 1 && (int64_t)nodes * rpn <= 4096)
    s->world_size = nodes * rpn;
  if (rpn == 0 && nodes >= 1 && s->world_size >= 1 && s->world_size <= 4096 &&
      s->world_size % nodes == 0)
    s->resources.ranks_per_node = s->world_size / nodes;
  s->world_size_given = true;
  if (!s->output_dir[0]) {
    char dir[JOBSPEC_PATH_MAX];
    snprintf(dir, sizeof dir, "runs/%s", s->name);
    jobspec_copy_str(s->output_dir, sizeof s->output_dir, dir);
  }
  vctx_t v = {s, check_paths};
  for (size_t i = 0; i < NRULES; i++)
    if (g_rules[i].check) g_rules[i].check(&v, errs);
  return errs->len > before ? TY_EINVAL : 0;
}
