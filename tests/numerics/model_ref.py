#!/usr/bin/python3
"""model_ref.py - trainyard's Llama forward and backward (full and LoRA)
against a reference written here in plain PyTorch, after Hugging Face's
LlamaForCausalLM (and Qwen2ForCausalLM: the same decoder with biases on the
q, k and v projections) and PEFT's LoRA layer.

usage: model_ref.py MODEL_DRIVER WORKDIR

For each generated case it writes the weights, adapters and tokens
(WORKDIR/<case>/input.safetensors, case.json), runs the driver, and compares
its logits, loss and every gradient (all base tensors for full training,
all adapter tensors with the base frozen) with the reference computed in
float64 from the same fp32 values.

Cases marked "masked" also carry a loss weight per target (0 or 1: the
loss is the mean over the counted targets, as for prompt and padding
tokens), and cases marked "packed" several documents per row: each token's
position in its document (0 at its first token) sets its rotary angle,
and attention never crosses a document boundary (Hugging Face's packing
with position_ids, as DataCollatorWithFlattening feeds it).

Error metric, per tensor: max|ours - ref| / max|ref| (the largest absolute
difference relative to the tensor's largest reference magnitude, so that
near-zero entries do not blow it up). Every tensor must stay below 1e-4."""
import json
import math
import os
import struct
import subprocess
import sys

import torch

TOL = 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LAYER_TENSORS = [  # (name, rows, cols) over the config; cols None: 1-D
    ("input_layernorm.weight", "C", None), ("self_attn.q_proj.weight", "QD", "C"),
    ("self_attn.k_proj.weight", "KVD", "C"), ("self_attn.v_proj.weight", "KVD", "C"),
    ("self_attn.o_proj.weight", "C", "QD"), ("post_attention_layernorm.weight", "C", None),
    ("mlp.gate_proj.weight", "FF", "C"), ("mlp.up_proj.weight", "FF", "C"),
    ("mlp.down_proj.weight", "C", "FF")]
# Qwen2 (model_type "qwen2"): Qwen2Attention's q/k/v nn.Linear(bias=True).
QWEN2_BIASES = [("self_attn.q_proj.bias", "QD", None), ("self_attn.k_proj.bias", "KVD", None),
                ("self_attn.v_proj.bias", "KVD", None)]


