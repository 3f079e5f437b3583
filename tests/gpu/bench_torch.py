#!/usr/bin/env python3
"""bench_torch.py CHECKPOINT_DIR B T R STEPS - the reference for bench_lora:
the same checkpoint and the same batch shape through transformers + peft on
one GPU. Device peak at load (torch.cuda.max_memory_allocated after
from_pretrained straight onto the device in bf16), then LoRA of rank R on
all linear layers (alpha 2R, no dropout, AdamW lr 1e-4 on the adapters):
tokens/s over STEPS steps after two warm-ups, and the training peak. Prints
one JSON line; run by tests/gpu/bench.sh where torch, transformers and peft
are installed."""
import json
import sys
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM


def main():
    ck = sys.argv[1]
    B, T, R, steps = (int(a) for a in sys.argv[2:6])
    dev = torch.device("cuda", 0)
    # The allocator's statistics exist only once CUDA is initialised.
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.time()
    try:
        model = LlamaForCausalLM.from_pretrained(ck, dtype=torch.bfloat16, device_map={"": 0})
    except TypeError:  # transformers before `dtype`
        model = LlamaForCausalLM.from_pretrained(ck, torch_dtype=torch.bfloat16, device_map={"": 0})
    torch.cuda.synchronize(dev)
    load_s = time.time() - t0
    load_peak = torch.cuda.max_memory_allocated(dev)
    V = model.config.vocab_size
    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=2 * R, lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(0, V, (B, T + 1), generator=g).to(dev)
    inp, tgt = tok[:, :-1], tok[:, 1:]

    def step():
        logits = model(input_ids=inp).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), tgt.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    torch.cuda.reset_peak_memory_stats(dev)
    first = step()
    step()
    torch.cuda.synchronize(dev)
    t0 = time.time()
    for _ in range(steps):
        last = step()
    torch.cuda.synchronize(dev)
    secs = time.time() - t0
    print(json.dumps({
        "status": "ok", "torch": torch.__version__,
        "transformers": sys.modules["transformers"].__version__,
        "B": B, "T": T, "lora_rank": R, "steps": steps,
        "load_device_peak_bytes": load_peak, "load_seconds": round(load_s, 3),
        "train_device_peak_bytes": torch.cuda.max_memory_allocated(dev),
        "tokens_per_s": round(B * T * steps / secs, 1),
        "loss_first": round(first, 4), "loss_last": round(last, 4),
    }))


if __name__ == "__main__":
    main()
