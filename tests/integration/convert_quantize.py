"""convert_quantize.py - the checks of convert_quantize.sh, with no trainyard
code: safetensors read (and rewritten, for the damaged copies) with json and
numpy; bitsandbytes' layout and formulas written out from its source
(functional.py: QuantState.as_dict(packed=True), get_4bit_type,
create_dynamic_map, dequantize_4bit; transformers' BitsAndBytesConfig.to_dict).

  check SRC OUT TYPE NESTED DTYPE   the 4-bit checkpoint OUT made from SRC
  dequant Q4 F32                    F32 (convert --dequantize --dtype f32 of
                                    Q4) holds bitsandbytes' dequantization
  damage KIND Q4 OUT                a copy of Q4 with one thing wrong
  strip_config Q4 OUT               a copy of Q4 without quantization_config
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
# get_4bit_type writes entry 8 as the int -0, which is 0: the map's is +0.0.
FP4 = [0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0,
       -3.0]
NP = {"F32": np.float32, "F16": np.float16, "U8": np.uint8, "BF16": np.uint16}
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1}


def code4(t):
    c = np.array(NF4 if t == "nf4" else FP4, dtype=np.float32)
    return (c / np.abs(c).max()).astype(np.float32)


def dynamic_map():
    """create_dynamic_map(signed=True), in torch when it is here, else None."""
    try:
        import torch
    except ImportError:
        return None
    data = []
    for i in range(7):
        b = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32)
        means = (b[:-1] + b[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0, 1.0]
    data.sort()
    return np.array(data, dtype=np.float32)


def read_file(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], b[8 + n + s:8 + n + e])
    return out, meta


def read_ckpt(d):
    """name -> (dtype, shape, bytes), and name -> file."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) \
        else ["model.safetensors"]
    t, where = {}, {}
    for f in files:
        got, meta = read_file(os.path.join(d, f))
        assert meta == {"format": "pt"}, meta
        for k, v in got.items():
            assert k not in t, k
            t[k], where[k] = v, f
    if os.path.exists(idx):
        assert json.load(open(idx))["weight_map"] == where
    return t, where


def write_file(path, tensors):
    hdr, off, data = {"__metadata__": {"format": "pt"}}, 0, b""
    for k, (dt, shape, raw) in tensors.items():
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


def floats(dt, raw):
    a = np.frombuffer(raw, dtype=NP[dt])
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def to_dtype(x, dt):
    """float32 -> dt -> float32, round to nearest even (as the weight
    bitsandbytes quantizes would have been stored)."""
    if dt == "F32":
        return x
    if dt == "F16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def encode(x, dt):
    """float32 values (already representable in dt) as dt's bytes."""
    if dt == "BF16":
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return x.astype(NP[dt]).tobytes()


def quant_state_expected(t, dtype, shape, offset=None):
    d = {"quant_type": t, "blocksize": 64, "dtype": dtype, "shape": list(shape)}
    if offset is not None:
        d.update({"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": offset})
    return json.dumps(d).encode()


