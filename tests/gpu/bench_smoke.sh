#!/usr/bin/env bash
# bench_smoke.sh - the GPU bench end to end on a small model (ctest
# gpu/bench_smoke, in builds on the simulated device): every bench program
# runs (LoRA, full training through the worker's device path, loads,
# attention), every row of bench.jsonl says ok, PyTorch's rows are run on
# the CPU where python3 has torch, transformers and peft and otherwise say
# skipped with the reason, and the verdict prints with "no reference" where
# PyTorch is missing; a missed target does not fail the bench, a failing
# program does. Then the verdict alone over the same rows with PyTorch
# rows given (its ratios, MFU count and met/missed checked against sums
# made here), so that a GPU host's run of tests/gpu/bench.sh meets no
# fault of the script's or the programs' own.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

bench() { # OUTDIR [VAR=VALUE...]: bench.sh on the small model; its exit status
  local o=$1
  shift
  mkdir -p "$o"
  env TY_GPU_BENCH_CKPT="$tmp/ckpt" TY_GPU_BENCH_B=2 TY_GPU_BENCH_T=32 TY_GPU_BENCH_R=4 \
    TY_GPU_BENCH_STEPS=2 TY_GPU_BENCH_FULL_STEPS=2 TY_GPU_BENCH_TORCH_DEVICE=cpu \
    TY_GPU_BENCH_SHAPE="--hidden-size 64 --intermediate-size 128 --layers 2 --heads 4 \
--kv-heads 2 --vocab-size 300 --tie-embeddings" "$@" \
    bash "$TRAINYARD_SRC_DIR/tests/gpu/bench.sh" "$bin" "$o" >"$o/table.txt" 2>&1
}

bench "$tmp/a" || { cat "$tmp/a/table.txt" >&2; fail "bench.sh failed"; }
cat "$tmp/a/table.txt"
grep -Eq '^figure +\| +ours +\| +pytorch +\| +ratio +\| target +\| result$' "$tmp/a/table.txt" ||
  fail "no verdict table header"
cmp -s <(sed -n '/^figure /,$p' "$tmp/a/table.txt") "$tmp/a/verdict.txt" ||
  fail "verdict.txt is not the table printed"
have_torch=0
python3 -c 'import torch, transformers, peft' 2>/dev/null && have_torch=1
python3 - "$tmp/a/bench.jsonl" $have_torch <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
have_torch = sys.argv[2] == "1"
kind = lambda k: [r for r in rows if r["bench"] == k]
load, lora, full, torch, verdict = (kind(k) for k in ("load", "lora", "full", "torch", "verdict"))
assert len(load) == 6, load  # 2 paths x (1 rank + 2 ranks)
assert [r["run"] for r in lora] == ["whole", "slots2", "slots1", "fp32attn"], lora
attn = kind("attn")
assert len(attn) == 1 and (attn[0]["NH"], attn[0]["NKV"], attn[0]["HS"]) == (4, 2, 16), attn
for r in load + lora + full + attn:
    assert r["status"] == "ok", r
eff = {(r["world"], r["rank"]): r for r in load if r["path"] == "memory_efficient"}
std = {(r["world"], r["rank"]): r for r in load if r["path"] == "standard"}
for k in eff:
    assert eff[k]["device_peak_bytes"] < std[k]["device_peak_bytes"], (eff[k], std[k])
for r in lora:
    assert r["tokens_per_s"] > 0 and r["loss_last"] < r["loss_first"] * 1.5, r
    assert r["device_used_bytes"] >= r["allocator_peak_bytes"] > 0, r
# A bf16 base: attention's products on tensor cores, with a workspace,
# except in the last run (TRAINYARD_CUDA_ATTN_MIB=0).
for r in lora[:3]:
    assert r["attention"] == "tf32" and r["attention_workspace_bytes"] > 0, r
assert lora[3]["slots"] == 0 and lora[3]["attention"] == "fp32", lora[3]
assert lora[3]["attention_workspace_bytes"] == 0, lora[3]
for k in ("tiled", "rows", "tf32"):
    assert attn[0][k + "_fwd_ms"] > 0 and attn[0][k + "_bwd_ms"] > 0, attn
assert attn[0]["max_diff"] < 1e-4 and attn[0]["tf32_max_diff"] < 4e-3, attn
# Full training: every weight of the tied model (the head is the
# embedding: 93,248 parameters), float32 weights, gradients and two moments
# on the device, and the same batch's loss going down.
(f,) = full
assert f["mode"] == "full" and f["dtype"] == "float32" and f["params"] == 93248, f
assert f["allocator_peak_bytes"] >= 4 * 4 * f["params"], f
assert math.isfinite(f["loss_first"]) and f["loss_last"] < f["loss_first"], f
assert f["tokens_per_s"] > 0 and f["grad_norm_last"] > 0, f
assert [r["run"] for r in torch] == ["lora", "full"], torch
for r in torch:
    if have_torch:  # PyTorch on the CPU, the same checkpoint and batch shape
        assert r["status"] == "ok" and r["device"] == "cpu", r
        assert abs(r["loss_first"] - f["loss_first"]) < 0.1, (r, f)
    else:
        assert r["status"] == "skipped" and "lacks" in r["message"], r