def write_safetensors(path, tensors):
    """tensors: {name: float32 tensor}; the format written by hand."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data, out = raw[8 + n:], {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        assert d["dtype"] == "F32", name
        a, b = d["data_offsets"]
        buf = bytearray(data[a:b])
        out[name] = torch.frombuffer(buf, dtype=torch.float32).reshape(d["shape"]).clone()
    return out


def dims(cfg):
    hs = cfg["head_dim"]
    return {"C": cfg["hidden_size"], "FF": cfg["intermediate_size"], "V": cfg["vocab_size"],
            "QD": cfg["num_attention_heads"] * hs, "KVD": cfg["num_key_value_heads"] * hs}


def make_weights(cfg, gen):
    d, w = dims(cfg), {}
    w["model.embed_tokens.weight"] = 0.5 * torch.randn(d["V"], d["C"], generator=gen)
    qwen2 = cfg.get("model_type") == "qwen2"
    for i in range(cfg["num_hidden_layers"]):
        for name, r, c in LAYER_TENSORS + (QWEN2_BIASES if qwen2 else []):
            key = f"model.layers.{i}.{name}"
            if name.endswith(".bias"):  # as large as a projection's outputs, so they matter
                w[key] = 0.5 * torch.randn(d[r], generator=gen)
            elif c is None:  # norms near 1 but not 1, so their gradients matter
                w[key] = 1.0 + 0.2 * torch.randn(d[r], generator=gen)
            else:
                w[key] = torch.randn(d[r], d[c], generator=gen) / math.sqrt(d[c])
    w["model.norm.weight"] = 1.0 + 0.2 * torch.randn(d["C"], generator=gen)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = torch.randn(d["V"], d["C"], generator=gen) / math.sqrt(d["C"])
    return w


def lora_shapes(cfg):
    d = dims(cfg)
    return {"q_proj": ("QD", "C"), "k_proj": ("KVD", "C"), "v_proj": ("KVD", "C"),
            "o_proj": ("C", "QD"), "gate_proj": ("FF", "C"), "up_proj": ("FF", "C"),
            "down_proj": ("C", "FF")}, d


def lora_name(i, target, ab):
    mod = "self_attn" if target in TARGETS[:4] else "mlp"
    return f"base_model.model.model.layers.{i}.{mod}.{target}.lora_{ab}.weight"


def make_lora(cfg, gen):
    """A as PEFT initialises it; B random too (PEFT's zero B would leave
    every A gradient zero and test nothing)."""
    shapes, d = lora_shapes(cfg)
    r, out = cfg["lora_rank"], {}
    for i in range(cfg["num_hidden_layers"]):
        for bit, t in enumerate(TARGETS):
            if not (cfg["lora_targets"] >> bit) & 1:
                continue
            o, n = d[shapes[t][0]], d[shapes[t][1]]
            bound = 1.0 / math.sqrt(n)
            out[lora_name(i, t, "A")] = (torch.rand(r, n, generator=gen) * 2 - 1) * bound
            out[lora_name(i, t, "B")] = 0.3 * torch.randn(o, r, generator=gen)
    return out


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_inv_freq(cfg):
    """Hugging Face's ROPE_INIT_FUNCTIONS for rope_scaling None, "linear"
    (_compute_linear_scaling_rope_parameters) and "llama3"
    (_compute_llama3_parameters), in float64."""
    hs = cfg["head_dim"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return inv_freq
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv_freq / rs["factor"]
    assert kind == "llama3", kind
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv_freq
    llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, llama)


def forward(cfg, w, lora, tokens, targets, weights=None, pos=None):
    """Hugging Face's LlamaForCausalLM in float64; lora: {name: tensor} or None;
    weights (B, T) 0/1 per target or None; pos (B, T) positions within
    documents or None (0..T-1, one document a row)."""
    B, T = tokens.shape
    nh, nkv, hs = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, scale = cfg["rms_norm_eps"], cfg["lora_alpha"] / cfg["lora_rank"]
    inv_freq = rope_inv_freq(cfg)
    if pos is None:
        pos = torch.arange(T).expand(B, T)
    freqs = pos.to(torch.float64)[..., None] * inv_freq  # (B, T, HS/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # (B, 1, T, HS)
    # Document ids from the positions: a new document where pos is 0.
    doc = (pos == 0).cumsum(-1)
    allowed = (doc[:, :, None] == doc[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
    mask = torch.zeros(B, 1, T, T, dtype=torch.float64).masked_fill(~allowed[:, None], float("-inf"))

    def proj(x, i, target, mod):
        y = x @ w[f"model.layers.{i}.{mod}.{target}.weight"].T
        bias = w.get(f"model.layers.{i}.{mod}.{target}.bias")
        if bias is not None:  # Qwen2's q/k/v nn.Linear(bias=True)
            y = y + bias
        if lora is not None and lora_name(i, target, "A") in lora:
            a, b = lora[lora_name(i, target, "A")], lora[lora_name(i, target, "B")]
            y = y + scale * ((x @ a.T) @ b.T)
        return y

    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        hsn = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = proj(hsn, i, "q_proj", "self_attn").view(B, T, nh, hs).transpose(1, 2)
        k = proj(hsn, i, "k_proj", "self_attn").view(B, T, nkv, hs).transpose(1, 2)
        v = proj(hsn, i, "v_proj", "self_attn").view(B, T, nkv, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=1)  # Hugging Face's repeat_kv
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hs) + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, nh * hs)
        x = x + proj(y, i, "o_proj", "self_attn")
        hsn = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = proj(hsn, i, "gate_proj", "mlp"), proj(hsn, i, "up_proj", "mlp")
        x = x + proj(torch.nn.functional.silu(g) * u, i, "down_proj", "mlp")
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    logits = x @ head.T
    if weights is None:
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
    else:  # ignore_index for the targets of weight 0, as Hugging Face's labels -100
        labels = targets.masked_fill(weights == 0, -100)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 labels.reshape(-1), ignore_index=-100)
    return logits, loss


def make_pos(B, T, gen):
    """Positions of 1-4 documents of random lengths a row (the first row one
    document whose tail is padding of its own)."""
    pos = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        cuts = sorted(torch.randperm(T - 1, generator=gen)[:b % 4].add(1).tolist())
        start = 0
        for t in range(T):
            if t in cuts:
                start = t
            pos[b, t] = t - start
    return pos


def rel_err(ours, ref):
    ref = ref.to(torch.float64)
    denom = ref.abs().max().item()
    return (ours.to(torch.float64) - ref).abs().max().item() / (denom if denom > 0 else 1.0)


def run_case(driver, work, name, cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    case = os.path.join(work, name)
    os.makedirs(case, exist_ok=True)
    w32 = make_weights(cfg, gen)
    l32 = make_lora(cfg, gen)
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab_size"]
    seq = torch.randint(0, V, (B, T + 1), generator=gen)
    tokens, targets = seq[:, :-1], seq[:, 1:]
    extra, weights, pos = {}, None, None
    if cfg.get("masked"):  # about half the targets count; the last row none
        weights = (torch.rand(B, T, generator=gen) < 0.5).to(torch.float64)
        weights[0, 0] = 1.0
        weights[-1] = 0.0
        extra["weights"] = weights.float()
    if cfg.get("packed"):
        pos = make_pos(B, T, gen)
        extra["pos"] = pos.float()
    write_safetensors(os.path.join(case, "input.safetensors"),
                      {**w32, **l32, "tokens": tokens.float(), "targets": targets.float(), **extra})
    with open(os.path.join(case, "case.json"), "w") as f:
        json.dump(cfg, f)
    subprocess.run([driver, case], check=True)
    out = read_safetensors(os.path.join(case, "output.safetensors"))

    checks = []
    # Full training: gradients for every base tensor.
    w = {k: v.to(torch.float64).requires_grad_(True) for k, v in w32.items()}
    logits, loss = forward(cfg, w, None, tokens, targets, weights, pos)
    loss.backward()
    checks.append(("logits", out["logits"], logits.detach()))
    checks.append(("loss", out["loss"], loss.detach().reshape(1)))
    checks += [("grad " + k, out["grad/" + k], v.grad) for k, v in w.items()]
    # LoRA: base frozen, adapter gradients only.
    w = {k: v.to(torch.float64) for k, v in w32.items()}
    lo = {k: v.to(torch.float64).requires_grad_(True) for k, v in l32.items()}
    logits, loss = forward(cfg, w, lo, tokens, targets, weights, pos)
    loss.backward()
    checks.append(("lora logits", out["lora/logits"], logits.detach()))
    checks.append(("lora loss", out["lora/loss"], loss.detach().reshape(1)))
    checks += [("lora grad " + k, out["lora/grad/" + k], v.grad) for k, v in lo.items()]

    if cfg.get("rope_scaling") is not None:
        # The scaling must matter at this tolerance, or the case tests nothing.
        plain = {k: v for k, v in cfg.items() if k != "rope_scaling"}
        w = {k: v.to(torch.float64) for k, v in w32.items()}
        unscaled = forward(plain, w, None, tokens, targets, weights, pos)[0]
        e = rel_err(unscaled, checks[0][2])
        if not e > 100 * TOL:
            print(f"{name}: FAIL: rope_scaling changes the logits by only {e:.1e}")
            return False

    if cfg.get("model_type") == "qwen2":
        # So must the biases, and every layer must have them.
        w = {k: v.to(torch.float64) for k, v in w32.items() if not k.endswith(".bias")}
        nb = len(w32) - len(w)
        e = rel_err(forward(cfg, w, None, tokens, targets, weights, pos)[0], checks[0][2])
        if nb != 3 * cfg["num_hidden_layers"] or not e > 100 * TOL:
            print(f"{name}: FAIL: {nb} biases, changing the logits by {e:.1e}")
            return False

    expected = 2 + len(w32) + 2 + len(l32)
    if len(checks) != expected or len(out) != expected:
        print(f"{name}: FAIL: {len(out)} tensors from the driver, expected {expected}")
        return False
    worst, ok = ("", 0.0), True
    for label, ours, ref in checks:
        if tuple(ours.shape) != tuple(ref.shape):
            print(f"{name}: FAIL {label}: shape {tuple(ours.shape)} != {tuple(ref.shape)}")
            ok = False
            continue
        e = rel_err(ours, ref)
        if not e < TOL:
            print(f"{name}: FAIL {label}: relative error {e:.3e} >= {TOL:.0e}")
            ok = False
        if e > worst[1]:
            worst = (label, e)
    print(f"{name}: {len(checks)} tensors, loss {out['loss'].item():.6f} / lora "
          f"{out['lora/loss'].item():.6f}, worst relative error {worst[1]:.3e} ({worst[0]}) "
          f"-> {'ok' if ok else 'FAIL'}")
    return ok


def main():
    driver, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    base = {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "lora_alpha": 8.0}
    cases = {
        # grouped-query attention (2 kv heads for 4), untied head, FF = 88,
        # adapters on every projection ("all-linear")
        "gqa_untied": {**base, "hidden_size": 64, "intermediate_size": 88,
                       "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97,
                       "tie_word_embeddings": False, "batch": 2, "seq": 11,
                       "lora_rank": 4, "lora_targets": 127},
        # one kv head, head_dim != hidden/heads, tied head, another rope
        # base, adapters on q, v and down only
        "mqa_tied": {**base, "hidden_size": 48, "intermediate_size": 100,
                     "num_hidden_layers": 3, "num_attention_heads": 6,
                     "num_key_value_heads": 1, "head_dim": 10, "vocab_size": 64,
                     "tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-6,
                     "batch": 3, "seq": 9, "lora_rank": 3, "lora_alpha": 5.0,
                     "lora_targets": (1 << 0) | (1 << 2) | (1 << 6)},
        # Llama 3.2's shape in small: tied head, GQA, and heads wider than
        # hidden_size / num_attention_heads (q is 64 x 24, o 24 x 64)
        "tied_wide_heads": {**base, "hidden_size": 24, "intermediate_size": 56,
                            "num_hidden_layers": 2, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 70,
                            "tie_word_embeddings": True, "batch": 2, "seq": 10,
                            "lora_rank": 3, "lora_targets": 127},
        # Llama 3.1's rotary scaling: with head_dim 16 and an original
        # context of 64 the eight frequencies fall in all three bands (kept,
        # interpolated, divided by factor)
        "rope_llama3": {**base, "hidden_size": 32, "intermediate_size": 40,
                        "num_hidden_layers": 2, "num_attention_heads": 2,
                        "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 50,
                        "tie_word_embeddings": True, "rope_theta": 10000.0,
                        "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64},
                        "batch": 2, "seq": 24, "lora_rank": 2, "lora_targets": 127},
        # linear scaling, under the older key "type"
        "rope_linear": {**base, "hidden_size": 32, "intermediate_size": 40,
                        "num_hidden_layers": 1, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 40,
                        "tie_word_embeddings": False, "rope_theta": 100.0,
                        "rope_scaling": {"type": "linear", "factor": 4.0},
                        "batch": 2, "seq": 13, "lora_rank": 2, "lora_targets": 3},
    }
    # The loss mask and packed documents over both shapes.
    cases["gqa_untied_masked_packed"] = {**cases["gqa_untied"], "batch": 4, "seq": 23,
                                         "masked": True, "packed": True}
    cases["mqa_tied_masked"] = {**cases["mqa_tied"], "masked": True}
    cases["mqa_tied_packed"] = {**cases["mqa_tied"], "batch": 4, "seq": 17, "packed": True}
    # Llama 3.1's rotary scaling, its three bands all present at head_dim 16
    # (wavelengths 6.3 .. 2.8e4 against 32/4 = 8 and 32/1 = 32), packed.
    cases["gqa_llama3_rope_packed"] = {
        **cases["gqa_untied"], "rope_theta": 500000.0, "batch": 3, "seq": 13, "packed": True,
        "masked": True, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 32}}
    # Qwen2: q/k/v biases (trained in full training, their gradients
    # checked; frozen under LoRA), rope_theta 1e6, tied head, GQA; and
    # packed documents with a loss mask, where the biases meet the
    # restarted positions.
    cases["qwen2"] = {**base, "model_type": "qwen2", "hidden_size": 56,
                      "intermediate_size": 72, "num_hidden_layers": 2,
                      "num_attention_heads": 7, "num_key_value_heads": 1, "head_dim": 8,
                      "vocab_size": 61, "tie_word_embeddings": True, "rope_theta": 1000000.0,
                      "rms_norm_eps": 1e-6, "batch": 2, "seq": 12, "lora_rank": 4,
                      "lora_targets": 127}
    cases["qwen2_untied_masked_packed"] = {**cases["qwen2"], "tie_word_embeddings": False,
                                           "num_key_value_heads": 7, "batch": 3, "seq": 15,
                                           "masked": True, "packed": True, "lora_targets": 5}
    # The output head in chunks of 5 rows (4 x 23 tokens: 19 chunks, the
    # last of 2), each chunk's logits computed again in the backward pass
    # (LoRA: the head's backward run in the forward pass); Qwen2's in 4.
    cases["gqa_untied_head_chunks"] = {**cases["gqa_untied_masked_packed"], "head_rows": 5}
    cases["mqa_tied_head_chunks"] = {**cases["mqa_tied_masked"], "head_rows": 3}
    cases["qwen2_head_chunks"] = {**cases["qwen2_untied_masked_packed"], "head_rows": 4}
    ok = True
    for i, (name, cfg) in enumerate(cases.items()):
        ok &= run_case(driver, work, name, cfg, 1000 + i)
    if not ok:
        sys.exit(1)
    print("model_ref: all cases within", TOL)


if __name__ == "__main__":
    main()
