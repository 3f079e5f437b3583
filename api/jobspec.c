/* jobspec.c - the job spec's field table, its defaults, JSON parsing and
 * serialization; see jobspec.h. Flags are in jobspec_flags.c, the rules in
 * jobspec_rules.c. */
#include "api/jobspec.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec_internal.h"
#include "common/json_util.h"

static const char *const g_device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const g_format_names[] = {"text", "u16", "u32", "jsonl", NULL};
static const char *const g_kind_names[] = {"auto",     "text",       "prompt_completion",
                                           "messages", "preference", NULL};
static const char *const g_loss_on_names[] = {"completion", "all", NULL};
static const char *const g_dist_names[] = {"auto", "shm", "gloo", "nccl", NULL};
static const char *const g_quant_type_names[] = {"nf4", "fp4", NULL};
static const char *const g_objective_names[] = {"sft", "dpo", NULL};
static const char *const g_dpo_loss_names[] = {"sigmoid", "ipo", "hinge", NULL};

#define OFF(m) offsetof(jobspec_t, m)
/* path, type, offset, string size, enum names, ranged, lo, hi, lo open, help */
const jobspec_field_t jobspec_fields[] = {
    {"name", JF_STRING, OFF(name), JOBSPEC_NAME_MAX, NULL, false, 0, 0, false,
     "job name: letters, digits, '.', '_' and '-'"},
    {"model_path", JF_STRING, OFF(model_path), JOBSPEC_PATH_MAX, NULL, false, 0, 0, false,
     "the pretrained checkpoint: a directory (config.json + *.safetensors or "
     "pytorch_model*.bin), or one .safetensors/.bin/.pt/.pth file with config.json beside it"},
    {"init_from_scratch", JF_BOOL, OFF(init_from_scratch), 0, NULL, false, 0, 0, false,
     "random initial weights of the shape in \"model\" instead of a checkpoint"},
    {"model", JF_MODEL, OFF(model), 0, NULL, false, 0, 0, false,
     "Llama config.json fields; only with init_from_scratch"},
    {"dtype", JF_DTYPE, OFF(dtype), 0, NULL, false, 0, 0, false,
     "float32, bfloat16 or float16: weights in memory"},
    {"device", JF_ENUM, OFF(device), 0, g_device_names, false, 0, 0, false, "auto, cpu or cuda"},
    {"allocation_mode", JF_STRING, OFF(allocation_mode), JOBSPEC_MODE_MAX, NULL, false, 0, 0, false,
     "static, or fsdp:d<N> (data-parallel degree N)"},
    {"world_size", JF_INT, OFF(world_size), 0, NULL, true, 1, 4096, false, "number of ranks"},
    {"fsdp", JF_OBJECT, 0, 0, NULL, false, 0, 0, false, "sharding and loading"},
    {"fsdp.memory_efficient_load", JF_BOOL, OFF(fsdp.memory_efficient_load), 0, NULL, false, 0, 0,
     false, "each rank reads only its shard through one bounded bucket"},
    {"fsdp.bucket_mb", JF_INT, OFF(fsdp.bucket_mb), 0, NULL, true, 1, 65536, false,
     "staging bucket of the memory-efficient load, MiB"},
    {"dist", JF_OBJECT, 0, 0, NULL, false, 0, 0, false, "how the ranks exchange tensors"},
    {"dist.backend", JF_ENUM, OFF(dist.backend), 0, g_dist_names, false, 0, 0, false,
     "auto (shm for CPU ranks, nccl for GPU ranks), shm (CPU ranks, one host's shared memory), "
     "gloo (CPU ranks over TCP) or nccl (GPU ranks)"},
    {"resources", JF_OBJECT, 0, 0, NULL, false, 0, 0, false, "where the ranks run"},
    {"resources.nodes", JF_INT, OFF(resources.nodes), 0, NULL, true, 1, 4096, false,
     "hosts the ranks spread over (more than 1 needs a cluster dispatcher: trainyardd "
     "--dispatcher slurm)"},
    {"resources.ranks_per_node", JF_INT, OFF(resources.ranks_per_node), 0, NULL, true, 0, 4096,
     false, "ranks on each host; 0: world_size / nodes"},
    {"use_lora", JF_BOOL, OFF(use_lora), 0, NULL, false, 0, 0, false,
     "train LoRA adapters instead of every weight"},
    {"lora_rank", JF_INT, OFF(lora_rank), 0, NULL, true, 1, JOBSPEC_LORA_RANK_MAX, false,
     "LoRA rank r"},
    {"lora_alpha", JF_DOUBLE, OFF(lora_alpha), 0, NULL, true, 0, 1e6, true,
     "LoRA scale numerator (scale = alpha / r)"},
    {"target_modules", JF_TARGETS, OFF(target_modules), 0, NULL, false, 0, 0, false,
     "list of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or \"all-linear\""},
    {"gradient_checkpointing", JF_BOOL, OFF(gradient_checkpointing), 0, NULL, false, 0, 0, false,
     "keep one layer's activations, recompute the others in the backward pass"},
    {"merge_adapter", JF_BOOL, OFF(merge_adapter), 0, NULL, false, 0, 0, false,
     "LoRA: at the end also write the base with the adapter merged into output_dir/merged/"},
    {"quantization", JF_OBJECT, 0, 0, NULL, false, 0, 0, false,
     "QLoRA: the frozen base in 4 bits (transformers' BitsAndBytesConfig names)"},
    {"quantization.load_in_4bit", JF_BOOL, OFF(quantization.load_in_4bit), 0, NULL, false, 0, 0,
     false,
     "keep the base's linear projections in 4 bits, quantized as each rank's shard is read; "
     "needs use_lora"},
    {"quantization.bnb_4bit_quant_type", JF_ENUM, OFF(quantization.bnb_4bit_quant_type), 0,
     g_quant_type_names, false, 0, 0, false, "nf4 (NormalFloat) or fp4: the 16 codes"},
    {"quantization.bnb_4bit_use_double_quant", JF_BOOL, OFF(quantization.bnb_4bit_use_double_quant),
     0, NULL, false, 0, 0, false,
     "quantize the blocks' absmax statistics too (8 bits, blocks of 256)"},
    {"quantization.bnb_4bit_compute_dtype", JF_DTYPE, OFF(quantization.bnb_4bit_compute_dtype), 0,
     NULL, false, 0, 0, false,
     "float32, bfloat16 or float16: what the 4-bit blocks dequantize into for the products"},
    {"data", JF_OBJECT, 0, 0, NULL, false, 0, 0, false, "training data"},
    {"data.path", JF_STRING, OFF(data.path), JOBSPEC_PATH_MAX, NULL, false, 0, 0, false,
     "token file, or JSONL file of examples"},
    {"data.format", JF_ENUM, OFF(data.format), 0, g_format_names, false, 0, 0, false,
     "text (a byte per token), u16 or u32 (little-endian token ids), or jsonl (examples)"},
    {"data.seq_len", JF_INT, OFF(data.seq_len), 0, NULL, true, 1, 1 << 20, false,
     "tokens per training window"},
    {"data.eval_fraction", JF_DOUBLE, OFF(data.eval_fraction), 0, NULL, true, 0, 0.5, false,
     "held-out tail of the data for evaluation (jsonl: whole examples)"},
    {"data.packing", JF_BOOL, OFF(data.packing), 0, NULL, false, 0, 0, false,
     "jsonl: pack several examples into each row of seq_len tokens"},
    {"data.tokenizer", JF_STRING, OFF(data.tokenizer), JOBSPEC_PATH_MAX, NULL, false, 0, 0, false,
     "jsonl: tokenizer folder or tokenizer.json; default model_path"},
    {"data.kind", JF_ENUM, OFF(data.kind), 0, g_kind_names, false, 0, 0, false,
     "jsonl: auto (by each line's keys), text, prompt_completion, messages or preference "
     "(chosen/rejected pairs: train.objective dpo)"},
    {"data.chat_template", JF_STRING, OFF(data.chat_template), JOBSPEC_TEMPLATE_MAX, NULL, false, 0,
     0, false, "jsonl messages: llama3, llama2, chatml or mistral; default the tokenizer's"},
    {"data.loss_on", JF_ENUM, OFF(data.loss_on), 0, g_loss_on_names, false, 0, 0, false,
     "jsonl: completion (completions and assistant turns) or all"},
    {"train", JF_OBJECT, 0, 0, NULL, false, 0, 0, false, "optimization"},
    {"train.objective", JF_ENUM, OFF(train.objective), 0, g_objective_names, false, 0, 0, false,
     "sft (the next-token loss on the counted tokens) or dpo (preference pairs, chosen over "
     "rejected, against the frozen base: see dpo.*)"},
    {"train.steps", JF_INT, OFF(train.steps), 0, NULL, true, 1, 1e9, false, "optimizer steps"},
    {"train.micro_batch_size", JF_INT, OFF(train.micro_batch_size), 0, NULL, true, 1, 65536, false,
     "sequences per rank per micro-batch (dpo: pairs, each two sequences)"},
    {"train.grad_accum", JF_INT, OFF(train.grad_accum), 0, NULL, true, 1, 65536, false,
     "micro-batches per optimizer step"},
    {"train.lr", JF_DOUBLE, OFF(train.lr), 0, NULL, true, 0, 10, true, "AdamW learning rate"},
    {"train.warmup_steps", JF_INT, OFF(train.warmup_steps), 0, NULL, true, 0, 1e9, false,
     "linear warm-up steps"},
    {"train.weight_decay", JF_DOUBLE, OFF(train.weight_decay), 0, NULL, true, 0, 10, false,
     "AdamW decoupled weight decay"},
    {"train.grad_clip", JF_DOUBLE, OFF(train.grad_clip), 0, NULL, true, 0, 1e6, false,
     "global gradient-norm clip; 0 disables"},
    {"train.seed", JF_U64, OFF(train.seed), 0, NULL, false, 0, 0, false,
     "seed for initialization and data order"},
    {"train.checkpoint_every", JF_INT, OFF(train.checkpoint_every), 0, NULL, true, 0, 1e9, false,
     "steps between resumable checkpoints; 0: only at the end"},
    {"train.sample_prompts", JF_STRINGS, OFF(train.sample_prompts), JOBSPEC_SAMPLE_PROMPT_MAX, NULL,
     false, 0, JOBSPEC_SAMPLE_PROMPTS_MAX, false,
     "prompts rank 0 decodes greedily with the weights being trained (job events \"sample\")"},
    {"train.sample_every", JF_INT, OFF(train.sample_every), 0, NULL, true, 0, 1e9, false,
     "steps between samples of train.sample_prompts; 0: only at the end"},
    {"train.sample_max_new_tokens", JF_INT, OFF(train.sample_max_new_tokens), 0, NULL, true, 1,
     1024, false, "tokens each sample generates at most (it also ends at an eos_token_id)"},
    {"dpo", JF_OBJECT, 0, 0, NULL, false, 0, 0, false,
     "preference tuning (train.objective dpo), named as TRL's DPOConfig names them"},
    {"dpo.beta", JF_DOUBLE, OFF(dpo.beta), 0, NULL, true, 0, 100, true,
     "how far the policy may move from the reference: the implicit rewards are beta times the "
     "log-probability ratios"},
    {"dpo.loss_type", JF_ENUM, OFF(dpo.loss_type), 0, g_dpo_loss_names, false, 0, 0, false,
     "sigmoid (DPO), ipo (over each response's mean log-probability) or hinge"},
    {"dpo.label_smoothing", JF_DOUBLE, OFF(dpo.label_smoothing), 0, NULL, true, 0, 0.5, false,
     "sigmoid: the share of pairs taken as mislabelled (conservative DPO); 0 for the others"},
    {"max_restarts", JF_INT, OFF(max_restarts), 0, NULL, true, 0, 100, false,
     "new attempts after a failed one"},
    {"output_dir", JF_STRING, OFF(output_dir), JOBSPEC_PATH_MAX, NULL, false, 0, 0, false,
     "where outputs go; default runs/<name>"},
};
const size_t jobspec_nfields = sizeof jobspec_fields / sizeof jobspec_fields[0];

