#!/usr/bin/env bash
# bench.sh BUILD OUTDIR - the GPU bench (run by tests/gpu/run.sh on a GPU
# host). A generated bf16 checkpoint of about 1.5B parameters (Llama-3.2-1B's
# layer shapes with an untied head: C 2048, FF 8192, 16 layers, 32 heads, 8
# kv heads, vocab 128256), then:
#   load   per-rank device peak, standard against memory-efficient, for 1 and
#          2 ranks (bench_load: ranks one after another on device 0), with
#          the cudaMemGetInfo cross-check;
#   lora   LoRA training tokens/s and model-FLOP utilisation on the GPU
#          (bench_lora), when built: the whole base read in place (slots 0),
#          then the sharded path at world size 1, every unit gathered by
#          NCCL into 2 slots (overlapped) and into 1 (not), all with
#          attention's products on tensor cores (the bf16 default); and,
#          last, the whole base with attention in fp32 on CUDA cores;
#   attn   attention alone at the model's heads, B and T (bench_attn): the
#          fp32 tiled kernels against the per-row ones, and the tensor-core
#          path against the tiled, forward and backward;
#   torch  the same checkpoint and batch through transformers + peft, when
#          python3 has torch, transformers and peft.
# Figures go to OUTDIR/bench.jsonl; a table to stdout.
# TY_GPU_BENCH_SHAPE replaces the model's mkmodel size flags (with its own
# TY_GPU_BENCH_CKPT): the simulated device runs the whole bench on a small
# model (gpu/bench_smoke) so that the programs and this script are checked
# before a GPU host runs them.
set -uo pipefail
build=${1:?usage: bench.sh BUILD OUTDIR}
out=${2:?usage: bench.sh BUILD OUTDIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
ck=${TY_GPU_BENCH_CKPT:-/tmp/trainyard-bench-1b}
jl="$out/bench.jsonl"
: >"$jl"
B=${TY_GPU_BENCH_B:-4} T=${TY_GPU_BENCH_T:-1024} R=${TY_GPU_BENCH_R:-16} STEPS=${TY_GPU_BENCH_STEPS:-10}
rc=0
# One program's JSON line into bench.jsonl, tagged {"bench":KIND,...}.
row() {
  local kind=$1
  shift
  "$@" | sed "s/^{/{\"bench\":\"$kind\",/" >>"$jl"
}

# Made aside and renamed when complete, so an interrupted run leaves no
# half-written checkpoint to be reused.
shape=${TY_GPU_BENCH_SHAPE:---hidden-size 2048 --intermediate-size 8192 --layers 16 --heads 32 --kv-heads 8 --vocab-size 128256}
if [ ! -f "$ck/config.json" ]; then
  rm -rf "$ck.part"
  # shellcheck disable=SC2086 # the shape is a list of flags
  "$build/cli/trainyard" mkmodel --out "$ck.part" $shape --dtype bf16 --shards 4 --seed 1 &&
    mv "$ck.part" "$ck" || exit 1
fi

for w in 1 2; do
  row load "$build/tests/gpu_bench_load" "$ck" $w 64 || rc=1
done
if [ -x "$build/tests/gpu_bench_lora" ]; then
  for slots in 0 2 1; do
    row lora "$build/tests/gpu_bench_lora" "$ck" $B $T $R $STEPS $slots || rc=1
  done
fi
# Attention alone at the model's heads and the bench's B and T: the tiled
# kernels against the per-row ones, the tensor-core path against the tiled.
if [ -x "$build/tests/gpu_bench_attn" ]; then
  heads=$(python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
nh = c["num_attention_heads"]
print(nh, c.get("num_key_value_heads") or nh, c.get("head_dim") or c["hidden_size"] // nh)' "$ck/config.json") || rc=1
  # shellcheck disable=SC2086 # heads is NH NKV HS
  row attn "$build/tests/gpu_bench_attn" $B $T $heads "${TY_GPU_BENCH_ATTN_REPS:-5}" || rc=1
fi
# PyTorch runs with the host's own libraries, not the unpacked .debs (in a
# subshell: the programs after it need the .debs' libraries again).
(
  [ -n "${TY_HOST_LD_LIBRARY_PATH+set}" ] && export LD_LIBRARY_PATH=$TY_HOST_LD_LIBRARY_PATH
  if python3 -c "import torch, transformers, peft" 2>/dev/null; then
    row torch python3 "$src/tests/gpu/bench_torch.py" "$ck" $B $T $R $STEPS
  else
    echo '{"bench":"torch","status":"skipped","message":"python3 lacks torch, transformers or peft"}' >>"$jl"
  fi
) || rc=1

# Last, so that it cannot crowd out the rows above: the whole base again
# with attention in fp32 on CUDA cores, the tensor-core path's gain in a
# whole step.
if [ -x "$build/tests/gpu_bench_lora" ]; then
  row lora env TRAINYARD_CUDA_ATTN_MIB=0 "$build/tests/gpu_bench_lora" "$ck" $B $T $R $STEPS 0 ||
    rc=1
fi

python3 - "$jl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
mib = lambda b: f"{b / 2**20:,.0f}"
print("device peak per rank (MiB), bf16 shards, bucket 64 MiB")
print(f"{'path':<17} {'world':>5} {'rank':>4} {'shard':>8} {'peak':>8} {'cudaMemGetInfo':>14} {'host peak':>9} {'s':>6}")
for r in rows:
    if r.get("bench") != "load":
        continue
    if r["status"] != "ok":
        print(f"{r['path']:<17} {r['world']:>5} {r['rank']:>4}  failed: {r.get('message', '')}")
        continue
    print(f"{r['path']:<17} {r['world']:>5} {r['rank']:>4} {mib(r['shard_bytes']):>8} "
          f"{mib(r['device_peak_bytes']):>8} {mib(r['cuda_meminfo_peak_bytes']):>14} "
          f"{mib(r['host_peak_bytes']):>9} {r['load_seconds']:>6.2f}")
for r in rows:
    if r.get("bench") in ("lora", "attn", "torch"):
        print(r["bench"], json.dumps({k: v for k, v in r.items() if k != "bench"}))
PY
exit $rc
