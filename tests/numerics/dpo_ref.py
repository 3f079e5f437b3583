#!/usr/bin/python3
"""dpo_ref.py - trainyard's DPO (train.objective dpo) against TRL's loss,
written here in PyTorch from TRL's DPOTrainer (dpo_loss and
concatenated_forward): each response's log-probability is the sum over its
own tokens of log_softmax(logits)[target] ("ipo": the mean over them), and
  logits = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
  sigmoid  -logsigmoid(beta logits) (1 - ls) - logsigmoid(-beta logits) ls
  hinge    relu(1 - beta logits)
  ipo      (logits - 1 / (2 beta))^2
the loss the mean over the pairs, the rewards beta (policy - reference),
and TRL's metrics rewards/chosen, rewards/rejected, rewards/accuracies,
rewards/margins, logps/chosen, logps/rejected (means over the pairs).

usage: dpo_ref.py DPO_DRIVER WORKDIR

Each case is a few pairs of random token sequences, a shared prompt and two
responses of different lengths (some cut at seq+1 tokens, as the rows cut
them), through the driver's real path: the examples file, the data's pairs,
worker/rank/train_dpo and the CPU backend. Under LoRA the reference is the
base (the adapters off) and the gradients are the adapters'; training
every weight the reference is the base and the policy other weights, and
the gradients are every base tensor's. The model is model_ref.py's
Hugging Face Llama in float64. Every tensor within 1e-4 (max abs error
over max abs value), the loss and metrics within 1e-4 relative."""
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_ref  # noqa: E402  the reference Llama and the safetensors helpers

TOL = 1e-4
METRICS = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
           "rewards/margins", "logps/chosen", "logps/rejected"]


def trl_dpo_loss(pc, pr, rc, rr, beta, loss_type, ls):
    """TRL's DPOTrainer.dpo_loss for one batch of pairs (tensors of P)."""
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(loss_type)
    chosen_rewards = beta * (pc - rc).detach()
    rejected_rewards = beta * (pr - rr).detach()
    return losses, chosen_rewards, rejected_rewards


def rows_of(pairs, T, pad):
    """The rows trainyard makes of the pairs: each response's example cut to
    T+1 tokens and padded, inputs, targets, each target's weight (its token
    counted, never the first), rows 2p and 2p+1 pair p."""
    toks, weights = [], []
    for p in pairs:
        for side in ("chosen", "rejected"):
            ids, cnt = p[side][:T + 1], p[side + "_counted"][:T + 1]
            row = ids + [pad] * (T + 1 - len(ids))
            w = [cnt[j] if j < len(ids) else 0 for j in range(1, T + 1)]
            toks.append(row)
            weights.append(w)
    seq = torch.tensor(toks)
    return seq[:, :-1], seq[:, 1:], torch.tensor(weights, dtype=torch.float64)


def row_logps(cfg, w, lora, tokens, targets, weights, mean):
    logits, _ = model_ref.forward(cfg, w, lora, tokens, targets)
    lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    s = (lp * weights).sum(-1)
    return s / weights.sum(-1) if mean else s


def reference(cfg, case, w_ref, w_pol, lora, tokens, targets, weights):
    """TRL's loss and metrics over the pairs; the gradients of the loss with
    respect to the policy's tensors (the adapters, or every weight)."""
    mean = case["loss_type"] == "ipo"
    with torch.no_grad():
        ref = row_logps(cfg, w_ref, None, tokens, targets, weights, mean)
    pol = row_logps(cfg, w_pol, lora, tokens, targets, weights, mean)
    losses, rc, rr = trl_dpo_loss(pol[0::2], pol[1::2], ref[0::2], ref[1::2], case["beta"],
                                  case["loss_type"], case["label_smoothing"])
    loss = losses.mean()
    loss.backward()
    metrics = [loss.item(), rc.mean().item(), rr.mean().item(), (rc > rr).double().mean().item(),
               (rc - rr).mean().item(), pol[0::2].mean().item(), pol[1::2].mean().item()]
    return metrics


