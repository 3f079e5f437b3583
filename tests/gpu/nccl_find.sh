#!/usr/bin/env bash
# nccl_find.sh - where the CUDA build finds NCCL (label integration; needs
# the CUDA toolkit, exits 77 without it). The top-level CMakeLists.txt
# looks in $NCCL_HOME, the toolkit and the system, then in the nvidia-nccl
# wheel of the python3 on PATH, where PyTorch's environments keep NCCL with
# no unversioned libnccl.so. Checked here, each in a worker-only configure:
#   1. NCCL_HOME naming a wheel-shaped folder (lib/libnccl.so.2 alone) wins
#      over the toolkit's NCCL, and the worker built against it loads that
#      library through its RUNPATH, with no LD_LIBRARY_PATH (and the RUNPATH
#      names the toolkit's library folder, for the CUDA runtime);
#   2. with every other NCCL hidden from the search, the wheel is found
#      through python3 (a package nvidia.nccl on PYTHONPATH);
#   3. with none anywhere, the configure says so, naming NCCL_HOME, and
#      leaves the nccl comm and its suite out instead of failing.
set -euo pipefail
src=${TRAINYARD_SRC_DIR:?set by ctest}
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "SKIP: no CUDA toolkit (nvcc): the CUDA build's NCCL search is not configured here"; exit 77; }
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
b=$tmp/build
configure() { cmake "$@" >"$tmp/cfg.log" 2>&1 || { tail -30 "$tmp/cfg.log"; fail "configure $*"; }; }
found() { grep -o 'trainyard: NCCL .*' "$tmp/cfg.log" | tail -1; }
cache() { sed -n "s/^$1:[A-Z]*=//p" "$b/CMakeCache.txt"; }

# The toolkit's (or the system's) own NCCL, if any: the wheel is made of it.
configure -S "$src" -B "$b" -DTRAINYARD_WORKER_ONLY=ON -DTRAINYARD_CUDA=ON -DCMAKE_BUILD_TYPE=Release
own_lib=$(cache NCCL_LIB) own_inc=$(cache NCCL_INCLUDE)
wheel=$tmp/py/nvidia/nccl
mkdir -p "$wheel/lib" "$wheel/include"
: >"$wheel/__init__.py"
real=0
if [ -f "$own_lib" ] && [ -f "$own_inc/nccl.h" ]; then
  ln -s "$(readlink -f "$own_lib")" "$wheel/lib/libnccl.so.2"
  cp "$own_inc/nccl.h" "$wheel/include/"
  real=1
else
  # No NCCL on this machine: empty stand-ins, for the configure steps only.
  : >"$wheel/lib/libnccl.so.2"
  : >"$wheel/include/nccl.h"
fi

# 1. NCCL_HOME first.
NCCL_HOME=$wheel configure "$b" -U NCCL_LIB -U NCCL_INCLUDE
[ "$(found)" = "trainyard: NCCL $wheel/lib/libnccl.so.2 (nccl.h in $wheel/include)" ] ||
  fail "NCCL_HOME=$wheel: the configure said '$(found)'"
if [ $real = 1 ]; then
  cmake --build "$b" -j2 --target trainyard-worker >"$tmp/build.log" 2>&1 ||
    { tail -30 "$tmp/build.log"; fail "build against NCCL_HOME's NCCL"; }
  got=$(env -u LD_LIBRARY_PATH ldd "$b/worker/trainyard-worker" | awk '$1 == "libnccl.so.2" {print $3}')
  [ "$got" = "$wheel/lib/libnccl.so.2" ] ||
    fail "trainyard-worker loads libnccl.so.2 from '$got', not from NCCL_HOME's $wheel/lib"
  # The CUDA runtime too is found through the RUNPATH, whatever ld.so.conf says.
  rt=$(ldd "$b/worker/trainyard-worker" | awk '$1 ~ /^libcudart\.so/ {print $3}')
  [ -n "$rt" ] || fail "trainyard-worker does not load a libcudart"
  runpath=$(readelf -d "$b/worker/trainyard-worker" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
  found_rt=0
  IFS=: read -ra dirs <<<"$runpath"
  for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ "$(readlink -f "$d")" = "$(dirname "$(readlink -f "$rt")")" ] && found_rt=1
  done
  [ $found_rt = 1 ] || fail "trainyard-worker's RUNPATH ($runpath) lacks the folder of $rt"
  echo "ok: NCCL_HOME's libnccl.so.2 (no unversioned link) is linked and loaded through RUNPATH, as is the CUDA runtime"
else
  echo "ok: NCCL_HOME's folder is chosen (no NCCL here to link against)"
fi

# 2. The wheel, once every other NCCL is hidden: each one the search finds
# is added to CMAKE_IGNORE_PATH (as written and as resolved) until the
# search falls through to python3.
ignore=()
for _ in 1 2 3 4 5 6; do
  hide=$(IFS=';' && echo "${ignore[*]}")
  PYTHONPATH=$tmp/py configure "$b" -U NCCL_LIB -U NCCL_INCLUDE "-DCMAKE_IGNORE_PATH=$hide"
  lib=$(cache NCCL_LIB) inc=$(cache NCCL_INCLUDE)
  [ "$lib" = "$wheel/lib/libnccl.so.2" ] && [ "$inc" = "$wheel/include" ] && break
  for p in "$lib" "$inc/nccl.h"; do
    [ -e "$p" ] || continue
    ignore+=("$(dirname "$p")" "$(dirname "$(readlink -f "$p")")")
  done
done
[ "$(found)" = "trainyard: NCCL $wheel/lib/libnccl.so.2 (nccl.h in $wheel/include)" ] ||
  fail "with the other NCCLs hidden (${ignore[*]:-none}), the wheel on PYTHONPATH was not found: '$(found)'"
echo "ok: python3's nvidia.nccl wheel found when nothing else has NCCL (hidden: ${ignore[*]:-none})"

# 3. None at all: said, and left out.
configure "$b" -U NCCL_LIB -U NCCL_INCLUDE "-DCMAKE_IGNORE_PATH=$hide"
grep -q "trainyard: NCCL not found (set NCCL_HOME" "$tmp/cfg.log" ||
  fail "without NCCL the configure did not say so: '$(found)'"
if (cd "$b" && ctest -N) | grep -q "gpu/comm_nccl"; then
  fail "without NCCL, gpu/comm_nccl is still registered"
fi
echo "ok: without NCCL the configure names NCCL_HOME and leaves the nccl comm out"
