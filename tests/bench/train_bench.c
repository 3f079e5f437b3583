/* train_bench.c - training throughput on the CPU for a ~100M-parameter
 * Llama at seq_len 256, full and LoRA, beside OpenBLAS sgemm measured in the
 * same run on the model's own matrix shapes.
 *
 * usage: train_bench [steps] [micro_batch_size]     (defaults 4, 2)
 * Prints one JSON line per measurement. Steps run through train_run (data
 * reads, forward, backward, clipping, AdamW): the first step is a warm-up,
 * the rate is the median of the rest.
 *
 * FLOPs per token (multiply-add = 2), the PaLM convention:
 *   full:  6 * P_mat + 12 * L * NH * HS * T
 *   LoRA:  4 * P_mat + 6 * P_lora + 12 * L * NH * HS * T
 * P_mat is every matrix a token passes through (the layers' projections and
 * the LM head; the embedding is a lookup); forward costs 2 per weight,
 * backward 4 (input and weight gradients) or 2 with frozen weights (LoRA:
 * input gradients only). Attention: Q K^T and P V are 2 * 2 * NH * HS * T
 * per token forward over the full T x T square, twice that backward (the
 * convention counts the square; the kernels skip the masked blocks above
 * their 64-row diagonal blocks, 62% of the square at T = 256). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "worker/dist/comm.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/ckpt/model_io.h"
#include "worker/rank/train.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static llama_config_t bench_config(void) {
  llama_config_t c;
  llama_config_init(&c);
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 12;
  c.head_dim = 64;
  c.vocab_size = 8192;
  c.max_position_embeddings = 1024;
  return c;
}

/* sgemm GFLOP/s over the model's projections at N token rows, in the three
 * orientations a training step uses (forward, input gradient, weight
 * gradient), timed together: total FLOPs / total seconds. */
static double sgemm_rate(const llama_config_t *c, int N, int reps) {
  const int C = (int)c->hidden_size, FF = (int)c->intermediate_size, V = (int)c->vocab_size;
  const int QD = (int)(c->num_attention_heads * c->head_dim);
  const int KVD = (int)(c->num_key_value_heads * c->head_dim);
  const int shapes[][2] = {{QD, C}, {KVD, C}, {KVD, C}, {C, QD}, {FF, C}, {FF, C}, {C, FF}, {V, C}};
  const int ns = (int)(sizeof shapes / sizeof shapes[0]);
  size_t maxw = (size_t)V * C, maxa = (size_t)N * (FF > V ? FF : V);
  float *w = malloc(maxw * sizeof *w), *dw = malloc(maxw * sizeof *dw);
  float *x = malloc(maxa * sizeof *x), *y = malloc(maxa * sizeof *y);
  for (size_t i = 0; i < maxw; i++) w[i] = dw[i] = (float)((i * 2654435761u) % 1000) * 1e-4f;
  for (size_t i = 0; i < maxa; i++) x[i] = y[i] = (float)((i * 40503u) % 1000) * 1e-3f;
  double flops = 0, t0 = 0;
  for (int r = -1; r < reps; r++) { /* r = -1: warm-up, not timed */
    if (r == 0) t0 = now_s();
    for (int s = 0; s < ns; s++) {
      int OUT = shapes[s][0], IN = shapes[s][1];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OUT, IN, 1.0f, x, IN, w, IN, 0.0f, y,
                  OUT);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IN, OUT, 1.0f, y, OUT, w, IN, 0.0f,
                  x, IN);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, IN, N, 1.0f, y, OUT, x, IN, 1.0f,
                  dw, IN);
      if (r >= 0) flops += 3.0 * 2.0 * N * (double)OUT * IN;
    }
  }
  double dt = now_s() - t0;
  free(w);
  free(dw);
  free(x);
  free(y);
  return flops / dt / 1e9;
}

typedef struct {
  double tps[64];
  int n;
} rates_t;