const jobspec_field_t *jobspec_field_find(const char *path) {
  for (size_t i = 0; i < jobspec_nfields; i++)
    if (!strcmp(jobspec_fields[i].path, path)) return &jobspec_fields[i];
  return NULL;
}

static const char *const g_target_names[] = {
#define TY_X(id, name) name,
    JOBSPEC_TARGETS(TY_X)
#undef TY_X
};

const char *jobspec_target_name(int bit) {
  return bit >= 0 && bit < JOBSPEC_TARGET_COUNT ? g_target_names[bit] : NULL;
}

int jobspec_target_parse(const char *name) {
  for (int i = 0; i < JOBSPEC_TARGET_COUNT; i++)
    if (!strcmp(g_target_names[i], name)) return i;
  return -1;
}

/* ---- defaults ---- */

void jobspec_init(jobspec_t *s) {
  memset(s, 0, sizeof *s);
  jobspec_copy_str(s->name, sizeof s->name, "job");
  s->init_from_scratch = false;
  s->has_model = false;
  llama_config_init(&s->model);
  s->dtype = TY_DTYPE_F32;
  s->device = JOBSPEC_DEVICE_AUTO;
  s->dist.backend = JOBSPEC_DIST_AUTO;
  s->resources.nodes = 1;
  s->resources.ranks_per_node = 0;
  jobspec_copy_str(s->allocation_mode, sizeof s->allocation_mode, "static");
  s->world_size = 1;
  s->fsdp.memory_efficient_load = false;
  s->fsdp.bucket_mb = 64;
  s->use_lora = false;
  s->lora_rank = 8;
  s->lora_alpha = 16;
  s->target_modules = 1u << JOBSPEC_TARGET_BIT_Q | 1u << JOBSPEC_TARGET_BIT_K |
                      1u << JOBSPEC_TARGET_BIT_V | 1u << JOBSPEC_TARGET_BIT_O;
  s->gradient_checkpointing = false;
  s->merge_adapter = false;
  s->quantization.load_in_4bit = false;
  s->quantization.bnb_4bit_quant_type = JOBSPEC_QUANT_NF4;
  s->quantization.bnb_4bit_use_double_quant = false;
  s->quantization.bnb_4bit_compute_dtype = TY_DTYPE_F32;
  s->data.format = JOBSPEC_DATA_TEXT;
  s->data.seq_len = 128;
  s->data.eval_fraction = 0.05;
  s->train.steps = 100;
  s->train.micro_batch_size = 4;
  s->train.grad_accum = 1;
  s->train.lr = 3e-4;
  s->train.warmup_steps = 0;
  s->train.weight_decay = 0;
  s->train.grad_clip = 1.0;
  s->train.seed = 1234;
  s->train.checkpoint_every = 0;
  s->train.sample_every = 0;
  s->train.sample_max_new_tokens = 32;
  s->train.objective = JOBSPEC_OBJECTIVE_SFT;
  s->dpo.beta = 0.1;
  s->dpo.loss_type = JOBSPEC_DPO_SIGMOID;
  s->dpo.label_smoothing = 0;
  s->max_restarts = 0;
  /* output_dir stays "" until jobspec_validate derives runs/<name>. */
}

