#!/usr/bin/env bash
# oom_cli.sh - a GPU too small for the job fails with what to change (ctest
# gpu/oom, in CUDA builds; skipped without a GPU). TRAINYARD_CUDA_MEM_LIMIT_MIB
# caps the worker's device memory, so that any GPU, the simulated one
# included, behaves as a small one: the standard load, which places the
# whole model before the shard, names fsdp.memory_efficient_load; the
# memory-efficient load fits the shard, and then the training buffers name
# the micro-batch; both errors say that the cap is in force; with enough
# memory the same job trains; a cap that is not a number is refused,
# naming the variable.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 4000
"$ty" mkmodel --out "$tmp/base" --hidden-size 128 --intermediate-size 256 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --dtype bf16 --seed 3 >/dev/null
train() { # MIB EFFICIENT
  TRAINYARD_CUDA_MEM_LIMIT_MIB=$1 "$ty" train --model_path "$tmp/base" --use_lora true --lora_rank 4 \
    --device cuda --dtype float32 --fsdp.memory_efficient_load "$2" --data.path "$data" \
    --data.format text --data.seq_len 64 --train.steps 2 --train.micro_batch_size 2 \
    --output_dir "$tmp/out-$1-$2" 2>&1
}
# 0: no cap. Without a GPU the job fails saying so, and there is nothing to check.
if ! out=$(train 0 true); then
  grep -q "no CUDA device is visible" <<<"$out" || fail "the job did not train without a cap: $out"
  echo "SKIP gpu/oom: no CUDA device is visible"
  exit 77
fi
capped="capped at 2.0 MiB by TRAINYARD_CUDA_MEM_LIMIT_MIB"
# The float32 base is 1.4 MiB: 2 MiB holds it once, not twice.
out=$(train 2 false) && fail "the standard load fit twice the model into 2 MiB: $out"
grep -q "beside the whole .* model that the standard load placed first (set fsdp.memory_efficient_load true" <<<"$out" ||
  fail "the standard load's error does not name the fix: $out"
grep -q "$capped" <<<"$out" || fail "the standard load's error does not name the cap: $out"
out=$(train 2 true) && fail "training fit into 2 MiB: $out"
grep -q "out of device memory after .* beside the 1.4 MiB base shard (lower the micro-batch" <<<"$out" ||
  fail "the training buffers' error does not name the fix: $out"
grep -q "$capped" <<<"$out" || fail "the training buffers' error does not name the cap: $out"
out=$(train 64 false) || fail "the job did not train with 64 MiB: $out"
out=$(train 2x true) && fail "a cap of 2x was taken: $out"
grep -q "TRAINYARD_CUDA_MEM_LIMIT_MIB='2x' is not a whole number in 0..1073741824 (MiB of device memory" <<<"$out" ||
  fail "a bad cap's error does not name the variable: $out"
echo "ok"
