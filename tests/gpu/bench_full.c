/* bench_full.c - training every weight on one GPU, through the worker's own
 * device path: the job spec a `use_lora false` job on one GPU has (dtype
 * float32, the memory-efficient load), train_cuda_create's device side
 * (the checkpoint loaded onto device 0 as float32 weights, gradients and
 * AdamW's moments beside them, worker/cuda/train_cuda.h) under the training
 * loop's backend table (train_backend_device over a host weights-only model,
 * worker/model/train_backend.h), and the loop's own sequence a step: zero
 * the gradients, forward, backward, the gradients' norm, AdamW on the device
 * with global-norm clipping at 1.0. Micro-batches of B x T random tokens
 * (next-token targets, the mean loss over all B x T), STEPS timed steps after
 * two warm-up steps. The products run in plain fp32 (cublasSgemm, no TF32)
 * and attention in fp32 on CUDA cores: float32 is the only dtype the worker
 * trains every weight in on a GPU.
 *
 * Prints one JSON line: tokens/s, the losses, the device's peak by our
 * allocator (every mem_cuda_alloc: weights, gradients, moments,
 * activations; not the CUDA context or cuBLAS's workspace) and by
 * cudaMemGetInfo after the steps (everything the process holds: nothing is
 * allocated during a step, so this is its peak), and the load's figures.
 *
 * usage: bench_full CHECKPOINT_DIR B T STEPS */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/jobspec.h"
#include "api/llama_config.h"
#include "common/json_util.h"
#include "tests/gpu/gpu_util.h"
#include "worker/cuda/mem_cuda.h"
#include "worker/cuda/train_cuda.h"
#include "worker/model/optim.h"
#include "worker/model/train_backend.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* dir's config.json into c. 0, or 1 with the reason in err. */
static int read_config(const char *dir, llama_config_t *c, char *err, size_t errlen) {
  char path[4096];
  llama_config_path(dir, path, sizeof path);
  json_t *j = ty_json_load_file(path, 0, err, errlen);
  if (!j) return 1;
  llama_config_init(c);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = llama_config_from_json(j, c, "", false, &errs) || llama_config_validate(c, "", &errs);
  if (rc)
    snprintf(err, errlen, "%.300s: %s: %s", path, errs.len ? errs.items[0].field : "",
             errs.len ? errs.items[0].message : "invalid");
  ty_errlist_clear(&errs);
  json_decref(j);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: bench_full CHECKPOINT_DIR B T STEPS\n");
    return 2;
  }
  gpu_require_device("bench_full");
  const char *dir = argv[1];
  const int B = atoi(argv[2]), T = atoi(argv[3]), steps = atoi(argv[4]);
  if (B < 1 || T < 2 || steps < 1) {
    fprintf(stderr, "bench_full: B and STEPS must be positive, T at least 2\n");
    return 2;
  }
  char err[1024];
  llama_config_t cfg;
  if (read_config(dir, &cfg, err, sizeof err)) {
    fprintf(stderr, "bench_full: %s\n", err);
    return 1;
  }
  /* What a one-GPU `use_lora false` job's spec says, where it matters here. */
  jobspec_t spec;
  jobspec_init(&spec);
  snprintf(spec.model_path, sizeof spec.model_path, "%s", dir);
  spec.dtype = TY_DTYPE_F32;
  spec.use_lora = false;
  spec.fsdp.memory_efficient_load = true;
  spec.gradient_checkpointing = false;

  int rc = 1;
  comm_t *comm = NULL;
  model_t *host = NULL;
  train_cuda_t *tc = NULL;
  train_backend_t hb = {0}, b = {0};
  optim_t *o = NULL;
  int *tok = NULL, *tgt = NULL;
  loader_stats_t ls = {0};
  train_device_t dev;
  if (comm_open(&comm, "self", 0, 1, err, sizeof err) ||
      model_create_weights(&host, &cfg, B, T, MODEL_TRAIN_FULL, err, sizeof err) ||
      train_cuda_create(&tc, &spec, &cfg, comm, 0, &(train_cuda_trained_t){.host = host}, B, T, &ls,
                        &dev, err, sizeof err) ||
      train_backend_host(&hb, host, NULL, err, sizeof err) ||
      train_backend_device(&b, &hb, &dev, 1, err, sizeof err))
    goto out;
  optim_config_t oc;
  optim_config_defaults(&oc);
  oc.lr = 1e-5, oc.weight_decay = 0.0, oc.warmup_steps = 0, oc.total_steps = steps + 2;
  if (!(o = optim_new(&oc, b.span.n, err, sizeof err))) goto out;
  b.no_decay(b.ctx, o);

  const int V = (int)cfg.vocab_size, n = B * T;
  tok = malloc(sizeof(int) * (n + 1)), tgt = malloc(sizeof(int) * n);
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i <= n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    tok[i] = (int)(x % (uint64_t)V);
  }
  for (int i = 0; i < n; i++) tgt[i] = tok[i + 1];
  const model_batch_t batch = {.tokens = tok, .targets = tgt, .b = B, .t = T};
  double loss = 0, first = 0, t0 = 0, norm = 0;
  for (int it = 0; it < steps + 2; it++) {
    if (it == 2) t0 = now_s();
    double sumsq = 0;
    if ((rc = b.zero_grads(b.ctx, err, sizeof err)) ||
        (rc = b.forward(b.ctx, &batch, &loss, err, sizeof err)) ||
        (rc = b.backward(b.ctx, 1.0f, err, sizeof err)) ||
        (rc = b.grad_sumsq(b.ctx, &sumsq, err, sizeof err)))
      goto out;
    norm = sqrt(sumsq);
    if ((rc =
             b.step(b.ctx, o, optim_lr_at(&oc, it), optim_clip_factor(norm, 1.0), err, sizeof err)))
      goto out;
    if (it == 0) first = loss;
  }
  /* The last step's AdamW may still be queued: wait for the device. */
  if (cudaDeviceSynchronize() != cudaSuccess) {
    snprintf(err, sizeof err, "the steps: %s", cudaGetErrorString(cudaGetLastError()));
    rc = 1;
    goto out;
  }
  const double secs = now_s() - t0;
  size_t fr, tot;
  cudaMemGetInfo(&fr, &tot);
  printf(
      "{\"status\":\"ok\",\"mode\":\"full\",\"dtype\":\"float32\",\"params\":%llu,"
      "\"B\":%d,\"T\":%d,\"steps\":%d,\"tokens_per_s\":%.1f,\"loss_first\":%.4f,"
      "\"loss_last\":%.4f,\"grad_norm_last\":%.4g,\"load_seconds\":%.3f,"
      "\"device_peak_bytes\":%llu,\"allocator_peak_bytes\":%llu,\"device_used_bytes\":%llu}\n",
      (unsigned long long)b.span.n, B, T, steps, (double)n * steps / secs, first, loss, norm,
      ls.load_seconds, (unsigned long long)ls.device_peak_bytes,
      (unsigned long long)mem_cuda_peak(), (unsigned long long)(tot - fr));
  rc = 0;
out:
  if (rc) fprintf(stderr, "bench_full: %s\n", err);
  free(tok);
  free(tgt);
  optim_free(o);
  train_backend_free(&b);
  train_backend_free(&hb);
  train_cuda_free(tc);
  model_free(host);
  comm_close(comm);
  return rc ? 1 : 0;
}
