#!/usr/bin/env bash
# demo.sh - the README's first command: builds trainyard and runs a job on
# the embedded defaults (SQLite file, local CPU ranks).
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh build
build=${TRAINYARD_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)"

"$build/cli/trainyard" version
echo "demo: the training demo (server + 2 CPU ranks) is coming; the build above is ready."
