#!/usr/bin/env bash
# train_gloo.sh - dist.backend gloo: the same LoRA job and the same full
# training from scratch, at 2 and 4 CPU ranks, with the ranks meeting over
# TCP (Gloo) and over this host's shared memory (shm), give bitwise the same
# per-step losses (gloo sums every element in rank order, as shm does); a
# rank killed with -9 fails the gloo job with no process left; and the
# rule dist-backend-device refuses gloo or shm for a device other than cpu,
# and nccl for one other than cuda. Exits 77 (skipped) where the worker was
# built without Gloo.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 6000
"$ty" mkmodel --out "$tmp/base" --hidden-size 48 --intermediate-size 80 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --seed 3 >/dev/null

common=(--device cpu --data.path "$data" --data.seq_len 32 --train.steps 6 --train.grad_accum 1
        --train.warmup_steps 2 --train.checkpoint_every 0)
lora=(--model_path "$tmp/base" --use_lora true --lora_rank 4 --target_modules all-linear
      --train.lr 1e-2 --fsdp.memory_efficient_load true)
full=(--init_from_scratch true --model '{"hidden_size": 48, "intermediate_size": 80,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 256}' --train.lr 3e-3)

losses() { # MODE WORLD BACKEND -> rank 0's per-step losses, one repr per line
  local mode=$1 w=$2 b=$3 args out="$tmp/$1-$2-$3"
  if [ "$mode" = lora ]; then args=("${lora[@]}"); else args=("${full[@]}"); fi
  if ! "$ty" train "${common[@]}" "${args[@]}" --world_size "$w" --dist.backend "$b" \
    --train.micro_batch_size $((8 / w)) --output_dir "$out" --json >"$out.out" 2>"$out.log"; then
    if grep -q "built without it" "$out.log"; then
      echo "SKIP: this trainyard-worker was built without Gloo (install libgloo-dev and rebuild)"
      exit 77
    fi
    cat "$out.log" >&2
    fail "$mode world $w over $b failed"
  fi
  rank0_losses "$out.out"
}

for mode in lora full; do
  for w in 2 4; do
    losses "$mode" "$w" shm >"$tmp/$mode.$w.shm"
    losses "$mode" "$w" gloo >"$tmp/$mode.$w.gloo"
    [ "$(wc -l <"$tmp/$mode.$w.gloo")" = 6 ] || fail "$mode world $w: $(wc -l <"$tmp/$mode.$w.gloo") losses, want 6"
    cmp -s "$tmp/$mode.$w.shm" "$tmp/$mode.$w.gloo" ||
      fail "$mode world $w: gloo losses differ from shm: $(paste "$tmp/$mode.$w.shm" "$tmp/$mode.$w.gloo" | tr '\n' ';')"
    grep -q "gloo:file:" "$tmp/$mode-$w-gloo.log" 2>/dev/null || true
    echo "# $mode world $w: gloo = shm bit for bit ($(head -1 "$tmp/$mode.$w.gloo") -> $(tail -1 "$tmp/$mode.$w.gloo"))"
  done
done

# A rank killed with -9 fails the gloo job; nothing of it is left running.
"$ty" train "${common[@]}" "${full[@]}" --world_size 2 --dist.backend gloo --train.steps 100000 \
  --train.micro_batch_size 4 --output_dir "$tmp/kill" --json >"$tmp/kill.out" 2>"$tmp/kill.log" &
launcher=$!
for _ in $(seq 1 200); do
  grep -q '"phase": *"training"' "$tmp/kill.out" 2>/dev/null && break
  sleep 0.1
done
victim=$(pgrep -f "trainyard-worker.*" -P "$launcher" | tail -1 || true)
[ -n "$victim" ] || victim=$(pgrep -f "trainyard-worker" | tail -1)
[ -n "$victim" ] || fail "no rank to kill"
kill -9 "$victim"
rc=0
wait "$launcher" || rc=$?
[ "$rc" != 0 ] || fail "the launcher succeeded after a rank was killed"
sleep 0.5
! pgrep -f "$tmp/kill" >/dev/null || fail "a rank of the killed job is still running"

# dist-backend-device
out=$("$ty" validate --init_from_scratch true --model '{"hidden_size": 48, "intermediate_size": 80,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}' \
  --device cuda --dist.backend gloo 2>&1) && fail "gloo with device cuda was accepted"
echo "$out" | grep -q 'dist.backend.*"gloo" connects CPU ranks, and device is "cuda"' ||
  fail "gloo with cuda: $out"
out=$("$ty" validate --init_from_scratch true --model '{"hidden_size": 48, "intermediate_size": 80,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}' \
  --dist.backend nccl 2>&1) && fail "nccl with device auto was accepted"
echo "$out" | grep -q '"nccl" connects GPU ranks, and device is "auto"' || fail "nccl with auto: $out"
echo "PASS: gloo gives shm's losses bit for bit at 2 and 4 ranks (LoRA and full); a killed rank fails the job; the backend-device rule holds"