def dequant(t, q4, w, nested):
    """(values, block maxima as stored) by bitsandbytes' formula."""
    dt, shape, codes = q4[w]
    n = int(np.prod(json.loads(bytes(q4[w + ".quant_state.bitsandbytes__" + t][2]))["shape"]))
    c = np.frombuffer(codes, dtype=np.uint8)
    q = np.empty(2 * c.size, dtype=np.int64)
    q[0::2], q[1::2] = c >> 4, c & 15
    qmap = floats("F32", q4[w + ".quant_map"][2])
    if nested:
        st = json.loads(bytes(q4[w + ".quant_state.bitsandbytes__" + t][2]))
        qa = np.frombuffer(q4[w + ".absmax"][2], dtype=np.uint8).astype(np.int64)
        a2 = floats("F32", q4[w + ".nested_absmax"][2])
        dyn = floats("F32", q4[w + ".nested_quant_map"][2])
        absmax = (dyn[qa] * a2[np.arange(qa.size) // 256]).astype(np.float32)
        absmax = (absmax + np.float32(st["nested_offset"])).astype(np.float32)
    else:
        absmax = floats("F32", q4[w + ".absmax"][2])
    vals = (qmap[q[:n]] * absmax[np.arange(n) // 64]).astype(np.float32)
    return vals, absmax


def check(src, out, t, nested, dtype):
    nested = nested == "1"
    st_dt = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]
    s, _ = read_ckpt(src)
    q4, where = read_ckpt(out)
    cfg_s, cfg_o = json.load(open(f"{src}/config.json")), json.load(open(f"{out}/config.json"))
    qc = cfg_o.pop("quantization_config")
    want_qc = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": dtype,
               "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": t,
               "bnb_4bit_use_double_quant": nested, "llm_int8_enable_fp32_cpu_offload": False,
               "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
               "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
               "quant_method": "bitsandbytes"}
    assert qc == want_qc, qc
    assert list(qc) == sorted(qc), list(qc)  # sorted, as transformers writes config.json
    cfg_s["torch_dtype"] = dtype
    assert cfg_o == cfg_s, (cfg_o, cfg_s)
    L = cfg_s["num_hidden_layers"]
    weights = [f"model.layers.{i}.{p}.weight" for i in range(L) for p in PROJ]
    comps = [".absmax", ".quant_map", ".quant_state.bitsandbytes__" + t]
    if nested:
        comps += [".nested_absmax", ".nested_quant_map"]
    want = set(s) | {w + c for w in weights for c in comps}
    assert set(q4) == want, (sorted(set(q4) ^ want))
    dyn = dynamic_map()
    gap4 = np.diff(np.sort(code4(t))).max()
    worst = 0.0
    for name, (dt, shape, raw) in s.items():
        if name not in weights:  # as it was (converted to dtype), bit for bit
            assert q4[name][:2] == (st_dt, shape), (name, q4[name][:2])
            assert q4[name][2] == encode(to_dtype(floats(dt, raw), st_dt), st_dt), name
            assert dt != st_dt or q4[name][2] == raw, name
            continue
        n = shape[0] * shape[1]
        nb, nn = -(-n // 64), -(-(-(-n // 64)) // 256)
        assert all(where[name + c] == where[name] for c in comps), name  # one file a weight
        assert q4[name][:2] == ("U8", [(n + 1) // 2, 1]), (name, q4[name][:2])
        assert q4[name + ".absmax"][:2] == ("U8" if nested else "F32", [nb]), name
        assert q4[name + ".quant_map"][:2] == ("F32", [16]), name
        assert floats("F32", q4[name + ".quant_map"][2]).tobytes() == code4(t).tobytes(), name
        qs = q4[name + comps[2]]
        assert qs[0] == "U8" and qs[1] == [len(qs[2])], (name, qs[:2])
        state = json.loads(bytes(qs[2]))
        w = to_dtype(floats(dt, raw), st_dt)
        pad = np.zeros(nb * 64, dtype=np.float32)
        pad[:n] = np.abs(w)
        true_max = pad.reshape(nb, 64).max(axis=1)  # the block maxima bitsandbytes computes
        offset = None
        if nested:
            assert q4[name + ".nested_absmax"][:2] == ("F32", [nn]), name
            assert q4[name + ".nested_quant_map"][:2] == ("F32", [256]), name
            nqm = floats("F32", q4[name + ".nested_quant_map"][2])
            # torch's linspace rounds a few entries an ulp apart across versions
            assert dyn is None or np.abs(nqm - dyn).max() <= 1e-6, name
            offset = state["nested_offset"]
            assert isinstance(offset, float) and offset == float(np.float32(offset)), offset
            assert abs(offset - true_max.astype(np.float64).mean()) <= 1e-6 * offset, name
        # The JSON bytes, exactly: json.dumps of the keys in as_dict's order.
        assert bytes(qs[2]) == quant_state_expected(t, dtype, shape, offset), bytes(qs[2])
        vals, absmax = dequant(t, q4, name, nested)
        if not nested:
            assert np.array_equal(absmax, true_max), name
        # 4-bit error: half the widest gap of the code, of the block's maximum,
        # plus what the nested quantization moved that maximum by.
        blk = np.arange(n) // 64
        bound = true_max[blk] * gap4 / 2 + np.abs(absmax - true_max)[blk] + 1e-7
        err = np.abs(w - vals)
        assert (err <= bound).all(), (name, float((err - bound).max()))
        if nested:
            assert (np.abs(absmax - true_max) <= 0.02 * true_max.max()).all(), name
        worst = max(worst, float((err / np.maximum(true_max[blk], 1e-30)).max()))
    print(f"{out}: {len(weights)} weights {t}{' nested' if nested else ''} {dtype}, "
          f"{len(q4)} tensors in {len(set(where.values()))} file(s), worst error "
          f"{worst:.4f} of the block maximum (bound {gap4 / 2:.4f})")


def dequant_check(q4dir, f32dir):
    q4, _ = read_ckpt(q4dir)
    f, _ = read_ckpt(f32dir)
    cfg = json.load(open(f"{q4dir}/config.json"))
    qc = cfg.pop("quantization_config")
    cfg["torch_dtype"] = "float32"
    assert json.load(open(f"{f32dir}/config.json")) == cfg
    t, nested = qc["bnb_4bit_quant_type"], qc["bnb_4bit_use_double_quant"]
    plain = {k for k in q4 if not any(k.endswith(c) for c in (
        ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", "__nf4", "__fp4"))}
    assert set(f) == plain, sorted(set(f) ^ plain)
    nq = 0
    for k, (dt, shape, raw) in f.items():
        assert dt == "F32", k
        if q4[k][0] != "U8":
            assert np.array_equal(floats("F32", raw), floats(*q4[k][::2])), k
            continue
        vals, _ = dequant(t, q4, k, nested)
        assert shape == json.loads(bytes(q4[k + ".quant_state.bitsandbytes__" + t][2]))["shape"]
        # bit for bit, but for the sign of a zero (the CUDA kernel's FP4 code 8
        # is -0.0, the map's +0.0)
        assert np.array_equal(floats("F32", raw), vals), k
        nq += 1
    print(f"{f32dir}: {nq} weights dequantized as bitsandbytes does")


def damage(kind, q4dir, out):
    shutil.copytree(q4dir, out)
    path = f"{out}/model.safetensors"
    t, _ = read_file(path)
    w = "model.layers.1.mlp.up_proj.weight"
    qs = [k for k in t if k.startswith(w + ".quant_state.")][0]
    if kind == "no_absmax":
        del t[w + ".absmax"]
    elif kind == "short_codes":
        dt, shape, raw = t[w]
        t[w] = (dt, [shape[0] - 1, 1], raw[:-1])
    elif kind == "bad_key":
        d = json.loads(bytes(t[qs][2]))
        d["bogus"] = 1
        raw = json.dumps(d).encode()
        t[qs] = ("U8", [len(raw)], raw)
    elif kind == "blocksize":
        d = json.loads(bytes(t[qs][2]))
        d["blocksize"] = 128
        raw = json.dumps(d).encode()
        t[qs] = ("U8", [len(raw)], raw)
    elif kind == "no_state":
        del t[qs]
    elif kind == "stray":
        t[w + ".SCB"] = ("F32", [1], b"\0\0\0\0")
    else:
        raise SystemExit(f"unknown damage {kind}")
    write_file(path, t)


def strip_config(q4dir, out):
    shutil.copytree(q4dir, out)
    cfg = json.load(open(f"{out}/config.json"))
    del cfg["quantization_config"]
    json.dump(cfg, open(f"{out}/config.json", "w"), indent=2)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"check": check, "dequant": dequant_check, "damage": damage,
     "strip_config": strip_config}[cmd](*args)
