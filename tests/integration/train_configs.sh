#!/usr/bin/env bash
# train_configs.sh - `trainyard train` on the configurations of published
# models: a tied head (no lm_head.weight; the head is the embedding, and its
# gradient the sum of both uses) with a head_dim that is not
# hidden_size / num_attention_heads, in full training on 1 and 2 ranks (FSDP
# shards the shared matrix: equal losses within 1e-5 relative) and in LoRA;
# the trained model is written tied and loads again. Then `mkmodel --like`:
# the published config.json of Llama 3.2 1B (tied, head_dim, llama3
# rope_scaling, a 128256-token vocabulary) with 2 layers, trained with LoRA
# for 3 steps (Qwen2.5's is integration/train_qwen2's); a Mistral model
# (sliding_window) trained within its window, refused beyond.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 6000
common=(--data.path "$data" --data.seq_len 32 --train.steps 6 --train.grad_accum 1
        --train.warmup_steps 1 --train.checkpoint_every 0 --json)

# Tied head, head_dim 16 with hidden_size 48 and 4 heads (q is 64 x 48).
"$ty" mkmodel --out "$tmp/tied" --hidden-size 48 --intermediate-size 80 --layers 2 --heads 4 \
  --kv-heads 2 --head-dim 16 --tie-embeddings --vocab-size 256 --seed 5 >/dev/null
for w in 1 2; do
  train_losses "full-$w" --model_path "$tmp/tied" --use_lora false --train.lr 3e-3 --world_size "$w" \
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
train_losses lora --model_path "$tmp/tied" --use_lora true --lora_rank 4 --target_modules all-linear \
  --train.lr 3e-2 --world_size 2 --train.micro_batch_size 4
python3 - "$tmp/lora.losses" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
assert len(a) == 6 and a[-1] < a[0], a
print(f"# tied: LoRA losses {a[0]:.5f} -> {a[-1]:.5f}")
PY
configs="$(dirname "$0")/../data/configs"
"$ty" mkmodel --like llama-3.2-1b --layers 2 --out "$tmp/l32" >/dev/null
python3 - "$configs/llama-3.2-1b.json" "$tmp/l32/config.json" <<'PY'
import json, sys
pub, ours = (json.load(open(p)) for p in sys.argv[1:])
assert ours.pop("num_hidden_layers") == 2 and pub.pop("num_hidden_layers") == 16
assert ours == pub, (ours, pub)
print("# mkmodel --like llama-3.2-1b: the published config.json, 2 layers")
PY
"$ty" train --data.path "$data" --data.seq_len 16 --train.steps 3 --train.grad_accum 1 \
  --train.warmup_steps 1 --train.checkpoint_every 0 --train.micro_batch_size 1 \
  --model_path "$tmp/l32" --use_lora true --lora_rank 4 --train.lr 1e-3 \
  --output_dir "$tmp/l32-lora" --json >"$tmp/l32.out" 2>"$tmp/l32.log" \
  || { cat "$tmp/l32.log" >&2; fail "LoRA on mkmodel --like llama-3.2-1b failed"; }
python3 - "$tmp/l32.out" <<'PY'
import json, math, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
done = [r for r in rows if r["phase"] == "done"]
assert done, rows[-1]
m = re.search(r"held-out loss ([0-9.]+) -> ([0-9.]+)", done[0]["message"])
a, b = float(m.group(1)), float(m.group(2))
# random weights: near the uniform loss ln(128256) = 11.76
assert abs(a - math.log(128256)) < 1.5 and b < a, (a, b)
print(f"# llama-3.2-1b, 2 layers, LoRA: held-out loss {a:.4f} -> {b:.4f}")
PY

# Mistral: Llama with a sliding window; sequences within it train, longer
# ones are refused naming the window, and the trained model stays Mistral.
"$ty" mkmodel --out "$tmp/mistral" --hidden-size 32 --intermediate-size 48 --layers 1 \
  --heads 4 --kv-heads 2 --vocab-size 256 >/dev/null
python3 - "$tmp/mistral/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=16)
json.dump(c, open(sys.argv[1], "w"))
PY
mistral=(--model_path "$tmp/mistral" --use_lora false --data.path "$data" --train.steps 2
         --train.micro_batch_size 2 --train.warmup_steps 0 --train.checkpoint_every 0)
if "$ty" train "${mistral[@]}" --data.seq_len 17 --output_dir "$tmp/m17" 2>"$tmp/m17.err"; then
  fail "a Mistral model trained on sequences longer than its sliding_window"
fi
grep -q "data.seq_len.*sliding_window (16" "$tmp/m17.err" || fail "seq_len 17: $(cat "$tmp/m17.err")"
"$ty" train "${mistral[@]}" --data.seq_len 16 --output_dir "$tmp/m16" >/dev/null 2>"$tmp/m16.err" \
  || { cat "$tmp/m16.err" >&2; fail "a Mistral model within its window did not train"; }
python3 - "$tmp/m16/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model_type"] == "mistral" and c["sliding_window"] == 16, c
print("# mistral: seq_len 17 > sliding_window 16 refused, 16 trains, written back as mistral")
PY
echo "ok"
