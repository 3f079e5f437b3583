/* dpo_driver.c - one DPO micro-batch through trainyard's own path (the
 * examples file, the data's pairs, worker/rank/train_dpo and the CPU
 * backend), for dpo_ref.py to compare with TRL's loss in PyTorch.
 *
 * usage: dpo_driver CASE_DIR
 *   reads  CASE_DIR/case.json          the Llama config, lora_rank,
 *                                      lora_alpha, lora_targets, seq, beta,
 *                                      loss_type, label_smoothing and
 *                                      "pairs": [{"chosen": [ids],
 *                                      "chosen_counted": [0/1], "rejected",
 *                                      "rejected_counted"}], pad_id
 *          CASE_DIR/input.safetensors  the base (Hugging Face names), the
 *                                      adapters (PEFT names) and, for full
 *                                      training, the policy's weights under
 *                                      "policy/<name>" (the reference is
 *                                      the base)
 *   writes CASE_DIR/output.safetensors "lora/metrics" and "full/metrics"
 *                                      (loss, then dpo.h's metrics: means
 *                                      over the pairs), "lora/grad/<name>"
 *                                      for every adapter and
 *                                      "full/grad/<name>" for every base
 *                                      tensor */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "worker/ckpt/safetensors.h"
#include "worker/data/examples.h"
#include "worker/dist/comm.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/train_backend.h"
#include "worker/rank/train_dpo.h"

#define DRIVER "dpo_driver"
#include "tests/numerics/driver_util.h"

#define MAX_OUT 1024


static const char *g_prefix = ""; /* of the weights model_fill reads */

static int fill_from_st(void *ctx, const model_tensor_t *t, float *dst, char *err, size_t errlen) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", g_prefix, t->name);
  const st_tensor_t *s = st_find(ctx, name);
  if (!s || s->dtype != TY_DTYPE_F32 || s->nelem != t->numel)
    return snprintf(err, errlen, "%s: missing or not %zu F32", name, t->numel), -5;
  return st_read(ctx, s, 0, dst, t->numel * sizeof(float), err, errlen);
}

static st_desc_t descs[MAX_OUT];
static float *datas[MAX_OUT];
static size_t n_out;

static void out_add(const char *prefix, const char *name, int ndim, const int64_t *shape,
                    const float *data) {
  if (n_out == MAX_OUT) die("output", "too many tensors");
  size_t numel = 1, len = strlen(prefix) + strlen(name) + 1;
  char *full = malloc(len);
  snprintf(full, len, "%s%s", prefix, name);
  st_desc_t *d = &descs[n_out];
  d->name = full;
  d->dtype = TY_DTYPE_F32;
  d->ndim = ndim;
  for (int i = 0; i < ndim; i++) numel *= (size_t)(d->shape[i] = shape[i]);
  datas[n_out] = malloc(numel * sizeof(float));
  memcpy(datas[n_out++], data, numel * sizeof(float));
}

/* The pairs of case.json as an examples file: chosen then rejected. */
static void write_examples(json_t *pairs, const char *path, uint64_t key) {
  char err[512];
  examples_writer_t *w;
  if (examples_writer_open(&w, path, err, sizeof err)) die(path, err);
  size_t i;
  json_t *p;
  json_array_foreach(pairs, i, p) {
    static const char *const side[2][2] = {{"chosen", "chosen_counted"},
                                           {"rejected", "rejected_counted"}};
    for (int k = 0; k < 2; k++) {
      json_t *ids = json_object_get(p, side[k][0]), *cnt = json_object_get(p, side[k][1]);
      const size_t n = json_array_size(ids);
      uint32_t *v = malloc(n * sizeof *v);
      uint8_t *c = malloc(n);
      for (size_t j = 0; j < n; j++) {
        v[j] = (uint32_t)json_integer_value(json_array_get(ids, j));
        c[j] = (uint8_t)json_integer_value(json_array_get(cnt, j));
      }
      if (examples_add(w, v, c, n, err, sizeof err)) die(path, err);
      free(v);
      free(c);
    }
  }
  if (examples_commit(w, key, 0, err, sizeof err)) die(path, err);
}

