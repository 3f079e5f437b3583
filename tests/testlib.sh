# testlib.sh - what the shell test scripts share; each sources it right
# after `set -euo pipefail`. It sets bin (the build tree, from ctest's
# TRAINYARD_BIN_DIR), ty (the trainyard CLI), worker (trainyard-worker) and
# tmp (a scratch directory removed at exit), and defines:
#   fail MESSAGE  print "FAIL: MESSAGE" and exit 1
#   words FILE N  write N seeded words of a 14-word vocabulary to FILE
#   rank0_losses OUT  print rank 0's per-step losses (repr, one a line) from
#                 the --json reports of `trainyard train` in OUT
#   train_losses NAME ARGS...  `trainyard train` with the caller's array
#                 `common` and ARGS into $tmp/NAME (its reports in
#                 $tmp/NAME.out, its log shown on failure); rank 0's losses
#                 into $tmp/NAME.losses
bin=${TRAINYARD_BIN_DIR:?set by ctest}
ty="$bin/cli/trainyard"
worker="$bin/worker/trainyard-worker"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

words() {
  python3 - "$1" "$2" <<'PY'
import random, sys
r = random.Random(1)
w = 'the cat sat on a mat and dog ran to house with red door'.split()
open(sys.argv[1], 'w').write(' '.join(r.choice(w) for _ in range(int(sys.argv[2]))))
PY
}

rank0_losses() {
  python3 - "$1" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["rank"] == 0 and r["phase"] == "training" and r["loss"] is not None:
        print(repr(r["loss"]))
PY
}

train_losses() {
  local name=$1
  shift
  "$ty" train "${common[@]}" "$@" --output_dir "$tmp/$name" >"$tmp/$name.out" \
    2>"$tmp/$name.log" || { cat "$tmp/$name.log" >&2; fail "$name failed"; }
  rank0_losses "$tmp/$name.out" >"$tmp/$name.losses"
}
