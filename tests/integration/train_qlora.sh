#!/usr/bin/env bash
# train_qlora.sh - QLoRA (quantization.load_in_4bit) through `trainyard
# train`, real worker processes on CPU ranks:
# - the linear projections are quantized as each rank's piece of them is
#   read, so 1, 2 and 4 ranks (memory-efficient path) and 2 ranks on the
#   standard path train to the same losses, nf4 with double quantization;
# - the losses equal, step for step, those of plain LoRA over a float32
#   checkpoint holding the weights dequantized by a reference written here
#   in Python from bitsandbytes' algorithm (tests/numerics/quant4_ref.py),
#   for nf4 and fp4, with and without double quantization: so the held-out
#   loss of the 4-bit model is that of its dequantized weights, and the
#   adapters see the same base;
# - bfloat16 compute rounds the dequantized weights as bitsandbytes' bf16
#   products would (the reference, rounded the same way, trains alike);
# - the adapter written is PEFT's, over the base's names;
# - a bitsandbytes 4-bit checkpoint (trainyard convert --quantize) is read
#   as it is on both load paths, evaluates like its dequantized weights,
#   merges into floats, and is refused damaged or taken as another kind;
# - the loading report says the shard is in 4 bits and its size, which
#   is about a quarter of the float32 LoRA rank's;
# - the spec's refusals (no LoRA, from scratch, cuda, options without
#   load_in_4bit, other stacks' names) name the field and the fix.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
here=$(cd "$(dirname "$0")" && pwd)

data="$tmp/words.txt"
words "$data" 6000
# k/v projections of 36 x 72 = 2592 elements: not a multiple of a 64-block.
"$ty" mkmodel --out "$tmp/base" --hidden-size 72 --intermediate-size 160 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --seed 5 >/dev/null

common=(--data.path "$data" --data.seq_len 32 --train.steps 5 --train.warmup_steps 1
        --train.lr 3e-3 --use_lora true --lora_rank 4 --target_modules all-linear
        --train.checkpoint_every 0 --json)
same() { # TOL NAME NAME... : every run's losses within TOL (relative) of the first's
  python3 - "$@" <<'PY'
import sys
tol, names = float(sys.argv[1]), sys.argv[2:]
runs = [[float(x) for x in open(n + ".losses")] for n in names]
assert all(len(r) == 5 for r in runs), runs
gap = max(abs(x - y) / abs(x) for r in runs[1:] for x, y in zip(runs[0], r))
print(f"# {' = '.join(n.rsplit('/', 1)[1] for n in names)}: max relative loss gap {gap:.2e} "
      f"(losses {runs[0][0]:.5f} -> {runs[0][-1]:.5f})")
assert gap <= tol, runs
PY
}

q=(--model_path "$tmp/base" --quantization.load_in_4bit true)
dq=("${q[@]}" --quantization.bnb_4bit_use_double_quant true)
mel=(--fsdp.memory_efficient_load true)
train_losses nf4dq-1 "${dq[@]}" "${mel[@]}" --world_size 1 --train.micro_batch_size 8
train_losses nf4dq-2 "${dq[@]}" "${mel[@]}" --world_size 2 --train.micro_batch_size 4
train_losses nf4dq-4 "${dq[@]}" "${mel[@]}" --world_size 4 --train.micro_batch_size 2
train_losses nf4dq-2s "${dq[@]}" --world_size 2 --train.micro_batch_size 4
train_losses nf4dq-2ck "${dq[@]}" "${mel[@]}" --world_size 2 --train.micro_batch_size 4 \
  --gradient_checkpointing true
same 1e-5 "$tmp"/nf4dq-1 "$tmp"/nf4dq-2 "$tmp"/nf4dq-4 "$tmp"/nf4dq-2s "$tmp"/nf4dq-2ck

