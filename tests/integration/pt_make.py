"""pt_make.py - PyTorch checkpoints written by torch.save itself, the twins
of a safetensors checkpoint (as `trainyard mkmodel` writes one), and the
checks that compare them.

  pt_make.py twin SRC OUT MODE   write OUT/config.json + the PyTorch files:
      single   pytorch_model.bin (an OrderedDict state dict; a tied model
               keeps lm_head.weight as a view of the embedding, as
               torch.save of model.state_dict() does)
      sharded  pytorch_model-0000i-of-00003.bin + pytorch_model.bin.index.json
      packed   model.pt holding {"state_dict": sd} where every tensor is a
               view at an offset into one shared storage, config.json beside
      proto4   pytorch_model.bin pickled with protocol 4 (torch.save's default is 2)
      legacy   model.pt in the pre-1.6 format (_use_new_zipfile_serialization=False)
  pt_make.py same A B            every tensor of safetensors checkpoint A
                                 equals B's bit for bit (names, dtypes, shapes)
  pt_make.py zip64 IN OUT        IN with a saturated end record (zip64 only)
  pt_make.py hostile DIR MARKER  write hostile files into DIR (see below);
                                 an os.system payload would create MARKER
"""
import collections
import io
import json
import os
import pickle
import shutil
import struct
import sys
import zipfile

import torch

DT = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_st(path):
    """The tensors of one safetensors file, in file order."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    out = collections.OrderedDict()
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        buf = bytearray(raw[8 + n + b:8 + n + end])
        t = torch.frombuffer(buf, dtype=DT[e["dtype"]]) if buf else torch.empty(0, dtype=DT[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def read_ckpt(d):
    """Every tensor of a safetensors checkpoint folder."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) \
        else ["model.safetensors"]
    sd = collections.OrderedDict()
    for f in files:
        sd.update(read_st(os.path.join(d, f)))
    return sd


def twin(src, out, mode):
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), out)
    cfg = json.load(open(os.path.join(src, "config.json")))
    sd = read_ckpt(src)
    names = [k for k in sd if k != "lm_head.weight"] + (["lm_head.weight"] if "lm_head.weight" in sd else [])
    sd = collections.OrderedDict((k, sd[k]) for k in names)
    if cfg.get("tie_word_embeddings"):
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # one storage, two names
    if mode == "single":
        torch.save(sd, os.path.join(out, "pytorch_model.bin"))
    elif mode == "sharded":
        keys = list(sd)
        parts = [keys[i::3] for i in range(3)]
        wm = {}
        for i, part in enumerate(parts):
            fn = "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(parts))
            shard = {k: sd[k] for k in part}
            if "lm_head.weight" in shard and cfg.get("tie_word_embeddings"):
                del shard["lm_head.weight"]  # as transformers drops a tied head
            torch.save(shard, os.path.join(out, fn))
            wm.update({k: fn for k in shard})
        json.dump({"metadata": {}, "weight_map": wm},
                  open(os.path.join(out, "pytorch_model.bin.index.json"), "w"))
    elif mode == "packed":
        dt = next(iter(sd.values())).dtype
        flat = torch.cat([torch.zeros(3, dtype=dt)] + [v.reshape(-1) for v in sd.values()])
        packed, at = collections.OrderedDict(), 3
        for k, v in sd.items():
            if k == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                packed[k] = packed["model.embed_tokens.weight"]
                continue
            packed[k] = flat[at:at + v.numel()].view(v.shape)
            at += v.numel()
        torch.save({"state_dict": packed}, os.path.join(out, "model.pt"))
    elif mode == "proto4":  # FRAME, MEMOIZE, STACK_GLOBAL, SHORT_BINUNICODE
        torch.save(sd, os.path.join(out, "pytorch_model.bin"), pickle_protocol=4)
    elif mode == "legacy":
        torch.save(sd, os.path.join(out, "model.pt"), _use_new_zipfile_serialization=False)
    else:
        sys.exit("unknown mode " + mode)


def same(a, b):
    x, y = read_ckpt(a), read_ckpt(b)
    assert list(sorted(x)) == list(sorted(y)), (sorted(set(x) ^ set(y)))
    for k in x:
        assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, (k, x[k].dtype, y[k].dtype)
        assert torch.equal(x[k].view(-1).view(torch.int16 if x[k].element_size() == 2 else torch.int32),
                           y[k].view(-1).view(torch.int16 if y[k].element_size() == 2 else torch.int32)), k
    print("same: %d tensors" % len(x))


def zip64(src, dst):
    """src with its end record saturated: only the zip64 records that torch
    writes beside it say where the directory is, as in a file over 4 GiB."""
    z = bytearray(open(src, "rb").read())
    assert z.find(b"PK\x06\x06") >= 0, "torch wrote no zip64 end record"
    eocd = z.rindex(b"PK\x05\x06")
    z[eocd + 8:eocd + 20] = b"\xff" * 12
    open(dst, "wb").write(bytes(z))


