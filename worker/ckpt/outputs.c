/* outputs.c - PEFT adapters and Hugging Face checkpoints out of a job; see
 * outputs.h. */
#include "worker/ckpt/outputs.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/beneath.h"
#include "common/json_util.h"
#include "common/xalloc.h"
#include "worker/ckpt/safetensors.h"
#include "worker/ckpt/train_state.h"

static const char *const g_st_metadata[] = {"format", "pt", NULL};

/* snprintf into a PATH_MAX buffer (output_dir is bounded well below it). */
__attribute__((format(printf, 2, 3))) static void pathf(char *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out, PATH_MAX, fmt, ap);
  va_end(ap);
}

int outputs_write_adapter(const char *dir, const lora_t *lo, const char *base_model, char *err,
                          size_t errlen) {
  int rc = ty_beneath_mkdirs(dir, err, errlen);
  if (rc) return rc;
  char path[PATH_MAX];
  json_t *targets = json_array();
  for (int b = 0; b < JOBSPEC_TARGET_COUNT; b++)
    if (lora_has_target(lo, b)) json_array_append_new(targets, json_string(jobspec_target_name(b)));
  /* The fields PEFT's LoraConfig reads; the rest take PEFT's defaults. */
  json_t *cfg = json_pack("{ss ss ss si sf sf so ss sb sb sb sn sn}", "peft_type", "LORA",
                          "task_type", "CAUSAL_LM", "base_model_name_or_path", base_model, "r",
                          lo->R, "lora_alpha", lo->alpha, "lora_dropout", 0.0, "target_modules",
                          targets, "bias", "none", "fan_in_fan_out", 0, "inference_mode", 1,
                          "use_rslora", 0, "modules_to_save", "layers_to_transform");
  pathf(path, "%s/%s", dir, OUTPUTS_ADAPTER_CONFIG);
  if (!cfg || ty_json_write_file(cfg, path, JSON_INDENT(2) | JSON_SORT_KEYS, err, errlen) != 0) {
    if (!cfg) snprintf(err, errlen, "cannot write %s", path);
    json_decref(cfg);
    return TY_EPERM;
  }
  json_decref(cfg);

  st_desc_t *descs = xcalloc((size_t)lo->n_tensors, sizeof *descs);
  for (int i = 0; i < lo->n_tensors; i++) {
    descs[i].name = lo->tensors[i].name;
    descs[i].dtype = TY_DTYPE_F32;
    descs[i].ndim = 2;
    descs[i].shape[0] = lo->tensors[i].shape[0];
    descs[i].shape[1] = lo->tensors[i].shape[1];
  }
  pathf(path, "%s/%s", dir, OUTPUTS_ADAPTER_WEIGHTS);
  st_writer_t *w;
  rc = st_writer_open(path, descs, (size_t)lo->n_tensors, g_st_metadata, &w, err, errlen);
  free(descs);
  if (rc) return rc;
  for (int i = 0; i < lo->n_tensors && !rc; i++)
    rc = st_writer_write(w, lo->tensors[i].data, lo->tensors[i].numel * sizeof(float), err, errlen);
  /* A failed write keeps its own message (the close would only say the
   * file is short). */
  int rc2 = st_writer_close(w, rc ? NULL : err, rc ? 0 : errlen);
  return rc ? rc : rc2;
}

/* target_modules as PEFT writes it: a list of names, or "all-linear". */
static int parse_targets(const json_t *v, unsigned *mask, char *err, size_t errlen) {
  *mask = 0;
  if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
    *mask = JOBSPEC_TARGET_ALL_LINEAR;
    return 0;
  }
  if (!json_is_array(v) || json_array_size(v) == 0) {
    snprintf(err, errlen, "target_modules must be a non-empty list of module names");
    return TY_EINVAL;
  }
  size_t i;
  const json_t *e;
  json_array_foreach(v, i, e) {
    int bit = -1;
    for (int b = 0; b < JOBSPEC_TARGET_COUNT && json_is_string(e); b++)
      if (!strcmp(json_string_value(e), jobspec_target_name(b))) bit = b;
    if (bit < 0) {
      snprintf(err, errlen,
               "target_modules[%zu] is not one of q_proj, k_proj, v_proj, o_proj, "
               "gate_proj, up_proj, down_proj",
               i);
      return TY_EINVAL;
    }
    *mask |= 1u << bit;
  }
  return 0;
}

/* Reads tensor t of the file into dst (numel floats), widening F16/BF16. */
static int read_f32(const st_ckpt_t *c, const st_tensor_t *t, float *dst, char *err,
                    size_t errlen) {
  if (t->dtype == TY_DTYPE_F32) return st_read(c, t, 0, dst, t->nbytes, err, errlen);
  void *tmp = malloc(t->nbytes ? t->nbytes : 1);
  if (!tmp) {
    snprintf(err, errlen, "out of memory reading %s", t->name);
    return TY_EEXHAUSTED;
  }
  int rc = st_read(c, t, 0, tmp, t->nbytes, err, errlen);
  if (!rc) ty_dtype_to_f32(t->dtype, tmp, dst, t->nelem);
  free(tmp);
  return rc;
}

