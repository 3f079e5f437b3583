/* fsdp_check.c - LoRA and full training over sharded GPU ranks
 * (worker/cuda/model_cuda.c given a comm; worker/cuda/prefetch_cuda.c) against the
 * whole model on the same GPU (ctest label gpu). One rank per visible
 * device, at most 4: a host with one GPU runs world size 1, where every
 * unit still goes through NCCL and the slots. Each rank loads only its
 * shard of a generated checkpoint by the memory-efficient path (its device
 * peak exactly that shard), runs two forward + backward passes with 2 slots
 * and again with 1, and compares the loss and every adapter gradient with
 * the whole model's on its own GPU: the same bytes reach the same kernels,
 * so they agree to 1e-6 (and are reported when bitwise equal). Then the
 * adapter gradients are summed over ranks from a host buffer (the nccl
 * comm's staging path): world x the whole model's. fp32 and bf16 bases,
 * tied and untied heads. Then, over an fp32 base, full training: each
 * unit's gradients reduce-scattered into the rank's gradient shard, which
 * must hold world x the whole model's gradient in its rows (every rank runs
 * the same batch), within 1e-5. The tied model has Qwen2's q/k/v biases
 * (gathered with their layer, their gradients reduce-scattered with it).
 * Exits 77 (a skip) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/jobspec.h"
#include "tests/gpu/gpu_util.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/loader.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/cuda/model_cuda.h"

enum { B = 2, T = 13, R = 4 };

static void config(llama_config_t *c, bool tied) {
  llama_config_init(c);
  c->hidden_size = 64, c->intermediate_size = 96, c->num_hidden_layers = 3;
  c->num_attention_heads = 4, c->num_key_value_heads = 2, c->vocab_size = 67;
  c->head_dim = 16;
  c->rope_theta = 10000.0;
  c->tie_word_embeddings = tied;
  c->qkv_bias = tied; /* the tied model is Qwen2's: q/k/v biases in every layer's unit */
}

#define FAIL(...)                   \
  do {                              \
    printf("FAIL rank %d: ", rank); \
    printf(__VA_ARGS__);            \
    printf("\n");                   \
    fflush(stdout);                 \
    return 1;                       \
  } while (0)

/* Two forward + backward passes (the second on shifted tokens), gradients
 * accumulated over both as the training loop's micro-batches are: dgrads
 * (bytes on the device: the adapters' or the base's) cleared first, then
 * brought down into grads. */
static int steps(model_cuda_t *mc, double *loss, void *dgrads, void *grads, size_t bytes, char *err,
                 size_t errlen) {
  int tok[B * T], tgt[B * T];
  cudaMemset(dgrads, 0, bytes);
  *loss = 0.0;
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < B * T; i++) tok[i] = (i * 13 + 7 + s) % 67, tgt[i] = (i * 29 + 3 + s) % 67;
    double l;
    int rc = model_cuda_forward(mc, tok, tgt, B, T, &l, err, errlen);
    if (!rc) rc = model_cuda_backward(mc, 0.5f, err, errlen);
    if (rc) return rc;
    *loss += l;
  }
  gpu_get(grads, dgrads, bytes);
  return 0;
}
/* The adapters' gradients, n floats. */
static int lora_steps(model_cuda_t *mc, double *loss, float *grads, size_t n, char *err,
                      size_t errlen) {
  return steps(mc, loss, model_cuda_lora_grads(mc), grads, n * sizeof(float), err, errlen);
}

/* The largest |got - want| relative to the tensor's largest |want|:
 * summation order differs between the whole model's products and a unit's
 * (and between reductions), so single elements that nearly cancel differ
 * in their own last digits; the tensor's scale is what they are judged by. */
static double worst_rel(const float *got, const float *want, size_t n) {
  double d = 0.0, big = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e == e)) return INFINITY;
    if (e > d) d = e;
    if (fabs((double)want[i]) > big) big = fabs((double)want[i]);
  }
  return d ? d / (big + 1e-30) : 0.0;
}

