#!/usr/bin/env bash
# train_cli.sh - LoRA training on device cuda (label gpu). The worker trains
# on one GPU from a generated checkpoint with the same spec and batches as
# on the CPU: float32 weights give the CPU's per-step losses up to summation
# order (1e-3 relative), and the adapter it writes evaluates like the CPU's;
# bfloat16 weights train too (the loss falls). Its reports carry the load's
# device peak. Training every weight (float32, one GPU, AdamW on the GPU,
# the output head over the tokens in chunks) gives the CPU's per-step
# losses likewise, and resumed from its step-10 checkpoint (the head whole)
# repeats its steps 11-20. Where two GPUs are visible, `trainyard
# train --world_size 2 --device cuda` (NCCL, each rank its shard, units
# gathered as the passes go; for every weight, gradients reduce-scattered
# into the shards) gives the one-GPU runs' losses for the same global batch,
# LoRA and every weight, and the model gathered from the shards evaluates
# alike. Exits 77 (a ctest skip), saying why, where no GPU is visible.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 20000
"$ty" mkmodel --out "$tmp/base" --hidden-size 128 --intermediate-size 256 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --dtype bf16 --seed 3 >/dev/null

run() { # NAME DEVICE DTYPE [USE_LORA [CHECKPOINT_EVERY]]
  cat >"$tmp/$1.json" <<JSON
{"name": "gpu-$1", "model_path": "$tmp/base", "use_lora": ${4:-true}, "lora_rank": 8,
 "lora_alpha": 16, "target_modules": "all-linear", "device": "$2", "dtype": "$3",
 "fsdp": {"memory_efficient_load": true, "bucket_mb": 1},
 "data": {"path": "$data", "format": "text", "seq_len": 64},
 "train": {"steps": 20, "micro_batch_size": 4, "grad_accum": 2, "lr": 3e-3, "warmup_steps": 3,
           "checkpoint_every": ${5:-0}},
 "output_dir": "$tmp/out-$1"}
JSON
  TRAINYARD_SPEC="$tmp/$1.json" "$worker" >"$tmp/$1.reports" 2>"$tmp/$1.log"
}
# same_eval WHAT ARGS-A... -- ARGS-B...: `trainyard eval` (CPU) of both on
# the same held-out batches agrees within 1e-3.
same_eval() {
  local what=$1 a=() b=()
  shift
  while [ "$1" != -- ]; do a+=("$1"); shift; done
  shift
  b=("$@")
  local ev=(--data "$data" --seq_len 64 --batches 8) ra rb
  ra=$("$ty" eval "${a[@]}" "${ev[@]}")
  rb=$("$ty" eval "${b[@]}" "${ev[@]}")
  echo "# eval (CPU) of $what: $ra, $rb"
  python3 -c "
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert abs(a['loss'] - b['loss']) < 1e-3 * max(1, b['loss']), (a, b)" "$ra" "$rb"
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
# Its output head runs over the 256 tokens in chunks of 100 rows (logits
# recomputed in the backward pass); the resume below runs it whole.
TRAINYARD_HEAD_ROWS=100 run fullgpu cuda float32 false 10 ||
  { cat "$tmp/fullgpu.log" >&2; fail "full training on the GPU failed"; }
run fullcpu cpu float32 false || { cat "$tmp/fullcpu.log" >&2; fail "full training on the CPU failed"; }

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
fg, fc = losses(reports("fullgpu")), losses(reports("fullcpu"))
assert len(fg) == len(fc) == 20, (len(fg), len(fc))
worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(fg, fc))
print("# every weight, fp32 GPU vs CPU: 20 step losses, worst relative difference %.2e" % worst)
assert worst < 1e-3, list(zip(fg, fc))
done = gpu[-1]
assert done["phase"] == "done" and done["device_peak_bytes"] > 0, done
# The load's report says the device's training buffers a rank holds.
import re
said = [r["message"] for r in gpu if r["message"].startswith("weights loaded onto the GPU")]
m = re.fullmatch(r"weights loaded onto the GPU; training buffers ([0-9.]+) MiB a rank", said[0])
assert m and float(m.group(1)) > 0, said
print("# " + said[0])
print("# GPU run: device peak %.1f MiB (load, or training: shard + activations); %s" % (done["device_peak_bytes"] / 2**20,
                                                     done["message"]))
