#!/usr/bin/env bash
# convert_quantize.sh - `trainyard convert --quantize nf4|fp4 [--double_quant]`
# checked outside trainyard (convert_quantize.py reads the safetensors with
# json + numpy): the exact tensor names, dtypes and shapes of bitsandbytes'
# 4-bit layout as transformers saves it, the quant_state JSON byte for byte,
# config.json's quantization_config, every projection within the 4-bit error
# of its weights by bitsandbytes' dequantization formula (with double quant
# through the nested statistics), every other tensor bit for bit (or
# converted by --dtype); a sharded copy keeps a weight's components in one
# file. `convert --dequantize` gives bitsandbytes' dequantized values bit for
# bit. Damaged copies (a missing absmax, a short codes tensor, a quant_state
# with an unknown key or another blocksize, no quant_state, a stray
# component) are refused naming the tensor; a 4-bit checkpoint is refused by
# --quantize, by a plain convert and by the loader, each by name.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
py="/usr/bin/python3 $(dirname "$0")/convert_quantize.py"

# Odd sizes: k/v_proj [9, 45] and gate/up/down [475, 45] have an odd count
# (a last half byte) and a partial last block; gate has 334 blocks, so the
# nested statistics have a partial block too.
"$ty" mkmodel --out "$tmp/m" --hidden-size 45 --intermediate-size 475 --layers 2 --heads 5 \
  --kv-heads 1 --vocab-size 37 --dtype bf16 --seed 7 >/dev/null

run() { # OUT ARGS...: convert into $tmp/OUT, its summary checked
  local out=$1
  shift
  "$ty" convert --out "$tmp/$out" "$@" >"$tmp/$out.log" 2>&1 || { cat "$tmp/$out.log"; fail "convert $*"; }
}
run nf4 --model_path "$tmp/m" --quantize nf4
grep -q "quantized 14 weights (nf4)" "$tmp/nf4.log" || fail "summary: $(cat "$tmp/nf4.log")"
run nf4d --model_path "$tmp/m" --quantize nf4 --double_quant
grep -q "quantized 14 weights (nf4, double quant)" "$tmp/nf4d.log" || fail "$(cat "$tmp/nf4d.log")"
run fp4 --model_path "$tmp/m" --quantize fp4 --dtype f16
run fp4d --model_path "$tmp/m" --quantize fp4 --double_quant
$py check "$tmp/m" "$tmp/nf4" nf4 0 bfloat16
$py check "$tmp/m" "$tmp/nf4d" nf4 1 bfloat16
$py check "$tmp/m" "$tmp/fp4" fp4 0 float16
$py check "$tmp/m" "$tmp/fp4d" fp4 1 bfloat16

# Sharded: 2.1M projection weights (about 1.2 MiB 4-bit) in files of 1 MiB.
"$ty" mkmodel --out "$tmp/big" --hidden-size 256 --intermediate-size 1000 --layers 2 --heads 4 \
  --kv-heads 4 --vocab-size 64 --dtype f32 --seed 3 >/dev/null
run bigq --model_path "$tmp/big" --quantize nf4 --double_quant --shard_mb 1
[ -f "$tmp/bigq/model.safetensors.index.json" ] || fail "--shard_mb 1 wrote one file"
$py check "$tmp/big" "$tmp/bigq" nf4 1 float32

# Back to floats: bitsandbytes' dequantization, bit for bit.
for q in nf4 nf4d fp4 fp4d bigq; do
  run "$q.f32" --model_path "$tmp/$q" --dequantize --dtype f32
  grep -q "dequantized 14 weights" "$tmp/$q.f32.log" || fail "$(cat "$tmp/$q.f32.log")"
  $py dequant "$tmp/$q" "$tmp/$q.f32"
done

# refused NAME WANT ARGS...: convert fails, its message holding WANT.
refused() {
  local name=$1 want=$2
  shift 2
  if "$ty" convert --out "$tmp/refused.$name" "$@" >"$tmp/$name.log" 2>&1; then
    fail "$name: converted"
  fi
  grep -qF -- "$want" "$tmp/$name.log" || fail "$name: $(cat "$tmp/$name.log")"
  [ ! -e "$tmp/refused.$name/model.safetensors" ] || fail "$name: wrote a file"
}
W=model.layers.1.mlp.up_proj.weight
$py damage no_absmax "$tmp/nf4d" "$tmp/no_absmax"
refused no_absmax "statistics are missing: no tensor '$W.absmax'" --model_path "$tmp/no_absmax" --dequantize
$py damage short_codes "$tmp/nf4" "$tmp/short_codes"
refused short_codes "tensor '$W' is U8 [10687, 1] but a 4-bit weight of shape [475, 45] needs U8 [10688, 1]: sizes disagree with the shape [475, 45]" \
  --model_path "$tmp/short_codes" --dequantize
$py damage bad_key "$tmp/nf4" "$tmp/bad_key"
refused bad_key "tensor '$W.quant_state.bitsandbytes__nf4': a quant_state that is not the JSON transformers writes (key 'bogus'" \
  --model_path "$tmp/bad_key" --dequantize
$py damage blocksize "$tmp/fp4d" "$tmp/blocksize"
refused blocksize "__fp4': a quant_state that is not the JSON transformers writes (key 'blocksize' must be 64" \
  --model_path "$tmp/blocksize" --dequantize
$py damage no_state "$tmp/nf4" "$tmp/no_state"
refused no_state "weight '$W' is stored 4-bit but has no '.quant_state.bitsandbytes__nf4|fp4' tensor" \
  --model_path "$tmp/no_state" --dequantize
$py damage stray "$tmp/nf4" "$tmp/stray"
refused stray "tensor '$W.SCB' is not a bitsandbytes 4-bit component of '$W'" \
  --model_path "$tmp/stray" --dequantize
refused again "is already quantized (config.json has a quantization_config)" \
  --model_path "$tmp/nf4" --quantize fp4
refused plain "is a bitsandbytes 4-bit checkpoint (config.json has a quantization_config): add --dequantize" \
  --model_path "$tmp/nf4"
refused float "is not a bitsandbytes 4-bit checkpoint" --model_path "$tmp/m" --dequantize
$py strip_config "$tmp/nf4" "$tmp/noqc"
refused noqc_quantize "is already quantized (tensor 'model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4' is a bitsandbytes quant_state)" \
  --model_path "$tmp/noqc" --quantize nf4

# The loader never takes bytes for weights: without quantization_config,
# the first U8 tensor is named (with it, config.json's key is refused).
if [ -x "$worker" ]; then
  if "$ty" load --model_path "$tmp/noqc" >"$tmp/load.out" 2>"$tmp/load.err"; then fail "loaded 4-bit"; fi
  grep -q "tensor 'model.layers.0.mlp.down_proj.weight' is U8, bytes rather than weights" \
    "$tmp/load.err" "$tmp/load.out" || fail "load: $(cat "$tmp/load.err" "$tmp/load.out")"
fi
echo "convert_quantize: ok"
