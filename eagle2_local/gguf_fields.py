"""Copying GGUF metadata fields between files (tokenizers into heads, hyper-parameters into cut-down drafts)."""

from __future__ import annotations

from typing import Any

import gguf


def copy_field(writer: gguf.GGUFWriter, key: str, field: Any, value: Any = None) -> None:
    """Write ``field`` (from a GGUFReader) under ``key``, keeping its type; ``value`` overrides its contents."""
    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(key, field.contents() if value is None else value, vtype, sub_type=sub)


def copy_tokenizer(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> int:
    """Copy every ``tokenizer.*`` field, so llama.cpp builds the same vocabulary for the head; returns the count."""
    n = 0
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            copy_field(writer, key, field)
            n += 1
    return n
