/* qlora_paper.c - what the host-memory rule (api/jobspec_server.c, rule
 * host-memory) says one CPU rank of a LoRA job holds at least, in float32
 * and with the base's projections in 4 bits, for a published config.json
 * over 1, 2, 4 and 8 ranks (memory-efficient load, micro-batch 1 x T):
 *   qlora_paper CONFIG_DIR T
 * prints a row per world size: ranks, LoRA GiB, QLoRA (nf4) GiB, QLoRA
 * with double quantization GiB, the ratio. tests/bench/qlora.sh calls it;
 * the figures are the rule's, the same the job's submit is checked by. */
#include <stdio.h>
#include <stdlib.h>

#include "api/jobspec.h"

static double rank_gib(const char *dir, int T, int world, bool q4, bool dq) {
  jobspec_t s;
  jobspec_init(&s);
  snprintf(s.model_path, sizeof s.model_path, "%s", dir);
  s.use_lora = true;
  s.world_size = world;
  s.world_size_given = true;
  s.fsdp.memory_efficient_load = true;
  s.train.micro_batch_size = 1;
  s.data.seq_len = T;
  s.quantization.load_in_4bit = q4;
  s.quantization.bnb_4bit_use_double_quant = dq;
  return (double)jobspec_rank_host_bytes(&s) / (1024.0 * 1024.0 * 1024.0);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: qlora_paper CONFIG_DIR T\n");
    return 2;
  }
  const int T = atoi(argv[2]);
  printf("ranks | LoRA float32 GiB/rank | QLoRA nf4 GiB/rank | QLoRA nf4+dq GiB/rank | ratio\n");
  for (int w = 1; w <= 8; w *= 2) {
    const double f = rank_gib(argv[1], T, w, false, false), q = rank_gib(argv[1], T, w, true, false),
                 d = rank_gib(argv[1], T, w, true, true);
    if (f <= 0) {
      fprintf(stderr, "qlora_paper: %s/config.json cannot be read\n", argv[1]);
      return 1;
    }
    printf("%d | %.2f | %.2f | %.2f | x%.2f\n", w, f, q, d, d / f);
  }
  return 0;
}
