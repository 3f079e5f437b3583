/* model_driver.c - runs trainyard's model on one case written by
 * model_ref.py and writes what PyTorch is compared against.
 *
 * usage: model_driver CASE_DIR
 *   reads  CASE_DIR/case.json          the Llama config plus batch, seq,
 *                                      lora_rank, lora_alpha, lora_targets
 *          CASE_DIR/input.safetensors  the weights (Hugging Face names), the
 *                                      adapters (PEFT names), "tokens" and
 *                                      "targets" (B, T) as F32 integers, and
 *                                      optionally "weights" (B, T) (the loss
 *                                      mask) and "pos" (B, T) (positions in
 *                                      packed documents)
 *   writes CASE_DIR/output.safetensors "logits", "loss", "grad/<name>" for
 *                                      every base tensor (full training),
 *                                      then "lora/logits", "lora/loss" and
 *                                      "lora/grad/<name>" for every adapter
 *                                      (base frozen). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/ckpt/safetensors.h"

#define DRIVER "model_driver"
#include "tests/numerics/driver_util.h"

#define MAX_OUT 4096


/* Copies the F32 tensor called name, of numel floats, into dst. */
static int read_f32(const st_ckpt_t *ck, const char *name, float *dst, size_t numel, char *err,
                    size_t errlen) {
  const st_tensor_t *t = st_find(ck, name);
  if (!t) return snprintf(err, errlen, "missing from the input"), -5;
  if (t->dtype != TY_DTYPE_F32 || t->nelem != numel)
    return snprintf(err, errlen, "has %llu elements of %s, expected %zu F32",
                    (unsigned long long)t->nelem, ty_dtype_st_name(t->dtype), numel),
           -3;
  return st_read(ck, t, 0, dst, numel * sizeof(float), err, errlen);
}

static int fill_from_st(void *ctx, const model_tensor_t *t, float *dst, char *err, size_t errlen) {
  return read_f32(ctx, t->name, dst, t->numel, err, errlen);
}

/* The output file's tensors, written at the end. */
static st_desc_t descs[MAX_OUT];
static const float *datas[MAX_OUT];
static char *names[MAX_OUT];
static size_t n_out;

static void out_add(const char *prefix, const char *name, int ndim, const int64_t *shape,
                    const float *data) {
  if (n_out == MAX_OUT) die("output", "too many tensors");
  size_t len = strlen(prefix) + strlen(name) + 1;
  names[n_out] = malloc(len);
  snprintf(names[n_out], len, "%s%s", prefix, name);
  st_desc_t *d = &descs[n_out];
  d->name = names[n_out];
  d->dtype = TY_DTYPE_F32;
  d->ndim = ndim;
  for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
  datas[n_out++] = data;
}

static size_t numel_of(const st_desc_t *d) {
  size_t n = 1;
  for (int i = 0; i < d->ndim; i++) n *= (size_t)d->shape[i];
  return n;
}

/* The adapters of a case: rank, alpha, targets; their tensors in the case's
 * input file under the names lora_create gives them. */
typedef struct {
  int rank;
  double alpha;
  unsigned targets;
} lora_src_t;

static lora_t *lora_from_st(model_t *m, const st_ckpt_t *ck, const lora_src_t *src) {
  char err[512];
  lora_t *lo;
  if (lora_create(&lo, m, src->rank, src->alpha, src->targets, err, sizeof err)) die("lora", err);
  for (int i = 0; i < lo->n_tensors; i++)
    if (read_f32(ck, lo->tensors[i].name, lo->tensors[i].data, lo->tensors[i].numel, err,
                 sizeof err))
      die(lo->tensors[i].name, err);
  return lo;
}

/* The logits of batch (with adapters when src is given) from a forward-only
 * model whose head takes every row at once, into out (b, t, V). */
