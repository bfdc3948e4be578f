"""llama.cpp in this process: set up once, its log captured (the lines that explain a failed load or decode), and
the seconds each thread spends inside it (a round's host time is its wall time minus these).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time

import llama_cpp

from . import cpu_buffers

log = logging.getLogger(__name__)

_recent_errors: collections.deque[str] = collections.deque(maxlen=20)
_n_errors = 0  # warning/error lines llama.cpp has printed so far (a mark for errors_since)
_log_lock = threading.Lock()
_verbose = False
_LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_LEVEL_WARN = 3


@llama_cpp.llama_log_callback
def _log_callback(level, text, _user_data):  # pragma: no cover - called from C
    msg = text.decode("utf-8", errors="replace") if text else ""
    global _n_errors
    if level >= _LEVEL_WARN and msg.strip():
        with _log_lock:
            _recent_errors.append(msg.strip())
            _n_errors += 1
    if _verbose:
        import sys
        sys.stderr.write(msg)
    else:
        log.debug("llama.cpp: %s", msg.rstrip())


_backend_ready = False


def ensure_backend(verbose: bool = False) -> None:
    """Initialise llama.cpp once per process, route its log through Python logging and leave out the weight
    buffers that crash (:mod:`.cpu_buffers`)."""
    global _backend_ready, _verbose
    _verbose = verbose
    if _backend_ready:
        return
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    cpu_buffers.keep_amx_out()
    _backend_ready = True


def last_llama_errors() -> str:
    """The most recent warning/error lines llama.cpp printed (to explain a failed load or decode)."""
    with _log_lock:
        lines = list(_recent_errors)
        _recent_errors.clear()
    return "; ".join(lines[-3:])


def error_mark() -> int:
    """How many warning/error lines llama.cpp has printed so far: a mark for :func:`errors_since`."""
    return _n_errors


def errors_since(mark: int) -> str:
    """The warning/error lines llama.cpp printed after ``mark`` (an earlier :func:`error_mark`): what a failed
    decode says, without clearing the log before every decode (a lock and a list each time, ~10 a round)."""
    with _log_lock:
        lines = list(_recent_errors)[len(_recent_errors) - min(_n_errors - mark, len(_recent_errors)):]
        _recent_errors.clear()
    return "; ".join(lines[-3:])


def system_info() -> str:
    """llama.cpp's build/backend description (for benchmark records)."""
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


_busy = threading.local()  # .s: seconds this thread spent in timed llama.cpp calls


def llama_seconds() -> float:
    """Seconds the calling thread has spent inside llama.cpp through :class:`~.llama.LlamaContext` (decode, encode,
    KV-memory calls and the output fetches that wait for a backend), since the thread started.

    A generation reads it at the marks of its round clock: the round's wall time minus this is the host's own
    work (numpy, Python), which a GPU does not speed up. Kept per thread rather than per context because a round
    spans the target's and the draft's contexts, and a generation runs on one thread: one float to read, no
    list of contexts to keep, and another thread's generation does not leak into it."""
    return getattr(_busy, "s", 0.0)


def charge_llama(t0: float) -> None:
    """Add the time since ``t0`` (``time.perf_counter``) to this thread's llama.cpp seconds."""
    _busy.s = getattr(_busy, "s", 0.0) + (time.perf_counter() - t0)


def host_inside_llama(seconds: float) -> None:
    """Count ``seconds`` spent in our own Python *inside* a llama.cpp call (callbacks such as the in-graph
    top-k's graph building) as host time: they run on the host before the graph does, on a GPU too."""
    _busy.s = getattr(_busy, "s", 0.0) - seconds
