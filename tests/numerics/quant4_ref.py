#!/usr/bin/python3
"""quant4_ref.py - trainyard's 4-bit quantization (worker/ckpt/quant4.c, run
through quant4_driver) against a reference written here in numpy from
bitsandbytes' published algorithm, compared bit for bit.

usage: quant4_ref.py QUANT4_DRIVER WORKDIR

The reference follows bitsandbytes' CUDA kernels (csrc/kernels.cu) and
bitsandbytes/functional.py, in float32 numpy arithmetic:
  kQuantizeBlockwise[Small]  blocks of 64 loaded with 0.0 padding, absmax =
                             max |x|, x * (1 / absmax), packed high nibble first
  dQuantizeNF4, dQuantizeFP4 the decision trees, ported node by node
  kDequantizeBlockwise       code * absmax; dDequantizeFP4Tree's sign rule
  quantize_4bit(compress_statistics=True)
                             offset = absmax.mean(); quantize_blockwise(absmax -
                             offset, blocksize=256) with create_dynamic_map()
  dQuantize<0>               the binary search and midpoint rule, vectorized
  dequantize_4bit            dequantize_blockwise(qabsmax) then += offset
Two choices are shared with the C side on purpose and stated there too:
the offset is a left-to-right float64 sum divided by nb and rounded to
float32 (torch's float32 mean may differ in the last ulp), and linspace in
create_dynamic_map is torch >= 2.0's CPU kernel with fused multiply-adds
(each value rounded once). When torch imports, the map built here is also
set beside torch's own create_dynamic_map, for information.

Every case runs nf4 and fp4; sections compared: quant_map, nested_quant_map,
codes, absmax, dequantized, offset, qabsmax, absmax2, absmax recovered,
dequantized through the nested scales. Exit 1 on any mismatch."""
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np

F32 = np.float32
BLOCK, NESTED = 64, 256

# functional.py get_4bit_type("nf4") (== kernels.cu nf4_dequantization_lut).
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
# functional.py get_4bit_type("fp4") before normalization; `-0` is Python's int 0.
FP4 = [0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0]


def round_f32(v):
    """A Fraction rounded once to float32, to nearest, ties to even."""
    a = F32(float(v))
    cands = [a, np.nextafter(a, F32(np.inf)), np.nextafter(a, F32(-np.inf))]
    return min(cands, key=lambda t: (abs(Fraction(float(t)) - v),
                                     int(np.array(t, dtype=F32).view(np.uint32)) & 1))


def c(literal):
    """A CUDA float literal ("0.25" for 0.25f): the decimal rounded straight to
    float32, as a C compiler does. Not F32(float(...)): the double in between
    rounds four of dQuantizeNF4's cuts to a neighbouring float."""
    return round_f32(Fraction(literal))


# kernels.cu fp4_dequantization_lut (indexed by the 3 low bits).
FP4_LUT = np.array([c(v) for v in ("0.0", "0.005208333333", "0.66666667", "1.0", "0.33333333",
                                   "0.5", "0.16666667", "0.25")], F32)


def get_4bit_type(name):
    """torch.tensor(data) (float32), then data.div_(data.abs().max())."""
    data = np.array(NF4 if name == "nf4" else FP4, dtype=F32)
    return data / np.abs(data).max()


# dQuantizeNF4's and dQuantizeFP4's cut literals, in increasing order.
NF4_CUTS = ["-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906",
            "-0.33967943489551544", "-0.23460740596055984", "-0.13791173323988914",
            "-0.045525018125772476", "0.03979014977812767", "0.1202552504837513",
            "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
            "0.5016634166240692", "0.6427869200706482", "0.8614784181118011"]
FP4_CUTS = ["0.00260417", "0.0859375", "0.20833333", "0.29166667", "0.4166667", "0.583333",
            "0.8333333"]


def nf4_tree(x):
    """dQuantizeNF4, node by node (x float32 array). NaN compares false."""
    w = np.where
    return w(x > c("0.03979014977812767"),
             w(x > c("0.3893125355243683"),
               w(x > c("0.6427869200706482"),
                 w(x > c("0.8614784181118011"), 0b1111, 0b1110),
                 w(x > c("0.5016634166240692"), 0b1101, 0b1100)),
               w(x > c("0.2035212516784668"),
                 w(x > c("0.2920137718319893"), 0b1011, 0b1010),
                 w(x > c("0.1202552504837513"), 0b1001, 0b1000))),
             w(x > c("-0.33967943489551544"),
               w(x > c("-0.13791173323988914"),
                 w(x > c("-0.045525018125772476"), 0b0111, 0b0110),
                 w(x > c("-0.23460740596055984"), 0b0101, 0b0100)),
               w(x > c("-0.6106329262256622"),
                 w(x > c("-0.4599952697753906"), 0b0011, 0b0010),
                 w(x > c("-0.8480964004993439"), 0b0001, 0b0000)))).astype(np.uint8)