static void whole_logits(const llama_config_t *cfg, st_ckpt_t *ck, const model_batch_t *batch,
                         const lora_src_t *src, float *out) {
  char err[512];
  model_t *m;
  if (model_create(&m, cfg, batch->b, batch->t, MODEL_EVAL, err, sizeof err)) die("model", err);
  if (model_fill(m, fill_from_st, ck, err, sizeof err)) die("fill", err);
  lora_t *lo = src ? lora_from_st(m, ck, src) : NULL;
  model_batch_t logits_only = *batch;
  logits_only.targets = NULL;
  logits_only.weights = NULL;
  if (model_forward_batch(m, &logits_only, lo, NULL, err, sizeof err)) die("forward", err);
  memcpy(out, m->logits, sizeof(float) * batch->b * batch->t * cfg->vocab_size);
  lora_free(lo);
  model_free(m);
}

int main(int argc, char **argv) {
  if (argc != 2) die("usage", "model_driver CASE_DIR");
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/case.json", argv[1]);
  json_error_t jerr;
  json_t *cj = json_load_file(path, 0, &jerr);
  if (!cj) die(path, jerr.text);
  llama_config_t cfg = {0};
  cfg.hidden_size = jint(cj, "hidden_size");
  cfg.intermediate_size = jint(cj, "intermediate_size");
  cfg.num_hidden_layers = jint(cj, "num_hidden_layers");
  cfg.num_attention_heads = jint(cj, "num_attention_heads");
  cfg.num_key_value_heads = jint(cj, "num_key_value_heads");
  cfg.head_dim = jint(cj, "head_dim");
  cfg.vocab_size = jint(cj, "vocab_size");
  cfg.max_position_embeddings = 2048;
  cfg.rms_norm_eps = json_number_value(json_object_get(cj, "rms_norm_eps"));
  cfg.rope_theta = json_number_value(json_object_get(cj, "rope_theta"));
  cfg.tie_word_embeddings = json_is_true(json_object_get(cj, "tie_word_embeddings"));
  /* rope_scaling and model_type (Qwen2's q/k/v biases) through the
   * config.json parser, as a checkpoint's would be. */
  json_t *o = json_object();
  if (json_object_get(cj, "rope_scaling"))
    json_object_set(o, "rope_scaling", json_object_get(cj, "rope_scaling"));
  if (json_object_get(cj, "model_type"))
    json_object_set(o, "model_type", json_object_get(cj, "model_type"));
  ty_errlist_t errs = TY_ERRLIST_INIT;
  if (llama_config_from_json(o, &cfg, "", false, &errs) || llama_config_validate(&cfg, "", &errs))
    die("case.json: rope_scaling or model_type", errs.len ? errs.items[0].message : "invalid");
  json_decref(o);
  int B = (int)jint(cj, "batch"), T = (int)jint(cj, "seq"), R = (int)jint(cj, "lora_rank");
  /* "head_rows": the output head in chunks of that many rows (the loss and
   * gradients come from the chunked head; the logits, never whole there,
   * from a model forward with the whole head). */
  const long head_rows = json_object_get(cj, "head_rows") ? (long)jint(cj, "head_rows") : 0;
  double alpha = json_number_value(json_object_get(cj, "lora_alpha"));
  unsigned targets = (unsigned)jint(cj, "lora_targets");
  json_decref(cj);

  snprintf(path, sizeof path, "%s/input.safetensors", argv[1]);
  st_ckpt_t *ck;
  if (st_open(path, &ck, err, sizeof err)) die(path, err);
  int *tokens = malloc(sizeof(int) * B * T), *tgts = malloc(sizeof(int) * B * T);
  float *tmp = malloc(sizeof(float) * B * T);
  if (read_f32(ck, "tokens", tmp, (size_t)B * T, err, sizeof err)) die("tokens", err);
  for (int i = 0; i < B * T; i++) tokens[i] = (int)tmp[i];
  if (read_f32(ck, "targets", tmp, (size_t)B * T, err, sizeof err)) die("targets", err);
  for (int i = 0; i < B * T; i++) tgts[i] = (int)tmp[i];
  float *weights = NULL;
  int *pos = NULL;
  if (st_find(ck, "weights")) {
    weights = malloc(sizeof(float) * B * T);
    if (read_f32(ck, "weights", weights, (size_t)B * T, err, sizeof err)) die("weights", err);
  }
  if (st_find(ck, "pos")) {
    pos = malloc(sizeof(int) * B * T);
    if (read_f32(ck, "pos", tmp, (size_t)B * T, err, sizeof err)) die("pos", err);
    for (int i = 0; i < B * T; i++) pos[i] = (int)tmp[i];
  }
  const model_batch_t batch = {tokens, tgts, weights, pos, B, T};

  const lora_src_t lora_src = {R, alpha, targets};
  const size_t nlogits = (size_t)B * T * cfg.vocab_size;
  float *logits_full = malloc(sizeof(float) * nlogits), *logits_lora = malloc(sizeof(float) * nlogits);
  if (head_rows) {
    whole_logits(&cfg, ck, &batch, NULL, logits_full);
    whole_logits(&cfg, ck, &batch, &lora_src, logits_lora);
    char rows[32];
    snprintf(rows, sizeof rows, "%ld", head_rows);
    setenv("TRAINYARD_HEAD_ROWS", rows, 1);
  }

  /* Full training: every base tensor gets a gradient. */
  model_t *full, *lm;
  if (model_create(&full, &cfg, B, T, MODEL_TRAIN_FULL, err, sizeof err)) die("model", err);
  if (head_rows && full->head_rows != head_rows) die("head_rows", "not taken");
  if (model_fill(full, fill_from_st, ck, err, sizeof err)) die("fill", err);
  double loss_full, loss_lora;
  if (model_forward_batch(full, &batch, NULL, &loss_full, err, sizeof err)) die("forward", err);
  if (!head_rows) memcpy(logits_full, full->logits, sizeof(float) * nlogits);
  model_zero_grad(full);
  model_backward(full, NULL, 1.0f);
  float lf = (float)loss_full;
  const int64_t lshape[3] = {B, T, cfg.vocab_size}, one[1] = {1};
  out_add("", "logits", 3, lshape, logits_full);
  out_add("", "loss", 1, one, &lf);
  for (int i = 0; i < full->n_tensors; i++) {
    const model_tensor_t *t = &full->tensors[i];
    out_add("grad/", t->name, t->ndim, t->shape, t->grad);
  }

  /* LoRA: base frozen, only the adapters get gradients. */
  if (model_create(&lm, &cfg, B, T, MODEL_TRAIN_LORA, err, sizeof err)) die("model", err);
  if (model_fill(lm, fill_from_st, ck, err, sizeof err)) die("fill", err);
  lora_t *lo = lora_from_st(lm, ck, &lora_src);
  if (model_forward_batch(lm, &batch, lo, &loss_lora, err, sizeof err)) die("forward", err);
  if (!head_rows) memcpy(logits_lora, lm->logits, sizeof(float) * nlogits);
  lora_zero_grad(lo);
  model_backward(lm, lo, 1.0f);
  float ll = (float)loss_lora;
  out_add("lora/", "logits", 3, lshape, logits_lora);
  out_add("lora/", "loss", 1, one, &ll);
  for (int i = 0; i < lo->n_tensors; i++)
    out_add("lora/grad/", lo->tensors[i].name, 2, lo->tensors[i].shape, lo->tensors[i].grad);

  snprintf(path, sizeof path, "%s/output.safetensors", argv[1]);
  st_writer_t *w;
  if (st_writer_open(path, descs, n_out, NULL, &w, err, sizeof err)) die(path, err);
  for (size_t i = 0; i < n_out; i++)
    if (st_writer_write(w, datas[i], numel_of(&descs[i]) * sizeof(float), err, sizeof err))
      die(path, err);
  if (st_writer_close(w, err, sizeof err)) die(path, err);
  printf("model_driver: %s: loss %.6f (full), %.6f (lora), %zu tensors written\n", argv[1],
         loss_full, loss_lora, n_out);
  for (size_t i = 0; i < n_out; i++) free(names[i]);
  free(tokens);
  free(tgts);
  free(tmp);
  free(weights);
  free(pos);
  free(logits_full);
  free(logits_lora);
  lora_free(lo);
  model_free(lm);
  model_free(full);
  st_close(ck);
  return 0;
}
