#!/usr/bin/env python3
"""bench_verdict.py BENCH_JSONL CONFIG_JSON OUTDIR - the GPU bench's verdict:
our figures against PyTorch's from the same run (tests/gpu/bench.sh's rows,
tagged {"bench": KIND, "run": LABEL}), each against its target, as a table
`figure | ours | pytorch | ratio | target | result` on stdout and in
OUTDIR/verdict.txt, and as {"bench": "verdict", ...} rows appended to
BENCH_JSONL. The last line of verdict.txt counts the targets:
`targets: M of K met, X missed, N no reference, F failed`.

A result is `met` or `missed`; `no reference` where the target is a ratio
to PyTorch and PyTorch's row is missing or skipped (python3 without torch,
transformers or peft); `failed` where our own row is missing or failed;
`info` for a figure without a target. A missed target is a finding, not a
failure of the bench: the exit status is 0 unless the input is unreadable.

Model FLOPs per token, the one count both sides' MFU use (the conventional
one of the scaling-law literature, with a causal mask's attention):

    6 * N + 6 * L * T * QD

N = the parameters of every matrix product (the L layers' q, k, v, o, gate,
up and down projections and the LM head's V x C, once, tied or not; the
embedding is a gather), QD = heads x head_dim; the attention term is QK^T
and AV over half of the T x T scores, forward (2 products) and backward
(4), 2 FLOPs per multiply-add. MFU = tokens/s x that / the device's dense
bf16 peak (TY_PEAK_TFLOPS TFLOP/s, by default the H200's 989). LoRA does
less work than 6 N (no weight gradient of the frozen base; bench_lora's own
`mfu` counts 4 N), so this MFU is a rate, not a utilisation, for LoRA: the
target is stated in it."""
import json
import os
import sys

# (figure, unit, ours (kind, run, key), pytorch (run, key), target); our
# load rows are the memory-efficient path's at world size 1 ("w1").
# target: None (information), ("ratio", op, x): ours / pytorch op x;
# ("ours", op, x): ours op x alone; ("shard",): ours <= our shard's bytes.
FIGURES = [
    ("load seconds (memory-efficient, bf16, 1 rank)", "s",
     ("load", "w1", "load_seconds"), ("lora", "load_seconds"), ("ratio", "<=", 1.0)),
    ("load device peak (allocator)", "bytes",
     ("load", "w1", "device_peak_bytes"), ("lora", "load_device_peak_bytes"),
     ("shard",)),
    ("LoRA tokens/s", "tok/s", ("lora", "whole", "tokens_per_s"), ("lora", "tokens_per_s"),
     ("ratio", ">=", 2.0)),
    ("LoRA MFU (6N + attention)", "mfu", ("lora", "whole", "tokens_per_s"),
     ("lora", "tokens_per_s"), ("ours", ">=", 0.40)),
    ("LoRA device memory (cudaMemGetInfo, process)", "bytes",
     ("lora", "whole", "device_used_bytes"), ("lora", "device_used_bytes"), ("ratio", "<=", 0.6)),
    ("LoRA allocator peak", "bytes", ("lora", "whole", "allocator_peak_bytes"),
     ("lora", "allocator_peak_bytes"), None),
    ("full training tokens/s (fp32)", "tok/s", ("full", "whole", "tokens_per_s"),
     ("full", "tokens_per_s"), ("ratio", ">=", 1.0)),
    ("full training MFU (6N + attention)", "mfu", ("full", "whole", "tokens_per_s"),
     ("full", "tokens_per_s"), None),
    ("full training device memory (cudaMemGetInfo, process)", "bytes",
     ("full", "whole", "device_used_bytes"), ("full", "device_used_bytes"), None),
]


def flops_per_token(cfg, T):
    """6 N + 6 L T QD, as the docstring states."""
    C, L, FF, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                    "vocab_size"))
    NH = cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    HS = cfg.get("head_dim") or C // NH
    QD, KVD = NH * HS, NKV * HS
    n_mm = L * (C * (QD + 2 * KVD) + QD * C + 3 * C * FF) + V * C
    return 6.0 * n_mm + 6.0 * L * T * QD, n_mm


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "bytes":
        return f"{v / 2**30:,.2f} GiB" if v >= 2**30 else f"{v / 2**20:,.2f} MiB"
    if unit == "mfu":
        return f"{100 * v:.1f}%" if v >= 1e-3 else f"{100 * v:.2g}%"
    if unit == "s":
        return f"{v:.2f} s" if v >= 0.1 else f"{v:.3f} s"
    return f"{v:,.0f}"


