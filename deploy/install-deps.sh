#!/usr/bin/env bash
# install-deps.sh - installs the Debian packages trainyard needs, only those
# missing. Safe to run twice. Needs root or sudo when anything is missing.
#
#   deploy/install-deps.sh          build + run (server, worker, CLI)
#   deploy/install-deps.sh test     also what the test suites need
#   deploy/install-deps.sh worker   only what the worker needs (GPU hosts)
#   deploy/install-deps.sh bench    the test packages plus the benchmarks' tools
set -euo pipefail

group=${1:-build}

# libpcre2-dev, libutf8proc-dev: the tokenizer's Unicode regular expressions and
# normalization forms (text/; the worker tokenizes).
worker_pkgs=(cmake make gcc pkg-config libjansson-dev libopenblas-dev libcurl4-openssl-dev
             libprotobuf-c-dev protobuf-c-compiler libpcre2-dev libutf8proc-dev)
# nodejs + npm: the build installs the web page's chart library with npm ci.
# g++ + libgloo-dev: the Gloo comm for CPU ranks on several hosts (optional in
# the build; installed so that it is built and tested).
build_pkgs=("${worker_pkgs[@]}" libgrpc-dev
            libmicrohttpd-dev libsqlite3-dev libcmocka-dev nodejs npm g++ libgloo-dev)
test_pkgs=("${build_pkgs[@]}" clang python3 python3-numpy python3-torch python3-grpcio
           python3-protobuf protobuf-compiler python3-prometheus-client python3-requests python3-yaml
           curl procps chromium slurmctld slurmd slurm-client munge)
# slurmctld, slurmd, slurm-client, munge: deploy/slurm-cluster.sh's two-node
# test cluster (integration/slurm_cluster).
# wrk + nginx: tests/bench/api.py measures trainyardd beside nginx.
bench_pkgs=("${test_pkgs[@]}" wrk nginx-light)

case "$group" in
  worker) want=("${worker_pkgs[@]}") ;;
  build) want=("${build_pkgs[@]}") ;;
  test) want=("${test_pkgs[@]}") ;;
  bench) want=("${bench_pkgs[@]}") ;;
  *) echo "install-deps.sh: unknown group '$group' (use worker, build, test or bench)" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  # A node and npm installed another way (e.g. a nodejs package that bundles
  # npm) serve as well as Debian's.
  if { [ "$p" = nodejs ] && command -v node >/dev/null; } ||
     { [ "$p" = npm ] && command -v npm >/dev/null; }; then
    continue
  fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#want[@]} packages for '$group' are installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo=(sudo)
  else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
