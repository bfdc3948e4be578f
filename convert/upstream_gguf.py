"""Translate an ``eagle3`` GGUF written by another llama.cpp version into the keys the pinned llama.cpp reads.

Newer llama.cpp converters name the feature layers ``eagle3.extract_layers``; the llama.cpp inside our
llama-cpp-python reads ``eagle3.target_layers`` (same meaning: the targets' layer *inputs*, which is how
llama.cpp captures them) and refuses to load the file without it. llama.cpp opens a model by path, so the key
cannot be renamed in memory: :func:`translate_upstream_gguf` writes a copy with the key renamed, every other key
and every tensor byte unchanged, plus provenance saying what was translated.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eagle2_local.errors import ModelError

log = logging.getLogger(__name__)

ARCH = "eagle3"
OUR_KEY = f"{ARCH}.target_layers"
UPSTREAM_KEYS = (f"{ARCH}.extract_layers",)  # the runtime names them too, to point users here


def upstream_layer_key(fields) -> str | None:
    """The foreign key a GGUF stores its feature layers under, if it lacks ours (``fields``: key -> anything)."""
    if OUR_KEY in fields:
        return None
    return next((k for k in UPSTREAM_KEYS if k in fields), None)


def translate_upstream_gguf(src: str | Path, out: str | Path, on_choices=None) -> Path:
    """Copy ``src`` to ``out`` with ``eagle3.extract_layers`` renamed to ``eagle3.target_layers``."""
    from eagle2_local.gguf_tensors import read_header

    src, out = Path(src), Path(out)
    metadata, index = read_header(src)
    arch = metadata.get("general.architecture")
    if arch != ARCH:
        raise ModelError(f"{src.name} is a {arch!r} GGUF; only eagle3 heads from other llama.cpp converters are "
                         "translated (a head folder converts with `eagle2-local convert FOLDER`)")
    foreign = upstream_layer_key(metadata)
    if foreign is None:
        if OUR_KEY in metadata:
            raise ModelError(f"{src.name} already stores {OUR_KEY}: it runs as it is (--head {src.name})")
        raise ModelError(f"{src.name} stores no feature layers ({OUR_KEY} or {', '.join(UPSTREAM_KEYS)})")
    layers = [int(x) for x in metadata[foreign]]
    if on_choices is not None:
        on_choices({"feature layers": f"inputs of target layers {layers} ({foreign} renamed to {OUR_KEY}; "
                                      "both name layer inputs)",
                    "tensors": f"{len(index)} copied byte for byte"})
    tmp = out.with_name(out.name + ".part")
    try:
        copy_gguf(src, tmp, {foreign: OUR_KEY})
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    log.info("translated %s -> %s (%s -> %s)", src, out, foreign, OUR_KEY)
    return out


def copy_gguf(src: Path, path: Path, rename: dict[str, str]) -> None:
    """Every key (``rename``d) and every tensor's bytes of ``src``, plus provenance of the translation."""
    import gguf
    import numpy as np

    from eagle2_local.gguf_fields import copy_fields_from
    from eagle2_local.gguf_tensors import tensor_index

    writer = gguf.GGUFWriter(str(path), ARCH)
    copy_fields_from(src, writer, "", rename, skip=("general.architecture", "general.alignment"))
    writer.add_string("eagle2_local.translated_from", src.name)
    writer.add_string("eagle2_local.translated_keys", ", ".join(f"{a} -> {b}" for a, b in rename.items()))
    entries = list(tensor_index(src).values())
    for e in entries:  # the shape is in elements: a non-uint8 dtype keeps gguf-py from reading it as bytes
        writer.add_tensor_info(e.name, e.shape, np.dtype(np.float32), e.n_bytes, gguf.GGMLQuantizationType(e.qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for e in entries:
        writer.write_tensor_data(np.fromfile(src, dtype=np.uint8, count=e.n_bytes, offset=e.offset))
    writer.close()