def target_text(t, ours_row):
    if t is None:
        return "-"
    if t[0] == "ratio":
        return f"{t[1]} {t[2]:.2f}x"
    if t[0] == "ours":
        return f"{t[1]} {100 * t[2]:.0f}%"
    return f"= shard ({fmt(ours_row.get('shard_bytes'), 'bytes')})" if ours_row else "= shard"


def main():
    jl, cfg_path, out = sys.argv[1:4]
    rows = [json.loads(l) for l in open(jl) if l.strip().startswith("{")]
    cfg = json.load(open(cfg_path))
    peak = float(os.environ.get("TY_PEAK_TFLOPS") or 989.0)
    pick = lambda kind, run: next((r for r in rows if r.get("bench") == kind and
                                   r.get("run") == run and
                                   r.get("path", "memory_efficient") == "memory_efficient"), None)
    verdict, counts = [], {"met": 0, "missed": 0, "no reference": 0, "failed": 0}
    for fig, unit, (kind, run, key), (trun, tkey), target in FIGURES:
        o, p = pick(kind, run), pick("torch", trun)
        o_ok = o is not None and o.get("status") == "ok"
        p_ok = p is not None and p.get("status") == "ok"
        ov = o.get(key) if o_ok else None
        pv = p.get(tkey) if p_ok else None
        if unit == "mfu":  # the same count for both sides, at our row's T
            T = (o or {}).get("T") or (p or {}).get("T")
            fpt = flops_per_token(cfg, T)[0] if T else None
            ov = ov * fpt / (peak * 1e12) if ov is not None and fpt else None
            pv = pv * fpt / (peak * 1e12) if pv is not None and fpt else None
        ratio = ov / pv if ov is not None and pv else None
        if target is None:
            res = "info"
        elif ov is None:
            res = "failed"
        elif target[0] == "ratio" and ratio is None:
            res = "no reference"
        else:
            x = {"ratio": ratio, "ours": ov}.get(target[0])
            if target[0] == "shard":
                good = ov <= o["shard_bytes"]
            else:
                good = x >= target[2] if target[1] == ">=" else x <= target[2]
            res = "met" if good else "missed"
        if res in counts:
            counts[res] += 1
        why = None if p_ok else (p or {}).get("message", "no PyTorch row")
        verdict.append({"bench": "verdict", "figure": fig, "unit": unit, "ours": ov,
                        "pytorch": pv, "ratio": round(ratio, 4) if ratio is not None else None,
                        "target": target_text(target, o if o_ok else None), "result": res,
                        **({"pytorch_missing": why} if why else {})})
    n_targets = sum(counts.values())
    w = max(len(v["figure"]) for v in verdict)
    lines = [f"{'figure':<{w}} | {'ours':>12} | {'pytorch':>12} | {'ratio':>6} | "
             f"{'target':<20} | result", "-" * (w + 80)]
    for v in verdict:
        pt = fmt(v["pytorch"], v["unit"]) if v["pytorch"] is not None else (
            "skipped" if "pytorch_missing" in v else "-")
        rt = f"{v['ratio']:.2f}x" if v["ratio"] is not None else "-"
        lines.append(f"{v['figure']:<{w}} | {fmt(v['ours'], v['unit']):>12} | {pt:>12} | "
                     f"{rt:>6} | {v['target']:<20} | {v['result']}")
    fpt, n_mm = flops_per_token(cfg, next((r.get("T") for r in rows if r.get("T")), 0))
    lines.append("")
    lines.append(f"MFU: tokens/s x (6 N + 6 L T QD) / {peak:g} TFLOP/s (dense bf16 peak; "
                 f"TY_PEAK_TFLOPS), N = {n_mm:,} matrix-product parameters, "
                 f"{fpt / 1e9:.3f} GFLOP a token")
    missing = sorted({v["pytorch_missing"] for v in verdict if "pytorch_missing" in v})
    for m in missing:
        lines.append(f"PyTorch: {m}")
    lines.append(f"targets: {counts['met']} of {n_targets} met, {counts['missed']} missed, "
                 f"{counts['no reference']} no reference, {counts['failed']} failed")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    with open(os.path.join(out, "verdict.txt"), "w") as f:
        f.write(text)
    with open(jl, "a") as f:
        for v in verdict:
            f.write(json.dumps(v) + "\n")


if __name__ == "__main__":
    main()
