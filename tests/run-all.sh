#!/usr/bin/env bash
# run-all.sh - every test suite, as README.md states and CI runs it:
#   1. installs what is missing (deploy/install-deps.sh test)
#   2. the release build and every ctest suite (GPU tests skip without a GPU)
#   3. the GPU suites on the simulated device (tests/cudasim): a build with
#      TRAINYARD_CUDA=SIM, every GPU suite (cuda jobs through trainyardd
#      too), then the multi-stream ones again with side streams run first
#      (TY_SIM_ORDER=side); then a worker-only clang build of the same with
#      AddressSanitizer + UBSan, for the CUDA host code (worker/cuda/*_cuda.c,
#      comm_nccl.c), every GPU suite but the long training one
#   4. a clang build with AddressSanitizer + UndefinedBehaviorSanitizer: the
#      unit tests again, each libFuzzer target for a bounded time, and the
#      worker's loading and training suites (real worker processes, CPU
#      ranks over shared memory)
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh test

jobs=$(nproc 2>/dev/null || echo 2)
build=${TRAINYARD_BUILD_DIR:-build}
asan=${TRAINYARD_ASAN_DIR:-build-asan}
sim=${TRAINYARD_SIM_DIR:-build-sim}
simasan=${TRAINYARD_SIM_ASAN_DIR:-build-sim-asan}

echo "== release build ($build)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$jobs"
echo "== tests ($build)"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --label-exclude 'fuzz|bench'
echo "== why GPU tests were skipped (if they were)"
ctest --test-dir "$build" -L gpu -V 2>/dev/null | grep -iE '^[0-9]+: .*skip' || echo "(none skipped)"

echo "== the GPU suites on the simulated device ($sim: TRAINYARD_CUDA=SIM)"
cmake -S . -B "$sim" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINYARD_CUDA=SIM >/dev/null
cmake --build "$sim" -j "$jobs"
ctest --test-dir "$sim" --output-on-failure -j "$jobs" -R '^(gpu/|sim/|integration/load_cuda$)'
echo "== the same, side streams run before the compute stream (TY_SIM_ORDER=side)"
TY_SIM_ORDER=side ctest --test-dir "$sim" --output-on-failure -j "$jobs" \
  -R '^(sim/device|gpu/(fsdp|model|train|comm_nccl))$'
echo "== the same under the sanitizers ($simasan: clang, address + undefined), but gpu/train and gpu/dpo"
CC=clang CXX=clang++ cmake -S . -B "$simasan" -DCMAKE_BUILD_TYPE=Debug -DTRAINYARD_SANITIZE=ON \
  -DTRAINYARD_CUDA=SIM -DTRAINYARD_WORKER_ONLY=ON >/dev/null
cmake --build "$simasan" -j "$jobs"
ctest --test-dir "$simasan" --output-on-failure -j "$jobs" \
  -R '^(gpu/|sim/|integration/load_cuda$)' -E '^gpu/(train|dpo)$'

echo "== sanitizer build ($asan: clang, address + undefined, libFuzzer)"
CC=clang CXX=clang++ cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DTRAINYARD_SANITIZE=ON \
  -DTRAINYARD_FUZZ=ON -DTRAINYARD_CUDA=OFF >/dev/null
cmake --build "$asan" -j "$jobs"
echo "== unit and fuzz tests under the sanitizers ($asan)"
ctest --test-dir "$asan" --output-on-failure -j "$jobs" --label-regex 'unit|fuzz'
echo "== the worker's load and training suites under the sanitizers ($asan)"
ctest --test-dir "$asan" --output-on-failure -j "$jobs" -R '^integration/(load|train|train_world|pytorch|train_qlora|convert_quantize)$'