int jobspec_micro_batch_rows(const jobspec_t *s) {
  return s->train.micro_batch_size * (s->train.objective == JOBSPEC_OBJECTIVE_DPO ? 2 : 1);
}

/* ---- one field to and from JSON ---- */

json_t *jobspec_field_to_json(const jobspec_t *s, const jobspec_field_t *f) {
  const char *p = (const char *)s + f->off;
  switch (f->type) {
    case JF_OBJECT:
      return json_object();
    case JF_STRING:
      return json_string(p);
    case JF_BOOL:
      return json_boolean(*(const bool *)p);
    case JF_INT:
      return json_integer(*(const int *)(const void *)p);
    case JF_U64:
      return json_integer((json_int_t) * (const uint64_t *)(const void *)p);
    case JF_DOUBLE:
      return json_real(*(const double *)(const void *)p);
    case JF_ENUM: {
      int e = *(const int *)(const void *)p, n = 0;
      while (f->names[n]) n++;
      return json_string(e >= 0 && e < n ? f->names[e] : "invalid");
    }
    case JF_DTYPE:
      return json_string(ty_dtype_name(*(const ty_dtype_t *)(const void *)p));
    case JF_TARGETS: {
      unsigned m = *(const unsigned *)(const void *)p;
      json_t *a = json_array();
      for (int i = 0; i < JOBSPEC_TARGET_COUNT; i++)
        if (m & (1u << i)) json_array_append_new(a, json_string(g_target_names[i]));
      return a;
    }
    case JF_MODEL:
      return s->has_model ? llama_config_to_json(&s->model) : json_null();
    case JF_STRINGS: {
      json_t *a = json_array();
      for (size_t i = 0; i < (size_t)f->hi && p[i * f->size]; i++)
        json_array_append_new(a, json_string(p + i * f->size));
      return a;
    }
  }
  return json_null(); /* cannot happen: every type is handled above */
}

