/* cmd_convert.c - trainyard convert: any checkpoint trainyard reads
 * (safetensors or PyTorch, single or sharded, a folder or one file with
 * config.json beside it) written again as a safetensors checkpoint,
 * streamed, with its projections 4-bit in bitsandbytes' layout if asked,
 * or from that layout back to floats (worker/ckpt/ckpt_convert.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/numbers.h"
#include "worker/ckpt/ckpt_convert.h"
#include "common/memstat.h"

static void convert_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard convert --model_path DIR|FILE --out DIR [--dtype f32|bf16|f16]\n"
          "                         [--shard_mb N] [--quantize nf4|fp4 [--double_quant]]\n"
          "                         [--dequantize]\n"
          "Reads a checkpoint (config.json + model.safetensors or pytorch_model.bin, their\n"
          "sharded forms with an index, or one .safetensors/.bin/.pt/.pth file with\n"
          "config.json beside it; PyTorch pickles are read without running them) and\n"
          "writes DIR/config.json + DIR/model.safetensors, or with --shard_mb files of at\n"
          "most N MiB (model-0000i-of-0000N.safetensors + model.safetensors.index.json).\n"
          "--dtype converts every tensor (and config.json's torch_dtype); by default each\n"
          "keeps its own. Streams a few MiB at a time; DIR must hold no checkpoint yet.\n"
          "--quantize writes each layer's seven projections (q/k/v/o/gate/up/down_proj)\n"
          "4-bit in bitsandbytes' layout, as transformers saves a load_in_4bit model\n"
          "(codes, absmax, quant_map, quant_state; config.json's quantization_config);\n"
          "--double_quant quantizes their block maxima again (bnb_4bit_use_double_quant).\n"
          "Embeddings, norms, lm_head and biases stay as they are. A projection is held\n"
          "whole in fp32 while it is quantized.\n"
          "--dequantize reads such a 4-bit checkpoint, checking every component, and\n"
          "writes its weights as floats (in --dtype, or the dtype each was quantized from).\n");
}

int cmd_convert(int argc, char **argv) {
  const char *src = NULL, *out = NULL;
  convert_opts_t o = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      convert_usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--double_quant") || !strcmp(a, "--double-quant")) {
      o.double_quant = true;
      continue;
    }
    if (!strcmp(a, "--dequantize")) {
      o.dequantize = true;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "trainyard convert: %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    long mb;
    if (!strcmp(a, "--model_path") || !strcmp(a, "--model-path")) {
      src = v;
    } else if (!strcmp(a, "--out")) {
      out = v;
    } else if (!strcmp(a, "--dtype")) {
      if (ty_dtype_parse(v, &o.dtype)) {
        fprintf(stderr, "trainyard convert: --dtype wants f32, bf16 or f16, got '%s'\n", v);
        return 2;
      }
      o.set_dtype = true;
    } else if (!strcmp(a, "--quantize")) {
      if (q4_type_parse(v, &o.q4_type)) {
        fprintf(stderr, "trainyard convert: --quantize wants nf4 or fp4, got '%s'\n", v);
        return 2;
      }
      o.quantize = true;
    } else if (!strcmp(a, "--shard_mb") || !strcmp(a, "--shard-mb")) {
      if (!ty_parse_long(v, 1, 1L << 30, &mb)) {
        fprintf(
            stderr,
            "trainyard convert: --shard_mb wants a whole number of MiB in [1, 2^30], got '%s'\n",
            v);
        return 2;
      }
      o.shard_bytes = (uint64_t)mb << 20;
    } else {
      fprintf(stderr, "trainyard convert: unknown flag '%s'\n\n", a);
      convert_usage(stderr);
      return 2;
    }
  }
  if (!src || !out) {
    fprintf(stderr, "trainyard convert: --model_path and --out are required\n\n");
    convert_usage(stderr);
    return 2;
  }
  if (o.double_quant && !o.quantize) {
    fprintf(stderr, "trainyard convert: --double_quant goes with --quantize nf4|fp4\n");
    return 2;
  }
  if (o.quantize && o.dequantize) {
    fprintf(stderr, "trainyard convert: --quantize and --dequantize exclude each other\n");
    return 2;
  }
  char err[1024];
  convert_stats_t s;
  double t0 = ty_mono_s();
  if (ckpt_convert(src, out, &o, &s, err, sizeof err)) {
    fprintf(stderr, "trainyard convert: %s\n", err);
    return 1;
  }
  memstat_t m;
  memstat_read(&m);
  printf(
      "wrote %s: %zu tensors, %.1f MiB in %zu file%s from %.1f MiB read, in %.2f s, "
      "host peak %.1f MiB\n",
      out, s.tensors, (double)s.bytes_written / 1048576.0, s.files,
      s.files > 1 ? "s (+ index)" : "", (double)s.bytes_read / 1048576.0, ty_mono_s() - t0,
      (double)m.hwm_bytes / 1048576.0);
  if (s.q4_weights && o.quantize)
    printf(
        "quantized %zu weights (%s%s): %.2f MiB as floats -> %.2f MiB 4-bit with their "
        "statistics\n",
        s.q4_weights, q4_type_name(o.q4_type), o.double_quant ? ", double quant" : "",
        (double)s.q4_float_bytes / 1048576.0, (double)s.q4_bytes / 1048576.0);
  else if (s.q4_weights)
    printf(
        "dequantized %zu weights: %.2f MiB 4-bit with their statistics -> %.2f MiB as "
        "floats\n",
        s.q4_weights, (double)s.q4_bytes / 1048576.0, (double)s.q4_float_bytes / 1048576.0);
  return 0;
}
