#!/usr/bin/env bash
# run.sh OUTDIR - everything trainyard checks on a GPU host, in one command,
# within about 8 minutes: builds the worker-only variant with CUDA, runs the
# GPU suites (ctest label gpu: CUDA kernels against the CPU backend, both
# load paths onto the device, NCCL collectives, sharded LoRA and
# full-training passes through NCCL against the whole model, LoRA and full
# training against the CPU worker, the device allocator's cap, and a GPU
# capped too small for the standard load failing with the fix while the
# memory-efficient load trains; and `trainyard load --device cuda`),
# then the GPU bench (tests/gpu/bench.sh). Results land in OUTDIR:
#   preflight.txt  the host: GPU, driver, toolkit, compilers, libraries
#   build.log      configure + build
#   tests.log      ctest output of the GPU suites (pass/fail per test), and
#                  the end of compute-sanitizer's memcheck/racecheck of the
#                  kernels (run last, in what is left of the 8 minutes)
#   bench.txt      the bench's human-readable tables, ending with the verdict
#   bench.jsonl    the bench's figures, one JSON object per line
#   verdict.txt    ours against PyTorch, each figure against its target
#                  (figure | ours | pytorch | ratio | target | result)
#   profile.txt    a LoRA step's time op by op (bench_profile)
#   summary.txt    one line per stage and the verdict
# Exit status 0 only when the build found NCCL, every GPU test passed (and
# none skipped: on a GPU host a skip is a failure), the bench's programs
# ran (a missed target is a finding, counted on the bench's summary line,
# not a failure) and compute-sanitizer reported no error (one that cannot attach to the device
# or runs out of time is reported, not failed).
#
# The build needs CMake, a C compiler, the CUDA toolkit (nvcc, cuBLAS), NCCL
# ($NCCL_HOME's, the toolkit's, the system's, or else the nvidia-nccl wheel
# of the python3 on PATH, as PyTorch's environments have it) and the
# worker's libraries: jansson, OpenBLAS, libcurl and protobuf-c (with protoc-c) with pkg-config. A host
# without them (an image with the toolkit only) can take them as .deb files:
# TY_DEPS_DEBS=DIR unpacks every DIR/*.deb into a private prefix first
# (tests/gpu/fetch-debs.sh DIR gathers them on a Debian machine with apt).
#
# Environment: TY_GPU_BUILD_DIR (default <source>/build-gpu),
#   TY_GPU_BENCH=0 to skip the bench, TY_GPU_BENCH_TIMEOUT (seconds, 420),
#   TY_GPU_TEST_TIMEOUT (seconds for each GPU suite, 300),
#   TY_DEPS_DEBS as above, TY_GPU_CUDA (the build's TRAINYARD_CUDA, ON):
#   SIM rehearses this whole script on the simulated device on a machine
#   without a GPU (with the bench's TY_GPU_BENCH_* set to a small model, as
#   tests/gpu/bench_smoke.sh does; integration/gpu_run does so in CI),
#   TY_GPU_TESTS (a ctest -R regex narrowing the GPU suites, for such
#   rehearsals; all of them by default).
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: tests/gpu/run.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1" && out=$(cd "$1" && pwd) || exit 2
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${TY_GPU_BUILD_DIR:-$src/build-gpu}
t0=$SECONDS
: >"$out/summary.txt"
stage() { printf '%-10s %-5s %4ds  %s\n' "$1" "$2" $((SECONDS - t0)) "${3:-}" | tee -a "$out/summary.txt"; }
jobs=$(nproc 2>/dev/null || echo 4)
# The suites compare fp32 products with the CPU's: no TF32 forced on cuBLAS
# by the environment.
unset NVIDIA_TF32_OVERRIDE

# 1. The host.
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm), $jobs cpus"
  if command -v nvidia-smi >/dev/null; then
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
  else
    echo "gpu: nvidia-smi not found"
  fi
  if command -v nvcc >/dev/null; then echo "nvcc: $(nvcc --version | tail -1)"; else echo "nvcc: not found"; fi
  cmake --version 2>&1 | head -1
  cc --version 2>&1 | head -1
  command -v ninja >/dev/null && echo "ninja: $(ninja --version)"
  command -v pkg-config >/dev/null && for p in jansson openblas libcurl libprotobuf-c cmocka; do
    echo "pkg-config $p: $(pkg-config --modversion $p 2>&1)"
  done
  echo "nccl: $(ls /usr/local/cuda/lib64/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | tr '\n' ' ')"
  echo "nccl wheel: $(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>&1 | tail -1)"
  command -v compute-sanitizer >/dev/null && echo "compute-sanitizer: $(compute-sanitizer --version | grep -i version | head -1)"
} >"$out/preflight.txt" 2>&1
stage preflight ok "$(grep '^gpu:' "$out/preflight.txt")"

# 2. Libraries from .deb files, when given.
if [ -n "${TY_DEPS_DEBS:-}" ]; then
  # shellcheck source=tests/gpu/deps-env.sh
  . "$src/tests/gpu/deps-env.sh" "$TY_DEPS_DEBS" /tmp/trainyard-deps || { stage deps FAIL "unpacking $TY_DEPS_DEBS"; exit 1; }
  stage deps ok "$(ls "$TY_DEPS_DEBS"/*.deb | wc -l) packages unpacked into /tmp/trainyard-deps"
fi