class Reduce:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def zip_with_pickle(path, pkl, extra=None, compress=False):
    """A torch-shaped archive: archive/data.pkl (+ extra entries)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
        for name, data in (extra or {}).items():
            z.writestr("archive/" + name, data)


def hostile(d, marker):
    os.makedirs(d, exist_ok=True)
    # An os.system global: torch.load would run `touch MARKER`.
    zip_with_pickle(os.path.join(d, "os_system.pt"),
                    pickle.dumps(Reduce(os.system, ("touch " + marker,)), protocol=2))
    zip_with_pickle(os.path.join(d, "eval.pt"),
                    pickle.dumps(Reduce(eval, ("__import__('os').system('touch %s')" % marker,)),
                                 protocol=4))  # STACK_GLOBAL inside a FRAME
    import subprocess
    zip_with_pickle(os.path.join(d, "popen.pt"),
                    pickle.dumps(Reduce(subprocess.Popen, (["touch", marker],)), protocol=4))
    # A REDUCE of an allowed global that is not a tensor callable.
    zip_with_pickle(os.path.join(d, "reduce_storage.pt"),
                    b"\x80\x02ctorch\nFloatStorage\nq\x00K\x05\x85q\x01Rq\x02.")
    # BUILD on a tensor-less object (an OrderedDict called with a list).
    zip_with_pickle(os.path.join(d, "reduce_odict_args.pt"),
                    b"\x80\x02ccollections\nOrderedDict\n]\x85R.")
    # A real state dict, saved with torch, then damaged in several ways.
    good = os.path.join(d, "good.pt")
    torch.save({"w": torch.arange(64, dtype=torch.float32)}, good)
    raw = open(good, "rb").read()
    open(os.path.join(d, "truncated.pt"), "wb").write(raw[:len(raw) // 2])
    open(os.path.join(d, "tail_cut.pt"), "wb").write(raw[:-30])
    with zipfile.ZipFile(good) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(os.path.join(d, "compressed.pt"), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            z.writestr(name, data)
    # Central-directory lies: a data entry's local header offset moved onto
    # the pickle's (overlap), or past the end of the file.

    first_cd = raw.index(b"PK\x01\x02")
    recs, at = [], first_cd
    while raw[at:at + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack("<HHH", raw[at + 28:at + 34])
        recs.append(at)
        at += 46 + nlen + xlen + clen
    names = [raw[r + 46:r + 46 + struct.unpack("<H", raw[r + 28:r + 30])[0]] for r in recs]
    data_rec = recs[[i for i, n in enumerate(names) if b"/data/" in n][0]]
    pkl_rec = recs[[i for i, n in enumerate(names) if n.endswith(b"data.pkl")][0]]
    # Overlap: a second directory record for the same bytes, under the same
    # name (so that every local header agrees), as a zip bomb shares data.
    # torch writes zip64 end records too: both are kept true.
    rec_len = 46 + sum(struct.unpack("<HHH", raw[data_rec + 28:data_rec + 34]))
    eocd = raw.rindex(b"PK\x05\x06")
    cnt, _, cd_size, cd_off = struct.unpack("<HHII", raw[eocd + 8:eocd + 20])
    cd_end = cd_off + cd_size
    over = bytearray(raw[:cd_end] + raw[data_rec:data_rec + rec_len] + raw[cd_end:])
    e = eocd + rec_len
    over[e + 8:e + 16] = struct.pack("<HHI", cnt + 1, cnt + 1, cd_size + rec_len)
    z64 = over.find(b"PK\x06\x06", cd_end + rec_len)
    if z64 >= 0:
        over[z64 + 24:z64 + 48] = struct.pack("<QQQ", cnt + 1, cnt + 1, cd_size + rec_len)
        loc = over.find(b"PK\x06\x07", z64)
        over[loc + 8:loc + 16] = struct.pack("<Q", z64)
    open(os.path.join(d, "overlap.pt"), "wb").write(bytes(over))
    # A directory record whose local header offset lands on another entry's.
    moved = bytearray(raw)
    moved[data_rec + 42:data_rec + 46] = raw[pkl_rec + 42:pkl_rec + 46]
    open(os.path.join(d, "moved.pt"), "wb").write(bytes(moved))
    past = bytearray(raw)
    past[data_rec + 20:data_rec + 28] = struct.pack("<II", 1 << 30, 1 << 30)
    open(os.path.join(d, "past_end.pt"), "wb").write(bytes(past))
    # An end record claiming far more entries than its directory holds.
    eocd = raw.rindex(b"PK\x05\x06")
    big = bytearray(raw)
    big[eocd + 8:eocd + 12] = struct.pack("<HH", 0xfffe, 0xfffe)
    open(os.path.join(d, "oversized.pt"), "wb").write(bytes(big))
    # A non-contiguous tensor, and a training checkpoint with other entries.
    torch.save({"w": torch.arange(12, dtype=torch.float32).view(3, 4).t()},
               os.path.join(d, "strided.pt"))
    torch.save({"model": {"w": torch.zeros(2)}, "epoch": 3}, os.path.join(d, "not_state_dict.pt"))
    torch.save({"w": torch.zeros(2, dtype=torch.float64)}, os.path.join(d, "float64.pt"))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "twin":
        twin(*sys.argv[2:5])
    elif cmd == "same":
        same(*sys.argv[2:4])
    elif cmd == "zip64":
        zip64(*sys.argv[2:4])
    elif cmd == "hostile":
        hostile(*sys.argv[2:4])
    else:
        sys.exit(__doc__)
