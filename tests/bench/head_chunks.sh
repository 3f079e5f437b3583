#!/usr/bin/env bash
# head_chunks.sh - what computing the output head in chunks of rows costs
# and saves on CPU ranks (label bench, not run by CI): LoRA and full
# training of a 2-layer Llama with Llama 3's 128,256-entry vocabulary (hidden 256,
# seq_len 512, micro-batch 2: 1,024 tokens, whose whole logits take 501
# MiB), the head whole (TRAINYARD_HEAD_ROWS=1024), in the default chunks
# (256 MiB: 2 chunks) and in chunks of 128 rows (8), taken in turn twice
# (A B C A B C, so that a noisy machine hits all alike): each run's median
# step time after the first step, its host peak and final loss, then the
# ratios against the whole head.
#   tests/bench/head_chunks.sh [steps]
# Needs a release build (TRAINYARD_BIN_DIR, default build/).
set -euo pipefail
bin=${TRAINYARD_BIN_DIR:-$(dirname "$0")/../../build}
steps=${1:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/cli/trainyard" mkmodel --out "$tmp/base" --hidden-size 256 --intermediate-size 688 \
  --layers 2 --heads 4 --kv-heads 2 --vocab-size 128256 --seed 1 >/dev/null
data=/usr/share/common-licenses/GPL-3
for run in 1 2; do
  for lora in true false; do
    for rows in 1024 default 128; do
      env_rows=()
      [ "$rows" = default ] || env_rows=(TRAINYARD_HEAD_ROWS="$rows")
      out="$tmp/$lora-$rows-$run"
      env "${env_rows[@]}" "$bin/cli/trainyard" train --model_path "$tmp/base" --use_lora "$lora" \
        --data.path "$data" --data.seq_len 512 --data.eval_fraction 0 --train.steps "$steps" \
        --train.micro_batch_size 2 --output_dir "$out.dir" --json >"$out.out" 2>"$out.log" ||
        { tail -5 "$out.log" >&2; exit 1; }
    done
  done
done
python3 - "$tmp" <<'PY'
import json, statistics, sys
tmp = sys.argv[1]
def run(lora, rows, n):
    reps = [json.loads(l) for l in open(f"{tmp}/{lora}-{rows}-{n}.out")]
    tr = [r for r in reps if r["phase"] == "training"]
    done = [r for r in reps if r["phase"] == "done"][0]
    secs = [2 * 512 / r["tokens_per_s"] for r in tr[1:]]
    return statistics.median(secs), done["host_peak_bytes"], tr[-1]["loss"]
print(f"{'use_lora':<9} {'head rows':<10} {'run':>3} {'s/step':>7} {'host peak MiB':>13} {'loss':>9}")
res = {}
for n in (1, 2):
    for lora in ("true", "false"):
        for rows in ("1024", "default", "128"):
            s, peak, loss = run(lora, rows, n)
            res[(lora, rows, n)] = (s, peak, loss)
            print(f"{lora:<9} {rows:<10} {n:>3} {s:>7.3f} {peak / 2**20:>13.1f} {loss:>9.5f}")
for n in (1, 2):
    for lora in ("true", "false"):
        w = res[(lora, "1024", n)]
        for rows in ("default", "128"):
            c = res[(lora, rows, n)]
            print(f"run {n} use_lora {lora}: {rows} / whole: step time x{c[0] / w[0]:.2f}, "
                  f"host peak x{c[1] / w[1]:.2f}, loss differs by {abs(c[2] - w[2]):.1e}")
PY
