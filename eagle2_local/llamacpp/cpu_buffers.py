"""Which of llama.cpp's extra CPU weight-buffer types a model may be loaded into.

llama.cpp loads a CPU model's matrix weights into "extra" buffer types when the build and the CPU have kernels
for them: ``CPU_REPACK`` (quant blocks interleaved for the AVX2/AVX-512/NEON kernels) and, in a build made on a
CPU with AMX, ``AMX`` (tiles for Intel's matrix units), which comes first in the loader's list. On some AMX
machines, this project's test VMs among them, the AMX kernel crashes the process (SIGSEGV in
``ggml_backend_amx_mul_mat``) at the first decode of any model, and llama.cpp offers no switch for AMX alone
(``use_extra_bufts = false`` also drops ``CPU_REPACK``, ~11% of a Qwen2.5 Q4_0 decode step there).

So :func:`keep_amx_out` removes ``AMX`` from the NULL-terminated list the model loader walks (the CPU device's
``ggml_backend_dev_get_extra_bufts``), before any model is loaded, and ``CPU_REPACK`` stays. Weights never
placed in an AMX buffer are never computed by the AMX kernel. ``EAGLE2_LOCAL_AMX=1`` keeps AMX for machines where
it works.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

from .ggml_backend import DEVICE_TYPE_CPU, ggml_fn

log = logging.getLogger(__name__)

AMX_ENV = "EAGLE2_LOCAL_AMX"
_GET_EXTRA_BUFTS = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


def _extra_list() -> Any:
    """The CPU device's NULL-terminated array of extra buffer types (a ``c_void_p`` pointer; llama.cpp keeps
    the array for the process), or None where the build exports none."""
    dev = ggml_fn("ggml_backend_dev_by_type")(DEVICE_TYPE_CPU)
    reg = ggml_fn("ggml_backend_dev_backend_reg")(dev) if dev else None
    addr = ggml_fn("ggml_backend_reg_get_proc_address")(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
    return _GET_EXTRA_BUFTS(addr)(dev) if addr else None


def _entries(arr: Any) -> list[int]:
    """The buffer types in ``arr``, up to its NULL (the array's only length)."""
    entries = []
    while arr[len(entries)]:
        entries.append(arr[len(entries)])
    return entries


def _name(buft: int) -> str:
    return ggml_fn("ggml_backend_buft_name")(buft).decode()


def drop_buffer_type(name: str) -> bool:
    """Remove ``name`` from the extra CPU buffer types later model loads may use; True if it was there.

    The array is rewritten in place (the kept entries moved up, the freed slots NULL): llama.cpp's loader reads
    it up to the first NULL, and the CPU backend's own list, which routes a tensor to its kernel by the buffer
    the tensor sits in, is a separate copy."""
    arr = _extra_list()
    if not arr:
        return False
    entries = _entries(arr)
    kept = [b for b in entries if _name(b) != name]
    if len(kept) == len(entries):
        return False
    for i in range(len(entries)):
        arr[i] = kept[i] if i < len(kept) else None
    return True


def keep_amx_out() -> None:
    """Leave the AMX buffer type out of model loads unless ``EAGLE2_LOCAL_AMX=1`` (once per process, before
    the first model is loaded: a model already loaded keeps its buffers)."""
    if os.environ.get(AMX_ENV) == "1":
        return
    try:
        dropped = drop_buffer_type("AMX")
    except AttributeError as exc:  # a llama.cpp build without ggml's device API: nothing to leave out
        log.debug("extra CPU buffer types not inspected: %s", exc)
        return
    if dropped:
        log.info("llama.cpp's AMX weight buffers left out (its AMX kernel crashes on some machines); "
                 "%s=1 keeps them", AMX_ENV)
