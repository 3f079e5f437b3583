/* jobspec_names.c - name handling shared by the job-spec files: edit
 * distance and "did you mean" suggestions, field paths cut at a UTF-8
 * boundary, and fixed-size string copies; see jobspec_internal.h. */
#include <stdio.h>
#include <string.h>

#include "api/jobspec_internal.h"

void jobspec_path_join(char *buf, size_t cap, const char *prefix, const char *key) {
  int n = snprintf(buf, cap, "%s%s%s", prefix, *prefix ? "." : "", key);
  if (n >= (int)cap) {
    size_t end = cap - 1;
    while (end > 0 && ((unsigned char)buf[end - 1] & 0xC0) == 0x80) end--;
    if (end > 0 && ((unsigned char)buf[end - 1] & 0x80)) end--;
    buf[end] = '\0';
  }
}

int jobspec_copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) return -1;
  memcpy(dst, src, n);
  memset(dst + n, 0, cap - n);
  return 0;
}

int jobspec_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return 64;
  int row[65];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

const char *jobspec_closest(const char *name, const char *const *candidates, size_t n) {
  size_t len = strlen(name);
  int limit = len / 3 > 2 ? (int)(len / 3) : 2;
  const char *best = NULL;
  int best_d = limit + 1;
  for (size_t i = 0; i < n; i++) {
    int d = jobspec_edit_distance(name, candidates[i]);
    if (d < best_d) {
      best_d = d;
      best = candidates[i];
    }
  }
  return best;
}

const char *jobspec_suggest_field(const char *prefix, const char *key, char *buf, size_t cap) {
  const char *names[64];
  size_t n = 0, plen = strlen(prefix);
  for (size_t i = 0; i < jobspec_nfields && n < 64; i++) {
    const char *p = jobspec_fields[i].path;
    if (plen) {
      if (strncmp(p, prefix, plen) != 0 || p[plen] != '.') continue;
      p += plen + 1;
    }
    if (strchr(p, '.')) continue;
    names[n++] = p;
  }
  const char *near = jobspec_closest(key, names, n);
  if (!near) {
    /* A field written at the wrong level: "bucket_mb" for "fsdp.bucket_mb". */
    for (size_t i = 0; i < jobspec_nfields; i++) {
      const char *dot = strrchr(jobspec_fields[i].path, '.');
      if (dot && !strcmp(dot + 1, key)) {
        snprintf(buf, cap, "%s", jobspec_fields[i].path);
        return buf;
      }
    }
    return NULL;
  }
  snprintf(buf, cap, "%s%s%s", prefix, plen ? "." : "", near);
  return buf;
}

/* Names other stacks (torchtune, axolotl, Hugging Face's Trainer, peft,
 * DeepSpeed) give our fields, as a user coming from them writes them: the
 * parser says which of ours to set instead of only "unknown field". */
static const struct {
  const char *theirs, *ours, *whose;
} g_other_names[] = {
    {"activation_checkpointing", "gradient_checkpointing", "AReaL's and Hugging Face's name"},
    {"train.activation_checkpointing", "gradient_checkpointing", "AReaL's and Hugging Face's name"},
    {"train.gradient_checkpointing", "gradient_checkpointing", "a top-level field, as AReaL's"},
    {"enable_activation_checkpointing", "gradient_checkpointing",
     "AReaL's and Hugging Face's name"},
    {"learning_rate", "train.lr", "the optimizer's settings are under train"},
    {"train.learning_rate", "train.lr", "AReaL's name"},
    {"max_steps", "train.steps", "the optimizer's settings are under train"},
    {"train.max_steps", "train.steps", "the optimizer steps"},
    {"gradient_accumulation_steps", "train.grad_accum", "the optimizer's settings are under train"},
    {"train.gradient_accumulation_steps", "train.grad_accum", "micro-batches per step"},
    {"per_device_train_batch_size", "train.micro_batch_size", "sequences per rank"},
    {"max_grad_norm", "train.grad_clip", "the optimizer's settings are under train"},
    {"train.max_grad_norm", "train.grad_clip", "the gradient-norm clip"},
    {"load_in_4bit", "quantization.load_in_4bit",
     "transformers' BitsAndBytesConfig names, under quantization"},
    {"bnb_4bit_quant_type", "quantization.bnb_4bit_quant_type",
     "transformers' BitsAndBytesConfig names, under quantization"},
    {"bnb_4bit_use_double_quant", "quantization.bnb_4bit_use_double_quant",
     "transformers' BitsAndBytesConfig names, under quantization"},
    {"bnb_4bit_compute_dtype", "quantization.bnb_4bit_compute_dtype",
     "transformers' BitsAndBytesConfig names, under quantization"},
    {"quantization_config", "quantization",
     "the BitsAndBytesConfig of from_pretrained: the same names, under quantization"},
    {"adapter", "use_lora",
     "axolotl's adapter: \"lora\" is use_lora: true; \"qlora\" is use_lora: true with "
     "quantization.load_in_4bit: true"},
    {"lora_r", "lora_rank", "peft's r"},
    {"rl", "train.objective", "axolotl's rl: \"dpo\" is train.objective: \"dpo\""},
    {"objective", "train.objective", "the optimizer's settings are under train"},
    {"beta", "dpo.beta", "TRL's DPOConfig names, under dpo"},
    {"rl_beta", "dpo.beta", "axolotl's name; TRL's DPOConfig names are under dpo"},
    {"loss_type", "dpo.loss_type", "TRL's DPOConfig names, under dpo"},
    {"label_smoothing", "dpo.label_smoothing", "TRL's DPOConfig names, under dpo"},
    {"lora_target_modules", "target_modules", "peft's name"},
    {"sequence_len", "data.seq_len", "the data's settings are under data"},
    {"max_seq_length", "data.seq_len", "the data's settings are under data"},
    {"max_seq_len", "data.seq_len", "the data's settings are under data"},
};

const char *jobspec_other_name(const char *path, const char **whose) {
  for (size_t i = 0; i < sizeof g_other_names / sizeof g_other_names[0]; i++)
    if (!strcmp(g_other_names[i].theirs, path)) {
      *whose = g_other_names[i].whose;
      return g_other_names[i].ours;
    }
  return NULL;
}
