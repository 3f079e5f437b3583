#!/usr/bin/python3
"""generate_ref.py - `trainyard generate`'s greedy tokens against a greedy
decode in plain PyTorch, after Hugging Face's LlamaForCausalLM /
MistralForCausalLM and PEFT's LoRA layer (float64 from the same fp32
weights, the whole sequence recomputed each step: no cache).

usage: generate_ref.py TRAINYARD WORKDIR [--device cuda]

Cases: a Llama configuration (GQA, untied head); a tied head with Llama 3.1
rope_scaling and an explicit head_dim; the first with a LoRA adapter on
every projection (PEFT format, applied unmerged); Mistral with a
sliding_window shorter than prompt + generation (the window is applied);
and an eos_token_id list in generation_config.json (decoding stops at the
first of them). Each case runs with the key/value cache and with
--no_cache (the training forward over the whole sequence each token); both
must give the reference's tokens exactly. The smallest gap between the
reference's best and second-best logit is printed: a tie within float32
rounding would make the comparison meaningless, and the seeds keep it
far from one.

With --device cuda (gpu/generate) each case runs on the GPU decoder
instead, whose tokens must equal the reference's and the CPU decoder's
(--device cpu); it exits 77 (a ctest skip), saying why, where trainyard
finds no GPU. A Qwen2 case without an adapter runs in both modes."""
import json
import math
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_ref import (TARGETS, lora_name, make_lora, make_weights, rmsnorm,  # noqa: E402
                       rope_inv_freq, rotate_half, write_safetensors)


def forward(cfg, w, lora, tokens):
    """Logits (T, V) of one sequence, float64; Mistral's sliding window
    (a query at i sees keys j with i - j < sliding_window) when set."""
    T = tokens.shape[0]
    nh, nkv, hs = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    scale = cfg["lora_alpha"] / cfg["lora_rank"] if lora else 0.0
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * rope_inv_freq(cfg)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None], emb.sin()[None]  # (1, T, HS)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = j <= i
    if cfg.get("sliding_window"):
        allowed &= (i - j) < cfg["sliding_window"]
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~allowed, float("-inf"))

    def proj(x, layer, target, mod):
        y = x @ w[f"model.layers.{layer}.{mod}.{target}.weight"].T
        bias = w.get(f"model.layers.{layer}.{mod}.{target}.bias")
        if bias is not None:  # Qwen2's q/k/v
            y = y + bias
        if lora and lora_name(layer, target, "A") in lora:
            a, b = lora[lora_name(layer, target, "A")], lora[lora_name(layer, target, "B")]
            y = y + scale * ((x @ a.T) @ b.T)
        return y

    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = proj(h, layer, "q_proj", "self_attn").view(T, nh, hs).transpose(0, 1)
        k = proj(h, layer, "k_proj", "self_attn").view(T, nkv, hs).transpose(0, 1)
        v = proj(h, layer, "v_proj", "self_attn").view(T, nkv, hs).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=0)
        v = v.repeat_interleave(nh // nkv, dim=0)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hs) + mask, dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, nh * hs)
        x = x + proj(y, layer, "o_proj", "self_attn")
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = proj(h, layer, "gate_proj", "mlp"), proj(h, layer, "up_proj", "mlp")
        x = x + proj(torch.nn.functional.silu(g) * u, layer, "down_proj", "mlp")
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def greedy(cfg, w, lora, prompt, n, eos=()):
    """Hugging Face's greedy search: argmax each step until n tokens or an
    eos id (not emitted). Returns the tokens and the smallest top-2 gap."""
    seq, out, gap = list(prompt), [], float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits = forward(cfg, w, lora, torch.tensor(seq))[-1]
            top = torch.topk(logits, 2).values
            gap = min(gap, (top[0] - top[1]).item())
            nxt = int(torch.argmax(logits))
            if nxt in eos:
                break
            out.append(nxt)
            seq.append(nxt)
    return out, gap


def hf_config(cfg):
    keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
            "rms_norm_eps", "rope_theta", "tie_word_embeddings", "rope_scaling", "sliding_window"]
    out = {k: cfg[k] for k in keys if k in cfg}
    out["model_type"] = cfg.get("model_type", "llama")
    out["architectures"] = [{"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(
        out["model_type"], "LlamaForCausalLM")]
    out["torch_dtype"] = "float32"
    return out


DEVICE = None  # --device cuda: the GPU decoder


def run(ty, args):
    r = subprocess.run([ty, "generate"] + args, capture_output=True, text=True)
    if r.returncode != 0 and "no CUDA device is visible" in r.stderr:
        print(f"SKIP gpu/generate_cli: {r.stderr.strip().splitlines()[-1]}")
        sys.exit(77)
    if r.returncode != 0:
        sys.exit(f"trainyard generate {' '.join(args)} failed:\n{r.stderr}")
    return json.loads(r.stdout), r.stderr