# 3. The worker-only build with CUDA (sm_90 + PTX unless CUDAARCHS says
# otherwise), with line numbers for compute-sanitizer's reports.
# The toolkit's usual place, when its nvcc is not on PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTRAINYARD_WORKER_ONLY=ON \
  -DTRAINYARD_CUDA="${TY_GPU_CUDA:-ON}" -DCMAKE_CUDA_FLAGS=-lineinfo >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j"$jobs" >>"$out/build.log" 2>&1; then
  # NCCL comes from $NCCL_HOME, the toolkit, the system or python3's
  # nvidia-nccl wheel (CMakeLists.txt); without it the collectives
  # are not built, so their suites would be missing rather than failed.
  # The other suites still run, for what they show; the verdict fails.
  nccl=$(grep -o 'trainyard: NCCL .*' "$out/build.log" | tail -1)
  build_bad=0
  grep -q 'NCCL not found' <<<"$nccl" && build_bad=1
  # A library the loader cannot find here (one the .debs lack, say) would
  # fail every suite that starts a worker with exit status 127: named here.
  missing=$(ldd "$build/worker/trainyard-worker" "$build/cli/trainyard" 2>&1 | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
  if [ -n "$missing" ]; then
    build_bad=1
    echo "the loader cannot find: $missing" >>"$out/build.log"
  fi
  stage build "$([ $build_bad = 0 ] && echo ok || echo FAIL)" "$build; ${nccl#trainyard: }${missing:+; libraries not found: $missing}"
else
  stage build FAIL "see build.log"
  tail -30 "$out/build.log"
  exit 1
fi

# 4. The GPU suites (and the CLI's device path).
cd "$build" || exit 1
sel=${TY_GPU_TESTS:-.}
ctest -L gpu -R "$sel" -V --timeout "${TY_GPU_TEST_TIMEOUT:-300}" >"$out/tests.log" 2>&1
rc=$?
if [[ integration/load_cuda =~ $sel ]]; then
  ctest -R integration/load_cuda --output-on-failure --timeout 120 >>"$out/tests.log" 2>&1 || rc=1
fi
if grep -q "Skipped\|Not Run" "$out/tests.log"; then rc=1; fi
# No test at all is no pass.
grep -q "% tests passed" "$out/tests.log" || { rc=1; echo "no GPU test ran" >>"$out/tests.log"; }
[ "$build_bad" = 0 ] || rc=1
stage tests "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(grep '% tests passed\|no GPU test ran' "$out/tests.log" | tr '\n' ' ')"

# 5. The bench (figures for the README): ours against PyTorch and the
# targets. Its summary line counts the targets met (verdict.txt's last line).
if [ "${TY_GPU_BENCH:-1}" != 0 ]; then
  # Bounded, so that the results of the stages before come back whatever happens.
  timeout "${TY_GPU_BENCH_TIMEOUT:-420}" bash "$src/tests/gpu/bench.sh" "$build" "$out" \
    >"$out/bench.txt" 2>&1
  brc=$?
  targets=$(tail -1 "$out/verdict.txt" 2>/dev/null | grep '^targets: ')
  targets=${targets:-targets: no verdict}
  if [ $brc -eq 0 ]; then
    stage bench ok "$targets; verdict.txt, bench.txt, bench.jsonl"
  else
    stage bench FAIL "exit $brc$([ $brc -eq 124 ] && echo ' (timed out)'); $targets; see bench.txt"
    rc=1
  fi
fi
# 6. The kernels and the LoRA step once more under compute-sanitizer (small
# shapes): out-of-bounds accesses and shared-memory races. Last and bounded,
# so that the figures come back first: each run gets an equal part of what
# is left of the script's 8 minutes (TY_GPU_BUDGET seconds, 480), at most
# TY_GPU_SANITIZE_TIMEOUT (100). Errors it reports fail the verdict; a
# sanitizer that cannot attach to this device (some virtualised hosts refuse
# it) or runs out of time leaves the stage unchecked, and says so.
if [ "${TY_GPU_CUDA:-ON}" = SIM ]; then
  stage sanitize ok "not run: the simulated device has its own checks"
elif command -v compute-sanitizer >/dev/null; then
  checks=("memcheck gpu_kernels_check" "memcheck gpu_model_check" "racecheck gpu_kernels_check")
  san=ok found=0 what="" n=${#checks[@]} cap=${TY_GPU_SANITIZE_TIMEOUT:-100}
  for chk in "${checks[@]}"; do
    set -- $chk
    per=$(((${TY_GPU_BUDGET:-480} - (SECONDS - t0)) / n)) n=$((n - 1))
    if [ "$per" -lt 15 ]; then
      what+="$1 $2 not run (the time budget is spent); "
      continue
    fi
    [ "$per" -le "$cap" ] || per=$cap
    res=$(timeout "$per" compute-sanitizer --tool "$1" --error-exitcode 3 "$build/tests/$2" 2>&1)
    r=$?
    # The tool's own lines (each hazard or error with its kernel and line),
    # then the end of the program's output.
    {
      echo "== compute-sanitizer --tool $1 $2: exit $r"
      grep '^=========' <<<"$res" | head -150
      grep -v '^=========' <<<"$res" | tail -5
    } >>"$out/tests.log"
    if [ $r -eq 0 ]; then
      what+="$1 $2 ok; "
    elif [ $r -eq 124 ]; then
      what+="$1 $2 timed out after ${per}s; "
    elif grep -qi "not supported" <<<"$res"; then
      # The device refuses the sanitizer: the other runs would too.
      what+="unavailable on this host ($(grep -i -m1 'not supported' <<<"$res" | sed 's/^=* *//')); "
      break
    else
      found=1 what+="$1 $2 FAILED (exit $r); "
    fi
  done
  [ $found = 0 ] || { san=FAIL rc=1; }
  stage sanitize $san "${what%; }"
else
  stage sanitize ok "compute-sanitizer not found: not run"
fi
stage total "$([ $rc -eq 0 ] && echo ok || echo FAIL)"
exit $rc
