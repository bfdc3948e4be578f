"""Read a ``.safetensors`` file into numpy arrays (the format is 8 bytes of header length, a JSON header, raw data).

Tiny on purpose: the converter must not need torch or the safetensors package.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

# EAGLE-3 heads also carry integer / boolean vocabulary maps (d2t offsets, t2d mask)
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": None,
          "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "BOOL": np.dtype("?")}


class SafetensorsError(ValueError):
    """The file is not a safetensors file this reader supports (the message says why)."""


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of the file; bf16 is widened to float32 (numpy has no bfloat16)."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 8:
        raise SafetensorsError(f"{path} is too short to be a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise SafetensorsError(f"{path} is truncated: header of {n} bytes does not fit")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as exc:
        raise SafetensorsError(f"{path}: header is not JSON ({exc})") from None
    body = memoryview(data)[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        out[name] = _tensor(path, name, meta, body)
    return out


def _tensor(path: Path, name: str, meta: dict, body: memoryview) -> np.ndarray:
    dtype = meta.get("dtype")
    if dtype not in DTYPES:
        raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {dtype}")
    start, end = meta["data_offsets"]
    if end > len(body):
        raise SafetensorsError(f"{path} is truncated: tensor {name} ends at {end}, data has {len(body)} bytes")
    shape = tuple(meta["shape"])
    if dtype == "BF16":
        raw = np.frombuffer(body[start:end], dtype="<u2")
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(body[start:end], dtype=DTYPES[dtype]).reshape(shape).copy()

