#!/usr/bin/python3
"""optim_ref.py - trainyard's AdamW, warmup + cosine schedule and global-norm
clipping against torch.optim.AdamW, a LambdaLR of the same shape and
torch.nn.utils.clip_grad_norm_, over random parameters and gradients.

usage: optim_ref.py OPTIM_DRIVER WORKDIR
Tolerance: parameters within 1e-5 relative (plus 1e-7 absolute) after 30
steps; fp32 rounding in the two implementations differs only in operation
order, so the gap stays at a few ulps per step."""
import math
import os
import subprocess
import sys

import numpy as np
import torch


def torch_run(p0, grads, lr, wd, warmup, clip, scale):
    steps = len(grads)
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = torch.optim.AdamW([p], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)

    def factor(s):
        if s < warmup:
            return (s + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    lrs, norms = [], []
    for g in grads:
        p.grad = torch.from_numpy(g.copy()) * scale
        lrs.append(opt.param_groups[0]["lr"])
        norm = torch.nn.utils.clip_grad_norm_([p], clip) if clip > 0 else p.grad.norm()
        norms.append(float(norm))
        opt.step()
        sched.step()
    return p.detach().numpy(), np.array(lrs), np.array(norms)


def main():
    driver, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(7)
    n, steps = 1000, 30
    fails = 0
    for lr, wd, warmup, clip, scale in [(1e-2, 0.0, 0, 0.0, 1.0), (3e-3, 0.1, 5, 1.0, 0.25),
                                        (5e-2, 0.01, 10, 0.5, 2.0)]:
        p0 = rng.standard_normal(n).astype(np.float32)
        grads = [(rng.standard_normal(n) * (0.1 + s % 3)).astype(np.float32) for s in range(steps)]
        inp, out = os.path.join(work, "optim.in"), os.path.join(work, "optim.out")
        with open(inp, "wb") as f:
            f.write(p0.tobytes())
            for g in grads:
                f.write(g.tobytes())
        subprocess.run([driver, inp, out, str(n), str(steps), repr(lr), repr(wd), str(warmup),
                        repr(clip), repr(scale)], check=True)
        raw = open(out, "rb").read()
        per = np.frombuffer(raw[:16 * steps], dtype=np.float64).reshape(steps, 2)
        ours = np.frombuffer(raw[16 * steps:], dtype=np.float32)
        ref, lrs, norms = torch_run(p0, grads, lr, wd, warmup, clip, scale)
        err = np.max(np.abs(ours - ref) / (np.abs(ref) + 1e-7 / 1e-5))
        lr_err = np.max(np.abs(per[:, 0] - lrs))
        norm_err = np.max(np.abs(per[:, 1] - norms) / norms)
        ok = err <= 1e-5 and lr_err <= 1e-12 and norm_err <= 1e-5
        print(f"lr={lr} wd={wd} warmup={warmup} clip={clip} scale={scale}: "
              f"param rel err {err:.2e}, lr err {lr_err:.1e}, norm rel err {norm_err:.1e} "
              f"{'ok' if ok else 'FAIL'}")
        fails += not ok
    sys.exit(1 if fails else 0)


main()
