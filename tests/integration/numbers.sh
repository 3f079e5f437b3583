#!/usr/bin/env bash
# numbers.sh - every number trainyard takes from its environment or a
# command's flags is checked where it is read, through the real binaries: a
# value that is not a whole number in range stops the command or the rank
# with a message naming the variable or flag, its value, its range (and for
# a variable what it means), never a silent default; `trainyard train`
# refuses a bad timeout before it writes anything. Good values still work.
# (`trainyard list --limit`: integration/server_cli.)
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

"$ty" mkmodel --out "$tmp/base" --hidden-size 32 --intermediate-size 48 --layers 1 --heads 2 \
  --kv-heads 1 --vocab-size 64 --seed 1 >/dev/null

# expect STATUS TEXT ENV... -- CMD...: CMD under ENV exits with STATUS and
# prints TEXT (a fixed string).
expect() {
  local want=$1 text=$2 envs=()
  shift 2
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local rc=0
  env "${envs[@]}" "$@" >"$tmp/out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "${envs[*]} $*: exit status $rc, not $want: $(cat "$tmp/out")"
  grep -qF -- "$text" "$tmp/out" || fail "${envs[*]}: no '$text' in: $(cat "$tmp/out")"
}

train=("$ty" train --model_path "$tmp/base" --use_lora true --lora_rank 2 --world_size 2
  --train.steps 2 --train.micro_batch_size 2 --data.seq_len 16)

# The CLI's own number: refused before the output folder is made.
expect 2 "TRAINYARD_PROGRESS_TIMEOUT_S='soon' is not a whole number in 1..604800 (seconds a rank" \
  TRAINYARD_PROGRESS_TIMEOUT_S=soon -- "${train[@]}" --output_dir "$tmp/o1"
[ ! -e "$tmp/o1" ] || fail "a refused timeout left $tmp/o1 behind"
expect 2 "TRAINYARD_PROGRESS_TIMEOUT_S='0' is not" TRAINYARD_PROGRESS_TIMEOUT_S=0 -- \
  "${train[@]}" --output_dir "$tmp/o1"

# The ranks' numbers: the job fails and says which variable and why.
expect 1 "TRAINYARD_THREADS='many' is not a whole number in 1..256 (threads for the CPU kernels" \
  TRAINYARD_THREADS=many -- "${train[@]}" --output_dir "$tmp/o2"
expect 1 "TRAINYARD_THREADS='0' is not a whole number in 1..256" TRAINYARD_THREADS=0 -- \
  "${train[@]}" --output_dir "$tmp/o2"
expect 1 "TRAINYARD_THREADS='300' is not a whole number in 1..256" TRAINYARD_THREADS=300 -- \
  "${train[@]}" --output_dir "$tmp/o2"
expect 1 "TRAINYARD_COMM_SHM_CHUNK_KB='2' is not a whole number in 4..1048576 (KiB" \
  TRAINYARD_COMM_SHM_CHUNK_KB=2 -- "${train[@]}" --output_dir "$tmp/o3"
expect 1 "TRAINYARD_COMM_TIMEOUT_MS='-5' is not a whole number in 1..86400000 (milliseconds" \
  TRAINYARD_COMM_TIMEOUT_MS=-5 -- "${train[@]}" --output_dir "$tmp/o4"
expect 1 "TRAINYARD_THREADS='x' is not a whole number in 1..256" TRAINYARD_THREADS=x -- \
  "$ty" load --model_path "$tmp/base" --world_size 2

# The worker contract's numbers, in both modes.
"$ty" train --model_path "$tmp/base" --use_lora true --lora_rank 2 --train.steps 1 \
  --train.micro_batch_size 2 --data.seq_len 16 --output_dir "$tmp/ok" >/dev/null 2>&1 ||
  fail "a one-rank job failed"
spec="$tmp/ok/job.json"
expect 2 "TRAINYARD_RANK='2' is not a whole number in 0..1 (this process's rank)" \
  TRAINYARD_SPEC="$spec" TRAINYARD_RANK=2 TRAINYARD_WORLD_SIZE=2 -- "$worker"
expect 2 "TRAINYARD_WORLD_SIZE='two' is not a whole number in 1..65536 (the job's ranks)" \
  TRAINYARD_SPEC="$spec" TRAINYARD_WORLD_SIZE=two -- "$worker"
expect 2 "TRAINYARD_HEARTBEAT_MS='5s' is not a whole number in 0..3600000 (milliseconds without a report" \
  TRAINYARD_SPEC="$spec" TRAINYARD_HEARTBEAT_MS=5s -- "$worker"
expect 2 "TRAINYARD_ATTEMPT='0' is not a whole number in 1..1073741824" \
  TRAINYARD_MODE=load TRAINYARD_SPEC="$spec" TRAINYARD_ATTEMPT=0 -- "$worker"
expect 2 "TRAINYARD_THREADS='1.5' is not" TRAINYARD_MODE=load TRAINYARD_SPEC="$spec" \
  TRAINYARD_THREADS=1.5 -- "$worker"
expect 2 "started without a job" TRAINYARD_SPEC= -- "$worker"
expect 1 '"message":"TRAINYARD_SPEC is not set (set it to the path of the job' \
  TRAINYARD_MODE=load -- "$worker"

# The local commands' flags.
expect 2 "trainyard mkmodel: --layers wants a whole number in [1, 2147483647], got '+2'" -- \
  "$ty" mkmodel --out "$tmp/m2" --layers +2
expect 2 "trainyard mkmodel: --seed wants a whole number in [0, " -- \
  "$ty" mkmodel --out "$tmp/m2" --seed 1e3
[ ! -e "$tmp/m2" ] || fail "a refused mkmodel left $tmp/m2 behind"
expect 2 "trainyard eval: --seq_len wants a whole number in 1..1073741824, got 'abc'" -- \
  "$ty" eval --model_path "$tmp/base" --data "$spec" --seq_len abc --batches 2
expect 2 "trainyard eval: --batches wants a whole number in 1..1073741824, got '0'" -- \
  "$ty" eval --model_path "$tmp/base" --data "$spec" --seq_len 4 --batches 0

# Good values, the bounds included, are taken.
expect 0 "train step 1/1" TRAINYARD_THREADS=1 TRAINYARD_PROGRESS_TIMEOUT_S=86399 \
  TRAINYARD_COMM_SHM_CHUNK_KB=4 -- "${train[@]}" --train.steps 1 --output_dir "$tmp/o5"
[ -s "$tmp/o5/adapter_model.safetensors" ] || fail "no adapter from the good values' run"
python3 -c 'import sys; sys.stdout.buffer.write(bytes(b for i in range(16) for b in (i, 0)))' \
  >"$tmp/ids.u16"
expect 0 '"tokens": 4' -- "$ty" eval --model_path "$tmp/base" --data "$tmp/ids.u16" --format u16 \
  --seq_len 4 --batches 1
echo "ok: every bad number named, with its range; good ones taken"