# The loading report: 4 bits, and the shard's size.
grep -q "the linear projections in 4 bits (nf4, double quantization)" "$tmp/nf4dq-1.out" ||
  { cat "$tmp/nf4dq-1.out" >&2; fail "the loading report does not say the base is in 4 bits"; }

# Against the reference: the same model with its weights dequantized by
# Python, as float32, trained by plain LoRA.
ref() { # NAME TYPE DOUBLE COMPUTE
  /usr/bin/python3 "$here/../numerics/quant4_ref.py" --dequantized-checkpoint "$tmp/base" \
    "$tmp/$1" "$2" "$3" "$4"
}
for case in "nf4 false float32" "nf4 true float32" "fp4 false float32" "fp4 true bfloat16"; do
  set -- $case
  name="$1-$2-$3"
  ref "ref-$name" "$1" "$2" "$3"
  train_losses "lora-$name" --model_path "$tmp/ref-$name" --world_size 1 --train.micro_batch_size 8
  train_losses "qlora-$name" "${q[@]}" --quantization.bnb_4bit_quant_type "$1" \
    --quantization.bnb_4bit_use_double_quant "$2" --quantization.bnb_4bit_compute_dtype "$3" \
    --world_size 2 --train.micro_batch_size 4 "${mel[@]}"
  same 1e-5 "$tmp/lora-$name" "$tmp/qlora-$name"
done
# merge_adapter of a QLoRA job over a float base: the adapter added to the
# projections as its 4 bits kept them (the reference's dequantized
# weights), as peft's merge_and_unload over the 4-bit model.
train_losses merge-q "${dq[@]}" "${mel[@]}" --world_size 2 --train.micro_batch_size 4 --merge_adapter true
"$ty" eval --data "$data" --seq_len 32 --batches 4 --model_path "$tmp/merge-q/merged" >"$tmp/ev-mq"
"$ty" eval --data "$data" --seq_len 32 --batches 4 --model_path "$tmp/ref-nf4-true-float32" \
  --adapter "$tmp/merge-q" >"$tmp/ev-mref"
python3 - "$tmp/ev-mq" "$tmp/ev-mref" <<'PY'
import json, sys
a, b = (json.load(open(p))["loss"] for p in sys.argv[1:])
assert abs(a - b) <= 1e-5 * abs(b), (a, b)
print(f"# merge_adapter over 4 bits: {a:.6f}, the reference's weights with the adapter: {b:.6f}")
PY
# 4 bits change the model: a float32 LoRA run over the original base
# differs from the quantized one (so the comparison above can fail).
train_losses lora-f32 --model_path "$tmp/base" --world_size 1 --train.micro_batch_size 8
if same 1e-5 "$tmp/lora-f32" "$tmp/qlora-nf4-false-float32" >/dev/null 2>&1; then
  fail "the 4-bit base trains exactly as the float32 one: nothing was quantized"
fi

# A bitsandbytes 4-bit checkpoint (`trainyard convert --quantize`, the
# layout transformers saves) is read as it is: its codes are the ones the
# job quantizes from the float base, so its QLoRA losses are the same on
# both load paths; it evaluates to the loss of the reference's dequantized
# weights; a job must keep it in 4 bits of its kind; merged, it becomes
# floats (as peft's merge_and_unload).
"$ty" convert --model_path "$tmp/base" --out "$tmp/q4" --quantize nf4 --double_quant >/dev/null
train_losses ck-1 --model_path "$tmp/q4" --quantization.load_in_4bit true \
  --quantization.bnb_4bit_use_double_quant true "${mel[@]}" --world_size 1 \
  --train.micro_batch_size 8
train_losses ck-2s --model_path "$tmp/q4" --quantization.load_in_4bit true \
  --quantization.bnb_4bit_use_double_quant true --world_size 2 --train.micro_batch_size 4
