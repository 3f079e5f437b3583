/* bench_load.c - the GPU load bench: each rank of a world of W ranks loads
 * its shard of a checkpoint onto CUDA device 0, one rank after the other in
 * this process (so that cudaMemGetInfo sees that rank alone), by the
 * standard and by the memory-efficient path. One JSON line per (path, rank):
 * device peak by our allocator and by cudaMemGetInfo, shard bytes, host peak
 * (VmHWM of the load alone), load seconds.
 *
 * usage: bench_load CHECKPOINT_DIR WORLD [BUCKET_MB] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_util.h"
#include "worker/ckpt/loader.h"
#include "common/memstat.h"

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_load CHECKPOINT_DIR WORLD [BUCKET_MB]\n");
    return 2;
  }
  gpu_require_device("bench_load");
  const char *dir = argv[1];
  int world = atoi(argv[2]), bucket_mb = argc > 3 ? atoi(argv[3]) : 64;
  if (world < 1 || bucket_mb < 1) {
    fprintf(stderr, "bench_load: WORLD and BUCKET_MB must be positive\n");
    return 2;
  }
  char err[1024];
  int bad = 0;
  for (int eff = 0; eff <= 1; eff++)
    for (int r = 0; r < world; r++) {
      placement_t pl;
      if (placement_cuda_init(&pl, 0, (size_t)bucket_mb << 20, err, sizeof err)) {
        fprintf(stderr, "bench_load: %s\n", err);
        return 1;
      }
      loader_opts_t o = {.rank = r,
                         .world_size = world,
                         .dtype = TY_DTYPE_BF16,
                         .memory_efficient = eff,
                         .bucket_bytes = (size_t)bucket_mb << 20,
                         .pl = &pl};
      memstat_reset_peak();
      loader_shard_t *s;
      loader_stats_t st;
      if (loader_load(dir, &o, &s, &st, err, sizeof err)) {
        /* The standard path may not fit: that is a result, not a crash. */
        for (char *c = err; *c; c++)
          if (*c == '"' || *c == '\\') *c = '\'';
        printf(
            "{\"path\":\"%s\",\"world\":%d,\"rank\":%d,\"status\":\"failed\",\"message\":\"%s\"}\n",
            eff ? "memory_efficient" : "standard", world, r, err);
        placement_cuda_free(&pl);
        bad |= eff; /* the memory-efficient path must always load */
        continue;
      }
      placement_cuda_info_t ci;
      placement_cuda_info(&pl, &ci);
      int chk = placement_cuda_check(&pl, (uint64_t)64 << 20, err, sizeof err);
      printf(
          "{\"path\":\"%s\",\"world\":%d,\"rank\":%d,\"status\":\"ok\",\"shard_bytes\":%llu,"
          "\"device_peak_bytes\":%llu,\"cuda_meminfo_peak_bytes\":%llu,\"host_peak_bytes\":%llu,"
          "\"load_seconds\":%.3f,\"gb_per_s\":%.3f,\"crosscheck\":\"%s\"}\n",
          eff ? "memory_efficient" : "standard", world, r, (unsigned long long)s->bytes,
          (unsigned long long)st.device_peak_bytes, (unsigned long long)ci.driver_peak,
          (unsigned long long)st.host_peak_bytes, st.load_seconds,
          st.load_seconds > 0 ? (double)st.bytes_read / st.load_seconds / 1e9 : 0.0,
          chk ? err : "ok");
      fflush(stdout);
      bad |= chk != 0;
      loader_shard_free(s);
      placement_cuda_free(&pl);
    }
  return bad;
}
