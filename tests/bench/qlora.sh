#!/usr/bin/env bash
# qlora.sh - QLoRA against bfloat16 LoRA, both measured in one run on this
# machine: a Llama-3.1-8B-shaped checkpoint (`trainyard mkmodel --like
# llama-3.1-8b --layers L`, bfloat16), 2 CPU ranks, the memory-efficient
# load, LoRA on all seven projections at micro-batch 1 x T 256; for each
# side the per-rank host peak (VmHWM), the load time and the steady
# step's tokens/s (the last step's; the first warms up), and their ratios
# against the issue's targets; then what the host-memory rule says a rank
# of the whole 8B and 70B models holds on 1 to 8 ranks.
#   tests/bench/qlora.sh [BUILD_DIR] [LAYERS] [STEPS]
# (defaults: build, 8 layers, 3 steps). The checkpoint is kept in
# $TRAINYARD_BENCH_DIR (default /var/tmp/trainyard-bench) for the next run.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
layers=${2:-8}
steps=${3:-3}
ty="$build/cli/trainyard"
work=${TRAINYARD_BENCH_DIR:-/var/tmp/trainyard-bench}
model="$work/llama-3.1-8b-L$layers-bf16"
mkdir -p "$work"
if [ ! -f "$model/config.json" ]; then
  echo "== making $model"
  "$ty" mkmodel --like llama-3.1-8b --layers "$layers" --dtype bf16 --out "$model.part" >/dev/null
  mv "$model.part" "$model"
fi
data="$work/words.txt"
python3 - "$data" <<'PY'
import random, sys
r = random.Random(1)
w = 'the cat sat on a mat and dog ran to house with red door'.split()
open(sys.argv[1], 'w').write(' '.join(r.choice(w) for _ in range(40000)))
PY

run() { # NAME ARGS...
  local name=$1
  shift
  echo "== $name" >&2
  rm -rf "$work/out-$name"
  "$ty" train --model_path "$model" --use_lora true --dtype bfloat16 --world_size 2 \
    --fsdp.memory_efficient_load true --target_modules all-linear --lora_rank 16 \
    --data.path "$data" --data.seq_len 256 --data.eval_fraction 0 --train.micro_batch_size 1 \
    --train.steps "$steps" --output_dir "$work/out-$name" --json "$@" >"$work/$name.jsonl"
}
# Where the float32 side cannot fit this host, trainyard train refuses it
# before a rank starts (rule host-memory): that refusal is its row.
run lora 2>"$work/lora.err" || { grep -h 'host\|memory' "$work/lora.err" | head -3; : >"$work/lora.jsonl"; }
run qlora --quantization.load_in_4bit true --quantization.bnb_4bit_use_double_quant true

python3 - "$work/lora.jsonl" "$work/qlora.jsonl" "$layers" <<'PY'
import json, sys
def figures(path):
    peak, load, tps = {0: 0}, {0: 0.0}, {}
    for line in open(path):
        r = json.loads(line)
        k = r["rank"]
        peak[k] = max(peak.get(k, 0), r.get("host_peak_bytes") or 0)
        if r.get("load_seconds"):
            load[k] = r["load_seconds"]
        if r["phase"] == "training" and r.get("tokens_per_s"):
            tps[k] = r["tokens_per_s"]
    return max(peak.values()), max(load.values()), sum(tps.values()) or float("nan")
q = figures(sys.argv[2])
lo = figures(sys.argv[1]) if open(sys.argv[1]).read().strip() else None
gib = 1024 ** 3
if lo is None:
    print(f"\nLlama-3.1-8B shape, {sys.argv[3]} layers: LoRA refused on this host (above); QLoRA "
          f"(nf4, double quant): host peak a rank {q[0] / gib:.2f} GiB, load {q[1]:.1f} s, "
          f"{q[2]:.1f} tokens/s")
    sys.exit(0)
print(f"\nLlama-3.1-8B shape, {sys.argv[3]} layers, bfloat16 checkpoint, 2 CPU ranks, "
      "memory-efficient load, T 256, micro-batch 1, rank 16 on all seven projections")
print("figure | LoRA (bfloat16) | QLoRA (nf4, double quant) | ratio | target")
print(f"host peak a rank (VmHWM) | {lo[0] / gib:.2f} GiB | {q[0] / gib:.2f} GiB | "
      f"x{q[0] / lo[0]:.2f} | <= x0.35 (the whole model)")
print(f"load time | {lo[1]:.1f} s | {q[1]:.1f} s | x{q[1] / lo[1]:.2f} | (info)")
print(f"tokens/s (the job, last step) | {lo[2]:.1f} | {q[2]:.1f} | x{q[2] / lo[2]:.2f} | >= x0.70")
PY
for m in llama-3.1-8b llama-3.1-70b; do
  mkdir -p "$work/paper-$m"
  cp "tests/data/configs/$m.json" "$work/paper-$m/config.json"
  echo
  echo "$m on paper (the host-memory rule; memory-efficient load, 1 x 256 tokens a rank):"
  "$build/tests/qlora_paper" "$work/paper-$m" 256
done