/* The default of a field as compact JSON text, for "remove it to use the
 * default" messages. Writes into buf. */
static const char *default_text(const jobspec_field_t *f, char *buf, size_t cap) {
  jobspec_t d;
  jobspec_init(&d);
  json_t *v = jobspec_field_to_json(&d, f);
  char *t = ty_json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  snprintf(buf, cap, "%s", t ? t : "?");
  free(t);
  json_decref(v);
  return buf;
}

/* A JF_STRINGS field: a list of at most f->hi non-empty UTF-8 strings,
 * each under f->size bytes, into p (the rest zeroed). */
static void set_strings_json(char *p, const jobspec_field_t *f, const json_t *v, const char *path,
                             ty_errlist_t *errs) {
  memset(p, 0, f->size * (size_t)f->hi);
  if (!json_is_array(v)) {
    ty_errlist_add(errs, path, "must be a list of strings, got %s", ty_json_kind(v));
    return;
  }
  if (json_array_size(v) > (size_t)f->hi) {
    ty_errlist_add(errs, path, "holds %zu strings; at most %d are allowed", json_array_size(v),
                   (int)f->hi);
    return;
  }
  size_t i;
  json_t *e;
  json_array_foreach(v, i, e) {
    const char *t = json_string_value(e);
    char ep[300];
    snprintf(ep, sizeof ep, "%s[%zu]", path, i);
    if (!t || !*t)
      ty_errlist_add(errs, ep, "must be a non-empty string, got %s", t ? "\"\"" : ty_json_kind(e));
    else if (jobspec_copy_str(p + i * f->size, f->size, t) != 0)
      ty_errlist_add(errs, ep, "is %zu bytes; at most %zu are allowed", strlen(t), f->size - 1);
  }
}