/* One micro-batch of every pair through train_dpo over backend b: the
 * metrics into out (loss first). */
static void run(const char *dir, jobspec_t *s, const data_prepared_t *prep, int V,
                train_backend_t *b, model_t *m, st_ckpt_t *ck, const char *policy, float *out) {
  char err[1024];
  snprintf(s->output_dir, sizeof s->output_dir, "%s/%s", dir, policy ? "full" : "lora");
  comm_t *comm;
  if (comm_open(&comm, "self", 0, 1, err, sizeof err)) die("comm", err);
  const data_config_t dc = train_data_config(s, prep, V, 0, 1);
  data_t *d;
  if (data_open(&d, &dc, err, sizeof err)) die("data", err);
  const train_args_t a = {.spec = s, .comm = comm, .backend = b, .data = prep};
  train_dpo_t *t;
  if (train_dpo_open(&t, &a, d, 0, err, sizeof err)) die("train_dpo_open", err);
  /* Full training: the reference was the base; the policy has moved. */
  if (policy) {
    g_prefix = policy;
    if (model_fill(m, fill_from_st, ck, err, sizeof err)) die("policy", err);
  }
  const int R = 2 * s->train.micro_batch_size, T = s->data.seq_len;
  int32_t *rows = malloc(sizeof *rows * R * (T + 1)), *pos = malloc(sizeof *pos * R * T);
  int *in = malloc(sizeof *in * R * T), *tg = malloc(sizeof *tg * R * T);
  float *w = malloc(sizeof *w * R * T);
  if (data_train_batch(d, 0, 0, rows, w, pos, err, sizeof err)) die("batch", err);
  data_split_rows(rows, R, T, in, tg);
  const model_batch_t bt = {in, tg, w, pos, R, T};
  dpo_sums_t sums = {0};
  if (b->zero_grads(b->ctx, err, sizeof err)) die("zero", err);
  if (train_dpo_step(t, &bt, 0, 0, 1.0 / s->train.micro_batch_size, &sums, err, sizeof err))
    die("train_dpo_step", err);
  const dpo_sums_t mean = dpo_mean(&sums);
  int i = 0;
#define TY_X(field) out[i++] = (float)mean.field;
  DPO_METRICS(TY_X)
#undef TY_X
  free(rows), free(pos), free(in), free(tg), free(w);
  train_dpo_free(t);
  data_free(d);
  comm_close(comm);
}

