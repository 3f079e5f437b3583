#!/usr/bin/env bash
# generate_device.sh - `trainyard generate --device`: cpu, cuda and auto.
# In a build without CUDA, --device cuda is refused saying so and what to
# do, and auto decodes on the CPU. In a CUDA build, --device cuda with no
# GPU visible (CUDA_VISIBLE_DEVICES empty) is refused naming why, auto then
# falls back to the CPU, and where a GPU is visible cuda and auto decode
# there (a bf16 checkpoint, a 100-token prompt: 16 ids in the vocabulary,
# the matrices bf16 on the GPU unless --dtype float32;
# that the GPU's tokens are the CPU's and the reference's, with the logits'
# gaps kept away from ties, is gpu/generate_cli's). Everywhere: an unknown
# device, --no_cache with cuda, and --dtype without cuda or of another type
# are refused.
#
#   generate_device.sh cuda|none   (whether this build has the CUDA backend)
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
built=$1

"$ty" mkmodel --out "$tmp/m" --hidden-size 64 --intermediate-size 96 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 128 --dtype bf16 --seed 5 >/dev/null
ids=$(python3 -c "print([(i * 37 + 11) % 128 for i in range(100)])")
gen() { "$ty" generate --model_path "$tmp/m" --prompt_ids "$ids" --max_new_tokens 16 "$@"; }

# refused: EXPECTED-STATUS TEXT ARGS...
refused() {
  local want=$1 text=$2 rc=0
  shift 2
  gen "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" = "$want" ] || fail "generate $* exited $rc, not $want: $(cat "$tmp/err")"
  grep -qF -- "$text" "$tmp/err" || fail "generate $*: no '$text' in: $(cat "$tmp/err")"
  echo "# refused, generate $*: $(cat "$tmp/err")"
}
refused 2 "--device tpu: use cpu, cuda or auto" --device tpu
refused 2 "--no_cache recomputes on the CPU; drop --device cuda" --device cuda --no_cache
refused 2 "--dtype float16: use float32 or bfloat16" --device cuda --dtype float16
refused 2 "--dtype sets the GPU's weights; use it with --device cuda" --dtype bfloat16

gen --device cpu >"$tmp/cpu.ids" 2>"$tmp/cpu.err" || fail "$(cat "$tmp/cpu.err")"
grep -q "device cpu$" "$tmp/cpu.err" || fail "no device in $(cat "$tmp/cpu.err")"
if [ "$built" = none ]; then
  refused 1 "--device cuda: this trainyard was built without the CUDA toolkit; rebuild where one is installed, or use --device cpu" --device cuda
  gen --device auto >"$tmp/auto.ids" 2>"$tmp/auto.err" || fail "$(cat "$tmp/auto.err")"
  grep -q "device cpu$" "$tmp/auto.err" || fail "auto: $(cat "$tmp/auto.err")"
  cmp -s "$tmp/cpu.ids" "$tmp/auto.ids" || fail "auto gave other ids than cpu"
  echo "# no CUDA in this build: auto decodes on the CPU"
  exit 0
fi
CUDA_VISIBLE_DEVICES= refused 1 "--device cuda: no CUDA device is visible" --device cuda
CUDA_VISIBLE_DEVICES= gen --device auto >"$tmp/auto0.ids" 2>"$tmp/auto0.err" \
  || fail "$(cat "$tmp/auto0.err")"
grep -q "device cpu$" "$tmp/auto0.err" || fail "auto without a GPU: $(cat "$tmp/auto0.err")"
rc=0
gen --device cuda >"$tmp/cuda.ids" 2>"$tmp/cuda.err" || rc=$?
if [ $rc -ne 0 ] && grep -q "no CUDA device is visible" "$tmp/cuda.err"; then
  echo "SKIP the GPU half: $(cat "$tmp/cuda.err")"
  exit 0
fi
[ $rc -eq 0 ] || fail "--device cuda: $(cat "$tmp/cuda.err")"
grep -q "device cuda (bfloat16 weights)$" "$tmp/cuda.err" || fail "$(cat "$tmp/cuda.err")"
gen --device cuda --dtype float32 >"$tmp/cuda32.ids" 2>"$tmp/cuda32.err" \
  || fail "$(cat "$tmp/cuda32.err")"
grep -q "device cuda$" "$tmp/cuda32.err" || fail "--dtype float32: $(cat "$tmp/cuda32.err")"
gen --device auto >"$tmp/auto.ids" 2>"$tmp/auto.err" || fail "$(cat "$tmp/auto.err")"
grep -q "device cuda (bfloat16 weights)$" "$tmp/auto.err" \
  || fail "auto with a GPU: $(cat "$tmp/auto.err")"
python3 -c "
import json, sys
ids = json.load(open(sys.argv[1]))
assert len(ids) == 16 and all(0 <= i < 128 for i in ids), ids" "$tmp/cuda.ids" \
  || fail "--device cuda printed $(cat "$tmp/cuda.ids")"
python3 -c "
import json, sys
ids = json.load(open(sys.argv[1]))
assert len(ids) == 16 and all(0 <= i < 128 for i in ids), ids" "$tmp/cuda32.ids" \
  || fail "--device cuda --dtype float32 printed $(cat "$tmp/cuda32.ids")"
echo "# cuda: $(cat "$tmp/cuda.ids"); $(tail -1 "$tmp/cuda.err")"
