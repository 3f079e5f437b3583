#!/usr/bin/env bash
# demo.sh - the README's first command. On the embedded defaults (SQLite file
# ./var/trainyard.db, local CPU ranks, 127.0.0.1:8080) it:
#   1. installs what is missing and builds trainyard,
#   2. makes a small Llama base model (trainyard mkmodel) and training text
#      from the licence texts every Debian system ships,
#   3. starts trainyardd and submits a LoRA job with
#      fsdp.memory_efficient_load on 2 CPU ranks,
#   4. follows it live to completion (per-rank loss, tokens/s, host peaks),
#   5. prints the web page's address and keeps serving it until Ctrl-C.
# TRAINYARD_DEMO_EXIT=1 stops the server after the job instead of step 5.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh build
build=${TRAINYARD_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)"

ty="$build/cli/trainyard"
listen=${TRAINYARD_LISTEN:-127.0.0.1:8080}
server="http://$listen"
demo=demo

mkdir -p "$demo/models" "$demo/data" var
if [ ! -f "$demo/models/tiny/config.json" ]; then
  # 4 layers, grouped-query attention (4 heads, 2 kv heads), byte vocabulary.
  "$ty" mkmodel --out "$demo/models/tiny" --hidden-size 128 --intermediate-size 344 \
    --layers 4 --heads 4 --kv-heads 2 --vocab-size 256 --seed 1
fi
if [ ! -s "$demo/data/train.txt" ]; then
  cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 \
    > "$demo/data/train.txt"
fi

if curl -fsS "$server/healthz" >/dev/null 2>&1; then
  echo "demo: something already answers on $listen; stop it or set TRAINYARD_LISTEN=HOST:PORT" >&2
  exit 1
fi

"$build/server/trainyardd" --listen "$listen" > var/demo-server.log 2>&1 &
server_pid=$!
stop_server() {
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
}
trap stop_server EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 100); do
  curl -fsS "$server/healthz" >/dev/null 2>&1 && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "demo: trainyardd did not start; its log:" >&2
    cat var/demo-server.log >&2
    exit 1
  fi
  sleep 0.1
done
echo "demo: trainyardd is serving on $server (state in var/, log var/demo-server.log)"

run="demo-lora-$(date +%Y%m%d-%H%M%S)"
job=$("$ty" submit --server "$server" --name "$run" --model_path "$demo/models/tiny" \
  --use_lora true --lora_rank 8 --lora_alpha 16 --target_modules all-linear \
  --data.path "$demo/data/train.txt" --data.seq_len 128 \
  --world_size 2 --allocation_mode static --fsdp.memory_efficient_load true \
  --train.steps 120 --train.micro_batch_size 4 --train.lr 3e-3 --train.warmup_steps 10 \
  --train.checkpoint_every 60 --output_dir "runs/$run")
echo "demo: submitted job $job (LoRA, 2 CPU ranks, fsdp.memory_efficient_load)"

status=0
"$ty" watch "$job" --server "$server" || status=$?
"$ty" get "$job" --server "$server" > "var/demo-job.json" || true
if [ "$status" -ne 0 ]; then
  echo "demo: job $job did not succeed; rank logs: $ty logs $job 0 --server $server" >&2
  exit "$status"
fi
echo "demo: adapter written to runs/$run/ ($(ls "runs/$run" | tr '\n' ' '))"
echo "demo: web page: $server/"
if [ "${TRAINYARD_DEMO_EXIT:-0}" = 1 ]; then
  exit 0
fi
echo "demo: serving until Ctrl-C"
wait "$server_pid"