int main(int argc, char **argv) {
  if (argc != 2) die("usage", "dpo_driver CASE_DIR");
  char path[4096], err[1024];
  snprintf(path, sizeof path, "%s/case.json", argv[1]);
  json_error_t jerr;
  json_t *cj = json_load_file(path, 0, &jerr);
  if (!cj) die(path, jerr.text);
  llama_config_t cfg;
  llama_config_init(&cfg);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  if (llama_config_from_json(json_object_get(cj, "config"), &cfg, "", false, &errs) ||
      llama_config_validate(&cfg, "", &errs))
    die("case.json config", errs.len ? errs.items[0].message : "invalid");
  json_t *pairs = json_object_get(cj, "pairs");
  const int P = (int)json_array_size(pairs), T = (int)jint(cj, "seq");

  jobspec_t s;
  jobspec_init(&s);
  s.train.objective = JOBSPEC_OBJECTIVE_DPO;
  s.data.format = JOBSPEC_DATA_JSONL;
  snprintf(s.data.path, sizeof s.data.path, "%s/pairs.jsonl", argv[1]); /* named, not read */
  s.data.seq_len = T;
  s.data.eval_fraction = 0;
  s.train.micro_batch_size = P;
  s.train.grad_accum = 1;
  s.dpo.beta = json_number_value(json_object_get(cj, "beta"));
  const char *lt = json_string_value(json_object_get(cj, "loss_type"));
  s.dpo.loss_type = !strcmp(lt, "ipo")     ? JOBSPEC_DPO_IPO
                    : !strcmp(lt, "hinge") ? JOBSPEC_DPO_HINGE
                                           : JOBSPEC_DPO_SIGMOID;
  s.dpo.label_smoothing = json_number_value(json_object_get(cj, "label_smoothing"));
  data_prepared_t prep = {.key = 0x5eed, .pad_id = (uint32_t)jint(cj, "pad_id"), .examples = 2 * P};
  snprintf(prep.path, sizeof prep.path, "%s/pairs.bin", argv[1]);
  write_examples(pairs, prep.path, prep.key);

  snprintf(path, sizeof path, "%s/input.safetensors", argv[1]);
  st_ckpt_t *ck;
  if (st_open(path, &ck, err, sizeof err)) die(path, err);
  const int64_t nm[1] = {DPO_SUMS_N - 1};
  float metrics[DPO_SUMS_N];

  /* LoRA: the reference is the base, the adapters switched off. */
  model_t *m;
  lora_t *lo;
  train_backend_t b;
  if (model_create(&m, &cfg, 2 * P, T, MODEL_TRAIN_LORA, err, sizeof err)) die("model", err);
  if (model_fill(m, fill_from_st, ck, err, sizeof err)) die("fill", err);
  if (lora_create(&lo, m, (int)jint(cj, "lora_rank"),
                  json_number_value(json_object_get(cj, "lora_alpha")),
                  (unsigned)jint(cj, "lora_targets"), err, sizeof err))
    die("lora", err);
  for (int i = 0; i < lo->n_tensors; i++) {
    const st_tensor_t *t = st_find(ck, lo->tensors[i].name);
    if (!t || st_read(ck, t, 0, lo->tensors[i].data, lo->tensors[i].numel * sizeof(float), err,
                      sizeof err))
      die(lo->tensors[i].name, t ? err : "missing");
  }
  if (train_backend_host(&b, m, lo, err, sizeof err)) die("backend", err);
  run(argv[1], &s, &prep, cfg.vocab_size, &b, m, ck, NULL, metrics);
  out_add("lora/", "metrics", 1, nm, metrics);
  for (int i = 0; i < lo->n_tensors; i++)
    out_add("lora/grad/", lo->tensors[i].name, 2, lo->tensors[i].shape, lo->tensors[i].grad);
  train_backend_free(&b);
  lora_free(lo);
  model_free(m);

  /* Every weight: the reference scored before the step, from the base. */
  if (model_create(&m, &cfg, 2 * P, T, MODEL_TRAIN_FULL, err, sizeof err)) die("model", err);
  if (model_fill(m, fill_from_st, ck, err, sizeof err)) die("fill", err);
  if (train_backend_host(&b, m, NULL, err, sizeof err)) die("backend", err);
  run(argv[1], &s, &prep, cfg.vocab_size, &b, m, ck, "policy/", metrics);
  out_add("full/", "metrics", 1, nm, metrics);
  for (int i = 0; i < m->n_tensors; i++)
    out_add("full/grad/", m->tensors[i].name, m->tensors[i].ndim, m->tensors[i].shape,
            m->tensors[i].grad);
  train_backend_free(&b);
  model_free(m);
  st_close(ck);

  snprintf(path, sizeof path, "%s/output.safetensors", argv[1]);
  st_writer_t *w;
  if (st_writer_open(path, descs, n_out, NULL, &w, err, sizeof err)) die(path, err);
  for (size_t i = 0; i < n_out; i++) {
    size_t numel = 1;
    for (int k = 0; k < descs[i].ndim; k++) numel *= (size_t)descs[i].shape[k];
    if (st_writer_write(w, datas[i], numel * sizeof(float), err, sizeof err)) die(path, err);
  }
  if (st_writer_close(w, err, sizeof err)) die(path, err);
  printf("dpo_driver: %s: %d pairs, loss %.6f (lora), %.6f (full)\n", argv[1], P,
         (double)datas[0][0], (double)metrics[0]);
  for (size_t i = 0; i < n_out; i++) free((char *)descs[i].name), free(datas[i]);
  json_decref(cj);
  return 0;
}