same 1e-5 "$tmp"/nf4dq-1 "$tmp"/ck-1 "$tmp"/ck-2s
# trainyard load: the shards quantized from the float base as they load
# and those read from the 4-bit checkpoint are the same bytes (digests),
# on both paths, and each rank's shard is the 4-bit record it reports.
for m in base q4; do
  for p in true false; do
    "$ty" load --model_path "$tmp/$m" --world_size 2 --use_lora true --fsdp.memory_efficient_load $p \
      --quantization.load_in_4bit true --quantization.bnb_4bit_use_double_quant true \
      >"$tmp/load-$m-$p" 2>"$tmp/load.err" || { cat "$tmp/load.err" >&2; fail "load $m $p"; }
  done
done
python3 - "$tmp"/load-base-true "$tmp"/load-base-false "$tmp"/load-q4-true "$tmp"/load-q4-false <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
digests = [[r["message"].rsplit("digest ", 1)[1] for r in run] for run in runs]
assert all(d == digests[0] for d in digests), digests
for run in runs:
    for r in run:
        assert "(the linear projections in 4 bits)" in r["message"], r
        assert r["bytes_loaded"] == r["bytes_total"], r
print("# trainyard load: quantized as it loads = read from the 4-bit checkpoint, both paths:",
      " ".join(digests[0]))
PY
ev() { "$ty" eval --data "$data" --seq_len 32 --batches 4 "$@"; }
ev --model_path "$tmp/q4" >"$tmp/ev-q4"
ev --model_path "$tmp/ref-nf4-true-float32" >"$tmp/ev-ref"
ev --model_path "$tmp/q4" --adapter "$tmp/ck-1" >"$tmp/ev-q4a"
"$ty" merge --model_path "$tmp/q4" --adapter "$tmp/ck-1" --out "$tmp/merged" \
  >/dev/null 2>"$tmp/merge.err" || { cat "$tmp/merge.err" >&2; fail "merge over 4 bits"; }
grep -q "its weights were dequantized" "$tmp/merge.err" || fail "merge does not say it dequantized"
ev --model_path "$tmp/merged" >"$tmp/ev-merged"
python3 - "$tmp/ev-q4" "$tmp/ev-ref" "$tmp/ev-q4a" "$tmp/ev-merged" "$tmp/merged/config.json" <<'PY'
import json, sys
q4, ref, q4a, merged = (json.load(open(p))["loss"] for p in sys.argv[1:5])
assert abs(q4 - ref) <= 1e-5 * abs(ref), (q4, ref)
assert abs(q4a - merged) <= 1e-5 * abs(merged), (q4a, merged)
assert abs(q4a - q4) > 1e-4, (q4a, q4)  # the adapter changed something
assert "quantization_config" not in json.load(open(sys.argv[5]))
print(f"# the 4-bit checkpoint evaluates to {q4:.6f}, its reference's weights to {ref:.6f}; "
      f"merged with its adapter {merged:.6f} (unmerged {q4a:.6f})")
PY
# trainyard generate over it: the reference's weights' greedy tokens.
for m in q4 ref-nf4-true-float32; do
  "$ty" generate --model_path "$tmp/$m" --adapter "$tmp/ck-1" --prompt_ids '[5, 17, 99, 3]' \
    --max_new_tokens 12 >"$tmp/gen-$m" 2>/dev/null || fail "generate over $m"
done
cmp -s "$tmp/gen-q4" "$tmp/gen-ref-nf4-true-float32" ||
  fail "generate over the 4-bit checkpoint: $(cat "$tmp/gen-q4") against $(cat "$tmp/gen-ref-nf4-true-float32")"
if "$ty" validate --model_path "$tmp/q4" --use_lora true --data.path "$data" \
  --output_dir "$tmp/v1" >"$tmp/v.out" 2>&1; then fail "a 4-bit checkpoint without load_in_4bit"; fi
grep -q "quantization.load_in_4bit: is false, and .* is a bitsandbytes 4-bit checkpoint (nf4, double quantization)" \
  "$tmp/v.out" || { cat "$tmp/v.out" >&2; fail "no load_in_4bit refusal"; }