def fp4_tree(x):
    """dQuantizeFP4, node by node: sign from x < 0, then the tree on |x|."""
    w = np.where
    sign = w(x < F32(0), 0b1000, 0)
    a = np.abs(x)
    mag = w(a > c("0.29166667"),
            w(a > c("0.583333"),
              w(a > c("0.8333333"), 0b0011, 0b0010),
              w(a > c("0.4166667"), 0b101, 0b100)),
            w(a > c("0.0859375"),
              w(a > c("0.20833333"), 0b0111, 0b0110),
              w(a > c("0.00260417"), 0b0001, 0b0000)))
    return (sign + mag).astype(np.uint8)


def dequant_table(name):
    """What kDequantizeBlockwise multiplies by: dDequantizeNF4 / dDequantizeFP4Tree."""
    if name == "nf4":
        return np.array(NF4, dtype=F32)
    q = np.arange(16)
    sign = F32(1.0) - F32(2) * ((q & 8) >> 3).astype(F32)
    return FP4_LUT[q & 7] * sign


def blocks(x, size):
    """x[n] -> zero-padded [nb, size], as the kernels load a partial block."""
    nb = -(-len(x) // size)
    pad = np.zeros(nb * size, dtype=F32)
    pad[:len(x)] = x
    return pad.reshape(nb, size)


def scale_blocks(x, size):
    """absmax of each block and x * (1 / absmax), both float32 [nb, size]."""
    xb = blocks(x, size)
    absmax = np.abs(xb).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = F32(1.0) / absmax
        y = xb * inv[:, None]
    return absmax, y


def quantize_4bit(name, x):
    n = len(x)
    absmax, y = scale_blocks(x, BLOCK)
    with np.errstate(invalid="ignore"):
        q = (nf4_tree if name == "nf4" else fp4_tree)(y).reshape(-1)[:n + (n & 1)]
    codes = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    return codes, absmax


def unpack(codes, n):
    q = np.empty(2 * len(codes), dtype=np.uint8)
    q[0::2], q[1::2] = codes >> 4, codes & 15
    return q[:n]


def dequantize_4bit(name, codes, absmax, n):
    return dequant_table(name)[unpack(codes, n)] * np.repeat(absmax, BLOCK)[:n]


def fma32(a, b, c0):
    return round_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c0)))


def linspace32(start, end, steps):
    """torch.linspace(start, end, steps, dtype=float32) as torch >= 2.0's CPU
    kernel computes it (two halves), each value one fused multiply-add."""
    start, end = F32(start), F32(end)
    step = (end - start) / F32(steps - 1)
    half = steps // 2
    return np.array([fma32(step, F32(i), start) if i < half else
                     fma32(-step, F32(steps - 1 - i), end) for i in range(steps)], dtype=F32)


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """functional.py create_dynamic_map with float32 tensors: a Python scale
    times a float32 tensor is a float32 product with the scale in float32."""
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    assert additional_items == 0
    for i in range(max_exponent_bits):
        items = 2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed else \
            2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1
        b = linspace32(0.1, 1, items)
        means = (b[:-1] + b[1:]) / F32(2.0)
        scale = F32(10 ** (-(max_exponent_bits - 1) + i))
        data += list(scale * means)
        if signed:
            data += list(-scale * means)
    data += [F32(0), F32(1.0)]
    assert len(data) == 2 ** total_bits
    return np.sort(np.array(data, dtype=F32))


