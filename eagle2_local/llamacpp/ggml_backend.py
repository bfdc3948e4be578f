"""ggml's backend and device-registry functions, which llama-cpp-python does not bind.

Both users (the RPC backend in ``rpc.py``, the CPU weight-buffer choice in ``cpu_buffers.py``) call the same few
C functions; each is bound once here, with its types, from the libraries llama-cpp-python already loaded.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import llama_cpp

DEVICE_TYPE_CPU = 0  # enum ggml_backend_dev_type
_vp = ctypes.c_void_p
_SIGNATURES = {
    "ggml_backend_reg_by_name": ([ctypes.c_char_p], _vp),
    "ggml_backend_reg_get_proc_address": ([_vp, ctypes.c_char_p], _vp),
    "ggml_backend_register": ([_vp], None),
    "ggml_backend_reg_dev_count": ([_vp], ctypes.c_size_t),
    "ggml_backend_reg_dev_get": ([_vp, ctypes.c_size_t], _vp),
    "ggml_backend_dev_by_type": ([ctypes.c_int], _vp),
    "ggml_backend_dev_backend_reg": ([_vp], _vp),
    "ggml_backend_dev_name": ([_vp], ctypes.c_char_p),
    "ggml_backend_dev_description": ([_vp], ctypes.c_char_p),
    "ggml_backend_buft_name": ([_vp], ctypes.c_char_p),
    "ggml_set_abort_callback": ([_vp], _vp),
}


@functools.lru_cache(maxsize=None)
def ggml_fn(name: str) -> Any:
    """A ggml function, typed: looked up through libllama first (dlsym searches a library's dependencies), then
    in libggml itself (Windows' GetProcAddress does not search dependencies). AttributeError if neither has it."""
    argtypes, restype = _SIGNATURES[name]
    fn = getattr(llama_cpp.llama_cpp._lib, name, None)
    if fn is None:
        from llama_cpp import _ggml as ggml_lib  # libggml itself, loaded by llama-cpp-python
        fn = getattr(ggml_lib.libggml, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn
