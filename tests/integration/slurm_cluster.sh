#!/usr/bin/env bash
# slurm_cluster.sh - deploy/slurm-cluster.sh brings up a real two-node Slurm
# cluster on this machine and takes it down again:
#   1. start: both nodes idle in sinfo (n1 at 127.0.0.1, n2 at 127.0.0.2)
#   2. srun over both nodes: each task sees its SLURM_PROCID, SLURM_NTASKS,
#      SLURM_NODEID, SLURM_LOCALID and node name, as trainyard's ranks will
#   3. sbatch of a two-node script: squeue shows it running on n[1-2]; it
#      ends COMPLETED in the job completion log; scancel ends a second one
#      with no task left behind
#   4. a second start while it runs changes nothing (one daemon of each)
#   5. stop: no daemon of the cluster and no task of its jobs remains
# Skips (77) when not root or when Slurm is not installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../../deploy/slurm-cluster.sh"
tmp=$(mktemp -d)
dir="$tmp/cluster"

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the test cluster needs root (slurmd starts job steps as their user)"
  exit 77
fi
for b in slurmctld slurmd munged srun; do
  if ! command -v "$b" >/dev/null; then
    echo "SKIP: $b not installed (deploy/install-deps.sh test installs Slurm and munge)"
    exit 77
  fi
done

cleanup() {
  bash "$script" stop "$dir" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -n 20 "$dir"/log/*.log >&2 2>/dev/null || true
  exit 1
}
daemons() { pgrep -f -- "$dir/(slurm.conf|key/munge.key)" | wc -l; }

# 1. start
bash "$script" start "$dir" || fail "start did not bring the cluster up"
eval "$(bash "$script" env "$dir")"
[ "$SLURM_CONF" = "$dir/slurm.conf" ] || fail "env printed SLURM_CONF=$SLURM_CONF"
idle=$(sinfo -h -N -o '%N %t' | sort)
[ "$idle" = $'n1 idle\nn2 idle' ] || fail "sinfo after start: $idle"
[ "$(daemons)" = 4 ] || fail "expected munged, slurmctld and two slurmd; found $(daemons)"

# 2. srun over both nodes
out=$(timeout 60 srun -N2 --ntasks-per-node=1 bash -c \
  'echo "$SLURM_PROCID $SLURM_NTASKS $SLURM_NODEID $SLURM_LOCALID $SLURMD_NODENAME"' | sort)
[ "$out" = $'0 2 0 0 n1\n1 2 1 0 n2' ] || fail "srun tasks saw: $out"

# 3. sbatch: running on both nodes, then completed in the completion log
cat >"$tmp/job.sh" <<'JOB'
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --no-requeue
srun bash -c 'sleep 2; echo "task $SLURM_PROCID on $SLURMD_NODENAME"'
JOB
id=$(sbatch --parsable --job-name=ty-cluster-check --output="$tmp/job.out" "$tmp/job.sh")
seen=
for _ in $(seq 1 60); do
  st=$(squeue -h -j "$id" -o '%T %N' 2>/dev/null || true)
  case "$st" in "RUNNING n[1-2]") seen=1; break ;; esac
  sleep 0.25
done
[ -n "$seen" ] || fail "squeue never showed job $id running on n[1-2] (last: '$st')"
for _ in $(seq 1 80); do
  grep -q "JobId=$id .*JobState=COMPLETED" "$dir/log/jobcomp.log" 2>/dev/null && break
  sleep 0.25
done
grep "JobId=$id " "$dir/log/jobcomp.log" | grep -q 'JobState=COMPLETED.*NodeList=n\[1-2\]' ||
  fail "job $id is not COMPLETED on n[1-2] in the completion log: $(cat "$dir/log/jobcomp.log")"
[ "$(sort "$tmp/job.out")" = $'task 0 on n1\ntask 1 on n2' ] || fail "job output: $(cat "$tmp/job.out")"

# scancel of a running two-node job leaves no task
id2=$(sbatch --parsable --nodes=2 --output=/dev/null --wrap "srun sleep 300 # $tmp")
for _ in $(seq 1 60); do
  [ "$(squeue -h -j "$id2" -o %T 2>/dev/null)" = RUNNING ] && break
  sleep 0.25
done
for _ in $(seq 1 40); do pgrep -f "^/usr/bin/sleep 300" >/dev/null && break; sleep 0.25; done
scancel "$id2"
for _ in $(seq 1 60); do
  grep -q "JobId=$id2 .*JobState=CANCELLED" "$dir/log/jobcomp.log" 2>/dev/null && break
  sleep 0.25
done
grep -q "JobId=$id2 .*JobState=CANCELLED" "$dir/log/jobcomp.log" || fail "job $id2 not CANCELLED"
for _ in $(seq 1 40); do pgrep -f "srun sleep 300 # $tmp" >/dev/null || break; sleep 0.25; done
! pgrep -f "srun sleep 300 # $tmp" >/dev/null || fail "a task of the cancelled job is still running"

# 4. a second start is a no-op
bash "$script" start "$dir" >/dev/null || fail "a second start failed"
[ "$(daemons)" = 4 ] || fail "a second start changed the daemons: $(daemons)"

# 5. stop
bash "$script" stop "$dir" || fail "stop failed"
sleep 0.5
[ "$(daemons)" = 0 ] || fail "daemons left after stop: $(pgrep -af -- "$dir")"
! bash "$script" status "$dir" >/dev/null 2>&1 || fail "status says it still runs"
echo "PASS: two-node Slurm cluster started, used by srun and sbatch, cancelled, stopped"