def dquantize(code, x):
    """dQuantize<0> over an array: 7 halvings from pivot 127, then the nearer
    of pivot and the last neighbour seen, by their float midpoint."""
    pivot = np.full(x.shape, 127)
    upper_p, lower_p = np.full(x.shape, 255), np.zeros(x.shape, dtype=int)
    lower, upper = np.full(x.shape, F32(-1.0)), np.full(x.shape, F32(1.0))
    val = code[pivot]
    i = 64
    while i > 0:
        right = x > val
        lower_p, lower = np.where(right, pivot, lower_p), np.where(right, val, lower)
        upper_p, upper = np.where(right, upper_p, pivot), np.where(right, upper, val)
        pivot = np.where(right, pivot + i, pivot - i)
        val = code[pivot]
        i >>= 1
    upper = np.where(upper_p == 255, code[255], upper)
    lower = np.where(lower_p == 0, code[0], lower)
    right = x > val
    to_upper = x > (upper + val) * F32(0.5)
    to_lower = x < (lower + val) * F32(0.5)
    q = np.where(right, np.where(to_upper, upper_p, pivot), np.where(to_lower, lower_p, pivot))
    return q.astype(np.uint8)


def mean_offset(absmax):
    """Left-to-right float64 sum (cumsum is sequential), / nb, rounded to float32."""
    return F32(np.cumsum(absmax.astype(np.float64))[-1] / len(absmax))


def nest(dyn, absmax, offset, back_map=None):
    """back_map: the map the scales are recovered with (a file's own)."""
    nb = len(absmax)
    v = absmax - offset
    absmax2, y = scale_blocks(v, NESTED)
    with np.errstate(invalid="ignore"):
        q = dquantize(dyn, y).reshape(-1)[:nb]
    back = (dyn if back_map is None else back_map)[q] * np.repeat(absmax2, NESTED)[:nb] + offset
    return q, absmax2, back


def reference(name, x, dyn):
    n = len(x)
    codes, absmax = quantize_4bit(name, x)
    deq = dequantize_4bit(name, codes, absmax, n)
    offset = mean_offset(absmax)
    q, absmax2, back = nest(dyn, absmax, offset)
    return [("quant_map", get_4bit_type(name)), ("nested_quant_map", dyn), ("codes", codes),
            ("absmax", absmax), ("dequantized", deq), ("offset", np.array([offset], F32)),
            ("qabsmax", q), ("absmax2", absmax2), ("absmax_back", back),
            ("dequantized_nested", dequantize_4bit(name, codes, back, n))]


def dequantized(x, name, double):
    """x (float32) through 4 bits and back: quantize_4bit (compress_statistics
    = double) then dequantize_4bit, as the weights a 4-bit base computes with."""
    x = np.asarray(x, dtype=F32).reshape(-1)
    codes, absmax = quantize_4bit(name, x)
    if double:
        absmax = nest(create_dynamic_map(), absmax, mean_offset(absmax))[2]
    return dequantize_4bit(name, codes, absmax, len(x))


def split(raw, layout):
    out, at = [], 0
    for name, like in layout:
        size = like.nbytes
        out.append((name, np.frombuffer(raw[at:at + size], dtype=like.dtype)))
        at += size
    if at != len(raw):
        raise ValueError(f"driver output is {len(raw)} bytes, expected {at}")
    return out


def compare(case, ref, got):
    """Bitwise; returns the number of differing sections (reports the first index)."""
    bad = 0
    for (name, r), (_, g) in zip(ref, got):
        rb = r.view(np.uint8 if r.dtype == np.uint8 else np.uint32)
        gb = g.view(rb.dtype)
        if len(rb) == len(gb) and np.array_equal(rb, gb):
            continue
        idx = np.flatnonzero(rb != gb)[0] if len(rb) == len(gb) else min(len(rb), len(gb))
        print(f"MISMATCH {case}: {name}[{idx}] reference {r[idx] if idx < len(r) else None!r} "
              f"got {g[idx] if idx < len(g) else None!r} ({len(rb)} vs {len(gb)} values)")
        bad += 1
    return bad


def bf16(x):
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(F32)


def tie_tensor():
    """Values on every NF4 and FP4 cut, one ulp either side, the code values
    themselves and their negatives, in blocks whose absmax is 1 (inv exact),
    then the same scaled by 4 (absmax 4, inv 0.25: products still exact)."""
    cuts = [c(t) for t in NF4_CUTS + FP4_CUTS]
    vals = []
    for t in cuts + [-t for t in cuts]:
        vals += [t, np.nextafter(t, F32(2)), np.nextafter(t, F32(-2))]
    # The float32 midpoints of the NF4 values, where four differ from the cuts.
    nf4 = get_4bit_type("nf4")
    vals += list((nf4[1:] + nf4[:-1]) / F32(2))
    vals += list(get_4bit_type("nf4")) + list(get_4bit_type("fp4")) + [F32(-0.0), F32(0.0)]
    vals = np.array(vals, dtype=F32)
    per = BLOCK - 1
    out = []
    for scale in (F32(1), F32(4)):
        for k in range(0, len(vals), per):
            chunk = vals[k:k + per] * scale
            out.append(np.concatenate([[scale], chunk, np.zeros(per - len(chunk), F32)]))
    return np.concatenate(out).astype(F32)


