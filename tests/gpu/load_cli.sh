#!/usr/bin/env bash
# load_cli.sh - `trainyard load --device cuda` end to end (label integration,
# CUDA builds): without a GPU every rank must fail, one of them with the
# reason and what to do (the first to fail stops the others); with GPUs every
# rank must load onto its device by the memory-efficient path and report a
# device peak and the cudaMemGetInfo cross-check in its message.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

"$ty" mkmodel --out "$tmp/m" --hidden-size 64 --intermediate-size 100 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 97 --dtype bf16 --seed 3 >/dev/null
rc=0
"$ty" load --model_path "$tmp/m" --world_size 2 --device cuda --fsdp.memory_efficient_load true \
  --fsdp.bucket_mb 1 >"$tmp/out" 2>"$tmp/err" || rc=$?
python3 - "$tmp/out" "$rc" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rc = int(sys.argv[2])
assert len(lines) == 2, lines
if rc != 0:
    # The first rank to fail stops the others ("stopped before it finished").
    assert all(j["status"] == "failed" for j in lines), lines
    why = [j["message"] for j in lines if "no CUDA device is visible" in j["message"]]
    assert why and "use device cpu" in why[0], lines
    print("no GPU: the ranks failed with:", why[0])
else:
    for j in lines:
        assert j["status"] == "ok" and j["path"] == "memory_efficient", j
        assert j["device_peak_bytes"] > 0, j
        assert "cudaMemGetInfo peak" in j["message"], j
    print("GPU: device peaks", [j["device_peak_bytes"] for j in lines])
PY
