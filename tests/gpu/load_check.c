/* load_check.c - both load paths onto the device (ctest label gpu): a
 * generated bf16 checkpoint (two safetensors shards) loaded through the CUDA
 * placement for world sizes 1 and 3, every rank, standard and
 * memory-efficient. Each device shard must equal the CPU placement's shard
 * byte for byte; the device peak must be exactly this rank's shard on the
 * memory-efficient path and the whole converted model plus the shard on the
 * standard path; our high-water mark must agree with cudaMemGetInfo within
 * allocation granularity.
 *
 * The placement queues its copies through two pinned buffers on its own
 * stream, so three more cases aim at the order of those copies (on the
 * simulated device, TY_SIM_ORDER=lazy runs a queued copy only when
 * something waits for it: a buffer refilled too early, or a shard read
 * before the load's completion point, shows up as wrong bytes):
 *   - many chunks: a 4 KiB bucket, so every tensor crosses in many turns of
 *     the two buffers, for bf16 and float32 files into float32 and bf16
 *     shards (read straight into a buffer, or converted into one);
 *   - an upload: a host shard of ~10 MiB through 64 KiB buffers (copy_in);
 *   - a load cut short: the files truncated once the loader has queued
 *     some tensors' chunks, swept over where; the load must fail naming the
 *     truncation, leave nothing allocated, and the same placement must
 *     then load an intact checkpoint exactly.
 * Exits 77 (a skip) where no CUDA device is visible. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errors.h"
#include "tests/gpu/gpu_util.h"
#include "tests/unit/cut_testutil.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/loader.h"
#include "worker/cuda/mem_cuda.h"

#define SLACK ((uint64_t)16 << 20) /* cudaMalloc granularity over two allocations */
#define SMALL_BUCKET 4096          /* bytes: many chunks a tensor */

/* The device shard s against the host shard ref, tensor by tensor (the
 * alignment padding between views holds nothing). 0 when equal, else 1
 * with the first differing tensor printed after label. */
static int same_shard(const char *label, const loader_shard_t *s, const loader_shard_t *ref) {
  if (s->bytes != ref->bytes || s->layout.ntensors != ref->layout.ntensors) {
    printf("FAIL %s: the device shard's layout differs from the CPU shard's\n", label);
    return 1;
  }
  char *host = malloc(s->bytes + 1);
  gpu_get(host, s->base, s->bytes);
  int bad = 0;
  for (size_t i = 0; !bad && i < s->layout.ntensors; i++) {
    const loader_view_t *a = &s->views[i], *b = &ref->views[i];
    bad = a->offset != b->offset || a->nbytes != b->nbytes ||
          memcmp(host + a->offset, (const char *)ref->base + b->offset, a->nbytes);
    if (bad)
      printf("FAIL %s: the device shard's %s differs from the CPU shard's\n", label, a->t->name);
  }
  free(host);
  return bad;
}

static int load_one(const char *dir, const char *file_dt, int world, int rank, ty_dtype_t dt,
                    int efficient, size_t bucket, uint64_t full_bytes) {
  char err[1024], label[160];
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
    loader_shard_free(ref);
    return 1;
  }
  o.pl = &gpu;
  o.memory_efficient = efficient;
  o.bucket_bytes = bucket;
  const char *path = efficient ? "memory_efficient" : "standard";
  snprintf(label, sizeof label, "%s %s->%s world %d rank %d bucket %zu", path, file_dt,
           ty_dtype_name(dt), world, rank, bucket);
  if (loader_load(dir, &o, &s, &st, err, sizeof err)) {
    printf("FAIL %s: cuda load: %s\n", label, err);
    placement_cuda_free(&gpu);
    loader_shard_free(ref);
    return 1;
  }
  int bad = same_shard(label, s, ref);
  uint64_t want_peak = efficient ? s->bytes : full_bytes + s->bytes;
  if (st.device_peak_bytes != want_peak) {
    printf("FAIL %s: device peak %llu, expected %llu\n", label,
           (unsigned long long)st.device_peak_bytes, (unsigned long long)want_peak);
    bad = 1;
  }
  if (placement_cuda_check(&gpu, SLACK, err, sizeof err)) {
    printf("FAIL %s: %s\n", label, err);
    bad = 1;
  }
  placement_cuda_info_t ci;
  placement_cuda_info(&gpu, &ci);
  printf("%-4s %-58s shard %8.3f MiB  device peak %8.3f MiB  cudaMemGetInfo peak %8.3f MiB\n",
         bad ? "FAIL" : "ok", label, (double)s->bytes / 1048576.0,
         (double)st.device_peak_bytes / 1048576.0, (double)ci.driver_peak / 1048576.0);
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

