#!/usr/bin/env bash
# bench_smoke.sh - the GPU bench end to end on a small model (ctest
# gpu/bench_smoke, in builds on the simulated device): every bench program
# runs, every row of bench.jsonl says ok (torch may be skipped), and the
# table prints, so that a GPU host's run of tests/gpu/bench.sh meets no
# fault of the script's or the programs' own.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

TY_GPU_BENCH_CKPT="$tmp/ckpt" TY_GPU_BENCH_B=2 TY_GPU_BENCH_T=32 TY_GPU_BENCH_R=4 \
  TY_GPU_BENCH_STEPS=2 TY_GPU_BENCH_SHAPE="--hidden-size 64 --intermediate-size 128 --layers 2 \
--heads 4 --kv-heads 2 --vocab-size 300" \
  bash "$TRAINYARD_SRC_DIR/tests/gpu/bench.sh" "$bin" "$tmp" >"$tmp/table.txt" 2>&1 ||
  { cat "$tmp/table.txt" >&2; fail "bench.sh failed"; }
cat "$tmp/table.txt"
python3 - "$tmp/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
load = [r for r in rows if r["bench"] == "load"]
lora = [r for r in rows if r["bench"] == "lora"]
assert len(load) == 6, load  # 2 paths x (1 rank + 2 ranks)
assert len(lora) == 4, lora  # slots 0, 2, 1, then 0 with fp32 attention
attn = [r for r in rows if r["bench"] == "attn"]
assert len(attn) == 1 and (attn[0]["NH"], attn[0]["NKV"], attn[0]["HS"]) == (4, 2, 16), attn
for r in load + lora + attn:
    assert r["status"] == "ok", r
eff = {(r["world"], r["rank"]): r for r in load if r["path"] == "memory_efficient"}
std = {(r["world"], r["rank"]): r for r in load if r["path"] == "standard"}
for k in eff:
    assert eff[k]["device_peak_bytes"] < std[k]["device_peak_bytes"], (eff[k], std[k])
for r in lora:
    assert r["tokens_per_s"] > 0 and r["loss_last"] < r["loss_first"] * 1.5, r
# A bf16 base: attention's products on tensor cores, with a workspace,
# except in the last run (TRAINYARD_CUDA_ATTN_MIB=0).
for r in lora[:3]:
    assert r["attention"] == "tf32" and r["attention_workspace_bytes"] > 0, r
assert lora[3]["slots"] == 0 and lora[3]["attention"] == "fp32", lora[3]
assert lora[3]["attention_workspace_bytes"] == 0, lora[3]
for k in ("tiled", "rows", "tf32"):
    assert attn[0][k + "_fwd_ms"] > 0 and attn[0][k + "_bwd_ms"] > 0, attn
assert attn[0]["max_diff"] < 1e-4 and attn[0]["tf32_max_diff"] < 4e-3, attn
print("# bench smoke: %d load rows, %d lora rows, %d attn row, all ok" % (len(load), len(lora), len(attn)))
PY
echo ok