def case(ty, work, name, cfg, seed, with_lora=False, eos_at=None):
    gen = torch.Generator().manual_seed(seed)
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    w32 = make_weights(cfg, gen)
    l32 = make_lora(cfg, gen) if with_lora else None
    prompt = torch.randint(0, cfg["vocab_size"], (cfg["prompt"],), generator=gen).tolist()
    write_safetensors(os.path.join(d, "model.safetensors"), w32)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f)
    w = {k: v.to(torch.float64) for k, v in w32.items()}
    lora = {k: v.to(torch.float64) for k, v in l32.items()} if l32 else None
    args = ["--model_path", d, "--prompt_ids", json.dumps(prompt),
            "--max_new_tokens", str(cfg["new"]), "--output", "ids"]
    if l32:
        ad = os.path.join(work, name + "-adapter")
        os.makedirs(ad, exist_ok=True)
        write_safetensors(os.path.join(ad, "adapter_model.safetensors"), l32)
        targets = [t for b, t in enumerate(TARGETS) if (cfg["lora_targets"] >> b) & 1]
        with open(os.path.join(ad, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": cfg["lora_rank"], "lora_alpha": cfg["lora_alpha"],
                       "target_modules": targets, "task_type": "CAUSAL_LM"}, f)
        args += ["--adapter", ad]
    ref, gap = greedy(cfg, w, lora, prompt, cfg["new"])
    eos = ()
    if eos_at is not None:  # stop at the eos_at-th greedy token, via a list
        eos = (cfg["vocab_size"] - 1, ref[eos_at])
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": list(eos)}, f)
        ref, gap = greedy(cfg, w, lora, prompt, cfg["new"], eos)
        assert len(ref) <= eos_at, (ref, eos)
    if DEVICE:
        cached, log = run(ty, args + ["--device", DEVICE])
        assert log.rstrip().endswith(f"device {DEVICE}"), log
        uncached, _ = run(ty, args + ["--device", "cpu"])  # the CPU decoder's, as a name
    else:
        cached, log = run(ty, args)
        uncached, _ = run(ty, args + ["--no_cache"]) if "sliding_window" not in cfg else (cached, "")
    print(f"# {name}: prompt {len(prompt)}, {len(ref)} greedy tokens, smallest top-2 gap "
          f"{gap:.2e}; {log.strip().splitlines()[-1]}")
    assert gap > 1e-4, f"{name}: a near tie ({gap}); choose another seed"
    first, second = (f"on {DEVICE}", "on the cpu") if DEVICE else ("with the cache",
                                                                   "without the cache")
    if cached != ref:
        sys.exit(f"{name}: {first} {cached}\n  reference {ref}")
    if uncached != ref:
        sys.exit(f"{name}: {second} {uncached}\n  reference {ref}")


def main():
    global DEVICE
    ty, work = sys.argv[1], sys.argv[2]
    if sys.argv[3:5] == ["--device", "cuda"]:
        DEVICE = "cuda"
    elif len(sys.argv) != 3:
        sys.exit("usage: generate_ref.py TRAINYARD WORKDIR [--device cuda]")
    os.makedirs(work, exist_ok=True)
    base = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 97, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "lora_rank": 4,
            "lora_alpha": 8.0, "lora_targets": 0x7F, "prompt": 11, "new": 24}
    case(ty, work, "llama", base, 1)
    tied = dict(base, tie_word_embeddings=True, hidden_size=48, head_dim=16, rope_theta=500000.0,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                prompt=70, new=20)  # the prompt passes one 64-token chunk
    case(ty, work, "tied_llama3", tied, 2)
    case(ty, work, "lora", dict(base, lora_targets=0x7F), 3, with_lora=True)
    case(ty, work, "lora_qv", dict(base, lora_targets=0x5, lora_rank=2), 4, with_lora=True)
    mistral = dict(base, model_type="mistral", sliding_window=8, num_key_value_heads=1)
    case(ty, work, "mistral_window", mistral, 5)
    case(ty, work, "eos_list", base, 6, eos_at=5)
    qwen2 = dict(base, model_type="qwen2", rope_theta=1000000.0)
    case(ty, work, "qwen2", qwen2, 8)
    case(ty, work, "qwen2_lora", dict(base, model_type="qwen2", rope_theta=1000000.0,
                                      lora_targets=0x7F), 7, with_lora=True)
    print("# greedy decoding matches the reference in every case"
          + (f" on {DEVICE}, and the CPU decoder" if DEVICE else ""))


main()
