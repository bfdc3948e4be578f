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
    import gguf

    src, out = Path(src), Path(out)
    reader = gguf.GGUFReader(str(src), "r")
    arch_field = reader.fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else None
    if arch != ARCH:
        raise ModelError(f"{src.name} is a {arch!r} GGUF; only eagle3 heads from other llama.cpp converters are "
                         "translated (a head folder converts with `eagle2-local convert FOLDER`)")
    foreign = upstream_layer_key(reader.fields)
    if foreign is None:
        if OUR_KEY in reader.fields:
            raise ModelError(f"{src.name} already stores {OUR_KEY}: it runs as it is (--head {src.name})")
        raise ModelError(f"{src.name} stores no feature layers ({OUR_KEY} or {', '.join(UPSTREAM_KEYS)})")
    layers = [int(x) for x in reader.fields[foreign].contents()]
    if on_choices is not None:
        on_choices({"feature layers": f"inputs of target layers {layers} ({foreign} renamed to {OUR_KEY}; "
                                      "both name layer inputs)",
                    "tensors": f"{len(reader.tensors)} copied byte for byte"})
    tmp = out.with_name(out.name + ".part")
    try:
        _copy(reader, tmp, {foreign: OUR_KEY}, src.name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    log.info("translated %s -> %s (%s -> %s)", src, out, foreign, OUR_KEY)
    return out


def _copy(reader, path: Path, rename: dict[str, str], source_name: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), ARCH)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.alignment"):
            continue  # header fields and the architecture (written by GGUFWriter itself)
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(rename.get(field.name, field.name), field.contents(), vtype, sub_type=sub_type)
    writer.add_string("eagle2_local.translated_from", source_name)
    writer.add_string("eagle2_local.translated_keys", ", ".join(f"{a} -> {b}" for a, b in rename.items()))
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