static int on_progress(void *ctx, const train_progress_t *p) {
  rates_t *r = ctx;
  if (p->phase == REPORT_PHASE_TRAINING && p->tokens_per_s > 0 && r->n < 64)
    r->tps[r->n++] = p->tokens_per_s;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int bench_mode(const llama_config_t *c, bool lora, int steps, int B, int T, const char *data,
                      const char *outdir, double sgemm_gflops) {
  char err[1024];
  jobspec_t s;
  jobspec_init(&s);
  snprintf(s.data.path, sizeof s.data.path, "%s", data);
  s.data.format = JOBSPEC_DATA_U16;
  s.data.seq_len = T;
  s.data.eval_fraction = 0;
  s.use_lora = lora;
  s.lora_rank = 16;
  s.lora_alpha = 32;
  s.target_modules = JOBSPEC_TARGET_ALL_LINEAR;
  s.train.steps = steps;
  s.train.micro_batch_size = B;
  s.train.grad_accum = 1;
  s.train.lr = 1e-4;
  s.train.checkpoint_every = 0;
  snprintf(s.output_dir, sizeof s.output_dir, "%s/%s", outdir, lora ? "lora" : "full");
  model_t *m;
  lora_t *lo = NULL;
  comm_t *comm;
  int rc = model_create(&m, c, B, T, lora ? MODEL_TRAIN_LORA : MODEL_TRAIN_FULL, err, sizeof err);
  if (rc) {
    fprintf(stderr, "train_bench: %s\n", err);
    return 1;
  }
  model_io_init_scratch(m, 1);
  if (lora &&
      (rc = lora_create(&lo, m, s.lora_rank, s.lora_alpha, s.target_modules, err, sizeof err))) {
    fprintf(stderr, "train_bench: %s\n", err);
    return 1;
  }
  if (lo) lora_init(lo, 1);
  comm_open(&comm, "self", 0, 1, err, sizeof err);
  rates_t r = {{0}, 0};
  train_backend_t b;
  train_result_t res;
  rc = train_backend_host(&b, m, lo, err, sizeof err);
  if (!rc) {
    train_args_t a = {
        .spec = &s, .comm = comm, .backend = &b, .progress = on_progress, .progress_ctx = &r};
    rc = train_run(&a, &res, err, sizeof err);
  }
  train_backend_free(&b);
  comm_close(comm);
  if (rc || r.n < 2) {
    fprintf(stderr, "train_bench: %s\n", rc ? err : "too few steps");
    return 1;
  }
  qsort(r.tps + 1, (size_t)r.n - 1, sizeof r.tps[0], cmp_double);
  double tps = r.tps[1 + (r.n - 1) / 2];
  const double L = (double)c->num_hidden_layers;
  const double attn = 12.0 * L * c->num_attention_heads * c->head_dim * T;
  double p_mat = 0;
  for (int i = 0; i < m->n_tensors; i++)
    if (m->tensors[i].ndim == 2 && strcmp(m->tensors[i].name, "model.embed_tokens.weight"))
      p_mat += (double)m->tensors[i].numel;
  if (m->d.tied) p_mat += (double)c->vocab_size * c->hidden_size;
  double flops_tok = lora ? 4.0 * p_mat + 6.0 * (double)lo->n_params + attn : 6.0 * p_mat + attn;
  double gflops = tps * flops_tok / 1e9;
  printf(
      "{\"bench\": \"train\", \"mode\": \"%s\", \"params\": %zu, \"trained\": %zu, "
      "\"seq_len\": %d, \"micro_batch_size\": %d, \"steps_timed\": %d, "
      "\"tokens_per_s\": %.1f, \"flops_per_token\": %.4g, \"gflops\": %.2f, "
      "\"sgemm_gflops\": %.2f, \"fraction_of_sgemm\": %.3f, \"loss\": %.4f}\n",
      lora ? "lora" : "full", m->n_params, lora ? lo->n_params : m->n_params, T, B, r.n - 1, tps,
      flops_tok, gflops, sgemm_gflops, gflops / sgemm_gflops, res.last_loss);
  fflush(stdout);
  lora_free(lo);
  model_free(m);
  return 0;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 4, B = argc > 2 ? atoi(argv[2]) : 2;
  const int T = 256;
  if (steps < 2 || B < 1) {
    fprintf(stderr, "usage: train_bench [steps >= 2] [micro_batch_size >= 1]\n");
    return 2;
  }
  llama_config_t c = bench_config();
  char dir[] = "/tmp/ty_train_bench_XXXXXX";
  if (!mkdtemp(dir)) {
    perror("train_bench: mkdtemp");
    return 1;
  }
  /* Random u16 tokens below V: enough windows for every step's batch. */
  char data[64];
  snprintf(data, sizeof data, "%s/tokens.u16", dir);
  size_t ntok = (size_t)(steps + 1) * B * T + 1;
  uint16_t *tok = malloc(ntok * sizeof *tok);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < ntok; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    tok[i] = (uint16_t)(x % (uint64_t)c.vocab_size);
  }
  FILE *f = fopen(data, "wb");
  if (!f || fwrite(tok, sizeof *tok, ntok, f) != ntok || fclose(f)) {
    perror("train_bench: writing tokens");
    return 1;
  }
  free(tok);
  double sg = sgemm_rate(&c, B * T, 3);
  printf("{\"bench\": \"sgemm\", \"rows\": %d, \"gflops\": %.2f, \"threads\": %d}\n", B * T, sg,
         openblas_get_num_threads());
  fflush(stdout);
  int rc = bench_mode(&c, false, steps, B, T, data, dir, sg);
  if (!rc) rc = bench_mode(&c, true, steps, B, T, data, dir, sg);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "train_bench: could not remove %s\n", dir);
  return rc;
}