static int run_rank(const char *dir, const char *rdv, int rank, int world, ty_dtype_t dt,
                    bool tied) {
  char err[1024];
  comm_t *comm;
  if (comm_open(&comm, rdv, rank, world, err, sizeof err)) FAIL("%s", err);
  int ndev;
  if (placement_cuda_devices(&ndev, err, sizeof err)) FAIL("%s", err);
  const int dev = rank % ndev;
  llama_config_t cfg;
  config(&cfg, tied);
  placement_t pw, ps;
  cuda_backend_t *cb;
  if (placement_cuda_init(&pw, dev, 1 << 16, err, sizeof err) ||
      placement_cuda_init(&ps, dev, 1 << 16, err, sizeof err) ||
      cuda_backend_create(&cb, dev, err, sizeof err))
    FAIL("%s", err);
  loader_opts_t o = {.rank = 0,
                     .world_size = 1,
                     .dtype = dt,
                     .memory_efficient = true,
                     .bucket_bytes = 1 << 12,
                     .pl = &pw};
  loader_shard_t *whole, *shard;
  loader_stats_t st;
  if (loader_load(dir, &o, &whole, NULL, err, sizeof err)) FAIL("whole load: %s", err);
  o.rank = rank, o.world_size = world, o.pl = &ps;
  if (loader_load(dir, &o, &shard, &st, err, sizeof err)) FAIL("shard load: %s", err);
  uint64_t want_shard = loader_shard_bytes(&cfg, rank, world, dt);
  if (st.device_peak_bytes != want_shard)
    FAIL("device peak of the memory-efficient load %llu, its shard %llu",
         (unsigned long long)st.device_peak_bytes, (unsigned long long)want_shard);

  model_t shape;
  lora_t *lo;
  if (model_init_shape(&shape, &cfg, B, T, MODEL_TRAIN_LORA, err, sizeof err) ||
      lora_create(&lo, &shape, R, 8.0, JOBSPEC_TARGET_ALL_LINEAR, err, sizeof err))
    FAIL("%s", err);
  lora_init(lo, 5);
  for (int i = 0; i < lo->n_tensors; i++)
    if (lo->tensors[i].is_b) gpu_fill(lo->tensors[i].data, lo->tensors[i].numel, 100 + i, 0.05f);
  const size_t n = lo->n_params;
  float *gw = malloc(n * sizeof(float)), *gs = malloc(n * sizeof(float));
  double lw, ls;
  model_cuda_t *mw, *ms;
  if (model_cuda_create(&mw, cb, whole, lo, NULL, 0, B, T, false, err, sizeof err) ||
      lora_steps(mw, &lw, gw, n, err, sizeof err))
    FAIL("whole model: %s", err);
  double gn = 0.0;
  for (size_t i = 0; i < n; i++) gn += (double)gw[i] * gw[i];
  if (!(gn > 0.0)) FAIL("the whole model's adapter gradients are zero: nothing would be compared");
  const char *tag = dt == TY_DTYPE_BF16 ? "bf16" : "fp32";
  for (int slots = 2; slots >= 1; slots--) {
    if (model_cuda_create(&ms, cb, shard, lo, comm, slots, B, T, false, err, sizeof err) ||
        lora_steps(ms, &ls, gs, n, err, sizeof err))
      FAIL("sharded, %d slot(s): %s", slots, err);
    double lerr = fabs(ls - lw) / fabs(lw), gerr = worst_rel(gs, gw, n);
    bool bitwise = ls == lw && !memcmp(gs, gw, n * sizeof(float));
    printf("%-4s rank %d/%d %s %s, %d slot(s): loss %.7f vs whole %.7f, grads worst rel %.2g%s\n",
           lerr <= 1e-6 && gerr <= 1e-6 ? "ok" : "FAIL", rank, world, tag, tied ? "tied" : "untied",
           slots, ls, lw, gerr, bitwise ? " (bitwise equal)" : "");
    if (lerr > 1e-6 || gerr > 1e-6) return 1;
    model_cuda_free(ms);
  }
  /* The loop's all-reduce of host gradients: every rank holds world x. */
  if (comm_all_reduce(comm, gs, n)) FAIL("all_reduce of host gradients: %s", comm_error(comm));
  for (size_t i = 0; i < n; i++) gw[i] *= (float)world;
  double aerr = worst_rel(gs, gw, n);
  printf("%-4s rank %d/%d %s: host-buffer all_reduce of the adapter gradients, worst rel %.2g\n",
         aerr <= 1e-5 ? "ok" : "FAIL", rank, world, tag, aerr);
  if (aerr > 1e-5) return 1;
  model_cuda_free(mw);
  free(gw);
  free(gs);
  lora_free(lo);
  /* Full training over the fp32 shard: world x the whole model's gradient
   * in this rank's rows of every tensor. */
  float *fw = dt == TY_DTYPE_F32 ? malloc(whole->bytes) : NULL;
  if (fw && (model_cuda_create(&mw, cb, whole, NULL, NULL, 0, B, T, false, err, sizeof err) ||
             steps(mw, &lw, model_cuda_base_grads(mw), fw, whole->bytes, err, sizeof err)))
    FAIL("whole model, full training: %s", err);
  for (int slots = 2; slots >= 1 && fw; slots--) {
    float *fs = malloc(shard->bytes);
    if (model_cuda_create(&ms, cb, shard, NULL, comm, slots, B, T, false, err, sizeof err) ||
        steps(ms, &ls, model_cuda_base_grads(ms), fs, shard->bytes, err, sizeof err))
      FAIL("sharded full training, %d slot(s): %s", slots, err);
    double ferr = fabs(ls - lw) / fabs(lw);
    for (size_t i = 0; i < shard->layout.ntensors; i++) {
      const loader_view_t *vs = &shard->views[i], *vw = &whole->views[i];
      size_t cols = (size_t)vs->t->cols, k = (size_t)vs->rows * cols;
      const float *got = fs + vs->offset / sizeof(float);
      float *want = malloc((k ? k : 1) * sizeof(float));
      memcpy(want, fw + vw->offset / sizeof(float) + (size_t)vs->row0 * cols, k * sizeof(float));
      for (size_t e = 0; e < k; e++) want[e] *= (float)world;
      double e = worst_rel(got, want, k);
      if (e > ferr) ferr = e;
      free(want);
    }
    printf(
        "%-4s rank %d/%d fp32 %s, full training, %d slot(s): loss %.7f vs whole %.7f, "
        "gradient shard worst rel %.2g\n",
        ferr <= 1e-5 ? "ok" : "FAIL", rank, world, tied ? "tied" : "untied", slots, ls, lw, ferr);
    if (ferr > 1e-5) return 1;
    model_cuda_free(ms);
    free(fs);
  }
  if (fw) model_cuda_free(mw);
  free(fw);
  loader_shard_free(shard);
  loader_shard_free(whole);
  placement_cuda_free(&ps);
  placement_cuda_free(&pw);
  cuda_backend_free(cb);
  comm_close(comm);
  return 0;
}

