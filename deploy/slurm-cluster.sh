#!/usr/bin/env bash
# slurm-cluster.sh - a two-node Slurm cluster on one machine, for trying
# trainyard's cluster dispatch and for its tests. Everything lives in DIR:
# a munge key and daemon of its own, a generated slurm.conf, slurmctld, and
# two slurmd started with -N: node n1 at 127.0.0.1 and node n2 at 127.0.0.2
# (the loopback range; nothing leaves the machine). Needs root (slurmd runs
# jobs as their user) and Debian's slurmctld, slurmd, slurm-client, munge.
#
#   deploy/slurm-cluster.sh start DIR    write the configuration, start the
#                                        daemons, wait until both nodes are idle
#   deploy/slurm-cluster.sh stop DIR     stop every daemon that start started
#   deploy/slurm-cluster.sh status DIR   sinfo of the cluster; exit 1 when down
#   deploy/slurm-cluster.sh env DIR      the line to use it from a shell:
#                                        eval "$(deploy/slurm-cluster.sh env DIR)"
#
# Environment: TY_SLURM_PORT (default 16817) is slurmctld's port; slurmd
# takes the next one and the nodes the two after it, so two clusters on one
# machine need ports four apart. TY_SLURM_CPUS (default: nproc) and
# TY_SLURM_MEM_MB (default 4096) size each node. Nodes share the machine's
# CPUs (OverSubscribe), as ranks of a test job need no more.
set -euo pipefail

usage() {
  sed -n '/^#   deploy/,/^#$/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case "$cmd" in start | stop | status | env) ;; *) usage ;; esac

if [ "$cmd" != stop ] || [ -d "$dir" ]; then
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
fi
conf=$dir/slurm.conf
# munged needs every folder above its socket searchable by all, which DIR's
# parents need not be (mktemp -d makes 0700 folders): the socket has a folder
# of its own in /tmp, named after DIR.
sockdir=/tmp/trainyard-munge-$(printf %s "$dir" | cksum | cut -d' ' -f1)
sock=$sockdir/munge.sock
nodes=(n1 n2)
addrs=(127.0.0.1 127.0.0.2)

need() {
  local missing=()
  for b in munged munge slurmctld slurmd sinfo srun sbatch; do
    command -v "$b" >/dev/null || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "slurm-cluster: not found: ${missing[*]} (deploy/install-deps.sh test installs them)" >&2
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-cluster: needs root: slurmd starts each job step as the job's user" >&2
    exit 1
  fi
}

write_conf() {
  local port=${TY_SLURM_PORT:-16817}
  local cpus=${TY_SLURM_CPUS:-$(nproc)}
  local mem=${TY_SLURM_MEM_MB:-4096}
  local i
  {
    echo "# written by deploy/slurm-cluster.sh start; rewritten at each start"
    echo "ClusterName=trainyard"
    echo "SlurmctldHost=localhost(127.0.0.1)"
    echo "SlurmctldPort=$port"
    echo "SlurmdPort=$((port + 1))"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$sock"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
    echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    # No cgroups in a container: processes are tracked by their parent.
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SchedulerType=sched/backfill"
    echo "ReturnToService=2"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    # The completion log is the record of finished jobs (no slurmdbd here).
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=$dir/log/jobcomp.log"
    echo "InactiveLimit=0"
    echo "MinJobAge=30"
    echo "KillWait=5"
    echo "SlurmdTimeout=30"
    for i in 0 1; do
      echo "NodeName=${nodes[$i]} NodeHostname=$(hostname) NodeAddr=${addrs[$i]}" \
        "Port=$((port + 2 + i)) CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } >"$conf"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
  # munged wants its key private and its socket's folder searchable by all.
  mkdir -p "$dir/key" "$dir/munge" "$sockdir"
  chmod 700 "$dir/key"
  chmod 755 "$sockdir"
  if [ ! -s "$dir/key/munge.key" ]; then
    head -c 1024 /dev/urandom >"$dir/key/munge.key"
  fi
  chmod 400 "$dir/key/munge.key"
  pid_alive "$dir/munge/munged.pid" && return 0
  munged --key-file="$dir/key/munge.key" --socket="$sock" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"
  munge -S "$sock" -n | unmunge -S "$sock" >/dev/null
}

wait_idle() {
  local i
  for i in $(seq 1 60); do
    if [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' idle$')" = 2 ]; then
      return 0
    fi
    sleep 0.5
  done
  echo "slurm-cluster: the nodes did not come up within 30 s:" >&2
  sinfo -N >&2 || true
  tail -n 5 "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log >&2 || true
  return 1
}

do_start() {
  need
  mkdir -p "$dir/state" "$dir/log" "$dir/run" "$dir/spool/n1" "$dir/spool/n2"
  write_conf
  start_munge
  export SLURM_CONF=$conf
  pid_alive "$dir/run/slurmctld.pid" || slurmctld -f "$conf"
  local n
  for n in "${nodes[@]}"; do
    pid_alive "$dir/run/slurmd-$n.pid" || slurmd -f "$conf" -N "$n"
  done
  wait_idle
  echo "slurm-cluster: up in $dir (nodes n1 at 127.0.0.1, n2 at 127.0.0.2)"
  echo "slurm-cluster: use it with: export SLURM_CONF=$conf"
}

stop_pid() {
  # The daemon may remove its pid file as soon as it is told to stop, before
  # it has ended its job steps: wait on the process, not on the file.
  local f=$1 pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  rm -f "$f"
  kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "slurm-cluster: pid $pid ($f) did not stop within 10 s; killing it" >&2
  kill -9 "$pid" 2>/dev/null || true
}

do_stop() {
  [ -d "$dir" ] || return 0
  # Jobs still running are cancelled first, so no job step outlives slurmd.
  if pid_alive "$dir/run/slurmctld.pid"; then
    SLURM_CONF=$conf scancel --full --quiet --user root 2>/dev/null || true
  fi
  local n
  for n in "${nodes[@]}"; do stop_pid "$dir/run/slurmd-$n.pid"; done
  stop_pid "$dir/run/slurmctld.pid"
  stop_pid "$dir/munge/munged.pid"
  rm -rf "$sockdir"
  echo "slurm-cluster: stopped ($dir)"
}

case "$cmd" in
  start) do_start ;;
  stop) do_stop ;;
  status)
    pid_alive "$dir/run/slurmctld.pid" || { echo "slurm-cluster: not running ($dir)"; exit 1; }
    SLURM_CONF=$conf sinfo -N
    ;;
  env) echo "export SLURM_CONF=$conf" ;;
esac
