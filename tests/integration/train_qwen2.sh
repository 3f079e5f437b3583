#!/usr/bin/env bash
# train_qwen2.sh - `trainyard train` on a Qwen2 checkpoint (model_type
# "qwen2": biases on the q, k and v projections, rope_theta 1e6, an unused
# sliding_window with use_sliding_window false), written here by PyTorch as
# safetensors and as a torch.save file: both load to the same eval loss;
# full training on 1 and 2 ranks (standard load) and 2 ranks with
# fsdp.memory_efficient_load (each rank reads its byte ranges of the
# biases) gives the same losses within 1e-5 relative, trains the biases and
# writes them back (the trained model loads); a resumed run repeats the
# steps after its checkpoint exactly (the biases and their AdamW moments
# are in it); LoRA on 1 and 2 ranks (same losses) trains with the biases
# frozen: the adapter holds no bias, and no base model is written. Then `mkmodel --like
# qwen2.5-0.5b --layers 2` writes the published config.json with 2 layers
# and every bias tensor.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

data="$tmp/words.txt"
words "$data" 6000
/usr/bin/python3 - "$tmp/qwen" "$tmp/qwen-pt" <<'PY'
import json, os, struct, sys
import torch
cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
       "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
       "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
       "hidden_act": "silu", "attention_dropout": 0.0, "use_sliding_window": False,
       "sliding_window": 4096, "max_window_layers": 2, "torch_dtype": "float32",
       "bos_token_id": 0, "eos_token_id": 0, "use_cache": True, "transformers_version": "4.40.1"}
g = torch.Generator().manual_seed(7)
C, FF, hs = 32, 48, 8
w = {"model.embed_tokens.weight": 0.02 * torch.randn(256, C, generator=g),
     "model.norm.weight": torch.ones(C)}
for i in range(2):
    p = f"model.layers.{i}."
    shapes = {"self_attn.q_proj.weight": (32, C), "self_attn.k_proj.weight": (16, C),
              "self_attn.v_proj.weight": (16, C), "self_attn.o_proj.weight": (C, 32),
              "mlp.gate_proj.weight": (FF, C), "mlp.up_proj.weight": (FF, C),
              "mlp.down_proj.weight": (C, FF), "self_attn.q_proj.bias": (32,),
              "self_attn.k_proj.bias": (16,), "self_attn.v_proj.bias": (16,)}
    for k, s in shapes.items():
        w[p + k] = (0.3 if k.endswith("bias") else 0.05) * torch.randn(*s, generator=g)
    w[p + "input_layernorm.weight"] = torch.ones(C)
    w[p + "post_attention_layernorm.weight"] = torch.ones(C)
for d in sys.argv[1:]:
    os.makedirs(d)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
torch.save(w, os.path.join(sys.argv[2], "pytorch_model.bin"))
header, blobs, off = {}, [], 0
for name, t in w.items():
    b = t.contiguous().numpy().tobytes()
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(sys.argv[1], "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY

# Both formats load the biases: the same eval loss, bit for bit.
for m in qwen qwen-pt; do
  "$ty" eval --model_path "$tmp/$m" --data "$data" --seq_len 32 --batches 4 >"$tmp/eval-$m" \
    || fail "eval of $m failed"
done
python3 - "$tmp/eval-qwen" "$tmp/eval-qwen-pt" <<'PY'
import json, sys
a, b = (json.load(open(p))["loss"] for p in sys.argv[1:])
assert a == b, (a, b)
print(f"# qwen2: safetensors and pytorch_model.bin evaluate alike ({a:.6f})")
PY

common=(--data.path "$data" --data.seq_len 32 --train.steps 6 --train.grad_accum 1
        --train.warmup_steps 1 --train.checkpoint_every 0 --json)
full=(--model_path "$tmp/qwen" --use_lora false --train.lr 3e-3)
train_losses full-1 "${full[@]}" --world_size 1 --train.micro_batch_size 8
train_losses full-2 "${full[@]}" --world_size 2 --train.micro_batch_size 4
train_losses full-2e "${full[@]}" --world_size 2 --train.micro_batch_size 4 \
  --fsdp.memory_efficient_load true
python3 - "$tmp"/full-1.losses "$tmp"/full-2.losses "$tmp"/full-2e.losses <<'PY'
import sys
a, b, c = ([float(x) for x in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == len(c) == 6, (a, b, c)
gap = max(abs(x - y) / abs(x) for r in (b, c) for x, y in zip(a, r))
print(f"# qwen2 full training, world 1 vs 2 (and 2 memory-efficient): max relative loss gap "
      f"{gap:.2e} (losses {a[0]:.5f} -> {a[-1]:.5f})")
assert gap <= 1e-5, (a, b, c)
assert a[-1] < a[0], a
PY
# The trained biases are written back (and changed), the model stays Qwen2
# and loads.
python3 - "$tmp/qwen/model.safetensors" "$tmp/full-2/model.safetensors" "$tmp/full-2/config.json" <<'PY'
import json, struct, sys
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in h.items() if k != "__metadata__"}, h
base, _ = read(sys.argv[1])
out, h = read(sys.argv[2])
cfg = json.load(open(sys.argv[3]))
assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"], cfg
assert set(out) == set(base), set(out) ^ set(base)
for i in range(2):
    for p in "qkv":
        k = f"model.layers.{i}.self_attn.{p}_proj.bias"
        assert h[k]["shape"] == [32 if p == "q" else 16], h[k]
        assert out[k] != base[k], k + " was not trained"
print("# qwen2: the trained q/k/v biases are written back, changed; config.json stays qwen2")
PY
"$ty" eval --model_path "$tmp/full-2" --data "$data" --seq_len 32 --batches 4 >"$tmp/eval-full" \
  || fail "eval of the trained qwen2 model failed"
python3 - "$tmp/eval-qwen" "$tmp/eval-full" <<'PY'
import json, sys
a, b = (json.load(open(p))["loss"] for p in sys.argv[1:])
print(f"# eval: base {a:.5f}, trained {b:.5f}")
assert b < a, (a, b)
PY

# Resume: the checkpoint of step 4 holds the biases and their moments.
for run in 1 2; do
  "$ty" train "${common[@]}" "${full[@]}" --world_size 2 --train.micro_batch_size 4 \
    --train.checkpoint_every 4 --train.steps 8 --output_dir "$tmp/resume" \
    >"$tmp/resume-$run.out" 2>"$tmp/resume-$run.log" \
    || { cat "$tmp/resume-$run.log" >&2; fail "resume run $run"; }
done
grep -q "resumed from the checkpoint of step 4" "$tmp/resume-2.log" || fail "no resume"
python3 - "$tmp/resume-1.out" "$tmp/resume-2.out" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))
            if r["rank"] == 0 and r["phase"] == "training" and r["loss"] is not None}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(b) == [5, 6, 7, 8], sorted(b)
