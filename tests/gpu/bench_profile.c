/* bench_profile.c - where a LoRA training step's device time goes, op by
 * op: the checkpoint loaded onto device 0 as bench_lora loads it (bf16
 * base by the memory-efficient path, read in place), LoRA of rank R on all
 * seven projections, micro-batches of B x T seeded tokens; two warm-up
 * steps (which also grow the profiler's event pool), then STEPS profiled
 * steps (forward, backward, AdamW on the adapters), each op of the CUDA
 * backend timed by a pair of CUDA events (cuda_backend_profile,
 * worker/cuda/backend_cuda.h), no profiling tool needed.
 *
 * stdout: one JSON line per op that ran,
 *   {"bench":"profile","op":TAG,"calls":N,"ms":TOTAL,"share":PERCENT},
 * most time first, then one summary line {"bench":"profile_summary",...}:
 * the ops' summed time against the device span of the steps and the
 * host's wall time, the step time, and every step's loss (warm-up
 * included) with the adapters' final sum, printed to round-trip, so that
 * a run with PROFILE 0 (the same steps, no events: the summary only) can
 * be compared with a profiled one bit for bit, and its step time shows
 * the profiler's own cost. stderr: the same as a table.
 *
 * usage: bench_profile CHECKPOINT_DIR B T R STEPS [PROFILE] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/jobspec.h"
#include "tests/gpu/bench_util.h"
#include "tests/gpu/gpu_util.h"
#include "worker/ckpt/loader.h"
#include "worker/cuda/model_cuda.h"
#include "worker/model/lora.h"

#define WARMUP 2

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int die(const char *what, const char *err) {
  fprintf(stderr, "bench_profile: %s%s%s\n", what, err ? ": " : "", err ? err : "");
  return 1;
}

/* The table on stderr: every row, then the window's totals. */
static void print_table(const cuda_profile_t *p, int steps) {
  fprintf(stderr, "%-26s %8s %11s %10s %10s %7s\n", "op", "calls", "total ms", "ms/step", "us/call",
          "share");
  for (int i = 0; i < p->n; i++) {
    const cuda_profile_row_t *r = &p->rows[i];
    fprintf(stderr, "%-26s %8ld %11.3f %10.3f %10.1f %6.2f%%\n", r->op, r->calls, r->ms,
            r->ms / steps, 1e3 * r->ms / (double)r->calls, r->share);
  }
  fprintf(stderr,
          "ops %.3f ms (%ld calls) of a %.3f ms device span (%.1f%%) and %.3f ms wall "
          "(%.1f%%); %d steps; %d event pairs, grown %d times in the steps\n",
          p->ops_ms, p->calls, p->span_ms, p->span_ms > 0 ? 100.0 * p->ops_ms / p->span_ms : 0.0,
          p->wall_ms, p->wall_ms > 0 ? 100.0 * p->ops_ms / p->wall_ms : 0.0, steps, p->pool_pairs,
          p->pool_grown);
}

