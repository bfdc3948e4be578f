"""Translate an ``eagle3`` GGUF written by another llama.cpp version into the keys the pinned llama.cpp reads.

llama.cpp converters other than the one pinned here name the feature layers ``eagle3.extract_layers`` (the
name the pinned loader's own error message still uses); the llama.cpp inside our llama-cpp-python reads
``eagle3.target_layers`` (same meaning: the targets' layer *inputs*, which is how
llama.cpp captures them) and refuses to load the file without it. llama.cpp opens a model by path, so the key
cannot be renamed in memory: :func:`translate_upstream_gguf` writes a copy with the key renamed, every other key
and every tensor byte unchanged, plus provenance saying what was translated. ``--head`` does the same once, into
a cache (``eagle2_local.drafts.open_head``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from eagle2_local.errors import ModelError
from eagle2_local.formats import gguf_keys as keys
from eagle2_local.formats.atomic_write import atomic_path
from eagle2_local.formats.gguf_fields import copy_gguf

log = logging.getLogger(__name__)

ARCH = keys.EAGLE3_ARCH
OUR_KEY = keys.EAGLE3_TARGET_LAYERS


def translate_upstream_gguf(src: str | Path, out: str | Path, on_choices=None) -> Path:
    """Copy ``src`` to ``out`` with ``eagle3.extract_layers`` renamed to ``eagle3.target_layers``."""
    from eagle2_local.drafts.eagle3_llama import UPSTREAM_LAYER_KEYS, foreign_layer_key
    from eagle2_local.formats.gguf_tensors import tensor_index
    from eagle2_local.formats.models import read_gguf_info

    src, out = Path(src), Path(out)
    info = read_gguf_info(src)
    if info.architecture != ARCH:
        raise ModelError(f"{src.name} is a {info.architecture!r} GGUF; only eagle3 heads from other llama.cpp "
                         "converters are translated (a head folder converts with `eagle2-local convert FOLDER`)")
    foreign = foreign_layer_key(info)
    if foreign is None:
        if info.get(OUR_KEY) is not None:
            raise ModelError(f"{src.name} already stores {OUR_KEY}: it runs as it is (--head {src.name})")
        raise ModelError(f"{src.name} stores no feature layers ({OUR_KEY} or {', '.join(UPSTREAM_LAYER_KEYS)})")
    layers = [int(x) for x in info.get(foreign)]
    if on_choices is not None:
        on_choices({"feature layers": f"inputs of target layers {layers} ({foreign} renamed to {OUR_KEY}; "
                                      "both name layer inputs)",
                    "tensors": f"{len(tensor_index(src))} copied byte for byte"})
    with atomic_path(out) as tmp:
        copy_gguf(src, tmp, {foreign: OUR_KEY}, ARCH)
    log.info("translated %s -> %s (%s -> %s)", src, out, foreign, OUR_KEY)
    return out
