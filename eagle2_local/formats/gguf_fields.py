"""Copying GGUF metadata fields between files (tokenizers into heads, hyper-parameters into cut-down drafts)."""

from __future__ import annotations

from typing import Any

import gguf

from . import gguf_keys as keys


def copy_field(writer: gguf.GGUFWriter, key: str, field: Any, value: Any = None) -> None:
    """Write ``field`` (from a GGUFReader) under ``key``, keeping its type; ``value`` overrides its contents."""
    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(key, field.contents() if value is None else value, vtype, sub_type=sub)


def copy_fields_from(path, writer: gguf.GGUFWriter, prefix: str, rename: dict[str, str] | None = None,
                     skip: tuple[str, ...] = ()) -> int:
    """Copy the fields of the GGUF at ``path`` whose key starts with ``prefix`` (types kept, ``rename``d, ``skip``
    left out) without gguf-py's slow reader; returns the count."""
    from .gguf_tensors import read_typed_fields

    n = 0
    for key, (vtype, sub, value) in read_typed_fields(path, prefix).items():
        if key in skip:
            continue
        writer.add_key_value((rename or {}).get(key, key), value, gguf.GGUFValueType(vtype),
                             sub_type=None if sub is None else gguf.GGUFValueType(sub))
        n += 1
    return n


def copy_gguf(src, path, rename: dict[str, str], arch: str) -> None:
    """Rewrite the GGUF ``src`` at ``path``: every key (``rename``d) and every tensor's bytes unchanged, plus
    ``eagle2_local.translated_*`` provenance (used to translate key names between llama.cpp versions)."""
    from pathlib import Path

    import numpy as np

    from .gguf_tensors import tensor_index

    src = Path(src)
    writer = gguf.GGUFWriter(str(path), arch)
    copy_fields_from(src, writer, "", rename, skip=(keys.ARCHITECTURE, keys.ALIGNMENT))
    writer.add_string(keys.TRANSLATED_FROM, src.name)
    writer.add_string(keys.TRANSLATED_KEYS, ", ".join(f"{a} -> {b}" for a, b in rename.items()))
    entries = list(tensor_index(src).values())
    for e in entries:  # the shape is in elements: a non-uint8 dtype keeps gguf-py from reading it as bytes
        writer.add_tensor_info(e.name, e.shape, np.dtype(np.float32), e.n_bytes, gguf.GGMLQuantizationType(e.qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for e in entries:
        writer.write_tensor_data(np.fromfile(src, dtype=np.uint8, count=e.n_bytes, offset=e.offset))
    writer.close()
