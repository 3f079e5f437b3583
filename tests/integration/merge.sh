#!/usr/bin/env bash
# merge.sh - `trainyard merge` checked outside trainyard: PyTorch writes a
# Qwen2 base as a torch.save file (q/k/v biases; tokenizer and generation
# files beside it) and a PEFT adapter on q, v, o and down; the merged
# safetensors, read back by a reader written here, hold W + (alpha/r) B @ A
# computed in torch for every adapted matrix (within 1e-6 of its largest
# value) and every other tensor, biases included, bit for bit; config.json
# and the side files are copied. The merged model evaluates to the same
# loss as the base with the adapter applied unmerged (1e-5 relative). The
# host peak (VmHWM) stays far below the model: the base is 16 layers of
# 4 MiB matrices (~200 MiB), the peak must be under a third of it.
# --dtype bfloat16 writes bf16 tensors (the merged values rounded).
# --shard_mb 20 writes files of at most 20 MiB (Hugging Face's names) with
# model.safetensors.index.json naming each tensor's file: the same tensors,
# bit for bit, and the same loss. An
# existing output, a missing adapter and an adapter for another model are
# refused by name, writing nothing.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

/usr/bin/python3 - "$tmp" <<'PY'
import json, math, os, struct, sys
import torch
tmp = sys.argv[1]
C, FF, V, L, NH, NKV, HS = 512, 2048, 256, 16, 8, 2, 64
cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": C,
       "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": NH,
       "num_key_value_heads": NKV, "vocab_size": V, "max_position_embeddings": 512,
       "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
       "hidden_act": "silu", "use_sliding_window": False, "sliding_window": 4096,
       "torch_dtype": "float32"}
g = torch.Generator().manual_seed(11)
w = {"model.embed_tokens.weight": 0.02 * torch.randn(V, C, generator=g),
     "model.norm.weight": 1 + 0.1 * torch.randn(C, generator=g),
     "lm_head.weight": 0.02 * torch.randn(V, C, generator=g)}
shapes = {"self_attn.q_proj": (NH * HS, C), "self_attn.k_proj": (NKV * HS, C),
          "self_attn.v_proj": (NKV * HS, C), "self_attn.o_proj": (C, NH * HS),
          "mlp.gate_proj": (FF, C), "mlp.up_proj": (FF, C), "mlp.down_proj": (C, FF)}
for i in range(L):
    p = f"model.layers.{i}."
    for k, s in shapes.items():
        w[p + k + ".weight"] = torch.randn(*s, generator=g) / math.sqrt(s[1])
    for k in ("q", "k", "v"):
        w[p + f"self_attn.{k}_proj.bias"] = 0.1 * torch.randn(shapes[f"self_attn.{k}_proj"][0],
                                                              generator=g)
    w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
os.makedirs(f"{tmp}/base")
json.dump(cfg, open(f"{tmp}/base/config.json", "w"))
torch.save(w, f"{tmp}/base/pytorch_model.bin")
side = {"tokenizer.json": '{"version": "1.0", "model": {"type": "BPE"}}',
        "tokenizer_config.json": '{"model_max_length": 512}',
        "special_tokens_map.json": '{"eos_token": "<|endoftext|>"}',
        "generation_config.json": '{"do_sample": false}'}
for name, text in side.items():
    open(f"{tmp}/base/{name}", "w").write(text)
# The adapter, as PEFT writes it (r 8, alpha 16; B random so that it matters).
r, alpha = 8, 16.0
tensors = {}
for i in range(L):
    for t in ("self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.down_proj"):
        o, n = shapes[t]
        base = f"base_model.model.model.layers.{i}.{t}"
        tensors[base + ".lora_A.weight"] = (torch.rand(r, n, generator=g) * 2 - 1) / math.sqrt(n)
        tensors[base + ".lora_B.weight"] = 0.05 * torch.randn(o, r, generator=g)
os.makedirs(f"{tmp}/adapter")
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
           "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"], "bias": "none",
           "base_model_name_or_path": f"{tmp}/base"}, open(f"{tmp}/adapter/adapter_config.json", "w"))
