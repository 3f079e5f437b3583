#!/usr/bin/env python3
"""bench_torch.py CHECKPOINT_DIR B T R STEPS [--mode lora|full] [--device cuda|cpu]
- the PyTorch reference of tests/gpu/bench.sh: the same checkpoint, batch
and loss as bench_lora (--mode lora) and bench_full (--mode full), through
transformers (LlamaForCausalLM, attention by SDPA: flash attention for
bf16 on the GPU) and peft.

  lora  the load timed and its device peak (from_pretrained straight onto
        the device in bf16, torch.cuda.max_memory_allocated), then LoRA of
        rank R (alpha 2R, no dropout) on the seven projections q k v o gate
        up down, AdamW lr 1e-4 on the adapters, no clipping: bench_lora's
        setup.
  full  every weight in float32 (the dtype the worker trains every weight
        in on a GPU; matrix products in plain fp32, PyTorch's default, no
        TF32), AdamW lr 1e-5 without weight decay, global-norm clipping at
        1.0: bench_full's setup. R is not used.

Tokens: one random stream of B x (T + 1) ids, the targets each next one,
the loss the mean cross-entropy over all B x T positions with float32
logits. tokens/s over STEPS steps after two warm-ups. Device memory: the
allocator's peak (max_memory_allocated) and the process's whole use after
the steps by cudaMemGetInfo (its context and cache included; the cache
keeps the steps' peak), as bench_lora/bench_full report ours.

Prints one JSON line; where python3 lacks torch, transformers or peft, one
that says so ({"status":"skipped","message":...}), with exit status 0.
--device cpu runs the same on the CPU (no memory figures): for rehearsals
on a machine without a GPU, on a small model."""
import argparse
import json
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ckpt")
    for k in ("B", "T", "R", "steps"):
        p.add_argument(k, type=int)
    p.add_argument("--mode", choices=("lora", "full"), default="lora")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = p.parse_args()
    if a.B < 1 or a.T < 2 or a.R < 1 or a.steps < 1:
        p.error("B, R and STEPS must be positive, T at least 2")
    return a


def skipped(a, why):
    print(json.dumps({"status": "skipped", "mode": a.mode, "message": why}))
    sys.exit(0)


def main():
    a = parse()
    try:
        import torch
        import transformers
        from transformers import LlamaForCausalLM
        if a.mode == "lora":
            import peft
            from peft import LoraConfig, get_peft_model
    except ImportError as e:
        skipped(a, f"python3 ({sys.executable}) lacks {e.name or 'a module'}: {e}")
    if a.device == "cuda" and not torch.cuda.is_available():
        skipped(a, f"torch {torch.__version__} sees no CUDA device")
    dev = torch.device(a.device, 0) if a.device == "cuda" else torch.device("cpu")
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if a.mode == "lora" else torch.float32

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    if cuda:
        torch.cuda.init()  # the allocator's statistics exist only once CUDA is up
        torch.cuda.reset_peak_memory_stats(dev)
    # Straight onto the device (no copy of the model on the host first).
    kw = {"attn_implementation": "sdpa"}
    if cuda:
        kw["device_map"] = {"": dev.index}
    t0 = time.time()
    try:
        model = LlamaForCausalLM.from_pretrained(a.ckpt, dtype=dtype, **kw)
    except TypeError:  # transformers before `dtype`
        model = LlamaForCausalLM.from_pretrained(a.ckpt, torch_dtype=dtype, **kw)
    sync()
    load_s = time.time() - t0
    load_peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    V = model.config.vocab_size
    row = {"status": "ok", "mode": a.mode, "device": a.device, "torch": torch.__version__,
           "transformers": transformers.__version__,
           "attention": getattr(model.config, "_attn_implementation", None),
           "dtype": str(dtype).replace("torch.", ""), "B": a.B, "T": a.T, "steps": a.steps,
           "params": sum(p.numel() for p in model.parameters()),
           "tied": bool(getattr(model.config, "tie_word_embeddings", False))}
    if a.mode == "lora":
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=a.R, lora_alpha=2 * a.R, lora_dropout=0.0,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
        row.update(peft=peft.__version__, lora_rank=a.R, target_modules=targets,
                   load_seconds=round(load_s, 3), load_device_peak_bytes=load_peak)
        lr, clip = 1e-4, None
    else:
        lr, clip = 1e-5, 1.0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(0, V, (a.B * a.T + 1,), generator=g)
    inp = tok[:-1].reshape(a.B, a.T).to(dev)
    tgt = tok[1:].reshape(a.B, a.T).to(dev)

    def step():
        logits = model(input_ids=inp).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), tgt.reshape(-1))
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    model.train()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    first = step()
    step()
    sync()
    t0 = time.time()
    for _ in range(a.steps):
        last = step()
    sync()
    secs = time.time() - t0
    row.update(trainable=sum(p.numel() for p in params),
               tokens_per_s=round(a.B * a.T * a.steps / secs, 1),
               loss_first=round(first, 4), loss_last=round(last, 4))
    if cuda:
        free, total = torch.cuda.mem_get_info(dev)
        row.update(allocator_peak_bytes=torch.cuda.max_memory_allocated(dev),
                   reserved_peak_bytes=torch.cuda.max_memory_reserved(dev),
                   device_used_bytes=total - free)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
