#!/usr/bin/env bash
# train.sh - training throughput benchmark (label bench, not run by CI):
#   1. tokens/s and achieved GFLOP/s of full and LoRA training of a
#      ~100M-parameter Llama at seq_len 256, beside OpenBLAS sgemm on the
#      model's own shapes (tests/bench/train_bench.c);
#   2. `trainyard train` of the same model with 1 and 2 ranks (FSDP over
#      shm) on the same global batch: median step time and tokens/s.
#   tests/bench/train.sh [steps] [micro_batch_size]
# Needs a release build (TRAINYARD_BIN_DIR, default build/).
set -euo pipefail
bin=${TRAINYARD_BIN_DIR:-$(dirname "$0")/../../build}
steps=${1:-4}
mbs=${2:-2}
"$bin/tests/train_bench" "$steps" "$mbs"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model='{"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 12, "vocab_size": 8192,
        "max_position_embeddings": 1024}'
for mode in full lora; do
  for w in 1 2; do
    if [ "$mode" = lora ]; then
      # LoRA needs a checkpoint: the from-scratch model of the full run.
      [ -s "$tmp/full-1/model.safetensors" ] || continue
      args=(--model_path "$tmp/full-1" --use_lora true --lora_rank 16 --lora_alpha 32
            --target_modules all-linear --fsdp.memory_efficient_load true)
    else
      args=(--init_from_scratch true --model "$model")
    fi
    # No data.path: the built-in corpus. Global batch = mbs windows.
    "$bin/cli/trainyard" train "${args[@]}" --world_size "$w" --data.seq_len 256 \
      --data.eval_fraction 0 --train.steps "$steps" --train.micro_batch_size $((mbs / w)) \
      --output_dir "$tmp/$mode-$w" --json >"$tmp/$mode-$w.out" 2>"$tmp/$mode-$w.log" ||
      { tail -5 "$tmp/$mode-$w.log" >&2; exit 1; }
    python3 - "$tmp/$mode-$w.out" "$mode" "$w" "$mbs" <<'PY'
import json, statistics, sys
path, mode, world, mbs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
reps = [json.loads(l) for l in open(path)]
steps = {}
for r in reps:
    if r["phase"] == "training" and r["loss"] is not None and r["tokens_per_s"] > 0:
        steps.setdefault(r["step"], []).append(r["tokens_per_s"])
# Skip the first step (warm-up); a step's time is its slowest rank's.
tok_per_rank = mbs // world * 256
times = [tok_per_rank / min(v) for s, v in sorted(steps.items()) if s > 1]
t = statistics.median(times)
peak = max(r["host_peak_bytes"] for r in reps)
print(json.dumps({"bench": "train_ranks", "mode": mode, "world_size": world,
                  "global_batch_tokens": mbs * 256, "step_s": round(t, 3),
                  "tokens_per_s": round(mbs * 256 / t, 1),
                  "host_peak_mib_per_rank": round(peak / 2**20)}))
PY
  done
done
