#!/usr/bin/env bash
# load.sh - benchmark of the two load paths: a >= 2 GiB bf16 checkpoint
# (TinyLlama-1.1B's shape, 2 shards) made by `trainyard mkmodel` in a
# temporary directory, loaded by 2 local ranks with the standard and the
# memory-efficient path. Prints, per rank: bytes read, host peak (VmHWM),
# the memory-efficient target, load seconds and GB/s, beside the page-cache
# read bandwidth of the same files measured in the same run; then checks
#   memory-efficient host peak <= rank's shard + one bucket + 64 MiB
#   memory-efficient load time <= 1.2 x the standard path's
# and exits non-zero when a target is missed. The checkpoint is deleted.
#
# Environment: TRAINYARD_BIN_DIR (build directory, default ./build),
# BENCH_DIR (where the checkpoint goes, default $TMPDIR or /tmp),
# BENCH_DTYPE (shard dtype, default bfloat16; float32 makes the standard
# path hold ~6.6 GB per rank), BENCH_BUCKET_MB (default 64), BENCH_LAYERS
# (default 22: 1.1 B parameters).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${TRAINYARD_BIN_DIR:-$here/build}
ty="$bin/cli/trainyard"
dtype=${BENCH_DTYPE:-bfloat16}
bucket=${BENCH_BUCKET_MB:-64}
layers=${BENCH_LAYERS:-22}
[ -x "$ty" ] || { echo "build first: $ty not found" >&2; exit 2; }
dir=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/trainyard-bench-load.XXXXXX")
trap 'rm -rf "$dir"' EXIT

echo "== mkmodel: TinyLlama-1.1B shape, $layers layers, bf16, 2 shards -> $dir"
t0=$(date +%s.%N)
"$ty" mkmodel --out "$dir/m" --hidden-size 2048 --intermediate-size 5632 --layers "$layers" \
  --heads 32 --kv-heads 4 --vocab-size 32000 --dtype bf16 --shards 2 --seed 1
t1=$(date +%s.%N)
echo "   written in $(python3 -c "print(f'{$t1-$t0:.1f}')") s"

# Page-cache read bandwidth of the same files: one warm-up pass, then timed.
files=("$dir"/m/*.safetensors)
cat "${files[@]}" >/dev/null
t0=$(date +%s.%N)
cat "${files[@]}" >/dev/null
t1=$(date +%s.%N)
bytes=$(cat "${files[@]}" | wc -c)
cache_gbps=$(python3 -c "print(f'{$bytes/($t1-$t0)/1e9:.2f}')")
echo "== page-cache read: $bytes bytes at $cache_gbps GB/s (one reader)"

run() { # run PATH_FLAG OUT
  "$ty" load --model_path "$dir/m" --world_size 2 --dtype "$dtype" --fsdp.bucket_mb "$bucket" \
    --fsdp.memory_efficient_load "$1" >"$2" 2>/dev/null
}
# Each path twice, alternating; the second of each is reported (warm cache).
run false "$dir/std1" && run true "$dir/eff1" && run false "$dir/std" && run true "$dir/eff"

python3 - "$dir/std" "$dir/eff" "$bucket" "$cache_gbps" "$bytes" "$dtype" <<'EOF'
import json, sys
std = [json.loads(l) for l in open(sys.argv[1])]
eff = [json.loads(l) for l in open(sys.argv[2])]
bucket, cache, total, dtype = int(sys.argv[3]) << 20, sys.argv[4], int(sys.argv[5]), sys.argv[6]
MiB = 1 << 20
print(f"\ncheckpoint {total / 2**30:.2f} GiB bf16 in 2 files; 2 ranks; shard dtype {dtype}; "
      f"bucket {bucket // MiB} MiB; page-cache read {cache} GB/s\n")
print("| path | rank | read MiB | host peak MiB | device peak MiB | target MiB | load s | GB/s |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
ok = True
for name, rows in (("standard", std), ("memory-efficient", eff)):
    for j in rows:
        target = ""
        if name == "memory-efficient":
            # device peak = this rank's converted shard (the CPU placement)
            t = j["device_peak_bytes"] + bucket + 64 * MiB
            target = f"{t / MiB:.0f}"
            if j["host_peak_bytes"] > t:
                ok = False
                print(f"MISSED: rank {j['rank']} host peak above its target", file=sys.stderr)
        print(f"| {name} | {j['rank']} | {j['bytes_loaded'] / MiB:.0f} | "
              f"{j['host_peak_bytes'] / MiB:.0f} | {j['device_peak_bytes'] / MiB:.0f} | "
              f"{target} | {j['load_seconds']:.2f} | {j['gb_per_s']:.2f} |")
ts = max(j["load_seconds"] for j in std)
te = max(j["load_seconds"] for j in eff)
print(f"\nslowest rank: standard {ts:.2f} s, memory-efficient {te:.2f} s "
      f"(ratio {te / ts:.2f}, target <= 1.2)")
if te > 1.2 * ts:
    ok = False
    print("MISSED: memory-efficient load slower than 1.2 x standard", file=sys.stderr)
print("targets:", "met" if ok else "MISSED")
sys.exit(0 if ok else 1)
EOF
