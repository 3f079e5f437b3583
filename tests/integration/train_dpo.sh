#!/usr/bin/env bash
# train_dpo.sh - preference tuning (train.objective dpo) through `trainyard
# train`: a checkpoint of the Llama 3 vocabulary (mkmodel) beside the real
# Llama 3 tokenizer files, a synthetic preference set (a complete correct
# sum chosen over a hedged wrong one) in TRL's three forms at once:
# strings, the conversational form with a "prompt", and conversations
# whose shared leading turns are the prompt.
#   - LoRA: the reference is the base with the adapters off, so the first
#     held-out loss is log 2 exactly; rewards/accuracies passes 0.9 and the
#     held-out loss falls; metrics.jsonl and the TensorBoard file carry
#     TRL's metric names;
#   - 1, 2 and 4 ranks give the same per-step losses (LoRA; 1 and 2 training every weight,
#     whose reference is scored before the first step in phase reference,
#     kept beside the tokenized data and read back by the next run);
#   - bad lines and bad options are refused by validate naming the file
#     and line or the field.
# usage: train_dpo.sh TOKENIZER_DIR (tokenizer.json + tokenizer_config.json)
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
tokdir=${1:?the Llama 3 tokenizer folder}

"$ty" mkmodel --out "$tmp/base" --hidden-size 32 --intermediate-size 64 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 128256 --tie-embeddings --seed 5 >/dev/null
cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$tmp/base/"
# 240 pairs: "What is a + b?" answered "The sum is <a+b>." (chosen) or
# "Maybe <wrong>?" (rejected), a third of them in each of TRL's forms.
data="$(cd "$(dirname "$0")/../.." && pwd)/examples/preference.jsonl"

common=(--model_path "$tmp/base" --data.path "$data" --data.format jsonl
        --data.chat_template llama3 --data.seq_len 48 --data.eval_fraction 0.1
        --train.objective dpo --dpo.beta 0.1 --train.checkpoint_every 0)
lora=(--use_lora true --lora_rank 8 --target_modules all-linear)

# --- LoRA learns the preference within the job.
"$ty" train "${common[@]}" "${lora[@]}" --train.steps 24 --train.lr 3e-2 \
  --train.micro_batch_size 4 --output_dir "$tmp/learn" --json >"$tmp/learn.out" \
  2>"$tmp/learn.log" || { cat "$tmp/learn.log" >&2; fail "the LoRA DPO run failed"; }
python3 - "$tmp/learn/metrics.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
names = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
         "logps/chosen", "logps/rejected"]
assert len(steps) == 24 and all(all(n in r for n in names) for r in steps), steps[0]
acc = [r["rewards/accuracies"] for r in steps]
# The reference is the base with the adapters off, and PEFT's B starts at
# zero: the policy is the reference before the first step.
assert abs(evals[0] - math.log(2)) < 1e-6, evals
assert evals[-1] < evals[0] - 0.05, evals
assert max(acc[-6:]) > 0.9 and sum(acc[-6:]) / 6 > 0.8, acc
for r in steps:  # the margins are the rewards' difference, as TRL logs them
    assert abs(r["rewards/margins"] - (r["rewards/chosen"] - r["rewards/rejected"])) < 1e-5, r
print(f"# dpo LoRA: held-out loss {evals[0]:.4f} -> {evals[-1]:.4f}, accuracies "
      f"{acc[0]:.2f} -> {acc[-1]:.2f}, margins {steps[0]['rewards/margins']:.3f} -> "
      f"{steps[-1]['rewards/margins']:.3f}")
PY
ls "$tmp/learn/tensorboard/"events.out.tfevents.* >/dev/null || fail "no TensorBoard events"
grep -aq "train/rewards/accuracies" "$tmp/learn/tensorboard/"events.out.tfevents.* ||
  fail "the TensorBoard events carry no train/rewards/accuracies"

