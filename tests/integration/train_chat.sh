#!/usr/bin/env bash
# train_chat.sh - LoRA on chat JSONL (examples/chat.jsonl) through
# `trainyard train`: a checkpoint of the Llama 3 vocabulary (128256, from
# mkmodel) beside the real Llama 3 tokenizer files, examples packed into
# rows, the loss counting assistant turns only.
#   - 1, 2 and 4 ranks (one global batch of 4 rows, then 8 with grad_accum)
#     give the same per-step losses (1e-5 relative, as train_world.sh: only
#     the order of fp32 additions differs; the mean is over the counted
#     targets of the whole global batch on every rank);
#   - the ranks report phase tokenizing, one examples file is built under
#     output_dir/tokenized and found again by a second run;
#   - trainyard eval on the same data counts fewer targets for the
#     assistant turns than with --loss_on all, and the adapter lowers the
#     masked loss;
#   - a bad line is refused by validate naming the file and the line, and
#     a tokenizer without a usable template is named with the fix.
# usage: train_chat.sh TOKENIZER_DIR (tokenizer.json + tokenizer_config.json)
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
tokdir=${1:?the Llama 3 tokenizer folder}
src=$(cd "$(dirname "$0")/../.." && pwd)
data="$src/examples/chat.jsonl"

"$ty" mkmodel --out "$tmp/base" --hidden-size 32 --intermediate-size 64 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 128256 --tie-embeddings --seed 5 >/dev/null
cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$tmp/base/"

common=(--model_path "$tmp/base" --use_lora true --lora_rank 4 --target_modules all-linear
        --data.path "$data" --data.format jsonl --data.chat_template llama3 --data.packing true
        --data.seq_len 96 --data.eval_fraction 0.1 --train.steps 4 --train.lr 2e-2
        --train.warmup_steps 1 --train.checkpoint_every 0)

losses() { # WORLD ACCUM OUT -> rank 0's per-step losses, one per line
  local w=$1 a=$2 out=$3
  "$ty" train "${common[@]}" --world_size "$w" --train.micro_batch_size $((4 / w)) \
    --train.grad_accum "$a" --output_dir "$tmp/$out" --json >"$tmp/$out.out" 2>"$tmp/$out.log" ||
    { cat "$tmp/$out.log" >&2; fail "world $w accum $a failed"; }
  rank0_losses "$tmp/$out.out"
}

for a in 1 2; do
  losses 1 "$a" "w1-a$a" >"$tmp/w1-a$a.loss"
  for w in 2 4; do
    losses "$w" "$a" "w$w-a$a" >"$tmp/w$w-a$a.loss"
    python3 - "$tmp/w1-a$a.loss" "$tmp/w$w-a$a.loss" "$w" "$a" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
assert len(a) == len(b) == 4, (a, b)
gap = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"# chat, packed, grad_accum {sys.argv[4]}: world 1 vs {sys.argv[3]}: max relative loss "
      f"gap {gap:.2e} (losses {a[0]:.5f} -> {a[-1]:.5f})")
assert gap <= 1e-5, (a, b)
PY
  done
done

# Every rank reported tokenizing; one examples file, and its lock, nothing else.
python3 - "$tmp/w4-a1.out" <<'PY'
import json, sys
ranks = {r["rank"] for r in map(json.loads, open(sys.argv[1])) if r["phase"] == "tokenizing"}
assert ranks == {0, 1, 2, 3}, ranks
PY
files=$(ls "$tmp/w4-a1/tokenized")
[ "$(echo "$files" | grep -c '\.bin$')" = 1 ] || fail "tokenized holds: $files"
! echo "$files" | grep -q partial || fail "a part was left: $files"
# A second run over the same data and settings builds nothing anew.
before=$(stat -c %i "$tmp/w4-a1/tokenized/"*.bin)
losses 4 1 w4-a1 >/dev/null
[ "$(stat -c %i "$tmp/w4-a1/tokenized/"*.bin)" = "$before" ] || fail "the examples were built again"

# eval: the assistant turns only, fewer than every token; the adapter helps.
ev=(--model_path "$tmp/base" --data "$data" --format jsonl --chat_template llama3 --seq_len 96
    --batches 6)
"$ty" eval "${ev[@]}" >"$tmp/base.eval"
"$ty" eval "${ev[@]}" --loss_on all >"$tmp/all.eval"
"$ty" eval "${ev[@]}" --adapter "$tmp/w1-a2" >"$tmp/lora.eval"
python3 - "$tmp/base.eval" "$tmp/all.eval" "$tmp/lora.eval" <<'PY'
import json, sys
base, every, lora = (json.load(open(p)) for p in sys.argv[1:4])
assert 0 < base["tokens"] < every["tokens"] / 3, (base, every)
assert lora["tokens"] == base["tokens"], (lora, base)
assert lora["loss"] < base["loss"], (lora, base)
print(f"# eval: {base['tokens']} assistant targets of {every['tokens']}; "
      f"loss {base['loss']:.4f} -> {lora['loss']:.4f} with the adapter")
PY

# Refusals, before any rank starts: a bad line by file and line number; the
# tokenizer's own template (Llama 3 base: its generation prompt is always
# added) named with the fix.
head -n 5 "$data" >"$tmp/bad.jsonl"
echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]}' \
  >>"$tmp/bad.jsonl"
if "$ty" validate "${common[@]}" --data.path "$tmp/bad.jsonl" >"$tmp/bad.out" 2>&1; then
  fail "a bad line was accepted"
fi
grep -q 'bad.jsonl line 6: "messages"\[1\] has role "bot"' "$tmp/bad.out" ||
  { cat "$tmp/bad.out"; fail "the bad line was not named"; }
if "$ty" validate "${common[@]}" --data.chat_template "" >"$tmp/tmpl.out" 2>&1; then
  fail "the tokenizer's template was accepted"
fi
grep -q 'name a built-in template in data.chat_template' "$tmp/tmpl.out" ||
  { cat "$tmp/tmpl.out"; fail "the template refusal does not say what to do"; }
ls "$tmp" | grep -q '^trainyard-check' && fail "validate left its scratch folder"
# The README's spec is a valid one.
"$ty" validate --no-check-paths "$src/examples/chat-lora.json" >/dev/null ||
  fail "examples/chat-lora.json does not validate"
echo "train_chat: ok"