/* A host shard of a whole float32 model copied up through the smallest
 * buffers (64 KiB): copy_in's many turns, then the completion point. */
static int check_upload(const llama_config_t *cfg) {
  char err[1024];
  placement_t cpu, gpu;
  placement_cpu_init(&cpu);
  loader_opts_t o = {.rank = 0, .world_size = 1, .dtype = TY_DTYPE_F32, .seed = 9, .pl = &cpu};
  loader_shard_t *hs, *ds = NULL;
  if (loader_init_scratch(cfg, &o, &hs, NULL, err, sizeof err)) {
    printf("FAIL upload's host shard: %s\n", err);
    return 1;
  }
  if (placement_cuda_init(&gpu, 0, 1, err, sizeof err)) {
    printf("FAIL placement_cuda_init: %s\n", err);
    loader_shard_free(hs);
    return 1;
  }
  placement_cuda_info_t ci;
  placement_cuda_info(&gpu, &ci);
  int bad = loader_shard_upload(hs, &gpu, &ds, err, sizeof err) != 0;
  if (bad)
    printf("FAIL upload: %s\n", err);
  else
    bad = same_shard("upload", ds, hs);
  printf("%-4s upload of %.3f MiB through %d x %llu-byte pinned buffers (%llu turns)\n",
         bad ? "FAIL" : "ok", (double)hs->bytes / 1048576.0, ci.staging_buffers,
         (unsigned long long)ci.staging_bytes,
         (unsigned long long)((hs->bytes + ci.staging_bytes - 1) / ci.staging_bytes));
  loader_shard_free(ds);
  loader_shard_free(hs);
  placement_cuda_free(&gpu);
  return bad;
}


/* Loads cut short after 1, 2, ... tensors (bf16 file, float32 and bf16
 * shards in turn, small bucket: chunks in flight when the read fails), all
 * on one placement, then an intact load on it against the CPU's. */
static int check_cut(const char *intact, const char *scratch_dir, const llama_config_t *cfg) {
  char err[1024], cmd[600];
  placement_t gpu;
  if (placement_cuda_init(&gpu, 0, 1, err, sizeof err)) {
    printf("FAIL placement_cuda_init: %s\n", err);
    return 1;
  }
  ckpt_layout_t lay;
  ckpt_layout_init(&lay, cfg);
  const int nt = (int)lay.ntensors;
  ckpt_layout_free(&lay);
  int bad = 0, cuts = 0;
  for (int after = 1; after < nt && !bad; after += after < 4 ? 1 : 7) {
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch_dir);
    if (system(cmd) ||
        ckpt_write_random(scratch_dir, cfg, TY_DTYPE_BF16, 2, 7, NULL, err, sizeof err)) {
      printf("FAIL writing %s: %s\n", scratch_dir, err);
      bad = 1;
      break;
    }
    tu_cut_t cut = {scratch_dir, after, 0, 0};
    ty_dtype_t dt = after % 2 ? TY_DTYPE_F32 : TY_DTYPE_BF16;
    loader_opts_t o = {.rank = 0,
                       .world_size = 1,
                       .dtype = dt,
                       .memory_efficient = true,
                       .bucket_bytes = SMALL_BUCKET,
                       .pl = &gpu,
                       .progress = tu_cut_files,
                       .progress_ctx = &cut};
    loader_shard_t *s = (loader_shard_t *)1;
    err[0] = 0;
    int rc = loader_load(scratch_dir, &o, &s, NULL, err, sizeof err);
    if (rc != TY_EDATALOSS || s || !strstr(err, "truncated") || cut.seen != after || cut.failed ||
        gpu.in_use ||
        mem_cuda_used()) {
      printf(
          "FAIL load cut after %d tensors (%s): rc %d, %d tensors loaded, %llu bytes placed, "
          "%zu held: %s\n",
          after, ty_dtype_name(dt), rc, cut.seen, (unsigned long long)gpu.in_use, mem_cuda_used(),
          err);
      bad = 1;
    }
    cuts++;
  }
  placement_t cpu;
  placement_cpu_init(&cpu);
  loader_opts_t o = {.rank = 1,
                     .world_size = 2,
                     .dtype = TY_DTYPE_F32,
                     .memory_efficient = true,
                     .bucket_bytes = SMALL_BUCKET,
                     .pl = &cpu};
  loader_shard_t *ref = NULL, *s = NULL;
  if (!bad && loader_load(intact, &o, &ref, NULL, err, sizeof err)) {
    printf("FAIL cpu load: %s\n", err);
    bad = 1;
  }
  o.pl = &gpu;
  if (!bad && loader_load(intact, &o, &s, NULL, err, sizeof err)) {
    printf("FAIL load after the cut loads: %s\n", err);
    bad = 1;
  }
  if (!bad) bad = same_shard("load after the cut loads", s, ref);
  if (!bad && placement_cuda_check(&gpu, SLACK, err, sizeof err)) {
    printf("FAIL after the cut loads: %s\n", err);
    bad = 1;
  }
  printf("%-4s %d loads cut short failed cleanly; the placement then loaded exactly\n",
         bad ? "FAIL" : "ok", cuts);
  loader_shard_free(s);
  loader_shard_free(ref);
  placement_cuda_free(&gpu);
  return bad;
}