# --- 1, 2 and 4 ranks: the same losses (a pair stays whole on one rank;
# the global batch of 4 pairs is 4, 2 or 1 pairs a rank).
same() { # NAME WORLDS ARGS...: world 1 against each of WORLDS over 4 steps
  local name=$1 worlds=$2
  shift 2
  local w
  for w in 1 $worlds; do
    "$ty" train "${common[@]}" "$@" --train.steps 4 --world_size "$w" \
      --train.micro_batch_size $((4 / w)) --output_dir "$tmp/$name-w$w" --json \
      >"$tmp/$name-w$w.out" 2>"$tmp/$name-w$w.log" ||
      { cat "$tmp/$name-w$w.log" >&2; fail "$name world $w failed"; }
    rank0_losses "$tmp/$name-w$w.out" >"$tmp/$name-w$w.loss"
    [ "$w" = 1 ] && continue
    python3 - "$tmp/$name-w1.loss" "$tmp/$name-w$w.loss" "$name" "$w" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
assert len(a) == len(b) == 4, (a, b)
gap = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"# dpo {sys.argv[3]}: world 1 vs {sys.argv[4]}: max relative loss gap {gap:.2e} "
      f"(losses {a[0]:.5f} -> {a[-1]:.5f})")
assert gap <= 1e-5, (a, b)
PY
  done
}
same lora "2 4" "${lora[@]}" --train.lr 3e-2
same full 2 --train.lr 1e-3

# Training every weight, the reference was scored in its own phase, by
# every rank, and kept beside the tokenized data.
python3 - "$tmp/full-w2.out" <<'PY'
import json, sys
reps = [json.loads(l) for l in open(sys.argv[1])]
ref = [r for r in reps if r["phase"] == "reference"]
assert {r["rank"] for r in ref} == {0, 1}, ref
last = max(ref, key=lambda r: r["bytes_loaded"])
assert last["bytes_loaded"] == last["bytes_total"] == 240, last
PY
ls "$tmp/full-w2/tokenized/"reference-*.bin >/dev/null || fail "no reference table was kept"
# A second run in the same folder reads the table back: no phase reference.
"$ty" train "${common[@]}" --train.steps 4 --world_size 1 --train.micro_batch_size 4 \
  --train.lr 1e-3 --output_dir "$tmp/full-w2" --json >"$tmp/again.out" 2>"$tmp/again.log" ||
  { cat "$tmp/again.log" >&2; fail "the second full run failed"; }
! grep -q '"phase":"reference"' "$tmp/again.out" || fail "the reference was scored again"
cmp <(rank0_losses "$tmp/again.out") "$tmp/full-w1.loss" ||
  fail "the kept reference gave other losses"

# --- Refusals, naming the file and line or the field.
refuse() { # WANT ARGS...: validate fails and says WANT
  local want=$1
  shift
  if "$ty" validate "$@" >"$tmp/v.out" 2>&1; then fail "validate accepted: $*"; fi
  grep -qF -- "$want" "$tmp/v.out" || { cat "$tmp/v.out" >&2; fail "no \"$want\""; }
}
bad() { printf '%s\n' "$2" >"$tmp/$1.jsonl"; echo "$tmp/$1.jsonl"; }
dpo=(--model_path "$tmp/base" --data.format jsonl --data.chat_template llama3
     --train.objective dpo --train.micro_batch_size 1 --data.eval_fraction 0)
refuse 'line 1: no "rejected"' "${dpo[@]}" --data.path "$(bad norej '{"prompt": "q", "chosen": "a"}')"
refuse 'line 1: no "prompt"' "${dpo[@]}" --data.path "$(bad noprompt '{"chosen": "a", "rejected": "b"}')"
refuse 'share no first turn' "${dpo[@]}" --data.path "$(bad noshare \
  '{"chosen": [{"role":"user","content":"q"},{"role":"assistant","content":"a"}], "rejected": [{"role":"user","content":"r"},{"role":"assistant","content":"b"}]}')"
refuse "roles are out of order" "${dpo[@]}" --data.path "$(bad order \
  '{"prompt": [{"role":"user","content":"q"},{"role":"assistant","content":"x"}], "chosen": [{"role":"assistant","content":"a"}], "rejected": [{"role":"assistant","content":"b"}]}')"
refuse 'preference pair ("chosen", "rejected") is for train.objective' \
  --model_path "$tmp/base" --data.format jsonl --data.path "$data"
refuse 'dpo.beta: applies to preference tuning only' --model_path "$tmp/base" --dpo.beta 0.5
refuse 'dpo.beta: must be > 0' "${dpo[@]}" --data.path "$data" --dpo.beta 0
refuse 'data.packing: cannot be true with train.objective "dpo"' "${dpo[@]}" \
  --data.path "$data" --data.packing true
refuse 'dpo.label_smoothing: applies to dpo.loss_type sigmoid only' "${dpo[@]}" \
  --data.path "$data" --dpo.loss_type ipo --dpo.label_smoothing 0.1
echo "train_dpo: ok"