def cases(rng):
    """(name, x, cuts, nested cuts): cuts in blocks, nested cuts in scales."""
    normal = lambda n, s=1.0: (rng.standard_normal(n) * s).astype(F32)
    mixed = normal(64 * 6 + 9)
    mixed[64:128] = 0
    mixed[384:] = 0
    heavy = (rng.standard_t(2, 64 * 40) * 0.05).astype(F32)
    heavy[::97] = F32(1e-30)
    heavy[5::101] = F32(-0.0)
    heavy[7::89] *= F32(1e6)
    return [
        ("normal-4096", normal(4096), "-", "-"),
        ("normal-1000", normal(1000), "-", "-"),
        ("normal-49189-pieces", normal(64 * 256 * 3 + 37), "256,700", "256,512,768"),
        ("normal-777", normal(777), "-", "-"),
        ("weights-2048x512-pieces", normal(2048 * 512, 0.02), "5120,10240", "5120,10240"),
        ("weights-1024x1536-bf16-pieces", bf16(normal(1024 * 1536, 0.02)), "3001,17000", "2816"),
        ("zero-blocks-393", mixed, "-", "-"),
        ("all-zero-101", np.zeros(101, F32), "-", "-"),
        ("ties", tie_tensor(), "-", "-"),
        ("bf16-6401", bf16(normal(64 * 100 + 1, 3.0)), "-", "-"),
        ("heavy-tails", heavy, "7,8", "-"),
    ]


def nest_cases(dyn, rng):
    """Scales fed straight to the nested quantization, offset 0: every
    midpoint of the dynamic map as the kernel computes it, an ulp either side,
    each run of 256 led by 1.0 (absmax2 1); a run of equal scales (absmax2 0:
    NaN, code 0); and random scales with their mean as offset."""
    mids = []
    for j in range(255):
        m = (dyn[j] + dyn[j + 1]) * F32(0.5)
        mids += [m, np.nextafter(m, F32(2)), np.nextafter(m, F32(-2))]
    mids += list(dyn)
    runs = []
    for k in range(0, len(mids), NESTED - 1):
        chunk = np.array(mids[k:k + NESTED - 1], F32)
        runs.append(np.concatenate([[F32(1.0)], chunk, np.zeros(NESTED - 1 - len(chunk), F32)]))
    ties = np.concatenate(runs + [np.full(NESTED, F32(0.0))]).astype(F32)
    rand = np.abs(rng.standard_normal(1000)).astype(F32)
    # A map from another torch: every third entry one ulp up (q4_unnest_with).
    other = dyn.copy()
    other[1:255:3] = np.nextafter(other[1:255:3], F32(2))
    return [("nest-midpoints", ties, F32(0.0), None),
            ("nest-random", rand, mean_offset(rand), None),
            ("nest-file-map", rand, mean_offset(rand), other)]


