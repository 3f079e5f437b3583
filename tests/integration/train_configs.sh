#!/usr/bin/env bash
# train_configs.sh - `trainyard train` on the configurations of published
# models: a tied head (no lm_head.weight; the head is the embedding, and its
# gradient the sum of both uses) with a head_dim that is not
# hidden_size / num_attention_heads, in full training on 1 and 2 ranks (FSDP
# shards the shared matrix: equal losses within 1e-5 relative) and in LoRA;
# the trained model is written tied and loads again.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 6000
common=(--data.path "$data" --data.seq_len 32 --train.steps 6 --train.grad_accum 1
        --train.warmup_steps 1 --train.checkpoint_every 0 --json)

losses() { # OUT_NAME ARGS... -> rank 0's per-step losses, one per line, in $tmp/OUT_NAME
  local name=$1
  shift
  "$ty" train "${common[@]}" "$@" --output_dir "$tmp/$name" >"$tmp/$name.out" \
    2>"$tmp/$name.log" || { cat "$tmp/$name.log" >&2; fail "$name failed"; }
  python3 - "$tmp/$name.out" >"$tmp/$name.losses" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["rank"] == 0 and r["phase"] == "training" and r["loss"] is not None:
        print(repr(r["loss"]))
PY
}

# Tied head, head_dim 16 with hidden_size 48 and 4 heads (q is 64 x 48).
"$ty" mkmodel --out "$tmp/tied" --hidden-size 48 --intermediate-size 80 --layers 2 --heads 4 \
  --kv-heads 2 --head-dim 16 --tie-embeddings --vocab-size 256 --seed 5 >/dev/null
for w in 1 2; do
  losses "full-$w" --model_path "$tmp/tied" --use_lora false --train.lr 3e-3 --world_size "$w" \
    --train.micro_batch_size $((8 / w))
done
python3 - "$tmp/full-1.losses" "$tmp/full-2.losses" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
assert len(a) == len(b) == 6, (a, b)
gap = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"# tied, head_dim 16: full training, world 1 vs 2: max relative loss gap {gap:.2e} "
      f"(losses {a[0]:.5f} -> {a[-1]:.5f})")
assert gap <= 1e-5, (a, b)
assert a[-1] < a[0], a
PY
python3 - "$tmp/full-2" <<'PY'
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
assert cfg["tie_word_embeddings"] is True and cfg["head_dim"] == 16, cfg
raw = open(d + "/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert "lm_head.weight" not in names, "a tied model was written with lm_head.weight"
assert names["model.layers.0.self_attn.q_proj.weight"]["shape"] == [64, 48], names
print("# the trained model is written tied, without lm_head.weight")
PY
# The trained model loads: its loss on the data is below the base's.
for m in tied full-2; do
  "$ty" eval --model_path "$tmp/$m" --data "$data" --seq_len 32 --batches 4 >"$tmp/eval-$m" \
    || fail "eval of $m failed"
done
python3 - "$tmp/eval-tied" "$tmp/eval-full-2" <<'PY'
import json, sys
a, b = (json.load(open(p))["loss"] for p in sys.argv[1:])
print(f"# eval: base {a:.5f}, trained tied model {b:.5f}")
assert b < a - 0.3, (a, b)
PY
# LoRA on the tied base (frozen: the head stays the embedding).
losses lora --model_path "$tmp/tied" --use_lora true --lora_rank 4 --target_modules all-linear \
  --train.lr 3e-2 --world_size 2 --train.micro_batch_size 4
python3 - "$tmp/lora.losses" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
assert len(a) == 6 and a[-1] < a[0], a
print(f"# tied: LoRA losses {a[0]:.5f} -> {a[-1]:.5f}")
PY
echo "ok"
