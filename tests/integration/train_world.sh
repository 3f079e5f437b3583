#!/usr/bin/env bash
# train_world.sh - `trainyard train` across world sizes: for one spec and one
# global batch of 8 windows, 1, 2 and 4 ranks give the same per-step losses
# (LoRA on a mkmodel checkpoint, and full training from scratch); kill -9 of
# one rank mid-run fails the job within 5 s with no orphan process and no
# shared memory left; each rank's host peak for the sharded training state
# (weights, gradients, AdamW moments) falls as 1/N; gradient_checkpointing
# changes no loss.
#
# Tolerance: 1e-5 relative. The ranks see the same windows (data.h), so the
# only differences are the order of fp32 additions: the all-reduce sums the
# ranks' gradients where one rank sums micro-batches, and micro-batches of
# 8, 4 or 2 windows average their token losses in different groupings. Each
# reassociation costs ~1e-7 relative; over 8 AdamW steps the observed gap
# stays near 1e-7, two orders below the bound.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 6000
"$ty" mkmodel --out "$tmp/base" --hidden-size 48 --intermediate-size 80 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --seed 3 >/dev/null

common=(--data.path "$data" --data.seq_len 32 --train.steps 8 --train.grad_accum 1
        --train.warmup_steps 2 --train.checkpoint_every 0)
lora=(--model_path "$tmp/base" --use_lora true --lora_rank 4 --target_modules all-linear
      --train.lr 1e-2 --fsdp.memory_efficient_load true --allocation_mode static)
full=(--init_from_scratch true --model '{"hidden_size": 48, "intermediate_size": 80,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 256}' --train.lr 3e-3)

losses() { # MODE WORLD -> rank 0's per-step losses, one per line
  local mode=$1 w=$2 args
  if [ "$mode" = lora ]; then args=("${lora[@]}"); else args=("${full[@]}"); fi
  "$ty" train "${common[@]}" "${args[@]}" --world_size "$w" \
    --train.micro_batch_size $((8 / w)) --output_dir "$tmp/$mode-$w" --json \
    >"$tmp/$mode-$w.out" 2>"$tmp/$mode-$w.log" || { cat "$tmp/$mode-$w.log" >&2; fail "$mode world $w failed"; }
  rank0_losses "$tmp/$mode-$w.out"
}

for mode in lora full; do
  losses "$mode" 1 >"$tmp/$mode.1"
  for w in 2 4; do
    losses "$mode" "$w" >"$tmp/$mode.$w"
    python3 - "$tmp/$mode.1" "$tmp/$mode.$w" "$mode" "$w" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
assert len(a) == len(b) == 8, (a, b)
gap = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"# {sys.argv[3]}: world 1 vs {sys.argv[4]}: max relative loss gap {gap:.2e} "
      f"(losses {a[0]:.5f} -> {a[-1]:.5f})")
assert gap <= 1e-5, (a, b)
assert a[-1] < a[0], a
PY
  done
done

# gradient_checkpointing (one layer's activations kept, the others run
# forward again in the backward pass): 2 ranks give the same losses, bit
# for bit, as without it.
for mode in lora full; do
  if [ "$mode" = lora ]; then args=("${lora[@]}"); else args=("${full[@]}"); fi
  "$ty" train "${common[@]}" "${args[@]}" --gradient_checkpointing true --world_size 2 \
    --train.micro_batch_size 4 --output_dir "$tmp/ckpt-$mode" --json >"$tmp/ckpt-$mode.out" \
    2>"$tmp/ckpt-$mode.log" || { cat "$tmp/ckpt-$mode.log" >&2; fail "$mode with gradient_checkpointing"; }
  python3 - "$tmp/ckpt-$mode.out" "$tmp/$mode.2" "$mode" <<'PY'
import json, sys
got = [repr(r["loss"]) for r in map(json.loads, open(sys.argv[1]))
       if r["rank"] == 0 and r["phase"] == "training" and r["loss"] is not None]
want = open(sys.argv[2]).read().split()
assert got == want, (got, want)
print(f"# {sys.argv[3]}: gradient_checkpointing over 2 ranks: the same {len(got)} losses")
PY
done

# Resume of sharded state: a rerun in the same output_dir resumes from the
# checkpoint of step 4 (each rank reads its own shard of the weights and
# AdamW moments) and repeats steps 5-8 with the same losses.
for mode in full lora; do
  if [ "$mode" = lora ]; then args=("${lora[@]}"); else args=("${full[@]}"); fi
  for run in 1 2; do
    "$ty" train "${common[@]}" "${args[@]}" --world_size 2 --train.micro_batch_size 4 \
      --train.checkpoint_every 4 --output_dir "$tmp/resume-$mode" --json \
      >"$tmp/resume-$mode-$run.out" 2>"$tmp/resume-$mode-$run.log" ||
      { cat "$tmp/resume-$mode-$run.log" >&2; fail "resume $mode run $run"; }
  done
  grep -q "resumed from the checkpoint of step 4" "$tmp/resume-$mode-2.log" || fail "$mode: no resume"
  python3 - "$tmp/resume-$mode-1.out" "$tmp/resume-$mode-2.out" "$mode" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))
            if r["rank"] == 1 and r["phase"] == "training" and r["loss"] is not None}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(b) == [5, 6, 7, 8], sorted(b)