header, blobs, off = {}, [], 0
for name, t in tensors.items():
    b = t.contiguous().numpy().tobytes()
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(f"{tmp}/adapter/adapter_model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY

"$ty" merge --model_path "$tmp/base" --adapter "$tmp/adapter" --out "$tmp/merged" \
  >"$tmp/merge.json" 2>"$tmp/merge.err" || { cat "$tmp/merge.err" >&2; fail "merge failed"; }
"$ty" merge --model_path "$tmp/base" --adapter "$tmp/adapter" --out "$tmp/merged16" \
  --dtype bfloat16 >/dev/null 2>"$tmp/merge16.err" || { cat "$tmp/merge16.err" >&2; fail "bf16"; }
"$ty" merge --model_path "$tmp/base" --adapter "$tmp/adapter" --out "$tmp/sharded" \
  --shard_mb 20 >"$tmp/sharded.json" 2>"$tmp/sharded.err" ||
  { cat "$tmp/sharded.err" >&2; fail "sharded merge failed"; }
/usr/bin/python3 - "$tmp" <<'PY'
import json, os, struct, sys
import torch
tmp = sys.argv[1]

def read(path):
    """safetensors, by hand (F32 and BF16)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, out = json.loads(raw[8:8 + n]), {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = d["data_offsets"]
        buf = bytearray(raw[8 + n + a:8 + n + b])
        if d["dtype"] == "F32":
            t = torch.frombuffer(buf, dtype=torch.float32)
        else:
            assert d["dtype"] == "BF16", d
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        out[name] = t.reshape(d["shape"]).clone()
    return out

stats = json.load(open(f"{tmp}/merge.json"))
base = torch.load(f"{tmp}/base/pytorch_model.bin", weights_only=True)
ad = read(f"{tmp}/adapter/adapter_model.safetensors")
cfg = json.load(open(f"{tmp}/adapter/adapter_config.json"))
scale = cfg["lora_alpha"] / cfg["r"]
merged = read(f"{tmp}/merged/model.safetensors")
assert set(merged) == set(base), set(merged) ^ set(base)
n_merged, worst = 0, 0.0
for name, W in base.items():
    key = "base_model.model." + name[:-len(".weight")]
    if key + ".lora_A.weight" in ad:
        want = W + scale * (ad[key + ".lora_B.weight"] @ ad[key + ".lora_A.weight"])
        e = ((merged[name] - want).abs().max() / want.abs().max()).item()
        worst = max(worst, e)
        assert e < 1e-6, (name, e)
        assert not torch.equal(merged[name], W), name
        n_merged += 1
    else:
        assert torch.equal(merged[name], W), name + " changed"
assert n_merged == 16 * 4 == stats["merged"], (n_merged, stats)
assert sum(k.endswith(".bias") for k in merged) == 48
# bfloat16: the same values, rounded.
m16 = read(f"{tmp}/merged16/model.safetensors")
for name, t in m16.items():
    assert t.dtype == torch.bfloat16, name
    assert torch.equal(t, merged[name].to(torch.bfloat16)), name
assert json.load(open(f"{tmp}/merged16/config.json"))["torch_dtype"] == "bfloat16"
# Sharded: files of at most 20 MiB, the index naming each tensor's file.
idx = json.load(open(f"{tmp}/sharded/model.safetensors.index.json"))
files = sorted(set(idx["weight_map"].values()))
n = len(files)
assert n > 1 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)], files
assert json.load(open(f"{tmp}/sharded.json"))["files"] == n
assert not os.path.exists(f"{tmp}/sharded/model.safetensors")
total = 0
for f in files:
    part = read(f"{tmp}/sharded/{f}")
    assert os.path.getsize(f"{tmp}/sharded/{f}") <= 20 * 2**20 + 2**16, f
    for name, t in part.items():
        assert idx["weight_map"][name] == f, name
        assert torch.equal(t, merged[name]), name
        total += t.numel() * 4
assert set(idx["weight_map"]) == set(merged) and idx["metadata"]["total_size"] == total
print(f"# merge --shard_mb 20: {n} files of at most 20 MiB and the index, the same tensors")
# config.json and the side files, copied.
for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "generation_config.json"):
    assert open(f"{tmp}/merged/{name}", "rb").read() == open(f"{tmp}/base/{name}", "rb").read() \
        or name == "config.json" and json.load(open(f"{tmp}/merged/{name}")) == \
        json.load(open(f"{tmp}/base/{name}")), name
assert not os.path.exists(f"{tmp}/merged.partial")
model = sum(t.numel() * 4 for t in base.values())
largest = max(t.numel() * 4 for t in base.values())
peak = stats["host_peak_bytes"]
print(f"# merge: {n_merged} matrices = W + {scale:g} B@A in torch (worst {worst:.1e}), "
      f"{len(base) - n_merged} tensors copied bit for bit (48 biases), side files copied; "
      f"bf16 output rounds them")
print(f"# merge host peak {peak / 2**20:.1f} MiB for a {model / 2**20:.0f} MiB model "
      f"(largest tensor {largest / 2**20:.0f} MiB)")
assert peak < model / 3, (peak, model)
PY

# The merged model evaluates as the base with the adapter applied unmerged.
words "$tmp/words.txt" 4000
ev=(--data "$tmp/words.txt" --seq_len 32 --batches 4)
"$ty" eval --model_path "$tmp/base" --adapter "$tmp/adapter" "${ev[@]}" >"$tmp/eval-a" \
  || fail "eval of base + adapter"
"$ty" eval --model_path "$tmp/merged" "${ev[@]}" >"$tmp/eval-m" || fail "eval of merged"
"$ty" eval --model_path "$tmp/sharded" "${ev[@]}" >"$tmp/eval-s" || fail "eval of sharded"
cmp -s <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["loss"])' "$tmp/eval-m") \
  <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["loss"])' "$tmp/eval-s") ||
  fail "the sharded merge evaluates otherwise: $(cat "$tmp/eval-m" "$tmp/eval-s")"
"$ty" eval --model_path "$tmp/base" "${ev[@]}" >"$tmp/eval-b" || fail "eval of base"
python3 - "$tmp/eval-a" "$tmp/eval-m" "$tmp/eval-b" <<'PY'
import json, sys
a, m, b = (json.load(open(p))["loss"] for p in sys.argv[1:])
print(f"# eval: base + adapter {a:.6f}, merged {m:.6f} (base alone {b:.6f})")
assert abs(a - m) <= 1e-5 * abs(a), (a, m)
assert abs(a - b) > 1e-3, "the adapter changes nothing; the test would not see a bad merge"
PY

# Bad inputs, named; nothing written.
if "$ty" merge --model_path "$tmp/base" --adapter "$tmp/adapter" --out "$tmp/merged" \
  2>"$tmp/e1"; then fail "merge wrote over an existing folder"; fi
grep -q "already exists" "$tmp/e1" || fail "exists: $(cat "$tmp/e1")"
if "$ty" merge --model_path "$tmp/base" --adapter "$tmp/nothing" --out "$tmp/m2" 2>"$tmp/e2"
then fail "merge without an adapter"; fi
grep -q "adapter_config.json" "$tmp/e2" || fail "no adapter: $(cat "$tmp/e2")"
python3 - "$tmp/adapter/adapter_config.json" "$tmp/other" <<'PY'
import json, os, shutil, sys
os.makedirs(sys.argv[2])
c = json.load(open(sys.argv[1]))
c["r"] = 4  # the tensors are rank 8: an adapter of another shape
json.dump(c, open(sys.argv[2] + "/adapter_config.json", "w"))
shutil.copy(os.path.dirname(sys.argv[1]) + "/adapter_model.safetensors", sys.argv[2])
PY
if "$ty" merge --model_path "$tmp/base" --adapter "$tmp/other" --out "$tmp/m3" 2>"$tmp/e3"
then fail "merge of an adapter of another shape"; fi
grep -q "has another shape" "$tmp/e3" || fail "shape: $(cat "$tmp/e3")"
[ ! -e "$tmp/m2" ] && [ ! -e "$tmp/m3" ] && [ ! -e "$tmp/m3.partial" ] || fail "files left"
if "$ty" merge --model_path "$tmp/base" --adapter "$tmp/adapter" --out "$tmp/m4" --shard_mb 5G \
  2>"$tmp/e4"; then fail "merge took --shard_mb 5G"; fi
grep -q "\-\-shard_mb wants a whole number of MiB" "$tmp/e4" || fail "shard_mb: $(cat "$tmp/e4")"
echo "# merge: an existing output, no adapter, an adapter of another shape, a bad --shard_mb refused by name"
echo "ok"