assert len(verdict) == 9, verdict
res = {v["figure"]: v["result"] for v in verdict}
assert res["load device peak (allocator)"] == "met", res
assert res["LoRA MFU (6N + attention)"] == "missed", res  # a small model on the CPU
for fig, r in res.items():
    if not have_torch and "x" in next(v["target"] for v in verdict if v["figure"] == fig):
        assert r == "no reference", (fig, r)
print("# bench smoke: %d load, %d lora, %d full, %d attn, %d torch (%s), %d verdict rows" %
      (len(load), len(lora), len(full), len(attn), len(torch),
       "run on the CPU" if have_torch else "skipped", len(verdict)))
PY
tail -1 "$tmp/a/verdict.txt" | grep -Eq '^targets: [0-9]+ of 6 met, [0-9]+ missed, [0-9]+ no reference, 0 failed$' ||
  fail "verdict.txt's last line: $(tail -1 "$tmp/a/verdict.txt")"

# A program that fails (T 1 is refused by each) fails the bench, whose
# verdict still prints, naming the figures it could not measure.
if bench "$tmp/b" TY_GPU_BENCH_T=1; then fail "bench.sh passed although its programs failed"; fi
grep -q "^LoRA tokens/s .*| failed$" "$tmp/b/verdict.txt" || { cat "$tmp/b/table.txt"; fail "no failed LoRA row"; }
grep -q "^full training tokens/s (fp32) .*| failed$" "$tmp/b/verdict.txt" || fail "no failed full row"
grep -q '"bench":"full","run":"whole","status":"failed"' "$tmp/b/bench.jsonl" || fail "no failed full row in bench.jsonl"
echo "ok: a failing program fails the bench, and the verdict says failed"

# The verdict with PyTorch's rows: ours as measured above, PyTorch's set
# here, so that every ratio, the MFU count and each met/missed is known.
mkdir -p "$tmp/v"
python3 - "$tmp/a/bench.jsonl" "$tmp/v/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if r["bench"] not in ("torch", "verdict")]
our = lambda k, run: next(r for r in rows if r["bench"] == k and r["run"] == run and
                          r.get("path", "memory_efficient") == "memory_efficient")
lo, fu, ld = our("lora", "whole"), our("full", "whole"), our("load", "w1")
rows.append({"bench": "torch", "run": "lora", "status": "ok", "T": 32,
             "tokens_per_s": lo["tokens_per_s"] / 2.5, "load_seconds": ld["load_seconds"] / 2,
             "load_device_peak_bytes": ld["device_peak_bytes"],
             "device_used_bytes": lo["device_used_bytes"] * 2, "allocator_peak_bytes": 1})
rows.append({"bench": "torch", "run": "full", "status": "ok", "T": 32,
             "tokens_per_s": fu["tokens_per_s"] * 2, "device_used_bytes": 7})
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
TY_PEAK_TFLOPS=1e-6 python3 "$TRAINYARD_SRC_DIR/tests/gpu/bench_verdict.py" "$tmp/v/bench.jsonl" \
  "$tmp/ckpt/config.json" "$tmp/v" >/dev/null
python3 - "$tmp/v/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
v = {r["figure"]: r for r in rows if r["bench"] == "verdict"}
lo = next(r for r in rows if r["bench"] == "lora" and r["run"] == "whole")
want = {  # figure: (ratio, result)
    "load seconds (memory-efficient, bf16, 1 rank)": (2.0, "missed"),
    "load device peak (allocator)": (1.0, "met"),
    "LoRA tokens/s": (2.5, "met"),
    "LoRA MFU (6N + attention)": (2.5, "met"),
    "LoRA device memory (cudaMemGetInfo, process)": (0.5, "met"),
    "full training tokens/s (fp32)": (0.5, "missed"),
}
for fig, (ratio, res) in want.items():
    assert abs(v[fig]["ratio"] - ratio) < 1e-3 and v[fig]["result"] == res, (fig, v[fig])
assert v["LoRA allocator peak"]["result"] == "info", v
# 6 N + 6 L T QD for C 64, FF 128, L 2, NH 4, NKV 2, HS 16, V 300 (tied),
# T 32: N = 2 x (64 x (64 + 2 x 32) + 64 x 64 + 3 x 64 x 128) + 300 x 64
# = 92,928; 6 N + 6 x 2 x 32 x 64 = 582,144 FLOPs a token; peak 1 MFLOP/s.
mfu = v["LoRA MFU (6N + attention)"]["ours"]
assert abs(mfu - lo["tokens_per_s"] * 582144 / 1e6) < 1e-6 * mfu, (mfu, lo)
print("ok: the verdict's ratios, MFU and results with PyTorch's rows")
PY
tail -1 "$tmp/v/verdict.txt" | grep -qx 'targets: 4 of 6 met, 2 missed, 0 no reference, 0 failed' ||
  fail "verdict.txt's last line: $(tail -1 "$tmp/v/verdict.txt")"
echo ok