int main(int argc, char **argv) {
  if (argc != 6 && argc != 7) {
    fprintf(stderr, "usage: bench_profile CHECKPOINT_DIR B T R STEPS [PROFILE]\n");
    return 2;
  }
  const char *dir = argv[1];
  int B = atoi(argv[2]), T = atoi(argv[3]), R = atoi(argv[4]), steps = atoi(argv[5]);
  const int profile = argc == 7 ? atoi(argv[6]) : 1;
  if (B < 1 || T < 2 || R < 1 || steps < 1 || (profile != 0 && profile != 1)) {
    fprintf(stderr, "bench_profile: B, R, STEPS must be positive, T at least 2, PROFILE 0 or 1\n");
    return 2;
  }
  gpu_require_device("bench_profile");
  char err[1024];
  placement_t pl;
  cuda_backend_t *cb;
  loader_shard_t *s;
  loader_stats_t st;
  if (bench_load_bf16(dir, &pl, &cb, &s, &st, err, sizeof err)) return die("load", err);
  /* lora_create reads only the shape and the micro-batch size. */
  model_t shape;
  lora_t *lo;
  model_cuda_t *mc;
  if (model_init_shape(&shape, &s->layout.cfg, B, T, MODEL_TRAIN_LORA, err, sizeof err) ||
      lora_create(&lo, &shape, R, 2.0 * R, JOBSPEC_TARGET_ALL_LINEAR, err, sizeof err))
    return die("model", err);
  lora_init(lo, 1);
  if (model_cuda_create(&mc, cb, s, lo, NULL, 0, B, T, false, err, sizeof err))
    return die("model_cuda", err);
  const model_dims_t *d = &shape.d;
  const int n = B * T, total = WARMUP + steps;
  int *tok = malloc(sizeof(int) * n), *tgt = malloc(sizeof(int) * n);
  double *losses = malloc(sizeof(double) * total);
  if (!tok || !tgt || !losses) return die("out of host memory", NULL);
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    tok[i] = (int)(x % (uint64_t)d->V);
  }
  for (int i = 0; i < n; i++) tgt[i] = i % T == T - 1 ? tok[i] : tok[i + 1];
  const size_t np = model_cuda_lora_size(mc);
  float *mom = gpu_dup(NULL, 2 * np * sizeof(float));
  cudaMemset(mom, 0, 2 * np * sizeof(float));
  cuda_adamw_cfg_t ac = {1e-4, 0.9, 0.999, 1e-8, 0.0};
  cuda_profile_t rep;
  memset(&rep, 0, sizeof rep);
  if (profile) cuda_backend_profile(cb, true);
  double t0 = 0.0;
  for (int it = 0; it < total; it++) {
    /* The warm-up's window is dropped; the steps' starts here. */
    if (it == WARMUP) {
      if (profile ? cuda_backend_profile_report(cb, &rep, err, sizeof err)
                  : cuda_backend_sync(cb, err, sizeof err))
        return die("warm-up", err);
      t0 = now_s();
    }
    cudaMemset(model_cuda_lora_grads(mc), 0, np * sizeof(float));
    if (model_cuda_forward(mc, tok, tgt, B, T, &losses[it], err, sizeof err) ||
        model_cuda_backward(mc, 1.0f, err, sizeof err)) {
      fprintf(stderr, "bench_profile: step %d: %s\n", it, err);
      return 1;
    }
    cuda_adamw_step(cb, model_cuda_lora_params(mc), model_cuda_lora_grads(mc), mom, mom + np, np,
                    &ac, it + 1, 1.0, 1);
  }
  if (profile ? cuda_backend_profile_report(cb, &rep, err, sizeof err)
              : cuda_backend_sync(cb, err, sizeof err))
    return die("steps", err);
  const double wall_ms = profile ? rep.wall_ms : (now_s() - t0) * 1e3;
  cuda_backend_profile(cb, false);
  double psum = 0.0;
  if (cuda_sum(cb, model_cuda_lora_params(mc), np, &psum)) return die("the adapters' sum", NULL);

  for (int i = 0; i < rep.n; i++) {
    const cuda_profile_row_t *r = &rep.rows[i];
    printf("{\"bench\":\"profile\",\"op\":\"%s\",\"calls\":%ld,\"ms\":%.4f,\"share\":%.3f}\n",
           r->op, r->calls, r->ms, r->share);
  }
  printf(
      "{\"bench\":\"profile_summary\",\"status\":\"ok\",\"profiled\":%s,\"B\":%d,\"T\":%d,"
      "\"lora_rank\":%d,\"layers\":%d,\"warmup\":%d,\"steps\":%d,\"attention\":\"%s\","
      "\"calls\":%ld,\"ops_ms\":%.4f,\"span_ms\":%.4f,\"wall_ms\":%.4f,\"step_ms\":%.4f,"
      "\"ops_share_of_span\":%.2f,\"ops_share_of_wall\":%.2f,\"pool_pairs\":%d,"
      "\"pool_grown\":%d,\"params_sum\":%.17g,"
      "\"losses\":[",
      profile ? "true" : "false", B, T, R, d->L, WARMUP, steps,
      model_cuda_attention_bytes(mc) ? "tf32" : "fp32", rep.calls, rep.ops_ms, rep.span_ms, wall_ms,
      wall_ms / steps, rep.span_ms > 0 ? 100.0 * rep.ops_ms / rep.span_ms : 0.0,
      wall_ms > 0 ? 100.0 * rep.ops_ms / wall_ms : 0.0, rep.pool_pairs, rep.pool_grown, psum);
  for (int i = 0; i < total; i++) printf("%s%.17g", i ? "," : "", losses[i]);
  printf("]}\n");
  if (profile) print_table(&rep, steps);
  fprintf(stderr, "%.3f ms a step (%s), loss %.4f -> %.4f\n", wall_ms / steps,
          profile ? "profiled" : "not profiled", losses[0], losses[total - 1]);

  cudaFree(mom);
  free(tok);
  free(tgt);
  free(losses);
  model_cuda_free(mc);
  lora_free(lo);
  loader_shard_free(s);
  placement_cuda_free(&pl);
  cuda_backend_free(cb);
  return 0;
}
