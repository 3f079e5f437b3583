"""tfevents.py - an independent reader of TensorBoard event files, for the
tests: TFRecord framing with every CRC checked by a CRC-32C of its own
(not trainyard's), and each Event decoded by the Python protobuf package
from api/tensorboard.proto compiled by protoc at test time."""
import glob
import importlib
import os
import struct
import subprocess
import sys
import tempfile

SRC = os.environ.get("TRAINYARD_SRC_DIR", os.path.join(os.path.dirname(__file__), "../.."))


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C

_PB = None


def event_class():
    """tensorboard.Event from api/tensorboard.proto, compiled by protoc now."""
    global _PB
    if _PB is None:
        out = tempfile.mkdtemp(prefix="ty-tbpb-")
        subprocess.run(["protoc", "--proto_path=" + os.path.join(SRC, "api"),
                        "--python_out=" + out, "tensorboard.proto"], check=True)
        sys.path.insert(0, out)
        _PB = importlib.import_module("tensorboard_pb2")
    return _PB.Event


def records(path):
    """The data of every TFRecord of path; raises on a bad CRC or a torn record."""
    with open(path, "rb") as f:
        blob = f.read()
    pos, out = 0, []
    while pos < len(blob):
        if pos + 12 > len(blob):
            raise ValueError("%s: a torn record header at byte %d" % (path, pos))
        head = blob[pos:pos + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if hcrc != masked_crc(head):
            raise ValueError("%s: the length CRC of the record at byte %d is wrong" % (path, pos))
        data = blob[pos + 12:pos + 12 + n]
        if len(data) != n or pos + 16 + n > len(blob):
            raise ValueError("%s: a torn record at byte %d" % (path, pos))
        (dcrc,) = struct.unpack("<I", blob[pos + 12 + n:pos + 16 + n])
        if dcrc != masked_crc(data):
            raise ValueError("%s: the data CRC of the record at byte %d is wrong" % (path, pos))
        out.append(data)
        pos += 16 + n
    return out


def events(path):
    Event = event_class()
    evs = []
    for data in records(path):
        ev = Event()
        ev.ParseFromString(data)
        evs.append(ev)
    return evs


def scalars(folder):
    """{tag: {step: value}} over every event file of folder, oldest file
    first (a later attempt's value of a step wins); checks that each file
    starts with the file_version event."""
    out = {}
    files = sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
    if not files:
        raise ValueError("no event files in " + folder)
    for path in files:
        evs = events(path)
        if not evs or evs[0].WhichOneof("what") != "file_version" or \
                evs[0].file_version != "brain.Event:2":
            raise ValueError("%s does not start with the file_version event" % path)
        for ev in evs[1:]:
            if ev.WhichOneof("what") != "summary":
                raise ValueError("%s: an event that is neither a version nor a summary" % path)
            for v in ev.summary.value:
                out.setdefault(v.tag, {})[ev.step] = v.simple_value
    return out
