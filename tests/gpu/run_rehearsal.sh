#!/usr/bin/env bash
# run_rehearsal.sh - tests/gpu/run.sh, the one command a GPU host runs, on
# the simulated device (label integration): its worker-only build into a
# temporary directory, two GPU suites (the kernels and the allocator's
# cap) and the bench on a small model, then the files and stage lines a
# GPU run is read from. And its verdict the other way: a selection that
# runs no suite, and a suite that fails (the simulated device made too
# small for it), each fail the run.
set -euo pipefail
src=${TRAINYARD_SRC_DIR:?set by ctest}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

rehearse() { # OUT [VAR=VALUE...]: run.sh on the simulated device; its exit status
  local out=$1
  shift
  env "$@" TY_GPU_CUDA=SIM TY_GPU_BUILD_DIR="$tmp/build" TY_GPU_BENCH_CKPT="$tmp/ckpt" \
    TY_GPU_BENCH_B=2 TY_GPU_BENCH_T=32 TY_GPU_BENCH_R=4 TY_GPU_BENCH_STEPS=2 TY_GPU_BENCH_FULL_STEPS=2 \
    TY_GPU_BENCH_TORCH_DEVICE=cpu \
    TY_GPU_BENCH_SHAPE="--hidden-size 64 --intermediate-size 128 --layers 2 --heads 4 --kv-heads 2 --vocab-size 300" \
    bash "$src/tests/gpu/run.sh" "$out" >"$out.log" 2>&1
}
line() { grep "^$2 " "$1/summary.txt" || true; }

# 1. A full rehearsal: every stage ok, exit 0.
out=$tmp/ok
rc=0
rehearse "$out" "TY_GPU_TESTS=^gpu/(kernels|mem)$" || rc=$?
[ $rc = 0 ] || { cat "$out.log"; fail "run.sh exited $rc"; }
for f in preflight.txt build.log tests.log bench.txt bench.jsonl verdict.txt profile.txt summary.txt; do
  [ -s "$out/$f" ] || fail "run.sh left no $f"
done
for s in preflight build tests bench sanitize total; do
  line "$out" $s | grep -Eq "^$s +ok " || fail "stage $s is not ok: '$(line "$out" $s)'"
done
line "$out" build | grep -q "NCCL ty_cudasim" || fail "the build line does not say where NCCL came from"
line "$out" bench | grep -Eq "^bench +ok .* targets: [0-9]+ of 6 met, " ||
  fail "the bench line does not count the targets: '$(line "$out" bench)'"
line "$out" tests | grep -q "0 tests failed out of 2" || fail "not the 2 selected suites: $(line "$out" tests)"
grep -q "gpu/kernels .*Passed" "$out/tests.log" || fail "tests.log does not show gpu/kernels passing"
python3 - "$out/bench.jsonl" <<'PY' || fail "bench.jsonl lacks rows"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
kinds = {}
for r in rows:
    kinds.setdefault(r["bench"], []).append(r)
ok = lambda k: [r for r in kinds.get(k, []) if r.get("status") == "ok"]
assert len(ok("load")) == 6, kinds.get("load")  # world 1 and 2, both paths
assert len(ok("lora")) == 4, kinds.get("lora")  # slots 0, 2, 1; 0 with fp32 attention
assert len(ok("full")) == 1, kinds.get("full")  # every weight, the worker's device path
assert len(ok("attn")) == 1, kinds.get("attn")
assert len(kinds.get("torch", [])) == 2, kinds.get("torch")  # LoRA and full, ok or skipped
assert len(kinds.get("verdict", [])) == 9, kinds.get("verdict")
# A LoRA step op by op: the attention and LoRA products among the ops.
ops = {r["op"] for r in kinds.get("profile", [])}
assert any(o.startswith("attention_forward") for o in ops) and "lora_forward" in ops, ops
assert len(kinds.get("profile_summary", [])) == 1, kinds.get("profile_summary")
PY
echo "ok: run.sh on the simulated device: every stage ok, every file written, the bench's rows"

# 2. No suite selected: no pass.
out=$tmp/none
if rehearse "$out" "TY_GPU_TESTS=^no-such-suite$" TY_GPU_BENCH=0; then fail "run.sh passed with no GPU suite run"; fi
line "$out" tests | grep -q "FAIL .*no GPU test ran" || fail "tests line: '$(line "$out" tests)'"
line "$out" total | grep -Eq "^total +FAIL" || fail "total line: '$(line "$out" total)'"
echo "ok: a run that selects no GPU suite fails"

# 3. A failing suite fails the run.
out=$tmp/bad
if rehearse "$out" "TY_GPU_TESTS=^gpu/kernels$" TY_GPU_BENCH=0 TY_SIM_MEM_MIB=1; then
  fail "run.sh passed although gpu/kernels failed"
fi
line "$out" tests | grep -Eq "^tests +FAIL " || fail "tests line: '$(line "$out" tests)'"
grep -q "gpu/kernels .*Failed" "$out/tests.log" || fail "tests.log does not show gpu/kernels failing"
echo "ok: a failing GPU suite fails the run"

# 4. A library the loader cannot find (seen on a GPU host whose .debs
# lacked one: every worker exited 127) fails the build stage by name. The
# loader's report comes from a stand-in ldd that adds one missing library.
mkdir -p "$tmp/fakebin"
cat >"$tmp/fakebin/ldd" <<'SH'
#!/bin/sh
echo "	libty-missing.so.7 => not found"
exec /usr/bin/ldd "$@"
SH
chmod +x "$tmp/fakebin/ldd"
out=$tmp/nolib
if rehearse "$out" "PATH=$tmp/fakebin:$PATH" "TY_GPU_TESTS=^gpu/mem$" TY_GPU_BENCH=0; then
  fail "run.sh passed although a library was not found"
fi
line "$out" build | grep -Eq "^build +FAIL .*libraries not found: libty-missing.so.7" ||
  fail "build line: '$(line "$out" build)'"
line "$out" total | grep -Eq "^total +FAIL" || fail "total line: '$(line "$out" total)'"
echo "ok: a library the loader cannot find fails the build stage, named"
