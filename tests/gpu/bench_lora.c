/* bench_lora.c - LoRA training throughput on one GPU: the checkpoint loaded
 * onto device 0 by the memory-efficient path (bf16 base weights), LoRA of
 * rank R on all seven projections, micro-batches of B x T random tokens;
 * STEPS timed steps (forward, backward, AdamW on the adapters) after two
 * warm-up steps. Prints one JSON line: tokens/s, model FLOP/s and the
 * model-FLOP utilisation against the H200's dense bf16 peak (989 TFLOP/s;
 * TY_PEAK_TFLOPS overrides), device peaks of the load and of training,
 * and attention's path (tf32 on tensor cores, the bf16 default, or fp32
 * with TRAINYARD_CUDA_ATTN_MIB=0) with its workspace. The device's peak
 * twice: by our allocator (every mem_cuda_alloc: the base, activations,
 * adapters, AdamW's moments; not the CUDA context or cuBLAS's workspace)
 * and by cudaMemGetInfo after the steps (all the process holds; nothing is
 * allocated during a step, so that is its peak). The targets are the next
 * token of one random stream (B x T + 1 ids), the loss their mean
 * cross-entropy over all B x T positions, as bench_torch.py's.
 *
 * FLOPs per token (stated here, counted as in the literature for LoRA: the
 * frozen base needs its forward product and its input-gradient product but
 * no weight gradient): 4 * P_mm + 6 * T * QD * L, where P_mm = the
 * parameters of every matrix product (projections and the LM head; the
 * embedding is a gather) and the attention term is QK^T and AV over a causal
 * mask (half of T x T), forward (2 products) and backward (4), 2 FLOPs per
 * multiply-add. The adapters' own FLOPs (rank R, under 1%) are not counted.
 * (tests/gpu/bench.sh's verdict counts the conventional 6 * P_mm instead,
 * the same for PyTorch's rate: the MFU target is stated in that count.)
 *
 * SLOTS (optional, default 0): 0 reads the whole base in place; 1 or 2
 * runs the sharded path (worker/cuda/prefetch_cuda.h) at world size 1 through an
 * NCCL comm, every unit gathered into 1 slot (no overlap) or 2 (the next
 * unit's gather overlapping the current unit's compute), so that the
 * gathers' cost and the overlap's gain show against the whole model.
 *
 * usage: bench_lora CHECKPOINT_DIR B T R STEPS [SLOTS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/jobspec.h"
#include "tests/gpu/bench_util.h"
#include "tests/gpu/gpu_util.h"
#include "worker/ckpt/loader.h"
#include "worker/model/lora.h"
#include "worker/cuda/mem_cuda.h"
#include "worker/cuda/model_cuda.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 6 && argc != 7) {
    fprintf(stderr, "usage: bench_lora CHECKPOINT_DIR B T R STEPS [SLOTS]\n");
    return 2;
  }
  const int slots = argc == 7 ? atoi(argv[6]) : 0;
  gpu_require_device("bench_lora");
  const char *dir = argv[1];
  int B = atoi(argv[2]), T = atoi(argv[3]), R = atoi(argv[4]), steps = atoi(argv[5]);
  if (B < 1 || T < 2 || R < 1 || steps < 1 || slots < 0 || slots > 2) {
    fprintf(stderr, "bench_lora: B, R, STEPS must be positive, T at least 2, SLOTS 0..2\n");
    return 2;
  }
  char err[1024];
  placement_t pl;
  cuda_backend_t *cb;
  loader_shard_t *s;
  loader_stats_t st;
  if (bench_load_bf16(dir, &pl, &cb, &s, &st, err, sizeof err)) {
    fprintf(stderr, "bench_lora: %s\n", err);
    return 1;
  }
  /* lora_create reads only the shape and the micro-batch size. */
  model_t shape;
  if (model_init_shape(&shape, &s->layout.cfg, B, T, MODEL_TRAIN_LORA, err, sizeof err)) {
    fprintf(stderr, "bench_lora: %s\n", err);
    return 1;
  }
  lora_t *lo;
  model_cuda_t *mc;
  if (lora_create(&lo, &shape, R, 2.0 * R, JOBSPEC_TARGET_ALL_LINEAR, err, sizeof err)) {
    fprintf(stderr, "bench_lora: %s\n", err);
    return 1;
  }
  lora_init(lo, 1);
  comm_t *comm = NULL;
  char rdv[96];
  snprintf(rdv, sizeof rdv, "nccl:file:/tmp/trainyard-bench-lora-%d.id", (int)getpid());
  if (slots && comm_open(&comm, rdv, 0, 1, err, sizeof err)) {
    fprintf(stderr, "bench_lora: %s\n", err);
    return 1;
  }
  if (model_cuda_create(&mc, cb, s, lo, comm, slots, B, T, false, err, sizeof err)) {
    fprintf(stderr, "bench_lora: %s\n", err);
    return 1;
  }
  const model_dims_t *d = &shape.d;
  const int V = d->V, n = B * T;
  int *tok = malloc(sizeof(int) * (n + 1)), *tgt = malloc(sizeof(int) * n);
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i <= n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    tok[i] = (int)(x % (uint64_t)V);
  }
  for (int i = 0; i < n; i++) tgt[i] = tok[i + 1];
  size_t np = model_cuda_lora_size(mc);
  float *mom;
  if (mem_cuda_alloc((void **)&mom, 2 * np * sizeof(float))) {
    fprintf(stderr, "bench_lora: no device memory for AdamW's moments\n");
    return 1;
  }
  cudaMemset(mom, 0, 2 * np * sizeof(float));
  cuda_adamw_cfg_t ac = {1e-4, 0.9, 0.999, 1e-8, 0.0};
  double loss = 0, first = 0, t0 = 0;
  for (int it = 0; it < steps + 2; it++) {
    if (it == 2) t0 = now_s();
    cudaMemset(model_cuda_lora_grads(mc), 0, np * sizeof(float));
    if (model_cuda_forward(mc, tok, tgt, B, T, &loss, err, sizeof err) ||
        model_cuda_backward(mc, 1.0f, err, sizeof err)) {
      fprintf(stderr, "bench_lora: step %d: %s\n", it, err);
      return 1;
    }
    if (it == 0) first = loss;
    cuda_adamw_step(cb, model_cuda_lora_params(mc), model_cuda_lora_grads(mc), mom, mom + np, np,
                    &ac, it + 1, 1.0, 1);
  }
  if (cuda_backend_sync(cb, err, sizeof err)) {
    fprintf(stderr, "bench_lora: %s\n", err);
    return 1;
  }
  double secs = now_s() - t0;
  const double QD = (double)d->NH * d->HS, KVD = (double)d->NKV * d->HS;
  double p_layer = (double)d->C * (QD + 2 * KVD) + QD * d->C + 3.0 * d->C * d->FF;
  double p_mm = p_layer * d->L + (double)V * d->C;
  double flops_tok = 4.0 * p_mm + 6.0 * T * QD * d->L;
  double tps = (double)n * steps / secs, peak = 989.0;
  const char *pe = getenv("TY_PEAK_TFLOPS");
  if (pe && atof(pe) > 0) peak = atof(pe);
  size_t fr, tot;
  cudaMemGetInfo(&fr, &tot);
  printf(
      "{\"status\":\"ok\",\"mode\":\"lora\",\"slots\":%d,\"params\":%llu,\"B\":%d,\"T\":%d,\"lora_"
      "rank\":%d,"
      "\"steps\":%d,"
      "\"tokens_per_s\":%.1f,\"flops_per_token\":%.4g,\"model_tflops\":%.2f,"
      "\"mfu\":%.4f,\"peak_tflops\":%.0f,\"loss_first\":%.4f,\"loss_last\":%.4f,"
      "\"load_device_peak_bytes\":%llu,\"train_activation_bytes\":%llu,"
      "\"attention\":\"%s\",\"attention_workspace_bytes\":%llu,\"allocator_peak_bytes\":%llu,"
      "\"device_used_bytes\":%llu}\n",
      slots, (unsigned long long)s->layout.nparams, B, T, R, steps, tps, flops_tok,
      tps * flops_tok / 1e12, tps * flops_tok / 1e12 / peak, peak, first, loss,
      (unsigned long long)st.device_peak_bytes, (unsigned long long)model_cuda_bytes(mc),
      model_cuda_attention_bytes(mc) ? "tf32" : "fp32",
      (unsigned long long)model_cuda_attention_bytes(mc), (unsigned long long)mem_cuda_peak(),
      (unsigned long long)(tot - fr));
  mem_cuda_free(mom);
  free(tok);
  free(tgt);
  model_cuda_free(mc);
  comm_close(comm);
  lora_free(lo);
  loader_shard_free(s);
  placement_cuda_free(&pl);
  cuda_backend_free(cb);
  return 0;
}
