"""Run numpy's BLAS on one thread while a numpy draft engine computes.

Measured on the 2-core machine: with OpenBLAS's default thread count, the numpy EAGLE engine's small matmuls
(4-10 rows) next to llama.cpp's thread pool took 4.7x longer (SmolLM2 head, draft 8.6 s vs 1.8 s for the same
24 tokens): the BLAS threads spin against llama.cpp's. One BLAS thread is also what makes results independent of
the machine's core count. Best effort: wheels of numpy bundle OpenBLAS under a few symbol names; anything else
(MKL, Accelerate) is left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
from typing import Iterator

log = logging.getLogger(__name__)

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")


def _find_openblas():
    import numpy
    libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs, "*openblas*"))):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: this returns the same handle
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and set_ is not None:
                    return get, set_
    log.debug("no bundled OpenBLAS found; BLAS thread count left as it is")
    return None


_OPENBLAS = _find_openblas()


@contextlib.contextmanager
def single_blas_thread() -> Iterator[None]:
    """Inside the block numpy's OpenBLAS uses one thread; the previous count is restored afterwards."""
    if _OPENBLAS is None:
        yield
        return
    get, set_ = _OPENBLAS
    before = int(get())
    set_(1)
    try:
        yield
    finally:
        set_(before)
