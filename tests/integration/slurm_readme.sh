#!/usr/bin/env bash
# slurm_readme.sh - the "Running on a Slurm cluster" block of docs/slurm.md, run as
# written on the two-node test cluster (its folders moved into a temporary
# one and its port to a free one, so that nothing of this machine's is
# touched), then: the LoRA adapter is in the output folder and the job
# completion log has the job COMPLETED on both nodes. Skips (77) when not
# root or when Slurm is not installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${TRAINYARD_BIN_DIR:-$root/build}
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the test cluster needs root (slurmd starts job steps as their user)"
  exit 77
fi
for b in slurmctld slurmd munged sbatch; do
  command -v "$b" >/dev/null || { echo "SKIP: $b not installed (deploy/install-deps.sh test)"; exit 77; }
done
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
block=$(awk '/^## Running on a Slurm cluster/ {on = 1} on && /^```sh$/ {grab = 1; next}
             grab && /^```$/ {exit} grab {print}' "$root/docs/slurm.md")
[ -n "$block" ] || { echo "FAIL: no sh block in docs/slurm.md's Slurm section" >&2; exit 1; }
block=${block//\/tmp\/slurm/$tmp/slurm}
block=${block//\/tmp\/trainyard-shared/$tmp/shared}
block=${block//8090/$port}
block=${block//build\//$bin/}
group=
cleanup() {
  # The block ran in a process group of its own: whatever it left (its
  # trainyardd, after a failure) ends with it.
  [ -z "$group" ] || kill -TERM -- "-$group" 2>/dev/null || true
  bash "$root/deploy/slurm-cluster.sh" stop "$tmp/slurm" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
cd "$root"
# As a reader pastes it into a shell: each command must succeed.
setsid bash -eu -c "$block" >"$tmp/out.log" 2>&1 &
group=$!
wait "$group" || {
  cat "$tmp/out.log" >&2
  echo "FAIL: the Slurm block of docs/slurm.md failed" >&2
  exit 1
}
grep -q "succeeded" "$tmp/out.log" || { cat "$tmp/out.log" >&2; echo "FAIL: no success seen" >&2; exit 1; }
[ -f "$tmp/shared/runs/two-nodes/adapter_model.safetensors" ] || { echo "FAIL: no adapter" >&2; exit 1; }
grep "trainyard-two-nodes" "$tmp/slurm/log/jobcomp.log" | grep -q "JobState=COMPLETED.*NodeList=n\[1-2\]" ||
  { cat "$tmp/slurm/log/jobcomp.log" >&2; echo "FAIL: not COMPLETED on n[1-2]" >&2; exit 1; }
echo "ok: the Slurm block of docs/slurm.md ran as written"
