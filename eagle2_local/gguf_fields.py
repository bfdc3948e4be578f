"""Copying GGUF metadata fields between files (tokenizers into heads, hyper-parameters into cut-down drafts)."""

from __future__ import annotations

from typing import Any

import gguf


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