static void set_targets_json(jobspec_t *s, const json_t *v, const char *path, ty_errlist_t *errs) {
  if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
    s->target_modules = JOBSPEC_TARGET_ALL_LINEAR;
    return;
  }
  if (!json_is_array(v)) {
    ty_errlist_add(errs, path, "must be a list of module names or \"all-linear\", got %s",
                   json_is_string(v) ? json_string_value(v) : ty_json_kind(v));
    return;
  }
  unsigned m = 0;
  size_t i;
  json_t *e;
  bool ok = true;
  json_array_foreach(v, i, e) {
    char ep[300];
    snprintf(ep, sizeof ep, "%s[%zu]", path, i);
    int bit = json_is_string(e) ? jobspec_target_parse(json_string_value(e)) : -1;
    if (bit >= 0) {
      m |= 1u << bit;
      continue;
    }
    ok = false;
    if (!json_is_string(e)) {
      ty_errlist_add(errs, ep, "must be a module name string, got %s", ty_json_kind(e));
      continue;
    }
    const char *near = jobspec_closest(json_string_value(e), g_target_names, JOBSPEC_TARGET_COUNT);
    if (!strcmp(json_string_value(e), "all-linear"))
      ty_errlist_add(errs, ep,
                     "\"all-linear\" stands alone: write \"target_modules\": "
                     "\"all-linear\"");
    else if (near)
      ty_errlist_add(errs, ep, "unknown module \"%s\"; did you mean \"%s\"?", json_string_value(e),
                     near);
    else
      ty_errlist_add(errs, ep,
                     "unknown module \"%s\"; use q_proj, k_proj, v_proj, o_proj, "
                     "gate_proj, up_proj or down_proj",
                     json_string_value(e));
  }
  if (ok) s->target_modules = m;
}