int main(void) {
  /* Count devices in a child: CUDA must not be initialised before fork. */
  pid_t probe = fork();
  if (probe == 0) {
    int n;
    char why[512];
    if (placement_cuda_devices(&n, why, sizeof why)) {
      printf("SKIP gpu/fsdp: %s\n", why);
      fflush(stdout);
      _exit(0);
    }
    _exit(n > 4 ? 4 : n);
  }
  int st, world = 0;
  if (probe > 0 && waitpid(probe, &st, 0) == probe && WIFEXITED(st)) world = WEXITSTATUS(st);
  if (world < 1) return GPU_SKIP;
  char dir[128], err[512];
  snprintf(dir, sizeof dir, "/tmp/trainyard-fsdp-check-%d", (int)getpid());
  int bad = 0, serial = 0;
  for (int tied = 0; tied < 2 && !bad; tied++) {
    llama_config_t cfg;
    config(&cfg, tied);
    if (ckpt_write_random(dir, &cfg, TY_DTYPE_BF16, 2, 3 + tied, NULL, err, sizeof err)) {
      printf("FAIL checkpoint: %s\n", err);
      return 1;
    }
    const ty_dtype_t dts[] = {TY_DTYPE_F32, TY_DTYPE_BF16};
    for (int d = 0; d < 2 && !bad; d++) {
      char rdv[192];
      snprintf(rdv, sizeof rdv, "nccl:file:%s.%d.id", dir, serial++);
      pid_t pids[4];
      fflush(stdout); /* or each child would print it again */
      for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
          int failed = run_rank(dir, rdv, r, world, dts[d], tied);
          fflush(stdout); /* _exit would drop what a pipe (ctest) has not taken yet */
          _exit(failed);
        }
      }
      for (int r = 0; r < world; r++)
        if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) bad = 1;
  }
  printf("gpu/fsdp: %d rank%s: %s\n", world, world == 1 ? "" : "s",
         bad ? "FAILED" : "sharded LoRA and full-training passes match the whole model");
  return bad;
}
