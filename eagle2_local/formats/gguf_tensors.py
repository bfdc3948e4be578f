"""Load single tensors from a GGUF file quickly, as float32 numpy arrays.

gguf-py's ``GGUFReader`` parses every metadata field into numpy objects first; on SmolLM2 (49152 tokens and as
many merges) that alone takes ~4 s on this machine, while the numpy draft engine only needs two tensors (the
embedding and the LM head). This reader walks the header with ``struct``, skipping values it does not need, and
memory-maps only the requested tensors. Dequantization is gguf-py's.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError
from . import gguf_keys as keys

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    name: str
    qtype: int
    shape: tuple[int, ...]  # numpy order (rows first)
    offset: int  # absolute byte offset in the file
    n_bytes: int


class _Cursor:
    def __init__(self, buf, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise ModelError(f"{self.path} is truncated or corrupt: header ends early") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ModelError(f"{self.path} is truncated or corrupt: string runs past the end")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, keep_upto: int = 0):
        """Read one value; arrays longer than ``keep_upto`` are skipped (returned as their length only)."""
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, n = self.take("<I"), self.take("<Q")
            if n <= keep_upto:
                return [self.value(itype) for _ in range(n)]
            if itype == _STRING:
                for _ in range(n):
                    length = self.take("<Q")  # read first: `pos += take()` would use the old pos
                    self.pos += length
            elif itype in _SCALAR:
                self.pos += n * struct.calcsize(_SCALAR[itype])
            else:
                for _ in range(n):
                    self.value(itype)
            return SkippedArray(n)
        if vtype not in _SCALAR:
            raise ModelError(f"{self.path}: unknown GGUF value type {vtype}")
        return self.take(_SCALAR[vtype])


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array too long to be worth decoding (token lists, merges): only its length is kept."""

    length: int


def tensor_index(path: str | Path) -> dict[str, TensorEntry]:
    """Name -> where the tensor lies, checked against the file size (truncated downloads are common)."""
    return read_header(path)[1]


def read_header(path: str | Path, keep_arrays_upto: int = 64) -> tuple[dict, dict[str, TensorEntry]]:
    """Metadata (arrays longer than ``keep_arrays_upto`` as :class:`SkippedArray`) and the tensor index."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        if bytes(buf[:4]) != b"GGUF":
            raise ModelError(f"{path} is not a GGUF file")
        cur.pos = 4
        version, n_tensors, n_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
        if version < 2:
            raise ModelError(f"{path}: GGUF version {version} is too old")
        metadata = {}
        for _ in range(n_kv):
            key, vtype = cur.string(), cur.take("<I")
            metadata[key] = cur.value(vtype, keep_arrays_upto)
        alignment = int(metadata.get(keys.ALIGNMENT, 32))
        infos = []
        for _ in range(n_tensors):
            name, n_dims = cur.string(), cur.take("<I")
            if n_dims > 8:
                raise ModelError(f"{path} is truncated or corrupt: tensor {name!r} claims {n_dims} dimensions")
            dims = [cur.take("<Q") for _ in range(n_dims)]
            infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
        data_start = -(-cur.pos // alignment) * alignment
    out = {}
    for name, dims, qtype, rel in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            raise ModelError(f"{path}: tensor {name} has unknown type {qtype}") from None
        n_bytes = int(np.prod(dims)) // block * type_size
        entry = TensorEntry(name, qtype, tuple(int(d) for d in reversed(dims)), data_start + rel, n_bytes)
        if entry.offset + n_bytes > size:
            raise ModelError(f"{path} is truncated: tensor {name} ends at byte {entry.offset + n_bytes} but the file "
                             f"has {size} bytes")
        out[name] = entry
    return metadata, out


def load_tensor(path: str | Path, entry: TensorEntry) -> np.ndarray:
    """The tensor as float32 with its numpy shape."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(entry.qtype)
    raw = np.fromfile(path, dtype=np.uint8, count=entry.n_bytes, offset=entry.offset)
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(entry.shape).copy()
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32).reshape(entry.shape)
    try:
        return np.asarray(dequantize(raw.reshape(entry.shape[:-1] + (-1,)), qtype), dtype=np.float32)
    except NotImplementedError as exc:
        raise ModelError(f"{Path(path).name}: cannot dequantize {entry.name} ({qtype.name}): {exc}") from None


def read_typed_fields(path: str | Path, prefix: str = "") -> dict[str, tuple[int, int | None, object]]:
    """Metadata fields whose key starts with ``prefix``, fully decoded: key -> (value type, array item type or
    None, value). The same struct walk as :func:`read_header`: copying a 49k-token tokenizer this way takes a
    fraction of a second, gguf-py's reader seconds."""
    path = Path(path)
    out = {}
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        if bytes(buf[:4]) != b"GGUF":
            raise ModelError(f"{path} is not a GGUF file")
        cur.pos = 4
        cur.take("<I")
        cur.take("<Q")
        n_kv = cur.take("<Q")
        for _ in range(n_kv):
            key, vtype = cur.string(), cur.take("<I")
            if not key.startswith(prefix):
                cur.value(vtype)
                continue
            sub = struct.unpack_from("<I", buf, cur.pos)[0] if vtype == _ARRAY else None
            out[key] = (vtype, sub, cur.value(vtype, keep_upto=1 << 62))
    return out