int outputs_read_adapter(const char *dir, const model_t *m, lora_t **out, char *err,
                         size_t errlen) {
  *out = NULL;
  char path[PATH_MAX];
  pathf(path, "%s/%s", dir, OUTPUTS_ADAPTER_CONFIG);
  char why[1024];
  json_t *cfg = ty_json_load_file(path, 0, why, sizeof why);
  if (!cfg) {
    snprintf(err, errlen, "adapter %s: cannot read %s: %s", dir, OUTPUTS_ADAPTER_CONFIG, why);
    return TY_ENOTFOUND;
  }
  int rc = 0;
  const json_t *r = json_object_get(cfg, "r"), *alpha = json_object_get(cfg, "lora_alpha");
  const char *type = json_string_value(json_object_get(cfg, "peft_type"));
  unsigned mask = 0;
  if (!type || strcmp(type, "LORA") != 0 || !json_is_integer(r) || !json_is_number(alpha)) {
    snprintf(err, errlen,
             "adapter %s: %s needs peft_type \"LORA\", an integer r and a number "
             "lora_alpha",
             dir, OUTPUTS_ADAPTER_CONFIG);
    rc = TY_EINVAL;
  } else {
    rc = parse_targets(json_object_get(cfg, "target_modules"), &mask, err, errlen);
  }
  int R = rc ? 0 : (int)json_integer_value(r);
  double a = rc ? 0 : json_number_value(alpha);
  json_decref(cfg);
  if (rc) return rc;

  lora_t *lo;
  rc = lora_create(&lo, m, R, a, mask, err, errlen);
  if (rc) return rc;
  pathf(path, "%s/%s", dir, OUTPUTS_ADAPTER_WEIGHTS);
  st_ckpt_t *c;
  rc = st_open(path, &c, err, errlen);
  if (rc) {
    lora_free(lo);
    return rc;
  }
  /* Strict, as base checkpoints are: every adapter tensor present with its
   * shape, nothing unknown. */
  if (c->ntensors != (size_t)lo->n_tensors) {
    snprintf(err, errlen,
             "adapter %s holds %zu tensors; r=%d on these target_modules over %d "
             "layers needs %d",
             path, c->ntensors, R, lo->L, lo->n_tensors);
    rc = TY_EINVAL;
  }
  for (int i = 0; i < lo->n_tensors && !rc; i++) {
    const lora_tensor_t *lt = &lo->tensors[i];
    const st_tensor_t *t = st_find(c, lt->name);
    if (!t || t->ndim != 2 || t->shape[0] != lt->shape[0] || t->shape[1] != lt->shape[1]) {
      snprintf(err, errlen, "adapter %s: tensor %s %s (expected shape [%lld, %lld])", path,
               lt->name, t ? "has another shape" : "is missing", (long long)lt->shape[0],
               (long long)lt->shape[1]);
      rc = TY_EINVAL;
      break;
    }
    rc = read_f32(c, t, lt->data, err, errlen);
  }
  st_close(c);
  if (rc) {
    lora_free(lo);
    return rc;
  }
  *out = lo;
  return 0;
}

int outputs_write_config(const char *dir, const llama_config_t *cfg, char *err, size_t errlen) {
  int rc = ty_beneath_mkdirs(dir, err, errlen);
  if (rc) return rc;
  char path[PATH_MAX];
  llama_config_t c = *cfg;
  c.torch_dtype = TY_DTYPE_F32; /* what model.safetensors holds */
  json_t *j = llama_config_to_json(&c);
  pathf(path, "%s/config.json", dir);
  if (!j || ty_json_write_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS, err, errlen) != 0) {
    if (!j) snprintf(err, errlen, "cannot write %s", path);
    json_decref(j);
    return TY_EPERM;
  }
  json_decref(j);
  return 0;
}

int outputs_write_model(const char *dir, const model_t *m, const llama_config_t *cfg, char *err,
                        size_t errlen) {
  int rc = outputs_write_config(dir, cfg, err, errlen);
  if (rc) return rc;
  char path[PATH_MAX];
  st_desc_t *descs = xcalloc((size_t)m->n_tensors, sizeof *descs);
  for (int i = 0; i < m->n_tensors; i++) {
    const model_tensor_t *t = &m->tensors[i];
    descs[i].name = t->name;
    descs[i].dtype = TY_DTYPE_F32;
    descs[i].ndim = t->ndim;
    descs[i].shape[0] = t->shape[0];
    descs[i].shape[1] = t->shape[1];
  }
  pathf(path, "%s/model.safetensors", dir);
  st_writer_t *w;
  rc = st_writer_open(path, descs, (size_t)m->n_tensors, g_st_metadata, &w, err, errlen);
  free(descs);
  if (rc) return rc;
  for (int i = 0; i < m->n_tensors && !rc; i++)
    rc = st_writer_write(w, m->tensors[i].data, m->tensors[i].numel * sizeof(float), err, errlen);
  /* A failed write keeps its own message (the close would only say the
   * file is short). */
  int rc2 = st_writer_close(w, rc ? NULL : err, rc ? 0 : errlen);
  return rc ? rc : rc2;
}