PY
# The full GPU run left its step-10 checkpoint: the same spec in a copy of
# its output_dir resumes there (the weights and AdamW's moments go back up
# to the GPU) and repeats the uninterrupted run's steps 11-20.
cp -r "$tmp/out-fullgpu" "$tmp/out-resume"
sed "s|out-fullgpu|out-resume|" "$tmp/fullgpu.json" >"$tmp/resume.json"
TRAINYARD_SPEC="$tmp/resume.json" "$worker" >"$tmp/resume.reports" 2>"$tmp/resume.log" ||
  { cat "$tmp/resume.log" >&2; fail "resuming full training on the GPU failed"; }
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def steps(name):
    reps = [json.loads(l) for l in open(f"{tmp}/{name}.reports")]
    return reps, {r["step"]: r["loss"] for r in reps if r["phase"] == "training"}
reps, resumed = steps("resume")
_, whole = steps("fullgpu")
assert any("resumed from the checkpoint of step 10" in r["message"] for r in reps), reps[:3]
assert sorted(resumed) == list(range(11, 21)), sorted(resumed)
worst = max(abs(resumed[k] - whole[k]) / max(1.0, abs(whole[k])) for k in resumed)
print("# every weight on the GPU, resumed at step 10: steps 11-20 vs the uninterrupted run, "
      "worst relative difference %.2e" % worst)
assert worst < 1e-5, [(k, resumed[k], whole[k]) for k in sorted(resumed)]
PY
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# The simulated device (a TRAINYARD_CUDA=SIM build) shows TY_SIM_GPUS of them.
[ -e "$bin/cudasim/libty_cudasim.so" ] && ngpu=${TY_SIM_GPUS:-2}
if [ "${ngpu:-0}" -ge 2 ]; then
  # The same global batch (8 windows a step) as the one-GPU runs: 2 x 4 x 1;
  # adapters, then every weight (the host keeps each rank's shards).
  for what in lora full; do
    lora_args=(--use_lora false)
    [ $what = lora ] && lora_args=(--use_lora true --lora_rank 8 --lora_alpha 16 --target_modules all-linear)
    "$ty" train --model_path "$tmp/base" "${lora_args[@]}" --device cuda --dtype float32 \
      --world_size 2 --fsdp.memory_efficient_load true --fsdp.bucket_mb 1 --data.path "$data" \
      --data.format text --data.seq_len 64 --train.steps 20 --train.micro_batch_size 4 \
      --train.grad_accum 1 --train.lr 3e-3 --train.warmup_steps 3 --output_dir "$tmp/out-w2-$what" \
      --json >"$tmp/w2-$what.out" 2>"$tmp/w2-$what.log" ||
      { cat "$tmp/w2-$what.log" >&2; fail "$what over 2 GPUs failed"; }
  done
  python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
for what, one in (("lora", "gpu"), ("full", "fullgpu")):
    w1 = [json.loads(l) for l in open(f"{tmp}/{one}.reports")]
    w2 = [json.loads(l) for l in open(f"{tmp}/w2-{what}.out")]
    l1 = [r["loss"] for r in w1 if r["phase"] == "training" and r["loss"] is not None]
    l2 = [r["loss"] for r in w2 if r["rank"] == 0 and r["phase"] == "training" and r["loss"] is not None]
    assert len(l1) == len(l2) == 20, (what, len(l1), len(l2))
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(l2, l1))
    print("# %s, fp32 2 GPUs (sharded) vs 1 GPU: 20 step losses, worst relative difference %.2e"
          % (what, worst))
    assert worst < 1e-4, (what, list(zip(l2, l1)))
PY
  # The model both GPUs trained, gathered from their shards, evaluates like the one GPU's.
  same_eval "every weight trained over 2 GPUs, and on one" --model_path "$tmp/out-w2-full" -- \
    --model_path "$tmp/out-fullgpu"
else
  echo "# world size 2 on GPUs: not run, this host shows ${ngpu:-0} GPU (NCCL needs one per rank);"
  echo "# gpu/fsdp checks the sharded passes through NCCL at world size 1"
fi
same_eval "the adapters trained on the GPU, and on the CPU" --model_path "$tmp/base" \
  --adapter "$tmp/out-gpu" -- --model_path "$tmp/base" --adapter "$tmp/out-cpu"
# The fully trained checkpoints, written from the host's copy, evaluate alike.
same_eval "the fully trained models, GPU and CPU" --model_path "$tmp/out-fullgpu" -- \
  --model_path "$tmp/out-fullcpu"
echo "ok"
