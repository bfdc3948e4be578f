"""Reading a head checkpoint folder and writing GGUF tensors: what every head converter shares.

A folder holds ``config.json`` plus ``model.safetensors`` or ``pytorch_model.bin`` (torch's zip pickle, read
without torch by :mod:`convert.torch_pickle`), or the same split in shards (``model-00001-of-00002.safetensors``
... listed by ``model.safetensors.index.json``; ``pytorch_model-0000X-of-0000Y.bin`` by
``pytorch_model.bin.index.json``), as Hugging Face's ``save_pretrained`` writes large checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from eagle2_local.errors import ModelError

from .safetensors_file import SafetensorsError, load_safetensors
from .torch_pickle import TorchPickleError, load_torch_state_dict

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
OUTTYPES = ("f32", "f16", "q8_0")

Progress = Callable[[str, int, int], None]  # (tensor name, index, total)


@dataclass
class Checkpoint:
    """A head folder as read from disk: its config and tensors under their checkpoint names."""

    folder: Path
    config: dict
    tensors: dict[str, np.ndarray]
    weight_format: str  # "safetensors" | "pytorch"


def read_config(folder: str | Path) -> dict:
    """The folder's config.json; ModelError if the folder or the file is missing or not JSON."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelError(f"{folder} is not a folder; give the folder holding config.json and the weights")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{folder} has no config.json")
    try:
        return json.loads(cfg_path.read_text())
    except ValueError as exc:
        raise ModelError(f"{cfg_path} is not valid JSON ({exc})") from None


def load_checkpoint(folder: str | Path) -> Checkpoint:
    """Read config.json and the weights; ModelError with the reason if the folder is not a usable head."""
    folder = Path(folder)
    config = read_config(folder)
    for name in WEIGHT_FILES:
        for files, label in (([folder / name], ""), (_shards(folder, name), " shards")):
            if files and all(f.is_file() for f in files):
                fmt = "safetensors" if name.endswith(".safetensors") else "pytorch"
                tensors = _read_weight_files(files)
                label = f"{fmt} ({len(files)}{label})" if label else fmt
                return Checkpoint(folder, config, tensors, label)
    raise ModelError(f"{folder} has no weights: expected {' or '.join(WEIGHT_FILES)} (or their shards with an "
                     "index .json)")


def _shards(folder: Path, name: str) -> list[Path]:
    """The shard files an ``<name>.index.json`` lists (in order), [] without an index; missing shards refuse."""
    index = folder / f"{name}.index.json"
    if not index.is_file():
        return []
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"{index} is not a shard index (no weight_map: {exc})") from None
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise ModelError(f"{index.name} lists shards that are missing: {', '.join(missing)}")
    return [folder / f for f in files]


def _read_weight_files(files: list[Path]) -> dict[str, np.ndarray]:
    """All tensors of the files; a name found in two shards is refused (which one would be the head's?)."""
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        try:
            part = load_safetensors(path) if path.name.endswith(".safetensors") else load_torch_state_dict(path)
        except (SafetensorsError, TorchPickleError) as exc:
            raise ModelError(str(exc)) from None
        twice = sorted(set(part) & set(tensors))
        if twice:
            raise ModelError(f"tensor {twice[0]} is stored in more than one shard ({path.name} and another)")
        tensors.update(part)
    return tensors


def add_tensor(w, name: str, arr: np.ndarray, outtype: str) -> None:
    """Add one tensor: vectors (norms, biases) stay f32; matrices take ``outtype`` (q8_0 needs rows of 32k)."""
    import gguf

    if outtype not in OUTTYPES:
        raise ModelError(f"unknown outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    arr = np.asarray(arr, dtype=np.float32)
    if arr.ndim == 1 or outtype == "f32":
        w.add_tensor(name, arr)
    elif outtype == "f16":
        w.add_tensor(name, arr.astype(np.float16))
    elif arr.shape[-1] % 32 == 0:
        q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:  # Q8_0 blocks are 32 wide; a row that does not divide stays f16
        w.add_tensor(name, arr.astype(np.float16))
