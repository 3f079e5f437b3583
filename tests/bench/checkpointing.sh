#!/usr/bin/env bash
# checkpointing.sh - what gradient_checkpointing costs and saves on CPU ranks
# (label bench, not run by CI): LoRA over a 16-layer Llama (hidden 512,
# seq_len 512, micro-batch 4, one rank), runs without and with it taken in
# turn (A B A B, so that a noisy machine hits both alike): each run's
# median step time after the first step, its host peak and final loss, then
# the ratios with/without.
#   tests/bench/checkpointing.sh [steps]
# Needs a release build (TRAINYARD_BIN_DIR, default build/).
set -euo pipefail
bin=${TRAINYARD_BIN_DIR:-$(dirname "$0")/../../build}
steps=${1:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/cli/trainyard" mkmodel --out "$tmp/base" --hidden-size 512 --intermediate-size 1376 \
  --layers 16 --heads 8 --kv-heads 4 --vocab-size 4096 --seed 1 >/dev/null
for run in 1 2; do
  for ck in false true; do
    "$bin/cli/trainyard" train --model_path "$tmp/base" --use_lora true --lora_rank 16 \
      --target_modules all-linear --gradient_checkpointing "$ck" --data.seq_len 512 \
      --data.eval_fraction 0 --train.steps "$steps" --train.micro_batch_size 4 \
      --output_dir "$tmp/out-$ck-$run" --json >"$tmp/$ck-$run.out" 2>"$tmp/$ck-$run.log" ||
      { tail -5 "$tmp/$ck-$run.log" >&2; exit 1; }
  done
done
python3 - "$tmp" "$steps" <<'PY'
import json, statistics, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
def run(ck, n):
    reps = [json.loads(l) for l in open(f"{tmp}/{ck}-{n}.out")]
    tr = [r for r in reps if r["phase"] == "training"]
    done = [r for r in reps if r["phase"] == "done"][0]
    # tokens/s of each step after the first -> seconds a step
    tok = 4 * 512
    secs = [tok / r["tokens_per_s"] for r in tr[1:]]
    return statistics.median(secs), done["host_peak_bytes"], tr[-1]["loss"]
print(f"{'gradient_checkpointing':<23} {'run':>3} {'s/step':>7} {'host peak MiB':>13} {'loss':>9}")
res = {}
for n in (1, 2):
    for ck in ("false", "true"):
        s, peak, loss = run(ck, n)
        res.setdefault(ck, []).append((s, peak, loss))
        print(f"{ck:<23} {n:>3} {s:>7.2f} {peak / 2**20:>13.1f} {loss:>9.5f}")
for n in (0, 1):
    a, b = res["false"][n], res["true"][n]
    print(f"run {n + 1}: with/without: step time x{b[0] / a[0]:.2f}, host peak x{b[1] / a[1]:.2f}, "
          f"same loss: {a[2] == b[2]}")
PY