assert all(a[s] == b[s] for s in b), (a, b)
print("# qwen2: resumed at step 4, steps 5-8 identical")
PY

# LoRA: the biases are frozen (no adapter for them, the base untouched);
# 1 rank and 2 memory-efficient ranks agree.
lora=(--model_path "$tmp/qwen" --use_lora true --lora_rank 4 --target_modules all-linear
      --train.lr 3e-2)
train_losses lora-1 "${lora[@]}" --world_size 1 --train.micro_batch_size 8
train_losses lora "${lora[@]}" --world_size 2 --train.micro_batch_size 4 \
  --fsdp.memory_efficient_load true
python3 - "$tmp/lora-1.losses" "$tmp/lora.losses" "$tmp/lora/adapter_model.safetensors" <<'PY'
import json, struct, sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
assert len(a) == len(b) == 6 and a[-1] < a[0], (a, b)
gap = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert gap <= 1e-5, (a, b)
raw = open(sys.argv[3], "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert names and not [k for k in names if "bias" in k], list(names)
print(f"# qwen2 LoRA: losses {a[0]:.5f} -> {a[-1]:.5f}, world 1 vs 2 gap {gap:.2e}, "
      "adapter without biases")
PY
[ ! -e "$tmp/lora/model.safetensors" ] || fail "LoRA wrote the base model"

# mkmodel --like qwen2.5-0.5b: the published configuration, 2 layers, with
# its biases (in bfloat16 as published).
configs="$(dirname "$0")/../data/configs"
"$ty" mkmodel --like qwen2.5-0.5b --layers 2 --out "$tmp/q05" >/dev/null
python3 - "$configs/qwen2.5-0.5b.json" "$tmp/q05" <<'PY'
import json, struct, sys
pub = json.load(open(sys.argv[1]))
ours = json.load(open(sys.argv[2] + "/config.json"))
assert ours.pop("num_hidden_layers") == 2 and pub.pop("num_hidden_layers") == 24
assert ours == pub, (ours, pub)
raw = open(sys.argv[2] + "/model.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
h.pop("__metadata__", None)
assert h["model.layers.1.self_attn.k_proj.bias"] == {**h["model.layers.1.self_attn.k_proj.bias"],
                                                     "dtype": "BF16", "shape": [128]}
assert len(h) == 1 + 2 * 12 + 1, len(h)  # tied: no lm_head
print("# mkmodel --like qwen2.5-0.5b --layers 2: the published config.json, 26 tensors")
PY
"$ty" load --model_path "$tmp/q05" --world_size 2 --fsdp.memory_efficient_load true \
  >"$tmp/q05.load" 2>&1 || { cat "$tmp/q05.load" >&2; fail "load of --like qwen2.5-0.5b"; }
echo "ok"
