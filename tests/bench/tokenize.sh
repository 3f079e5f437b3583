#!/usr/bin/env bash
# tokenize.sh - encoding throughput of trainyard's tokenizer beside the
# reference (@huggingface/tokenizers on node), in one run, on the same
# English text: the licence texts of /usr/share/common-licenses repeated to
# about BENCH_MB (default 20) MB, encoded line by line with the Llama 3
# tokenizer (BENCH_MODEL=llama2 for Llama 2). Prints both MB/s and the
# ratio; exits non-zero when trainyard encodes under BENCH_MIN_MBPS (default
# 10) MB/s on one core. MB/s are per CPU-second of each (single-threaded)
# process, so that a busy machine does not count against either; wall
# seconds are printed beside them.
#
#   tokenize.sh NODE_MODULES     (the build's tests/text-npm/node_modules)
#
# Environment: TRAINYARD_BIN_DIR (build directory, default ./build).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${TRAINYARD_BIN_DIR:-$here/build}
modules=${1:-$bin/tests/text-npm/node_modules}
model=${BENCH_MODEL:-llama3}
mb=${BENCH_MB:-20}
min=${BENCH_MIN_MBPS:-10}
dir="$modules/@lenml/tokenizer-$model/models"
[ -x "$bin/tests/tok_bench" ] || { echo "build first: $bin/tests/tok_bench not found" >&2; exit 2; }
[ -f "$dir/tokenizer.json" ] || { echo "no $dir/tokenizer.json (the build's npm ci)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-bench-tok.XXXXXX")
trap 'rm -rf "$work"' EXIT

licences=(/usr/share/common-licenses/{Apache-2.0,Artistic,BSD,GPL-2,GPL-3,LGPL-2.1,LGPL-3,MPL-2.0})
while [ "$(stat -c %s "$work/text.txt" 2>/dev/null || echo 0)" -lt $((mb * 1000000)) ]; do
  cat "${licences[@]}" >>"$work/text.txt"
done
echo "== $(($(stat -c %s "$work/text.txt") / 1000000)) MB of licence text, $model tokenizer, one encode per line"
ours=$(taskset -c 0 "$bin/tests/tok_bench" "$dir" "$work/text.txt" 2>/dev/null ||
       "$bin/tests/tok_bench" "$dir" "$work/text.txt")
ref=$(NODE_PATH="$modules" node "$here/tests/text/bench_ref.cjs" "$dir" "$work/text.txt")
echo "trainyard:                 $ours"
echo "@huggingface/tokenizers:   $ref"
python3 - "$ours" "$ref" "$min" <<'PY'
import json, sys
ours, ref, minimum = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
if ours["ids"] != ref["ids"]:
    sys.exit(f"the two disagree: {ours['ids']} ids against {ref['ids']}")
print(f"trainyard {ours['mb_per_s']:.1f} MB/s, reference {ref['mb_per_s']:.1f} MB/s (per core): "
      f"{ours['mb_per_s'] / ref['mb_per_s']:.1f}x")
if ours["mb_per_s"] < minimum:
    sys.exit(f"trainyard encodes at {ours['mb_per_s']:.1f} MB/s, under the {minimum} MB/s target")
PY