def self_check(dyn):
    """The reference against bitsandbytes' own statements, before any C."""
    fp4 = get_4bit_type("fp4")
    assert np.array_equal(np.abs(fp4[:8]), FP4_LUT), "fp4 quant_map vs fp4_dequantization_lut"
    assert not np.signbit(fp4[8]) and np.signbit(dequant_table("fp4")[8])
    # The tree, ported node by node, is the search over its sorted cuts.
    nf4 = get_4bit_type("nf4")
    cuts = np.array([c(t) for t in NF4_CUTS], F32)
    y = np.concatenate([np.linspace(-1.2, 1.2, 20001, dtype=F32), cuts,
                        np.nextafter(cuts, F32(2)), (nf4[1:] + nf4[:-1]) / F32(2)])
    assert np.array_equal(nf4_tree(y), (y[:, None] > cuts[None, :]).sum(axis=1))
    fcuts = np.array([c(t) for t in FP4_CUTS], F32)
    rank = (np.abs(y)[:, None] > fcuts[None, :]).sum(axis=1)
    fp4_code_of_rank = np.array([0, 1, 6, 7, 4, 5, 2, 3])
    assert np.array_equal(fp4_tree(y), np.where(y < 0, 8, 0) + fp4_code_of_rank[rank])
    # The cuts are decimal midpoints of the NF4 values; as float literals four
    # of them sit one ulp off the float32 midpoint of the float32 values.
    off = [i for i in range(15) if cuts[i] != (nf4[i] + nf4[i + 1]) / F32(2)]
    print(f"quant4: dQuantizeNF4 cuts one ulp off the float32 midpoints: {off}")
    assert np.all(np.diff(dyn) > 0) and dyn[255] == 1 and dyn[127] == 0
    try:
        import torch  # optional: absent, or still installing
    except Exception:
        print("quant4: torch not importable; nested_quant_map not set beside torch's")
        return
    data = []
    for i in range(7):
        b = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32)
        means = (b[:-1] + b[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist() + (-(10 ** (-6 + i)) * means).tolist()
    theirs = np.array(sorted(data + [0, 1.0]), dtype=F32)
    ulps = np.abs(theirs.view(np.int32).astype(np.int64) - dyn.view(np.int32))
    why = " (torch < 2.0's vectorized linspace rounds some boundaries apart)" \
        if ulps.max() and int(torch.__version__.split(".")[0]) < 2 else ""
    print(f"quant4: nested_quant_map vs torch {torch.__version__}'s create_dynamic_map here: "
          f"{int((ulps > 0).sum())} of 256 entries differ, at most {int(ulps.max())} ulp{why}")
    assert ulps.max() <= 4, "dynamic map construction is off by more than rounding"


def main():
    driver, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(20240607)
    dyn = create_dynamic_map()
    self_check(dyn)
    ncases = mismatches = 0
    inp, outp = os.path.join(work, "quant4.in"), os.path.join(work, "quant4.out")
    for name, x, cuts, ncuts in cases(rng):
        for qt in ("nf4", "fp4"):
            case = f"{name}/{qt}"
            x.astype(F32).tofile(inp)
            subprocess.run([driver, "quant", qt, inp, outp, cuts, ncuts], check=True)
            ref = reference(qt, x, dyn)
            got = split(open(outp, "rb").read(), ref)
            ncases += 1
            mismatches += compare(case, ref, got)
    mapp = os.path.join(work, "quant4.map")
    for name, absmax, offset, back_map in nest_cases(dyn, rng):
        absmax.tofile(inp)
        extra = []
        if back_map is not None:
            back_map.tofile(mapp)
            extra = [mapp]
        subprocess.run([driver, "nest", inp, outp, float(offset).hex()] + extra, check=True)
        q, absmax2, back = nest(dyn, absmax, offset, back_map)
        ref = [("qabsmax", q), ("absmax2", absmax2), ("absmax_back", back)]
        got = split(open(outp, "rb").read(), ref)
        ncases += 1
        mismatches += compare(name, ref, got)
    print(f"quant4: {ncases} cases, {mismatches} mismatches")
    return 1 if mismatches else 0


def dequantized_checkpoint(src, out, qtype, double, compute):
    """A float32 copy of the checkpoint in src (config.json + one float32
    model.safetensors) into out, its seven projections of each layer
    through 4 bits and back (dequantized), rounded to compute as the
    products over a 4-bit base see them: the weights a QLoRA job trains
    over, for the tests to compare with plain LoRA and generate over."""
    import json
    import shutil
    import struct
    raw = open(os.path.join(src, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    lin = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    blobs, hdr, off = [], {}, 0
    for name, v in header.items():
        if name == "__metadata__":
            continue
        assert v["dtype"] == "F32", v
        a, b = v["data_offsets"]
        w = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=F32)
        if any(f".{p}.weight" in name for p in lin):
            w = dequantized(w, qtype, double)
            if compute == "bfloat16":  # round to nearest even, as torch's .to(bfloat16)
                u = w.view(np.uint32).astype(np.uint64)
                u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
                w = u.astype(np.uint32).view(F32)
        data = np.ascontiguousarray(w, dtype=F32).tobytes()
        hdr[name] = {"dtype": "F32", "shape": v["shape"], "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    os.makedirs(out)
    shutil.copy(os.path.join(src, "config.json"), out)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--dequantized-checkpoint":
        # quant4_ref.py --dequantized-checkpoint SRC OUT nf4|fp4 true|false COMPUTE
        dequantized_checkpoint(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "true",
                               sys.argv[6])
        sys.exit(0)
    sys.exit(main())
