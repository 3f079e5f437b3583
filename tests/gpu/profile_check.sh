#!/usr/bin/env bash
# profile_check.sh - the CUDA backend's profiler (ctest gpu/profile, in CUDA
# builds and on the simulated device; skipped without a GPU), through
# bench_profile on a 2-layer bf16 model, 3 profiled steps after 2 warm-up:
#   - every op a LoRA step runs is a row, and no other, with the calls that
#     the layer count gives (per step, L layers, all seven projections
#     adapted, the head in one chunk: 2L+1 RMSNorms each way, 7L+1 bf16
#     products each way, each behind a conversion of its input to bf16,
#     7L adapters each way, 2L rotations each way, L attentions each way on
#     the path the run chose, one embedding, loss, sum and AdamW), the
#     warm-up's calls not among them;
#   - the shares add up to 100%, the rows to the totals, each op measured
#     some time, and the ops' time lies within the device span, which lies
#     within the wall time; the event pool, sized by the warm-up, did not
#     grow during the steps, though they ran more ops than it holds pairs;
#   - the same steps unprofiled give the same losses and adapters, bit for
#     bit (profiling changes no result);
#   - with attention in fp32 (TRAINYARD_CUDA_ATTN_MIB=0) its rows are the
#     fp32 path's.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

prog="$bin/tests/gpu_bench_profile"
"$ty" mkmodel --out "$tmp/ckpt" --hidden-size 64 --intermediate-size 128 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 300 --dtype bf16 --seed 1 >/dev/null
run() { # NAME [PROFILE], under the caller's environment
  local name=$1 rc=0
  shift
  "$prog" "$tmp/ckpt" 2 16 4 3 "$@" >"$tmp/$name.jsonl" 2>"$tmp/$name.err" || rc=$?
  [ "$rc" = 77 ] && { cat "$tmp/$name.jsonl"; exit 77; }
  [ "$rc" = 0 ] || { cat "$tmp/$name.err" >&2; fail "bench_profile ($name) exited $rc"; }
}
run tf32
run off 0
TRAINYARD_CUDA_ATTN_MIB=0 run fp32
cat "$tmp/tf32.err"

python3 - "$tmp" <<'PY'
import json, os, sys

def load(name):
    rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], name + ".jsonl"))]
    ops = {r["op"]: r for r in rows if r["bench"] == "profile"}
    summary = [r for r in rows if r["bench"] == "profile_summary"]
    assert len(summary) == 1 and len(ops) + 1 == len(rows), rows
    return ops, summary[0]

def expected(L, attn):
    return {
        "embedding_forward bf16": 1,
        "rmsnorm_forward": 2 * L + 1, "rmsnorm_backward": 2 * L + 1,
        "f32_to_bf16": 2 * (7 * L + 1),
        "matmul_forward bf16": 7 * L + 1, "matmul_backward bf16": 7 * L + 1,
        "lora_forward": 7 * L, "lora_backward": 7 * L,
        "rope_forward": 2 * L, "rope_backward": 2 * L,
        "attention_forward " + attn: L, "attention_backward " + attn: L,
        "swiglu_forward": L, "swiglu_backward": L,
        "crossentropy_forward": 1, "crossentropy_backward": 1,
        "sum": 1, "adamw_step": 1,
    }

def check(name, attn):
    ops, s = load(name)
    assert s["status"] == "ok" and s["profiled"] and s["layers"] == 2, s
    assert s["attention"] == {"tf32": "tf32", "f32": "fp32"}[attn], s
    want = {op: n * s["steps"] for op, n in expected(s["layers"], attn).items()}
    got = {op: r["calls"] for op, r in ops.items()}
    assert got == want, "%s: calls %s, want %s" % (name, got, want)
    shares = sum(r["share"] for r in ops.values())
    assert abs(shares - 100.0) < 0.05, "%s: shares add up to %g" % (name, shares)
    assert sum(got.values()) == s["calls"], (name, s)
    assert abs(sum(r["ms"] for r in ops.values()) - s["ops_ms"]) < 1e-3 * len(ops), (name, s)
    assert all(r["ms"] > 0 for r in ops.values()), (name, ops)
    # On one stream the ops do not overlap: their time is inside the span
    # (events around the window), and the span inside the host's window.
    assert 0 < s["ops_ms"] <= s["span_ms"] * 1.0001 + 1e-3, (name, s)
    assert s["span_ms"] <= s["wall_ms"] * 1.0001 + 1e-3, (name, s)
    # Sized by the warm-up: the steps reuse the pool's events, whose pairs
    # (fewer than the steps' ops here) were summed as the device ran them.
    assert s["pool_grown"] == 0 and 0 < s["pool_pairs"] < s["calls"], (name, s)
    return s

on = check("tf32", "tf32")
check("fp32", "f32")
off_ops, off = load("off")
assert not off_ops and not off["profiled"] and off["calls"] == 0, (off_ops, off)
assert len(on["losses"]) == on["warmup"] + on["steps"], on
assert on["losses"] == off["losses"], "profiling changed the losses: %s, %s" % (on["losses"], off["losses"])
assert on["params_sum"] == off["params_sum"], (on["params_sum"], off["params_sum"])
assert on["losses"][-1] < on["losses"][0], on["losses"]
print("# profile: %d ops, %.1f%% of the span; the same losses unprofiled (%.3f ms a step "
      "profiled, %.3f not)" % (len(load("tf32")[0]), on["ops_share_of_span"], on["step_ms"],
                               off["step_ms"]))
PY
echo ok
