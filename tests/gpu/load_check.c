/* load_check.c - both load paths onto the device (ctest label gpu): a
 * generated bf16 checkpoint (two safetensors shards) loaded through the CUDA
 * placement for world sizes 1 and 3, every rank, standard and
 * memory-efficient. Each device shard must equal the CPU placement's shard
 * byte for byte; the device peak must be exactly this rank's shard on the
 * memory-efficient path and the whole converted model plus the shard on the
 * standard path; our high-water mark must agree with cudaMemGetInfo within
 * allocation granularity. Exits 77 (a skip) where no CUDA device is visible. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "tests/gpu/gpu_util.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/loader.h"

#define SLACK ((uint64_t)16 << 20) /* cudaMalloc granularity over two allocations */

static int load_one(const char *dir, int world, int rank, ty_dtype_t dt, int efficient,
                    uint64_t full_bytes) {
  char err[1024];
  placement_t cpu, gpu;
  placement_cpu_init(&cpu);
  loader_opts_t o = {.rank = rank,
                     .world_size = world,
                     .dtype = dt,
                     .memory_efficient = true,
                     .bucket_bytes = 1 << 20,
                     .pl = &cpu};
  loader_shard_t *ref, *s;
  loader_stats_t st;
  if (loader_load(dir, &o, &ref, NULL, err, sizeof err)) {
    printf("FAIL cpu load: %s\n", err);
    return 1;
  }
  if (placement_cuda_init(&gpu, 0, 1 << 20, err, sizeof err)) {
    printf("FAIL placement_cuda_init: %s\n", err);
    return 1;
  }
  o.pl = &gpu;
  o.memory_efficient = efficient;
  int bad = 0;
  if (loader_load(dir, &o, &s, &st, err, sizeof err)) {
    printf("FAIL cuda load: %s\n", err);
    placement_cuda_free(&gpu);
    return 1;
  }
  char *host = malloc(s->bytes + 1);
  gpu_get(host, s->base, s->bytes);
  const char *path = efficient ? "memory_efficient" : "standard";
  /* Tensor by tensor: the alignment padding between views holds nothing. */
  int same = s->bytes == ref->bytes && s->layout.ntensors == ref->layout.ntensors;
  for (size_t i = 0; same && i < s->layout.ntensors; i++) {
    const loader_view_t *a = &s->views[i], *b = &ref->views[i];
    same = a->offset == b->offset && a->nbytes == b->nbytes &&
           !memcmp(host + a->offset, (const char *)ref->base + b->offset, a->nbytes);
    if (!same)
      printf("FAIL %s world %d rank %d: the device shard's %s differs from the CPU shard's\n",
             path, world, rank, a->t->name);
  }
  if (!same) bad = 1;
  uint64_t want_peak = efficient ? s->bytes : full_bytes + s->bytes;
  if (st.device_peak_bytes != want_peak) {
    printf("FAIL %s world %d rank %d: device peak %llu, expected %llu\n", path, world, rank,
           (unsigned long long)st.device_peak_bytes, (unsigned long long)want_peak);
    bad = 1;
  }
  if (placement_cuda_check(&gpu, SLACK, err, sizeof err)) {
    printf("FAIL %s world %d rank %d: %s\n", path, world, rank, err);
    bad = 1;
  }
  placement_cuda_info_t ci;
  placement_cuda_info(&gpu, &ci);
  printf(
      "%-4s %-16s %-8s world %d rank %d  shard %8.3f MiB  device peak %8.3f MiB  "
      "cudaMemGetInfo peak %8.3f MiB\n",
      bad ? "FAIL" : "ok", path, ty_dtype_name(dt), world, rank, (double)s->bytes / 1048576.0,
      (double)st.device_peak_bytes / 1048576.0, (double)ci.driver_peak / 1048576.0);
  free(host);
  loader_shard_free(s);
  loader_shard_free(ref);
  if (gpu.in_use) {
    printf("FAIL %s: %llu device bytes still allocated after the shard was freed\n", path,
           (unsigned long long)gpu.in_use);
    bad = 1;
  }
  placement_cuda_free(&gpu);
  return bad;
}

int main(void) {
  gpu_require_device("gpu/load");
  char dir[] = "/tmp/ty-gpu-load-XXXXXX", err[1024];
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  llama_config_t cfg;
  llama_config_init(&cfg);
  cfg.hidden_size = 256, cfg.intermediate_size = 688, cfg.num_hidden_layers = 3;
  cfg.num_attention_heads = 8, cfg.num_key_value_heads = 2, cfg.vocab_size = 1003;
  cfg.head_dim = 32;
  uint64_t bytes;
  int bad = ckpt_write_random(dir, &cfg, TY_DTYPE_BF16, 2, 7, &bytes, err, sizeof err) != 0;
  if (bad) printf("FAIL ckpt_write_random: %s\n", err);
  /* The converted model's bytes (the standard path's full buffer). */
  ckpt_layout_t lay;
  ckpt_layout_init(&lay, &cfg);
  for (int w = 1; w <= 3 && !bad; w += 2) {
    ty_dtype_t dt = w == 1 ? TY_DTYPE_F32 : TY_DTYPE_BF16;
    uint64_t full = lay.nparams * ty_dtype_size(dt);
    for (int r = 0; r < w; r++) {
      bad |= load_one(dir, w, r, dt, 1, full);
      bad |= load_one(dir, w, r, dt, 0, full);
    }
  }
  ckpt_layout_free(&lay);
  /* A device that does not exist fails with a message that says so. */
  placement_t pl;
  if (placement_cuda_init(&pl, 4096, 1 << 20, err, sizeof err) != TY_EUNAVAILABLE ||
      !strstr(err, "does not exist")) {
    printf("FAIL device 4096 was accepted or not explained: %s\n", err);
    bad = 1;
  } else {
    printf("ok   device 4096 refused: %s\n", err);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  printf("gpu/load: %s\n", bad ? "FAILED" : "both paths match the CPU shards, peaks as expected");
  return bad ? 1 : 0;
}
