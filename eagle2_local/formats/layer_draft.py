"""Derive a same-vocabulary draft from a GGUF by keeping only its first N transformer blocks (early exit).

The result is a genuine, cheaper model whose token ids mean exactly what the target's mean, so the draft-model
engine can use it with any target that has no smaller sibling. It is a weak draft (the last blocks matter a
lot: SmolLM2 cut to 24 of 30 blocks reaches tau ~1.5-2.5), useful for tests and as a baseline.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf

from ..errors import Eagle2Error
from . import gguf_keys as keys
from .gguf_fields import copy_field


def write_truncated(src: str | Path, dst: str | Path, n_layers: int) -> Path:
    """Copy ``src`` to ``dst`` with ``block_count = n_layers`` and only the tensors of those blocks."""
    dst = Path(dst)
    if dst.exists():
        return dst
    reader = gguf.GGUFReader(str(src), "r")
    arch = reader.fields[keys.ARCHITECTURE].contents()
    block_count = keys.BLOCK_COUNT.format(arch=arch)
    n_total = reader.fields[block_count].contents()
    if not 1 <= n_layers < n_total:
        raise Eagle2Error(f"n_layers must be in 1..{n_total - 1} for this {n_total}-block model, got {n_layers}")
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == keys.ARCHITECTURE:
            continue
        copy_field(writer, key, field, n_layers if key == block_count else None)
    block = re.compile(r"^blk\.(\d+)\.")
    for t in reader.tensors:
        m = block.match(t.name)
        if m and int(m.group(1)) >= n_layers:
            continue
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # data.shape is the byte shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
