#!/usr/bin/env bash
# jsonl_check.sh - validation of a JSONL file (rule data-holds-a-batch)
# tokenizes only the start of a large file, TRAINYARD_JSONL_CHECK_KIB of it
# (here 64 KiB of a ~2.4 MiB file), when the examples there already hold a
# global batch; the ranks tokenize all of it:
#   - a bad line within the start is refused by validate, naming the line;
#   - a bad line past it passes validate, and `trainyard train` fails at
#     its ranks' tokenizing, naming the file and the line; with the bound 0
#     validate reads the whole file and refuses it;
#   - where the start holds too few examples for a global batch the whole
#     file decides: enough in all passes, too few is refused with the
#     rows it has;
#   - a bound that is not a number is named;
#   - a rank sent SIGTERM while it tokenizes (before its first step) exits
#     75, preempted, leaving no half-written examples file.
# usage: jsonl_check.sh TOKENIZER_DIR (tokenizer.json + tokenizer_config.json)
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
tokdir=${1:?the Llama 3 tokenizer folder}

"$ty" mkmodel --out "$tmp/base" --hidden-size 32 --intermediate-size 64 --layers 1 --heads 2 \
  --kv-heads 1 --vocab-size 128256 --tie-embeddings --seed 5 >/dev/null
cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$tmp/base/"
python3 - "$tmp" <<'PY'
import json, random, sys
tmp = sys.argv[1]
r = random.Random(3)
w = "the quick brown fox jumps over a lazy dog near the river bank at dawn".split()
def ex():
    return json.dumps({"messages": [
        {"role": "user", "content": " ".join(r.choice(w) for _ in range(40))},
        {"role": "assistant", "content": " ".join(r.choice(w) for _ in range(80))}]})
good = [ex() for _ in range(4000)]
def write(name, lines):
    open(f"{tmp}/{name}.jsonl", "w").write("\n".join(lines) + "\n")
write("good", good)
write("late", good[:3990] + ['{"messages": 3}'] + good[3991:])
write("early", good[:4] + ['{"messages": 3}'] + good[5:])
write("few", good[:120])
PY
export TRAINYARD_JSONL_CHECK_KIB=64
common=(--model_path "$tmp/base" --use_lora true --lora_rank 4 --data.format jsonl
        --data.chat_template llama3 --data.seq_len 64 --train.steps 1)
check() { "$ty" validate "${common[@]}" "$@" >"$tmp/out" 2>&1; }

check --data.path "$tmp/good.jsonl" || { cat "$tmp/out"; fail "the good file is refused"; }
check --data.path "$tmp/early.jsonl" && fail "a bad line at the start passes validate"
grep -q "early.jsonl line 5: \"messages\" must be a non-empty list" "$tmp/out" ||
  { cat "$tmp/out"; fail "the bad line at the start is not named"; }
check --data.path "$tmp/late.jsonl" || { cat "$tmp/out"; fail "validate read past its bound"; }
if "$ty" train "${common[@]}" --data.path "$tmp/late.jsonl" --output_dir "$tmp/o-late" \
  >"$tmp/train.out" 2>&1; then
  fail "a job over a bad line trained"
fi
grep -q "late.jsonl line 3991: \"messages\" must be a non-empty list" "$tmp/train.out" ||
  { cat "$tmp/train.out"; fail "the ranks did not name the bad line"; }
echo "ok   the ranks name a bad line validate did not read: $(grep -o 'late.jsonl line 3991[^;]*' "$tmp/train.out" | head -1)"
TRAINYARD_JSONL_CHECK_KIB=0 check --data.path "$tmp/late.jsonl" &&
  fail "with no bound validate passes a bad line"
grep -q "late.jsonl line 3991" "$tmp/out" || { cat "$tmp/out"; fail "the whole file was not read"; }
# A global batch of 2 x 80 rows of 65 tokens: more than the start's
# examples make, fewer than the file's.
check --data.path "$tmp/good.jsonl" --train.micro_batch_size 80 --train.grad_accum 2 ||
  { cat "$tmp/out"; fail "the whole file was not read where the start holds too few"; }
check --data.path "$tmp/few.jsonl" --train.micro_batch_size 80 --train.grad_accum 2 &&
  fail "a file of too few examples passes"
grep -q "^data.path: " "$tmp/out" || { cat "$tmp/out"; fail "too few examples not named"; }
echo "ok   too few for a global batch: $(head -c 300 "$tmp/out")"
TRAINYARD_JSONL_CHECK_KIB=soon check --data.path "$tmp/good.jsonl" &&
  fail "a bound that is no number passes"
grep -q "TRAINYARD_JSONL_CHECK_KIB='soon' is not a whole number" "$tmp/out" ||
  { cat "$tmp/out"; fail "the bad bound is not named"; }

# SIGTERM while the rank tokenizes a file of ~30 MiB (seconds of work).
python3 - "$tmp" <<'PY'
import sys
tmp = sys.argv[1]
good = open(f"{tmp}/good.jsonl").read()
open(f"{tmp}/big.jsonl", "w").write(good * 13)
PY
cat >"$tmp/big.json" <<JSON
{"name": "big", "model_path": "$tmp/base", "use_lora": true, "lora_rank": 4,
 "data": {"path": "$tmp/big.jsonl", "format": "jsonl", "chat_template": "llama3", "seq_len": 64},
 "train": {"steps": 1}, "output_dir": "$tmp/o-big"}
JSON
TRAINYARD_SPEC="$tmp/big.json" "$worker" >/dev/null 2>"$tmp/big.err" &
pid=$!
for _ in $(seq 400); do
  grep -q "tokenize " "$tmp/big.err" 2>/dev/null && break
  sleep 0.02
done
grep -q "tokenize " "$tmp/big.err" || { cat "$tmp/big.err"; fail "the rank never tokenized"; }
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 75 ] || { cat "$tmp/big.err"; fail "SIGTERM while tokenizing: exit $rc, not 75"; }
if ls "$tmp/o-big/tokenized" | grep -q "partial"; then
  ls -la "$tmp/o-big/tokenized"
  fail "a half-written examples file was left"
fi
echo "ok   SIGTERM while tokenizing: exit 75, no half-written file"
echo "ok   validation reads the start of a large JSONL file, the ranks all of it"