int main(void) {
  gpu_require_device("gpu/load");
  char dir[] = "/tmp/ty-gpu-load-XXXXXX", err[1024], sub[3][300];
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  static const char *const sub_name[3] = {"bf16", "f32", "cut"}; /* two files, the cut one */
  for (int i = 0; i < 3; i++) snprintf(sub[i], sizeof sub[i], "%s/%s", dir, sub_name[i]);
  llama_config_t cfg;
  llama_config_init(&cfg);
  cfg.hidden_size = 256, cfg.intermediate_size = 688, cfg.num_hidden_layers = 3;
  cfg.num_attention_heads = 8, cfg.num_key_value_heads = 2, cfg.vocab_size = 1003;
  cfg.head_dim = 32;
  int bad = ckpt_write_random(sub[0], &cfg, TY_DTYPE_BF16, 2, 7, NULL, err, sizeof err) ||
            ckpt_write_random(sub[1], &cfg, TY_DTYPE_F32, 2, 7, NULL, err, sizeof err);
  if (bad) printf("FAIL ckpt_write_random: %s\n", err);
  /* The converted model's bytes (the standard path's full buffer). */
  ckpt_layout_t lay;
  ckpt_layout_init(&lay, &cfg);
  for (int w = 1; w <= 3 && !bad; w += 2) {
    ty_dtype_t dt = w == 1 ? TY_DTYPE_F32 : TY_DTYPE_BF16;
    uint64_t full = lay.nparams * ty_dtype_size(dt);
    for (int r = 0; r < w; r++) {
      bad |= load_one(sub[0], "bf16", w, r, dt, 1, 1 << 20, full);
      bad |= load_one(sub[0], "bf16", w, r, dt, 0, 1 << 20, full);
    }
  }
  /* Many chunks: every file dtype into every shard dtype, both paths. */
  for (int f = 0; f < 2 && !bad; f++)
    for (int d = 0; d < 2; d++) {
      ty_dtype_t dt = d ? TY_DTYPE_BF16 : TY_DTYPE_F32;
      uint64_t full = lay.nparams * ty_dtype_size(dt);
      const char *fdt = f ? "float32" : "bf16";
      bad |= load_one(sub[f], fdt, 2, 1, dt, 1, SMALL_BUCKET, full);
      bad |= load_one(sub[f], fdt, 2, 1, dt, 0, SMALL_BUCKET, full);
    }
  ckpt_layout_free(&lay);
  if (!bad) bad |= check_upload(&cfg);
  if (!bad) bad |= check_cut(sub[0], sub[2], &cfg);
  /* A device that does not exist fails with a message that says so. */
  placement_t pl;
  if (placement_cuda_init(&pl, 4096, 1 << 20, err, sizeof err) != TY_EUNAVAILABLE ||
      !strstr(err, "does not exist")) {
    printf("FAIL device 4096 was accepted or not explained: %s\n", err);
    bad = 1;
  } else {
    printf("ok   device 4096 refused: %s\n", err);
  }
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  printf("gpu/load: %s\n", bad ? "FAILED"
                               : "both paths match the CPU shards, peaks as expected, through "
                                 "many buffer turns and loads cut short");
  return bad ? 1 : 0;
}
