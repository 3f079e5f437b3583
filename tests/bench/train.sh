#!/usr/bin/env bash
# train.sh - training throughput benchmark (label bench, not run by CI):
# tokens/s and achieved GFLOP/s of full and LoRA training of a ~100M-parameter
# Llama at seq_len 256, beside OpenBLAS sgemm on the model's own shapes.
#   tests/bench/train.sh [steps] [micro_batch_size]
# Needs a release build (TRAINYARD_BIN_DIR, default build/).
set -euo pipefail
bin=${TRAINYARD_BIN_DIR:-$(dirname "$0")/../../build}
exec "$bin/tests/train_bench" "${1:-4}" "${2:-2}"
