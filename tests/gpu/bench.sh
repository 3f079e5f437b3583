#!/usr/bin/env bash
# bench.sh BUILD OUTDIR - the GPU bench (run by tests/gpu/run.sh on a GPU
# host): ours against PyTorch on one GPU, side by side in one run, the same
# checkpoint and batch, and a verdict against the targets. The checkpoint is
# Llama-3.2-1B's published configuration (`trainyard mkmodel --like
# llama-3.2-1b`: C 2048, FF 8192, 16 layers, 32 heads, 8 kv heads, vocab
# 128,256, tied embeddings, llama3 rope scaling; 1.24B parameters) in bf16
# with seeded weights; batches of B 4 x T 2048 tokens, LoRA rank 16.
# First what the verdict needs, then the rest:
#   load   per-rank device peak, standard against memory-efficient, for 1 and
#          2 ranks (bench_load: ranks one after another on device 0), with
#          the cudaMemGetInfo cross-check;
#   lora   LoRA training tokens/s and device memory (bench_lora): the whole
#          base read in place, attention's products on tensor cores (the
#          bf16 default);
#   torch  the same through transformers + peft (bench_torch.py --mode lora,
#          its load timed too);
#   full   training every weight, float32 weights, gradients and AdamW on
#          the device, through the worker's device path (bench_full);
#   torch  the same in plain transformers (bench_torch.py --mode full);
#   profile  a LoRA step's time op by op, from CUDA events around each
#          backend call (bench_profile; its table in OUTDIR/profile.txt);
# then, while the bench has run less than TY_GPU_BENCH_EXTRA_UNTIL seconds
# (300; rows past it say skipped), the extras: LoRA through the sharded
# path at world size 1, every unit gathered by NCCL into 2 slots
# (overlapped) and into 1 (not); attention alone at the model's heads, B and
# T (bench_attn); LoRA with attention in fp32 on CUDA cores.
# Every row goes to OUTDIR/bench.jsonl, tagged {"bench":KIND,"run":LABEL};
# the load table and the rows to stdout; then the verdict
# (tests/gpu/bench_verdict.py: `figure | ours | pytorch | ratio | target |
# result`, also OUTDIR/verdict.txt and "verdict" rows in bench.jsonl). A
# missed target is reported, not failed: the exit status is 1 only when one
# of the programs failed.
# Environment: TY_GPU_BENCH_B, _T, _R, _STEPS (LoRA's timed steps, 10),
#   _FULL_STEPS (full training's, 5), _CKPT (where the checkpoint is made,
#   or reused), _SHAPE (mkmodel's shape flags instead of --like
#   llama-3.2-1b; with its own _CKPT), _EXTRA_UNTIL, _ATTN_REPS,
#   _PYTHON (the python3 with torch, transformers and peft),
#   _TORCH_DEVICE (cuda; cpu on a machine without a GPU); TY_PEAK_TFLOPS.
# The simulated device runs the whole bench on a small model
# (gpu/bench_smoke) so that the programs and this script are checked
# before a GPU host runs them.
set -uo pipefail
build=${1:?usage: bench.sh BUILD OUTDIR}
out=${2:?usage: bench.sh BUILD OUTDIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
ck=${TY_GPU_BENCH_CKPT:-/tmp/trainyard-bench-llama-3.2-1b}
jl="$out/bench.jsonl"
: >"$jl"
B=${TY_GPU_BENCH_B:-4} T=${TY_GPU_BENCH_T:-2048} R=${TY_GPU_BENCH_R:-16}
STEPS=${TY_GPU_BENCH_STEPS:-10} FSTEPS=${TY_GPU_BENCH_FULL_STEPS:-5}
py=${TY_GPU_BENCH_PYTHON:-python3}
tdev=${TY_GPU_BENCH_TORCH_DEVICE:-cuda}
rc=0
# row KIND RUN CMD...: CMD's JSON lines into bench.jsonl, tagged
# {"bench":KIND,"run":RUN,...}; a program that fails without a line of its
# own leaves a failed row (its stderr is in this script's output).
row() {
  local kind=$1 run=$2 res r
  shift 2
  res=$("$@")
  r=$?
  grep '^{' <<<"$res" | sed "s/^{/{\"bench\":\"$kind\",\"run\":\"$run\",/" >>"$jl"
  if [ $r -ne 0 ]; then
    grep -q '^{' <<<"$res" ||
      echo "{\"bench\":\"$kind\",\"run\":\"$run\",\"status\":\"failed\",\"message\":\"$1 exited $r\"}" >>"$jl"
    echo "bench: $kind $run: $* exited $r" >&2
    rc=1
  fi
}
# PyTorch runs with the host's own libraries, not the unpacked .debs (in a
# subshell: the programs after it need the .debs' libraries again).
torch_row() {
  (
    [ -n "${TY_HOST_LD_LIBRARY_PATH+set}" ] && export LD_LIBRARY_PATH=$TY_HOST_LD_LIBRARY_PATH
    row torch "$1" "$py" "$src/tests/gpu/bench_torch.py" "$ck" "$B" "$T" "$R" "$2" --mode "$1" \
      --device "$tdev"
    exit $rc
  ) || rc=1
}
# The extras run while the bench is young enough; else a skipped row.
extra() {
  local kind=$1 run=$2
  if [ "$SECONDS" -ge "${TY_GPU_BENCH_EXTRA_UNTIL:-300}" ]; then
    echo "{\"bench\":\"$kind\",\"run\":\"$run\",\"status\":\"skipped\",\"message\":\"the bench had run ${SECONDS}s (TY_GPU_BENCH_EXTRA_UNTIL)\"}" >>"$jl"
    return
  fi
  row "$@"
}

# Made aside and renamed when complete, so an interrupted run leaves no
# half-written checkpoint to be reused.
shape=${TY_GPU_BENCH_SHAPE:---like llama-3.2-1b}
if [ ! -f "$ck/config.json" ]; then
  rm -rf "$ck.part"
  # shellcheck disable=SC2086 # the shape is a list of flags
  "$build/cli/trainyard" mkmodel --out "$ck.part" $shape --dtype bf16 --shards 4 --seed 1 &&
    mv "$ck.part" "$ck" || exit 1
fi

for w in 1 2; do
  row load "w$w" "$build/tests/gpu_bench_load" "$ck" $w 64
done
lora=$build/tests/gpu_bench_lora
row lora whole "$lora" "$ck" "$B" "$T" "$R" "$STEPS" 0
torch_row lora "$STEPS"
row full whole "$build/tests/gpu_bench_full" "$ck" "$B" "$T" "$FSTEPS"
torch_row full "$FSTEPS"
# Where a LoRA step's time goes, op by op (CUDA events around each backend
# call: bench_profile): its rows tag themselves {"bench":"profile",...};
# the table goes to OUTDIR/profile.txt.
if [ -x "$build/tests/gpu_bench_profile" ]; then
  "$build/tests/gpu_bench_profile" "$ck" "$B" "$T" "$R" "$STEPS" >>"$jl" 2>"$out/profile.txt" || {
    echo "bench: profile: gpu_bench_profile failed (see profile.txt)" >&2
    rc=1
  }
fi

extra lora slots2 "$lora" "$ck" "$B" "$T" "$R" "$STEPS" 2
extra lora slots1 "$lora" "$ck" "$B" "$T" "$R" "$STEPS" 1
# Attention alone at the model's heads and the bench's B and T: the tiled
# kernels against the per-row ones, the tensor-core path against the tiled.
heads=$(python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
nh = c["num_attention_heads"]
print(nh, c.get("num_key_value_heads") or nh, c.get("head_dim") or c["hidden_size"] // nh)' "$ck/config.json") || rc=1
# shellcheck disable=SC2086 # heads is NH NKV HS
extra attn whole "$build/tests/gpu_bench_attn" "$B" "$T" $heads "${TY_GPU_BENCH_ATTN_REPS:-5}"
# The whole base again with attention in fp32 on CUDA cores: the
# tensor-core path's gain in a whole step.
extra lora fp32attn env TRAINYARD_CUDA_ATTN_MIB=0 "$lora" "$ck" "$B" "$T" "$R" "$STEPS" 0

python3 - "$jl" <<'PY' || rc=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
mib = lambda b: f"{b / 2**20:,.0f}"
print("device peak per rank (MiB), bf16 shards, bucket 64 MiB")
print(f"{'path':<17} {'world':>5} {'rank':>4} {'shard':>8} {'peak':>8} {'cudaMemGetInfo':>14} {'host peak':>9} {'s':>6}")
for r in rows:
    if r.get("bench") != "load" or "path" not in r:
        continue
    if r["status"] != "ok":
        print(f"{r['path']:<17} {r['world']:>5} {r['rank']:>4}  failed: {r.get('message', '')}")
        continue
    print(f"{r['path']:<17} {r['world']:>5} {r['rank']:>4} {mib(r['shard_bytes']):>8} "
          f"{mib(r['device_peak_bytes']):>8} {mib(r['cuda_meminfo_peak_bytes']):>14} "
          f"{mib(r['host_peak_bytes']):>9} {r['load_seconds']:>6.2f}")
for r in rows:
    if r.get("bench") in ("profile", "profile_summary"):
        continue  # their own table: profile.txt
    if r.get("bench") != "load" or "path" not in r:
        print(r["bench"], r.get("run", ""), json.dumps({k: v for k, v in r.items() if k not in ("bench", "run")}))
PY
echo
python3 "$src/tests/gpu/bench_verdict.py" "$jl" "$ck/config.json" "$out" || rc=1
exit $rc
