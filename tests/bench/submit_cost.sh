#!/usr/bin/env bash
# submit_cost.sh - the server's instructions per POST /v1/jobs, counted by
# callgrind (the same count for the same binary and inputs whatever else the
# machine does, unlike a rate on a shared machine). Each build runs
# trainyardd under callgrind twice, with 0 and with N submissions (each job
# its own output folder, queued behind one job whose rank sleeps), and the
# difference over N is the figure. Given two build folders it prints both
# and their ratio. The scheduler's 100 ms ticks add a little that depends on
# the wall time (two runs agree within about 0.2%). Not run by CI (label bench).
#   bash tests/bench/submit_cost.sh [BUILD [OTHER_BUILD]]   (N: TY_SUBMITS, 200)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
n=${TY_SUBMITS:-200}
command -v valgrind >/dev/null || { echo "submit_cost.sh: needs valgrind" >&2; exit 1; }
tmp=$(mktemp -d /tmp/ty-submit-cost-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf '#!/bin/sh\nexec sleep 600\n' >"$tmp/sleeper" && chmod +x "$tmp/sleeper"

# total_ir BUILD COUNT: the instructions trainyardd ran, from start to a
# clean stop, with COUNT submissions in between.
total_ir() {
  local d port
  d=$(mktemp -d "$tmp/run-XXXX")
  mkdir -p "$d/models/tiny"
  echo '{"hidden_size": 64}' >"$d/models/tiny/config.json"
  echo "hello trainyard" >"$d/train.txt"
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  (cd "$d" && exec valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" \
    "$1/server/trainyardd" --listen "127.0.0.1:$port" --db "$d/var/ty.db" --state_dir "$d/var" \
    --cpu_slots 1 --worker "$tmp/sleeper" --heartbeat_timeout 3600 --progress_timeout 3600 \
    >"$d/log" 2>&1) &
  local pid=$!
  for _ in $(seq 300); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
  python3 - "$port" "$2" <<'PY'
import http.client, json, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for i in range(n):
    spec = {"name": "cost", "model_path": "models/tiny", "world_size": 1, "use_lora": True,
            "data": {"path": "train.txt"}, "train": {"steps": 1}, "output_dir": "runs/c-%d" % i}
    c.request("POST", "/v1/jobs", json.dumps(spec), {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    if r.status != 201:
        sys.exit("submission %d answered %d" % (i, r.status))
PY
  kill -TERM "$pid"
  wait "$pid" || { cat "$d/log" >&2; echo "submit_cost.sh: trainyardd did not stop cleanly" >&2; exit 1; }
  awk '/^summary:/ {print $2}' "$d/cg.out"
}

per_submit() { # BUILD: instructions per submission
  local base with
  base=$(total_ir "$1" 0)
  with=$(total_ir "$1" "$n")
  echo $(((with - base) / n))
}

echo "# $n submissions, callgrind instruction counts (all of trainyardd's threads)"
a=$(per_submit "${1:-$src/build}")
echo "| ${1:-$src/build} | $a instructions per submission |"
if [ $# -ge 2 ]; then
  b=$(per_submit "$2")
  echo "| $2 | $b instructions per submission |"
  python3 -c "print('| ratio | %.3f (second / first) |' % ($b / $a))"
fi