def make_pairs(gen, P, T, V, prompt_len):
    """P pairs: a prompt (not counted) and two responses of random lengths,
    the longest past T+1 tokens (cut)."""
    pairs = []
    for p in range(P):
        prompt = torch.randint(0, V, (prompt_len + p % 2,), generator=gen).tolist()
        pair = {}
        for side in ("chosen", "rejected"):
            n = int(torch.randint(2, T + 4 - prompt_len, (1,), generator=gen))
            resp = torch.randint(0, V, (n,), generator=gen).tolist()
            pair[side] = prompt + resp
            pair[side + "_counted"] = [0] * len(prompt) + [1] * n
        pairs.append(pair)
    return pairs


def check(name, ours, ref):
    err = model_ref.rel_err(ours, ref)
    if not err < TOL:
        print(f"FAIL {name}: error {err:.3g}")
        return False
    return True


def run_case(driver, work, name, case, seed):
    gen = torch.Generator().manual_seed(seed)
    cfg = case["config"]
    mcfg = {**cfg, "lora_rank": case["lora_rank"], "lora_alpha": case["lora_alpha"],
            "lora_targets": case["lora_targets"]}
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    for sub in ("lora", "full"):  # a stale reference table would be read back
        path = os.path.join(d, sub, "tokenized")
        for f in os.listdir(path) if os.path.isdir(path) else []:
            os.remove(os.path.join(path, f))
    w_ref = model_ref.make_weights(mcfg, gen)
    lora = model_ref.make_lora(mcfg, gen)
    w_pol = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in w_ref.items()}
    T, V, pad = case["seq"], cfg["vocab_size"], cfg["vocab_size"] - 1
    pairs = make_pairs(gen, case["pairs"], T, V, 3)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump({**case, "pairs": pairs, "pad_id": pad}, f)
    model_ref.write_safetensors(os.path.join(d, "input.safetensors"),
                                {**w_ref, **lora, **{"policy/" + k: v for k, v in w_pol.items()}})
    subprocess.run([driver, d], check=True)
    out = model_ref.read_safetensors(os.path.join(d, "output.safetensors"))
    tokens, targets, weights = rows_of(pairs, T, pad)
    ok = True
    # LoRA: the base is the reference and stays frozen.
    w64 = {k: v.to(torch.float64) for k, v in w_ref.items()}
    l64 = {k: v.to(torch.float64).requires_grad_() for k, v in lora.items()}
    m = reference(mcfg, case, w64, w64, l64, tokens, targets, weights)
    ok &= check(f"{name} lora metrics {m}", out["lora/metrics"], torch.tensor(m))
    for k, v in l64.items():
        ok &= check(f"{name} lora grad {k}", out["lora/grad/" + k], v.grad)
    # Every weight: the reference is the base, the policy has moved.
    p64 = {k: v.to(torch.float64).requires_grad_() for k, v in w_pol.items()}
    m = reference(mcfg, case, w64, p64, None, tokens, targets, weights)
    ok &= check(f"{name} full metrics {m}", out["full/metrics"], torch.tensor(m))
    for k, v in p64.items():
        ok &= check(f"{name} full grad {k}", out["full/grad/" + k], v.grad)
    print(f"{'ok' if ok else 'FAIL'} {name}: loss {m[0]:.6f}, accuracy {m[3]:.2f}")
    return ok


def main():
    driver, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "vocab_size": 53, "tie_word_embeddings": False,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256}
    base = {"config": cfg, "seq": 12, "pairs": 3, "lora_rank": 4, "lora_alpha": 8.0,
            "lora_targets": 127, "beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0}
    cases = {
        "sigmoid": base,
        "sigmoid_smoothed": {**base, "label_smoothing": 0.2, "beta": 0.5},
        "ipo": {**base, "loss_type": "ipo", "beta": 0.3},
        # beta large enough that some pairs sit past the hinge and give no gradient
        "hinge": {**base, "loss_type": "hinge", "beta": 2.0, "pairs": 4},
        "sigmoid_tied": {**base, "config": {**cfg, "tie_word_embeddings": True,
                                            "num_key_value_heads": 1},
                         "lora_targets": 5, "pairs": 2, "seq": 9},
    }
    ok = True
    for i, (name, case) in enumerate(cases.items()):
        ok &= run_case(driver, work, name, case, 4200 + i)
    if not ok:
        sys.exit(1)
    print("dpo_ref: every case within", TOL)


if __name__ == "__main__":
    main()
