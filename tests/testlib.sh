# testlib.sh - what the shell test scripts share; each sources it right
# after `set -euo pipefail`. It sets bin (the build tree, from ctest's
# TRAINYARD_BIN_DIR), ty (the trainyard CLI), worker (trainyard-worker) and
# tmp (a scratch directory removed at exit), and defines:
#   fail MESSAGE  print "FAIL: MESSAGE" and exit 1
#   words FILE N  write N seeded words of a 14-word vocabulary to FILE
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