void jobspec_set_enum_error(const jobspec_field_t *f, const char *got, const char *path,
                            ty_errlist_t *errs) {
  char list[256] = "";
  size_t n = 0;
  for (; f->names[n]; n++) {
    size_t l = strlen(list);
    snprintf(list + l, sizeof list - l, "%s\"%s\"", n ? ", " : "", f->names[n]);
  }
  const char *near = got ? jobspec_closest(got, f->names, n) : NULL;
  if (near)
    ty_errlist_add(errs, path, "unknown value \"%s\"; did you mean \"%s\"? (one of %s)", got, near,
                   list);
  else
    ty_errlist_add(errs, path, "must be one of %s%s%s", list, got ? ", got " : "", got ? got : "");
}

/* Sets one leaf field from a JSON value; problems go to errs. */
void jobspec_set_json(jobspec_t *s, const jobspec_field_t *f, const json_t *v, const char *path,
                      ty_errlist_t *errs) {
  char *p = (char *)s + f->off;
  char dflt[128];
  if (json_is_null(v) && f->type != JF_MODEL) {
    ty_errlist_add(errs, path, "must not be null; remove the field to use the default (%s)",
                   default_text(f, dflt, sizeof dflt));
    return;
  }
  switch (f->type) {
    case JF_OBJECT:
      return; /* groups are walked by the caller */
    case JF_STRING:
      if (!json_is_string(v)) {
        ty_errlist_add(errs, path, "must be a string, got %s", ty_json_kind(v));
      } else if (jobspec_copy_str(p, f->size, json_string_value(v)) != 0) {
        ty_errlist_add(errs, path, "is %zu bytes long; at most %zu are allowed",
                       json_string_length(v), f->size - 1);
      }
      return;
    case JF_BOOL:
      if (!json_is_boolean(v))
        ty_errlist_add(errs, path, "must be true or false, got %s", ty_json_kind(v));
      else
        *(bool *)p = json_is_true(v);
      return;
    case JF_INT:
    case JF_U64: {
      double d = json_is_real(v) ? json_real_value(v) : 0;
      bool integral = json_is_integer(v) || (json_is_real(v) && d == floor(d) && fabs(d) < 9e18);
      if (!integral) {
        ty_errlist_add(errs, path, "must be an integer, got %s", ty_json_kind(v));
        return;
      }
      long long x = json_is_integer(v) ? (long long)json_integer_value(v) : (long long)d;
      if (f->type == JF_U64) {
        if (x < 0)
          ty_errlist_add(errs, path, "must be >= 0, got %lld", x);
        else
          *(uint64_t *)(void *)p = (uint64_t)x;
        return;
      }
      if (x < INT_MIN || x > INT_MAX) {
        ty_errlist_add(errs, path, "must be between %.0f and %.0f, got %lld", f->lo, f->hi, x);
        return;
      }
      *(int *)(void *)p = (int)x;
      if (f->off == OFF(world_size)) s->world_size_given = true;
      return;
    }
    case JF_DOUBLE:
      if (!json_is_number(v))
        ty_errlist_add(errs, path, "must be a number, got %s", ty_json_kind(v));
      else if (!isfinite(json_number_value(v)))
        ty_errlist_add(errs, path, "must be a finite number");
      else
        *(double *)(void *)p = json_number_value(v);
      return;
    case JF_ENUM: {
      if (json_is_string(v))
        for (int i = 0; f->names[i]; i++)
          if (!strcmp(f->names[i], json_string_value(v))) {
            *(int *)(void *)p = i;
            return;
          }
      jobspec_set_enum_error(f, json_is_string(v) ? json_string_value(v) : ty_json_kind(v), path,
                             errs);
      return;
    }
    case JF_DTYPE: {
      ty_dtype_t t;
      if (json_is_string(v) && ty_dtype_parse(json_string_value(v), &t) == 0)
        *(ty_dtype_t *)(void *)p = t;
      else
        ty_errlist_add(errs, path, "must be \"float32\", \"bfloat16\" or \"float16\", got %s",
                       json_is_string(v) ? json_string_value(v) : ty_json_kind(v));
      return;
    }
    case JF_TARGETS:
      set_targets_json(s, v, path, errs);
      return;
    case JF_STRINGS:
      set_strings_json(p, f, v, path, errs);
      return;
    case JF_MODEL:
      llama_config_init(&s->model);
      s->has_model = false;
      if (json_is_null(v)) return;
      if (llama_config_from_json(v, &s->model, path, true, errs) == 0) s->has_model = true;
      return;
  }
}