if "$ty" validate --model_path "$tmp/q4" --use_lora true --data.path "$data" --output_dir "$tmp/v1" \
  --quantization.load_in_4bit true --quantization.bnb_4bit_quant_type fp4 >"$tmp/v.out" 2>&1; then
  fail "a 4-bit nf4 checkpoint taken as fp4"
fi
grep -q 'quantization.bnb_4bit_quant_type: is "fp4", and .* stores nf4 codes' "$tmp/v.out" ||
  { cat "$tmp/v.out" >&2; fail "no quant type refusal"; }
# A damaged one is refused by the tensor's name before anything is placed.
python3 - "$tmp/q4" "$tmp/q4bad" <<'PY'
import json, os, shutil, struct, sys
src, dst = sys.argv[1:]
shutil.copytree(src, dst)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
del h["model.layers.1.mlp.up_proj.weight.nested_absmax"]
body = json.dumps(h).encode()
body += b" " * (-len(body) % 8)
# The data section keeps its bytes: the dropped tensor leaves a hole the
# header check also names, whichever it meets first.
open(os.path.join(dst, "model.safetensors"), "wb").write(struct.pack("<Q", len(body)) + body + raw[8 + n:])
PY
if "$ty" train "${common[@]}" --model_path "$tmp/q4bad" --quantization.load_in_4bit true \
  --quantization.bnb_4bit_use_double_quant true --output_dir "$tmp/bad" >"$tmp/bad.out" 2>&1; then
  fail "a damaged 4-bit checkpoint trained"
fi
grep -q "up_proj" "$tmp/bad.out" || { cat "$tmp/bad.out" >&2; fail "the damage is not named"; }

# PEFT's adapter over the base's names; no base weights written.
python3 - "$tmp/nf4dq-2" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "adapter_config.json")))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 4, cfg
raw = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names, sorted(names)
assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in names, sorted(names)
assert not os.path.exists(os.path.join(d, "model.safetensors"))
print("# the QLoRA adapter is PEFT's:", len([n for n in names if n != "__metadata__"]), "tensors")
PY

# The spec's rules, each naming the field and the fix.
refuse() { # PATTERN ARGS...: validate refuses, saying PATTERN
  local want=$1
  shift
  if "$ty" validate --no-check-paths "$@" >"$tmp/v.out" 2>&1; then
    fail "validate accepted: $*"
  fi
  grep -q -- "$want" "$tmp/v.out" || { cat "$tmp/v.out" >&2; fail "no '$want' for: $*"; }
}
refuse 'quantization.load_in_4bit: needs use_lora: true' --model_path m \
  --quantization.load_in_4bit true
refuse 'quantization.load_in_4bit: cannot be true together with init_from_scratch' \
  --init_from_scratch true --quantization.load_in_4bit true --use_lora true \
  --model '{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 256}'
refuse 'quantization.load_in_4bit: a 4-bit base trains on CPU ranks' --model_path m \
  --use_lora true --quantization.load_in_4bit true --device cuda
refuse 'quantization.bnb_4bit_use_double_quant: applies to a 4-bit base only' --model_path m \
  --quantization.bnb_4bit_use_double_quant true
refuse 'quantization.bnb_4bit_quant_type: unknown value "int4"' --model_path m --use_lora true \
  --quantization.load_in_4bit true --quantization.bnb_4bit_quant_type int4
refuse 'load_in_4bit: unknown flag --load_in_4bit; trainyard calls it --quantization.load_in_4bit' \
  --model_path m --load_in_4bit true
echo '{"model_path": "m", "adapter": "qlora"}' >"$tmp/axolotl.json"
refuse 'adapter: unknown field; trainyard calls it "use_lora"' "$tmp/axolotl.json"
"$ty" validate --no-check-paths --model_path m --use_lora true --quantization.load_in_4bit true \
  >/dev/null || fail "a QLoRA spec is refused"
echo "# the QLoRA refusals name their field"
