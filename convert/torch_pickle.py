"""Read a torch ``pytorch_model.bin`` (zip + pickle) into numpy arrays without importing torch.

Users converting a head may not have torch, and unpickling arbitrary files runs arbitrary code. So this is a
*restricted* unpickler: it resolves only the handful of globals a plain state dict needs (OrderedDict, the
tensor rebuild function, the storage classes of the supported dtypes) and refuses anything else by name.

Layout of the archive (torch >= 1.6): ``<name>/data.pkl`` holds the pickled dict; each tensor storage is the raw
little-endian bytes of ``<name>/data/<key>``, referenced from the pickle through a persistent id
``('storage', StorageClass, key, location, numel)``; a tensor is ``_rebuild_tensor_v2(storage, offset, size,
stride, ...)`` over it.
"""

from __future__ import annotations

import collections
import logging
import pickle
import zipfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


class TorchPickleError(ValueError):
    """The file is not a torch zip checkpoint this reader supports (the message says why)."""


_BF16 = "bfloat16"  # numpy has no bfloat16: we read raw uint16 and widen to float32
# EAGLE-3 checkpoints carry an int64 ``d2t`` buffer (draft -> target id offsets) and a bool ``t2d`` mask
STORAGE_DTYPES = {"FloatStorage": np.dtype("<f4"), "HalfStorage": np.dtype("<f2"), "DoubleStorage": np.dtype("<f8"),
                  "BFloat16Storage": _BF16, "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
                  "ShortStorage": np.dtype("<i2"), "CharStorage": np.dtype("i1"), "ByteStorage": np.dtype("u1"),
                  "BoolStorage": np.dtype("?")}


class _StorageType:
    """Stands in for torch.<X>Storage inside the pickle: only its dtype matters."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = STORAGE_DTYPES[name]


def _rebuild_tensor_v2(storage: np.ndarray, offset: int, size, stride, *_ignored) -> np.ndarray:
    """numpy twin of torch._utils._rebuild_tensor_v2: a strided view of the storage, copied out."""
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    needed = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else offset
    if needed > storage.size:
        raise TorchPickleError(f"tensor of size {size} at offset {offset} overruns its storage of {storage.size}")
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=tuple(s * item for s in stride))
    return np.array(view)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, fh, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(fh)
        self._archive = archive
        self._prefix = prefix
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise TorchPickleError(f"refusing to load {module}.{name}: a weights file should hold only tensors "
                               "(this reader supports float, integer and bool state dicts)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise TorchPickleError(f"unsupported persistent id {pid!r}")
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise TorchPickleError(f"unsupported storage type {storage_type!r}")
        if key not in self._storages:
            self._storages[key] = self._read_storage(key, storage_type.dtype)
        return self._storages[key]

    def _read_storage(self, key: str, dtype) -> np.ndarray:
        try:
            raw = self._archive.read(f"{self._prefix}/data/{key}")
        except KeyError:
            raise TorchPickleError(f"storage {key} is missing from the archive (truncated file?)") from None
        if dtype == _BF16:
            if len(raw) % 2:
                raise TorchPickleError(f"storage {key} has an odd number of bytes for bfloat16")
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        if len(raw) % dtype.itemsize:
            raise TorchPickleError(f"storage {key} size {len(raw)} is not a multiple of {dtype.itemsize}")
        return np.frombuffer(raw, dtype=dtype)


def load_torch_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """Tensors of a torch zip checkpoint as numpy arrays (bf16 widened to float32), keyed as saved."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise TorchPickleError(f"{path} is not a zip archive: only torch's zip format (torch >= 1.6) is supported; "
                               "re-save it with a recent torch or convert it to safetensors")
    with zipfile.ZipFile(path) as archive:
        pkls = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pkls) != 1:
            raise TorchPickleError(f"{path}: expected one */data.pkl in the archive, found {len(pkls)}")
        prefix = pkls[0][: -len("/data.pkl")]
        order = f"{prefix}/byteorder"
        if order in archive.namelist() and archive.read(order).strip() != b"little":
            raise TorchPickleError(f"{path}: big-endian checkpoints are not supported")
        with archive.open(pkls[0]) as fh:
            try:
                obj = _RestrictedUnpickler(fh, archive, prefix).load()
            except TorchPickleError:
                raise
            except Exception as exc:  # corrupt pickle stream
                raise TorchPickleError(f"{path}: cannot unpickle data.pkl ({exc})") from None
    if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
        raise TorchPickleError(f"{path} does not hold a flat state dict of tensors")
    log.debug("read %d tensors from %s", len(obj), path)
    return dict(obj)
