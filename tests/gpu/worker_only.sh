#!/usr/bin/env bash
# worker_only.sh - the worker-only build (label integration): configures
# trainyard with -DTRAINYARD_WORKER_ONLY=ON (CUDA off, so that it stays
# quick) into a temporary directory, builds everything it has (the worker,
# the CLI and the tests a GPU host runs: tests/gpu/run.sh builds the same
# variant with CUDA on), and checks that neither program links the server's
# libraries (gRPC, libmicrohttpd, SQLite) and that the configure step did
# not look for them. protobuf-c is the worker's too (TensorBoard's event
# files, worker/rank/tb_events.c).
set -euo pipefail
src=${TRAINYARD_SRC_DIR:?set by ctest}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake -S "$src" -B "$tmp" -DTRAINYARD_WORKER_ONLY=ON -DTRAINYARD_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/cfg.log" 2>&1 || { cat "$tmp/cfg.log"; fail "configure"; }
grep -q "worker-only ON" "$tmp/cfg.log" || fail "the configure step did not report worker-only"
if grep -Eiq "Checking for module '(grpc|libmicrohttpd|sqlite3)'" "$tmp/cfg.log"; then
  fail "a worker-only configure looked for a server library"
fi
cmake --build "$tmp" -j2 >"$tmp/build.log" 2>&1 ||
  { tail -30 "$tmp/build.log"; fail "build"; }
for b in worker/trainyard-worker cli/trainyard; do
  [ -x "$tmp/$b" ] || fail "$b was not built"
  if ldd "$tmp/$b" | grep -Ei "libgrpc|libmicrohttpd|libsqlite3"; then
    fail "$b links a server library"
  fi
done
"$tmp/cli/trainyard" mkmodel --out "$tmp/m" --hidden-size 16 --intermediate-size 20 --layers 1 \
  --heads 2 --kv-heads 1 --vocab-size 40 >/dev/null || fail "worker-only trainyard mkmodel"
echo "worker-only build: trainyard-worker and trainyard without server libraries"
