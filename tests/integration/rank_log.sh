#!/usr/bin/env bash
# rank_log.sh - a rank that writes its own log (TRAINYARD_RANK_LOG_DIR, as
# trainyardd --dispatcher slurm starts its ranks): its stdout and stderr go
# to rank-<rank>.log through a process of its own (named trainyard-log),
# capped at TRAINYARD_RANK_LOG_MAX with a note; killed with SIGKILL, the
# rank still leaves every line it wrote, and its log process ends with it;
# a cap out of range is refused naming the variable.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

"$ty" mkmodel --out "$tmp/base" --hidden-size 32 --intermediate-size 64 --layers 1 --heads 2 \
  --kv-heads 1 --vocab-size 256 >/dev/null
words "$tmp/words.txt" 4000
spec() { # NAME STEPS
  cat >"$tmp/$1.json" <<JSON
{"name": "$1", "model_path": "$tmp/base", "use_lora": true, "lora_rank": 4,
 "data": {"path": "$tmp/words.txt", "seq_len": 16},
 "train": {"steps": $2, "micro_batch_size": 2}, "output_dir": "$tmp/out-$1"}
JSON
}
spec whole 5
mkdir "$tmp/logs"
TRAINYARD_SPEC="$tmp/whole.json" TRAINYARD_RANK_LOG_DIR="$tmp/logs" "$worker" >"$tmp/out" 2>&1 ||
  { cat "$tmp/logs/rank-0.log" "$tmp/out"; fail "the run failed"; }
[ ! -s "$tmp/out" ] || { cat "$tmp/out"; fail "output went past the log"; }
grep -q '"phase":"done"' "$tmp/logs/rank-0.log" || fail "the log lacks the rank's last report"
echo "ok   every line in rank-0.log ($(wc -c <"$tmp/logs/rank-0.log") bytes), none past it"

spec capped 40
rm "$tmp/logs/rank-0.log"
TRAINYARD_SPEC="$tmp/capped.json" TRAINYARD_RANK_LOG_DIR="$tmp/logs" \
  TRAINYARD_RANK_LOG_MAX=4096 "$worker" >/dev/null 2>&1 || fail "the capped run failed"
python3 - "$tmp/logs/rank-0.log" <<'PY'
import sys
log = open(sys.argv[1], "rb").read()
note = b"\n[trainyard-worker: log capped at 4096 bytes; later output dropped]\n"
assert log.endswith(note) and len(log) <= 4096 + len(note), log[-200:]
assert b'"step":1,' in log and b'"step":40,' not in log
PY
echo "ok   capped at 4096 bytes with the note"

# SIGKILL mid-run: what the rank wrote is in the log, and the log's process
# is gone once the rank is.
spec killed 100000
rm -f "$tmp/logs/rank-0.log"
TRAINYARD_SPEC="$tmp/killed.json" TRAINYARD_RANK_LOG_DIR="$tmp/logs" "$worker" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -q '"step":3,' "$tmp/logs/rank-0.log" 2>/dev/null && break
  sleep 0.05
done
logpid=$(pgrep -P "$pid" -x trainyard-log || true)
[ -n "$logpid" ] || fail "no trainyard-log process beside the rank"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$logpid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$logpid" 2>/dev/null && fail "the log process outlived its rank"
grep -q '"step":3,' "$tmp/logs/rank-0.log" || fail "the killed rank's lines are lost"
echo "ok   SIGKILL: the rank's lines kept, its log process gone"

TRAINYARD_SPEC="$tmp/whole.json" TRAINYARD_RANK_LOG_DIR="$tmp/logs" TRAINYARD_RANK_LOG_MAX=12 \
  "$worker" >"$tmp/bad" 2>&1 && fail "a cap of 12 bytes was taken"
grep -q "TRAINYARD_RANK_LOG_MAX='12' is not a whole number in 4096..1099511627776" "$tmp/bad" ||
  { cat "$tmp/bad"; fail "the bad cap is not named"; }
echo "ok   a rank's own log, capped"