/* Walks one JSON object whose fields live under prefix ("" or a group). */
static void from_object(jobspec_t *s, const json_t *obj, const char *prefix, ty_errlist_t *errs) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    char path[256], sug[256];
    jobspec_path_join(path, sizeof path, prefix, key);
    const jobspec_field_t *f = strchr(key, '.') ? NULL : jobspec_field_find(path);
    if (!f) {
      const char *whose, *ours = jobspec_other_name(path, &whose);
      const char *near =
          strchr(key, '.') ? NULL : jobspec_suggest_field(prefix, key, sug, sizeof sug);
      if (ours)
        ty_errlist_add(errs, path, "unknown field; trainyard calls it \"%s\" (%s): set that", ours,
                       whose);
      else if (strchr(key, '.'))
        ty_errlist_add(errs, path,
                       "unknown field; dotted names are for command-line flags, "
                       "in JSON nest the object (\"fsdp\": {\"bucket_mb\": 64})");
      else if (near)
        ty_errlist_add(errs, path, "unknown field; did you mean \"%s\"?", near);
      else
        ty_errlist_add(errs, path, "unknown field; 'trainyard validate --fields' lists them");
      continue;
    }
    if (f->type == JF_OBJECT) {
      if (json_is_object(v))
        from_object(s, v, path, errs);
      else if (json_is_null(v))
        ty_errlist_add(errs, path, "must not be null; remove it to use the defaults");
      else
        ty_errlist_add(errs, path, "must be an object, got %s", ty_json_kind(v));
      continue;
    }
    jobspec_set_json(s, f, v, path, errs);
  }
}

int jobspec_from_json(jobspec_t *s, const json_t *root, ty_errlist_t *errs) {
  size_t before = errs->len;
  if (!json_is_object(root)) {
    ty_errlist_add(errs, "", "the spec must be a JSON object, got %s", ty_json_kind(root));
    return TY_EINVAL;
  }
  from_object(s, root, "", errs);
  return errs->len > before ? TY_EINVAL : 0;
}

/* Rejects documents nested deeper than JOBSPEC_JSON_MAX_DEPTH before
 * jansson (which recurses) sees them. Returns 0, or -1 with line and column of
 * the bracket that went too deep (in *line, *col). */
static int depth_scan(const char *t, size_t len, int *line, int *col) {
  int depth = 0, l = 1, c = 0;
  bool in_str = false, esc = false;
  for (size_t i = 0; i < len; i++) {
    char ch = t[i];
    c++;
    if (ch == '\n') {
      l++;
      c = 0;
      continue;
    }
    if (in_str) {
      if (esc)
        esc = false;
      else if (ch == '\\')
        esc = true;
      else if (ch == '"')
        in_str = false;
      continue;
    }
    if (ch == '"') {
      in_str = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > JOBSPEC_JSON_MAX_DEPTH) {
        *line = l;
        *col = c;
        return -1;
      }
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      depth--;
    }
  }
  return 0;
}

