#!/usr/bin/env bash
# train_cli.sh - LoRA training on device cuda (label gpu). The worker trains
# on one GPU from a generated checkpoint with the same spec and batches as
# on the CPU: float32 weights give the CPU's per-step losses up to summation
# order (1e-3 relative), and the adapter it writes evaluates like the CPU's;
# bfloat16 weights train too (the loss falls). Its reports carry the load's
# device peak. Exits 77 (a ctest skip), saying why, where no GPU is visible.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 20000
"$ty" mkmodel --out "$tmp/base" --hidden-size 128 --intermediate-size 256 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --dtype bf16 --seed 3 >/dev/null

run() { # NAME DEVICE DTYPE
  cat >"$tmp/$1.json" <<JSON
{"name": "gpu-$1", "model_path": "$tmp/base", "use_lora": true, "lora_rank": 8,
 "lora_alpha": 16, "target_modules": "all-linear", "device": "$2", "dtype": "$3",
 "fsdp": {"memory_efficient_load": true, "bucket_mb": 1},
 "data": {"path": "$data", "format": "text", "seq_len": 64},
 "train": {"steps": 20, "micro_batch_size": 4, "grad_accum": 2, "lr": 1e-2, "warmup_steps": 3},
 "output_dir": "$tmp/out-$1"}
JSON
  TRAINYARD_SPEC="$tmp/$1.json" "$worker" >"$tmp/$1.reports" 2>"$tmp/$1.log"
}
rc=0
run gpu cuda float32 || rc=$?
if [ $rc -ne 0 ]; then
  if grep -q 'no CUDA device is visible' "$tmp/gpu.reports"; then
    echo "SKIP gpu/train: $(grep -o 'device cuda: no CUDA device[^"]*' "$tmp/gpu.reports" | head -1)"
    exit 77
  fi
  cat "$tmp/gpu.log" >&2
  fail "LoRA training on the GPU failed"
fi
run cpu cpu float32 || { cat "$tmp/cpu.log" >&2; fail "the CPU run failed"; }
run bf16 cuda bfloat16 || { cat "$tmp/bf16.log" >&2; fail "the bf16 GPU run failed"; }

python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def reports(name):
    return [json.loads(l) for l in open(f"{tmp}/{name}.reports")]
def losses(reps):
    return [r["loss"] for r in reps if r["phase"] == "training" and r["loss"] is not None]
gpu, cpu, bf16 = reports("gpu"), reports("cpu"), reports("bf16")
lg, lc, lb = losses(gpu), losses(cpu), losses(bf16)
assert len(lg) == len(lc) == len(lb) == 20, (len(lg), len(lc), len(lb))
worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(lg, lc))
print("# fp32 GPU vs CPU: 20 step losses, worst relative difference %.2e" % worst)
assert worst < 1e-3, list(zip(lg, lc))
assert lb[-1] < lb[0], lb
print("# bf16 GPU: loss %.4f -> %.4f (CPU fp32 %.4f -> %.4f)" % (lb[0], lb[-1], lc[0], lc[-1]))
done = gpu[-1]
assert done["phase"] == "done" and done["device_peak_bytes"] > 0, done
print("# GPU run: device peak %.1f MiB at load; %s" % (done["device_peak_bytes"] / 2**20,
                                                     done["message"]))
PY
ev=("$ty" eval --model_path "$tmp/base" --data "$data" --seq_len 64 --batches 8)
with_gpu=$("${ev[@]}" --adapter "$tmp/out-gpu")
with_cpu=$("${ev[@]}" --adapter "$tmp/out-cpu")
echo "# eval (CPU) of the adapters: trained on the GPU $with_gpu, on the CPU $with_cpu"
python3 -c "
import json, sys
g, c = json.loads('''$with_gpu'''), json.loads('''$with_cpu''')
assert abs(g['loss'] - c['loss']) < 1e-3 * max(1, c['loss']), (g, c)"
echo "ok"
