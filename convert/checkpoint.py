"""Reading a head checkpoint folder: ``config.json`` plus ``model.safetensors`` or ``pytorch_model.bin``.

safetensors is simple enough to read with numpy alone (8-byte little-endian header length, a JSON header of
name → dtype/shape/offsets, then raw little-endian data), so neither the ``safetensors`` package nor torch is
needed to convert a head.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from eagle2_local.errors import ModelError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def load_checkpoint(head_dir: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """``(config, tensors)`` of a head folder, with clear errors for a missing or unreadable part."""
    head_dir = Path(head_dir)
    if not head_dir.is_dir():
        raise ModelError(f"head folder not found: {head_dir}")
    cfg_path = head_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{head_dir} has no config.json")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{cfg_path} is not valid JSON: {exc}") from None
    for name in WEIGHT_FILES:
        path = head_dir / name
        if path.is_file():
            return config, read_weights(path)
    raise ModelError(f"{head_dir} has no weights: expected one of {', '.join(WEIGHT_FILES)}")


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """Tensors of one weights file as float32/int arrays (bf16 widened to float32)."""
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    from .torch_pickle import load_torch_file  # torch-free reader of torch's zip pickle format
    return load_torch_file(path)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    if len(data) < 8:
        raise ModelError(f"{path} is truncated (no safetensors header)")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ModelError(f"{path} is truncated (header of {n} bytes, file of {len(data)})")
    try:
        header = json.loads(data[8:8 + n])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: corrupt safetensors header ({exc})") from None
    body = memoryview(data)[8 + n:]
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        if end > len(body):
            raise ModelError(f"{path} is truncated: tensor {name} ends past the end of the file")
        raw = body[start:end]
        if meta["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif meta["dtype"] in _ST_DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[meta["dtype"]]).newbyteorder("<"))
        else:
            raise ModelError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        out[name] = arr.reshape(meta["shape"]).copy()
    return out