int jobspec_parse_json(jobspec_t *s, const char *text, size_t len, ty_errlist_t *errs) {
  int line, col;
  if (len > JOBSPEC_JSON_MAX_BYTES) {
    ty_errlist_add(errs, "", "the spec is %zu bytes; at most %u are accepted", len,
                   JOBSPEC_JSON_MAX_BYTES);
    return TY_EINVAL;
  }
  if (depth_scan(text, len, &line, &col) != 0) {
    ty_errlist_add(errs, "", "invalid JSON at line %d, column %d: nested deeper than %d levels",
                   line, col, JOBSPEC_JSON_MAX_DEPTH);
    return TY_EINVAL;
  }
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    ty_errlist_add(errs, "", "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
    return TY_EINVAL;
  }
  int rc = jobspec_from_json(s, root, errs);
  json_decref(root);
  return rc;
}

/* ---- serialization and comparison ---- */

json_t *jobspec_to_json(const jobspec_t *s) {
  json_t *root = json_object();
  for (size_t i = 0; i < jobspec_nfields; i++) {
    const jobspec_field_t *f = &jobspec_fields[i];
    const char *dot = strchr(f->path, '.');
    if (!dot) {
      json_object_set_new(root, f->path, jobspec_field_to_json(s, f));
      continue;
    }
    char group[64];
    snprintf(group, sizeof group, "%.*s", (int)(dot - f->path), f->path);
    json_object_set_new(json_object_get(root, group), dot + 1, jobspec_field_to_json(s, f));
  }
  return root;
}

bool jobspec_equal(const jobspec_t *a, const jobspec_t *b) {
  json_t *ja = jobspec_to_json(a), *jb = jobspec_to_json(b);
  bool eq = json_equal(ja, jb);
  json_decref(ja);
  json_decref(jb);
  return eq;
}

char *jobspec_dumps(const jobspec_t *s, bool pretty) {
  json_t *j = jobspec_to_json(s);
  char *t = ty_json_dumps(j, pretty ? JSON_INDENT(2) : JSON_COMPACT);
  json_decref(j);
  return t;
}

static const char *type_name(const jobspec_field_t *f, char *buf, size_t cap) {
  switch (f->type) {
    case JF_OBJECT:
      return "object";
    case JF_STRING:
      return "string";
    case JF_BOOL:
      return "bool";
    case JF_INT:
      return "int";
    case JF_U64:
      return "uint64";
    case JF_DOUBLE:
      return "number";
    case JF_DTYPE:
      return "float32|bfloat16|float16";
    case JF_TARGETS:
      return "list|all-linear";
    case JF_MODEL:
      return "object|null";
    case JF_STRINGS:
      return "list of strings";
    case JF_ENUM:
      break;
  }
  buf[0] = '\0';
  for (int i = 0; f->names[i]; i++) {
    size_t l = strlen(buf);
    snprintf(buf + l, cap - l, "%s%s", i ? "|" : "", f->names[i]);
  }
  return buf;
}

void jobspec_fields_each(jobspec_field_fn fn, void *ctx) {
  for (size_t i = 0; i < jobspec_nfields; i++) {
    const jobspec_field_t *f = &jobspec_fields[i];
    char tbuf[128], dbuf[128], rbuf[64] = "";
    if (f->has_range)
      snprintf(rbuf, sizeof rbuf, "%c%.15g, %.15g]", f->lo_open ? '(' : '[', f->lo, f->hi);
    const char *d = f->type == JF_OBJECT ? "" : default_text(f, dbuf, sizeof dbuf);
    if (!strcmp(f->path, "output_dir")) d = "\"runs/<name>\"";
    fn(f->path, type_name(f, tbuf, sizeof tbuf), d, rbuf, f->help, ctx);
  }
}
