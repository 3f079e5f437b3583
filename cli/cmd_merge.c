/* cmd_merge.c - trainyard merge: a LoRA adapter merged into its base
 * checkpoint, written as a Hugging Face checkpoint tensor by tensor
 * (worker/ckpt/merge.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "worker/ckpt/merge.h"
#include "common/memstat.h"

static void merge_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard merge --model_path DIR|FILE --adapter DIR --out DIR\n"
          "                       [--dtype float32|bfloat16|float16] [--shard_mb N]\n"
          "Merges a LoRA adapter (adapter_config.json + adapter_model.safetensors, as a\n"
          "trainyard LoRA job or PEFT writes them) into its base checkpoint (safetensors or\n"
          "PyTorch files): each adapted projection becomes W + (lora_alpha / r) * B @ A,\n"
          "every other tensor is copied. Writes DIR/config.json, DIR/model.safetensors (or,\n"
          "past --shard_mb, files of at most that many MiB with model.safetensors.index.json;\n"
          "default 5120, as Hugging Face's save_pretrained; 0: one file) and the base's\n"
          "tokenizer and generation_config files, as DIR.partial renamed onto\n"
          "DIR when whole; DIR must not exist. --dtype sets every tensor's dtype (and\n"
          "config.json's torch_dtype); by default each keeps the base's. The host holds\n"
          "about the largest adapted tensor in float32 and the adapter, never the model.\n"
          "Prints one JSON line of figures.\n");
}

int cmd_merge(int argc, char **argv) {
  const char *src = NULL, *adapter = NULL, *out = NULL;
  merge_opts_t o = {.shard_bytes = MERGE_SHARD_BYTES};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      merge_usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "trainyard merge: %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--model_path") || !strcmp(a, "--model-path")) {
      src = v;
    } else if (!strcmp(a, "--adapter")) {
      adapter = v;
    } else if (!strcmp(a, "--out")) {
      out = v;
    } else if (!strcmp(a, "--dtype")) {
      if (ty_dtype_parse(v, &o.dtype)) {
        fprintf(stderr, "trainyard merge: --dtype wants float32, bfloat16 or float16, got '%s'\n",
                v);
        return 2;
      }
      o.set_dtype = true;
    } else if (!strcmp(a, "--shard_mb") || !strcmp(a, "--shard-mb")) {
      char *end;
      long long mb = strtoll(v, &end, 10);
      if (*end || end == v || mb < 0 || mb > (1LL << 30)) {
        fprintf(stderr,
                "trainyard merge: --shard_mb wants a whole number of MiB in [0, 2^30] (0: one "
                "file), got '%s'\n",
                v);
        return 2;
      }
      o.shard_bytes = (uint64_t)mb << 20;
    } else {
      fprintf(stderr, "trainyard merge: unknown flag '%s'\n\n", a);
      merge_usage(stderr);
      return 2;
    }
  }
  if (!src || !adapter || !out) {
    fprintf(stderr, "trainyard merge: --model_path, --adapter and --out are required\n\n");
    merge_usage(stderr);
    return 2;
  }
  char err[2048];
  merge_stats_t s;
  double t0 = ty_mono_s();
  if (ckpt_merge_dir(src, adapter, out, &o, &s, err, sizeof err)) {
    fprintf(stderr, "trainyard merge: %s\n", err);
    return 1;
  }
  if (s.dequantized)
    fprintf(stderr,
            "trainyard merge: the base is a bitsandbytes 4-bit checkpoint: its weights were "
            "dequantized (as peft's merge_and_unload does) and %s holds them as floats\n",
            out);
  memstat_t m;
  memstat_read(&m);
  json_t *j =
      json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "out", out, "tensors",
                (json_int_t)s.tensors, "merged", (json_int_t)s.merged, "files", (json_int_t)s.files,
                "files_copied", (json_int_t)s.files_copied, "bytes_written",
                (json_int_t)s.bytes_written, "largest_merged_bytes", (json_int_t)s.largest_tensor,
                "host_peak_bytes", (json_int_t)m.hwm_bytes, "seconds", ty_mono_s() - t0);
  char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (line) printf("%s\n", line);
  free(line);
  json_decref(j);
  return line ? 0 : 1;
}