assert all(a[s] == b[s] for s in b), (a, b)
print(f"# {sys.argv[3]}: 2 ranks resumed at step 4, steps 5-8 identical (last {b[8]:.6f})")
PY
done

# Host peak per rank against world size, full training of a 14M-parameter
# model whose state (4 floats per weight: 230 MB) dominates the process.
big=(--init_from_scratch true --model '{"hidden_size": 384, "intermediate_size": 1024,
     "num_hidden_layers": 8, "num_attention_heads": 6, "num_key_value_heads": 2,
     "vocab_size": 256}' --data.path "$data" --data.seq_len 16 --train.micro_batch_size 1
     --train.steps 2 --fsdp.bucket_mb 1)
for w in 1 2 4; do
  "$ty" train "${big[@]}" --world_size "$w" --output_dir "$tmp/peak-$w" --json \
    >"$tmp/peak-$w.out" 2>"$tmp/peak-$w.log" || { cat "$tmp/peak-$w.log" >&2; fail "peak run $w"; }
done
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
C, FF, L, NH, NKV, V = 384, 1024, 8, 6, 2, 256
HS = C // NH
P = V * C * 2 + C + L * (2 * C + 2 * C * NH * HS + 2 * C * NKV * HS + 3 * C * FF)
S = 16 * P                      # params, gradients, exp_avg, exp_avg_sq in fp32
layer = 4 * (2 * C * NH * HS + 2 * C * NKV * HS + 3 * C * FF)
margin = 2 * layer + 24 * 2**20  # two gathered-unit buffers and allocator slack
peak = {}
for w in (1, 2, 4):
    reps = [json.loads(l) for l in open(f"{tmp}/peak-{w}.out")]
    peak[w] = max(r["host_peak_bytes"] for r in reps)
for w in (2, 4):
    bound = peak[1] - S * (1 - 1 / w) + margin
    print(f"# host peak: world {w}: {peak[w] / 2**20:.0f} MiB per rank, bound {bound / 2**20:.0f} "
          f"MiB (world 1: {peak[1] / 2**20:.0f} MiB; sharded state {S / 2**20:.0f} MiB / {w})")
    assert peak[w] <= bound, (w, peak)
PY

# interrupt_rank1 NAME SIGNAL [VAR=VALUE ...]: starts an endless 2-rank run
# (with the environment given) writing $tmp/NAME.log, sends SIGNAL to rank 1
# once it has reached step 2, and waits for the launcher; sets $launcher,
# $rc (its exit status) and $dt (seconds from the signal to its exit).
interrupt_rank1() {
  local name=$1 sig=$2 victim t0 t1
  shift 2
  env "$@" "$ty" train "${common[@]}" "${full[@]}" --world_size 2 --train.micro_batch_size 4 \
    --train.steps 100000 --output_dir "$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.log" &
  launcher=$!
  for _ in $(seq 1 300); do
    grep -q 'rank 1/2\] train step 2/' "$tmp/$name.log" 2>/dev/null && break
    sleep 0.1
  done
  victim=$(pgrep -P "$launcher" | while read -r p; do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'TRAINYARD_RANK=1' && echo "$p"; done)
  [ -n "$victim" ] || { kill "$launcher"; fail "rank 1 not found"; }
  t0=$(date +%s.%N)
  kill "-$sig" "$victim"
  set +e
  wait "$launcher"
  rc=$?
  set -e
  t1=$(date +%s.%N)
  dt=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
}

# kill -9 of rank 1 in the middle of a 2-rank run.
interrupt_rank1 killed KILL
echo "# kill -9 of rank 1: launcher exited $rc after $dt s"
python3 -c "assert $rc != 0 and $dt < 5.0"
grep -q 'rank 1 failed' "$tmp/killed.log" || fail "the failure does not name rank 1: $(tail -3 "$tmp/killed.log")"
[ -z "$(pgrep -P "$launcher" || true)" ] || fail "orphan ranks remain"
for p in $(pgrep -f "$tmp/killed/job.json" || true); do fail "orphan process $p"; done
ls /dev/shm | grep -q "trainyard-local-$launcher-" && fail "shared memory left in /dev/shm"

# A rank that stops making progress (SIGSTOP): its peer's collective times
# out naming it, and the job fails instead of hanging.
interrupt_rank1 stalled STOP TRAINYARD_COMM_TIMEOUT_MS=2000
echo "# rank 1 stopped: launcher exited $rc after $dt s"
python3 -c "assert $rc != 0 and $dt < 15.0"
grep 'trainyard train: rank' "$tmp/stalled.log" | grep -q 'rank 1' ||
  fail "the failure does not name the stalled rank 1: $(tail -2 "$tmp/stalled.log")"
grep 'trainyard train: rank' "$tmp/stalled.log"
[ -z "$(pgrep -P "$launcher" || true)" ] || fail "orphan ranks remain"
echo ok
