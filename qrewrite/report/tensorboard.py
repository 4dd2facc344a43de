"""Read scalars from TensorBoard event files without TensorFlow or tensorboard (the report runs in the data env).

An event file is a sequence of TFRecords (u64 length, u32 masked CRC-32C of the length, payload, u32 masked
CRC-32C of the payload); each payload is an `Event` protobuf. Only what scalars need is decoded: `Event.step`
(field 2), `Event.summary` (5) → `Summary.value` (1) → `Value.tag` (1) and either `simple_value` (2, what
torch's SummaryWriter.add_scalar writes) or a scalar `tensor` (8; `float_val` / `double_val` /
`tensor_content`). A truncated last record (a writer still running) ends the file; a CRC mismatch is an error.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import QrewriteError


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message; value is an int or bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, v


def _tensor_scalar(buf: bytes) -> float | None:
    dtype, content = None, None
    for num, wt, v in _fields(buf):
        if num == 1 and wt == 0:
            dtype = v
        elif num == 4 and wt == 2:
            content = v
        elif num == 5:  # float_val: packed (wt 2) or single (wt 5)
            return struct.unpack("<f", v[:4])[0]
        elif num == 6:  # double_val
            return struct.unpack("<d", v[:8])[0]
    if content is not None:
        if dtype == 1 and len(content) == 4:
            return struct.unpack("<f", content)[0]
        if dtype == 2 and len(content) == 8:
            return struct.unpack("<d", content)[0]
    return None


def _records(path: Path):
    data = path.read_bytes()
    i = 0
    while i + 12 <= len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        if masked_crc(header) != hcrc:
            raise QrewriteError(f"corrupt TensorBoard record header at byte {i}", file=str(path))
        end = i + 12 + length + 4
        if end > len(data):
            return  # truncated tail: the writer had not flushed the whole record
        payload = data[i + 12:i + 12 + length]
        (pcrc,) = struct.unpack("<I", data[end - 4:end])
        if masked_crc(payload) != pcrc:
            raise QrewriteError(f"corrupt TensorBoard record at byte {i}", file=str(path))
        yield payload
        i = end


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} over every event file under `log_dir` (sorted by step; the last value
    wins when a step repeats, e.g. after a resumed run)."""
    out: dict[str, dict[int, float]] = {}
    for path in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        for payload in _records(path):
            step, values = 0, []
            for num, wt, v in _fields(payload):
                if num == 2 and wt == 0:
                    step = v
                elif num == 5 and wt == 2:
                    for snum, swt, sv in _fields(v):
                        if snum == 1 and swt == 2:
                            values.append(sv)
            for val in values:
                tag, value = None, None
                for vnum, vwt, vv in _fields(val):
                    if vnum == 1 and vwt == 2:
                        tag = vv.decode("utf-8", "replace")
                    elif vnum == 2 and vwt == 5:
                        value = struct.unpack("<f", vv)[0]
                    elif vnum == 8 and vwt == 2 and value is None:
                        value = _tensor_scalar(vv)
                if tag is not None and value is not None:
                    out.setdefault(tag, {})[int(step)] = float(value)
    return {tag: sorted(points.items()) for tag, points in sorted(out.items())}
