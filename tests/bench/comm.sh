#!/usr/bin/env bash
# comm.sh - shm all_gather and reduce_scatter bandwidth for 2 ranks at 1, 16
# and 64 MiB, beside memcpy bandwidth measured in the same run (the ratio
# is memcpy time / collective time). Not run by CI (label bench).
#   TRAINYARD_BIN_DIR=build bash tests/bench/comm.sh [bench_comm options]
set -euo pipefail
bin=${TRAINYARD_BIN_DIR:-build}/tests/bench_comm
if [ ! -x "$bin" ]; then
  echo "comm.sh: $bin not found: build first (cmake --build build)" >&2
  exit 1
fi
nproc_now=$(nproc)
echo "# host: $(uname -m), $nproc_now cores, $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ $# -eq 0 ]; then set -- --ranks 2 --sizes 1,16,64 --iters 10; fi
exec "$bin" "$@"
