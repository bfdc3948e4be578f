"""Bindings for llama.cpp's staging API (``src/llama-ext.h``) that llama-cpp-python does not bind.

These functions are compiled as C++ (no ``extern "C"``), so the shared library exports them under mangled names;
we look each one up under its Itanium (Linux/macOS) and MSVC (Windows) spelling, the way
``llama_cpp.llama_cpp_ext`` binds its own symbols. A missing symbol raises :class:`ModelError` on first use
instead of at import, so builds without these symbols can still run plain decoding and draft models.

Why they matter: EAGLE-3 heads read the *residual inputs* of three target layers. llama.cpp computes them in the
target's decode and copies them out (one row per batch token, batch order) only for layers switched on here.
Switching a layer on for an architecture whose graph does not record layer inputs aborts the process, so
:data:`LAYER_INPUT_ARCHS` lists the architectures whose graphs do (read from ``src/models/*.cpp``).

MTP (NextN) drafts read the *nextn embeddings*: the target's post-norm hidden state of every batch token (what a
model's MTP layer reads beside the next token), and the same of the MTP context's own outputs (what a deeper draft
step reads). :func:`set_nextn` switches them on; llama.cpp copies them out per batch token ("unmasked") or per
output row ("masked").
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable

import llama_cpp
import numpy as np

from ..errors import ModelError

# Architectures whose llama.cpp graph stores ``res->t_layer_inp[il]`` (llama-cpp-python 0.3.36).
LAYER_INPUT_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen4exp", "gemma4", "gpt-oss", "minimax-m2", "mimo2", "deepseek4",
    "nanbeige", "hunyuan_vl", "bailingmoe3", "muse-glimmer",
})

_ctx_p = llama_cpp.llama_context_p_ctypes

# name -> (mangled spellings, argtypes, restype)
_SYMBOLS: dict[str, tuple[tuple[str, ...], list[Any], Any]] = {
    "llama_set_embeddings_layer_inp": (
        ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
         "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"),
        [_ctx_p, ctypes.c_uint32, ctypes.c_bool], None),
    "llama_get_embeddings_layer_inp": (
        ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
         "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"),
        [_ctx_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)),
    "llama_set_embeddings_nextn": (
        ("llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb",
         "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z"),
        [_ctx_p, ctypes.c_bool, ctypes.c_bool], None),
    "llama_get_embeddings_nextn": (
        ("llama_get_embeddings_nextn", "_Z26llama_get_embeddings_nextnP13llama_context",
         "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z"),
        [_ctx_p], ctypes.POINTER(ctypes.c_float)),
    "llama_get_embeddings_nextn_ith": (
        ("llama_get_embeddings_nextn_ith", "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
         "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z"),
        [_ctx_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)),
}


@functools.lru_cache(maxsize=None)
def _function(name: str) -> Callable:
    spellings, argtypes, restype = _SYMBOLS[name]
    lib = llama_cpp.llama_cpp._lib
    for spelling in spellings:
        fn = getattr(lib, spelling, None)
        if fn is not None:
            fn.argtypes = argtypes
            fn.restype = restype
            return fn
    needed = "MTP drafts" if "nextn" in name else "EAGLE-3 heads"
    raise ModelError(f"this llama.cpp build does not export {name} (needed for {needed}); "
                     f"llama-cpp-python {llama_cpp.__version__} from source exports it")


def set_layer_input(ctx, layer: int, enable: bool) -> None:
    """Switch extraction of layer ``layer``'s residual input on or off (takes effect at the next decode)."""
    _function("llama_set_embeddings_layer_inp")(ctx, layer, enable)


def set_nextn(ctx, enable: bool, masked: bool = False) -> None:
    """Switch the nextn embeddings on or off: ``masked`` False, one row per batch token in batch order (a target
    feeding an MTP draft, every token's row); True, one row per output (takes effect at the next decode)."""
    _function("llama_set_embeddings_nextn")(ctx, enable, masked)


def nextn_ptr(ctx):
    """llama.cpp's buffer of the last decode's nextn embeddings (it waits for a GPU to finish); NULL when off."""
    return _function("llama_get_embeddings_nextn")(ctx)


def nextn_row_ptr(ctx, i: int):
    """One row of the last decode's nextn embeddings (batch index unmasked, output index masked); NULL when out
    of range."""
    return _function("llama_get_embeddings_nextn_ith")(ctx, i)


_views: dict[tuple, np.ndarray] = {}  # (address, shape, pointer type) -> a view of llama.cpp's buffer


def address(ptr) -> int | None:
    """The address a ctypes pointer holds (None: NULL), read from the pointer's own bytes. Not
    ``ctypes.cast(ptr, c_void_p)``: a cast leaves a reference cycle (the result and its keep-alive dict), two
    objects for the garbage collector at every call, and every decode reads a few of these."""
    return ctypes.c_void_p.from_buffer(ptr).value


def buffer_view(ptr, shape: tuple[int, ...]) -> np.ndarray:
    """A numpy view (no copy) of ``shape`` at a llama.cpp output buffer (logits, hidden states, layer inputs),
    valid until the next decode. Views are kept per address and shape: llama.cpp reuses its buffers, and making a
    view (``np.ctypeslib.as_array``, ~4 us) costs more than copying a plain step's row."""
    key = (address(ptr), shape, type(ptr))
    view = _views.get(key)
    if view is None:
        if len(_views) > 256:
            _views.clear()
        view = _views[key] = np.ctypeslib.as_array(ptr, shape=shape)
    return view


def layer_input_ptr(ctx, layer: int):
    """llama.cpp's buffer of ``layer``'s residual inputs for the last decode (it waits for a GPU to finish)."""
    return _function("llama_get_embeddings_layer_inp")(ctx, layer)


def layer_input_view(ptr, layer: int, n_tokens: int, n_embd: int) -> np.ndarray:
    """:func:`buffer_view` of the residual inputs of ``layer`` (``ptr``: :func:`layer_input_ptr`) for the last
    decode's ``n_tokens`` tokens (every plain step of the speculative loop reads three)."""
    if not ptr:
        raise ModelError(f"llama.cpp returned no layer input for layer {layer}")
    return buffer_view(ptr, (n_tokens, n_embd))
