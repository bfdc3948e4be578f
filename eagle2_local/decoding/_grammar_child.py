"""The child process of :func:`eagle2_local.decoding.grammar_screen.compile_isolated`: compile one grammar with llama.cpp
under an address-space limit, and say by the exit status whether llama.cpp took it.

Run as a script (``python -I -S _grammar_child.py LIBLLAMA ROOT LIMIT_BYTES``, the GBNF on stdin): it imports
only the standard library and loads libllama with ctypes, so it starts in under 0.1 s. A grammar that hangs
llama.cpp is killed by the parent's timeout; one that needs too much memory fails an allocation here (an abort);
one that overflows the C stack crashes here. None of that reaches the parent. The child says ``compiling`` on
stdout once its limit is set, so the parent tells a failure of the grammar from a child that could not start.

Run as ``python -I -S _grammar_child.py --schema LLAMA_GRAMMAR_PY LIMIT_BYTES MAX_OUT`` (the JSON schema on stdin),
it turns a schema into GBNF with :mod:`.grammar_schema` under the same limit and writes the GBNF after
``compiling``: a schema that makes the converter allocate gigabytes, recurse or loop costs this child only. A
GBNF over ``MAX_OUT`` bytes is refused here, so the parent never reads more.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import resource
import sys

ACCEPTED, REFUSED = 0, 3
COMPILING = b"compiling\n"  # written once the limit is set: any failure after it is the grammar's doing


def _vm_bytes() -> int:
    """This process's address space now (the interpreter and libllama, mapped)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit(limit: int) -> None:
    """No core file; the address space capped at what is mapped now plus ``limit``; then say ``compiling``."""
    vm = _vm_bytes()
    if vm:  # the limit is what the work may add to what is mapped already
        resource.setrlimit(resource.RLIMIT_AS, (vm + limit, vm + limit))
    sys.stdout.buffer.write(COMPILING)
    sys.stdout.buffer.flush()


def convert(llama_grammar_file: str, limit: int, max_out: int) -> int:
    """The schema on stdin as GBNF on stdout (after ``compiling``); the converter's complaint on stderr.
    llama-cpp-python's ``llama_grammar.py`` is loaded by its path (its package would load libllama), and this
    folder's ``grammar_schema`` (standard library only) as a top-level module."""
    text = sys.stdin.buffer.read().decode("utf-8")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    spec = importlib.util.spec_from_file_location("llama_grammar", llama_grammar_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules["llama_grammar"] = module
    spec.loader.exec_module(module)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import grammar_schema  # noqa: E402 - only once the path holds it

    _limit(limit)
    try:
        gbnf = grammar_schema.schema_to_gbnf(text).encode("utf-8")
    except MemoryError:
        sys.stderr.write("bad_alloc: the conversion ran out of memory\n")
        return REFUSED
    except RecursionError:
        sys.stderr.write("the schema nests too deep for the converter\n")
        return REFUSED
    except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions of several kinds
        sys.stderr.write(" ".join(str(exc).split())[:300] or type(exc).__name__)
        return REFUSED
    if len(gbnf) > max_out:
        sys.stderr.write(f"the grammar it makes is {len(gbnf)} bytes; the limit is {max_out}")
        return REFUSED
    sys.stdout.buffer.write(gbnf)
    return ACCEPTED


def main(lib_path: str, root: str, limit: int) -> int:
    text = sys.stdin.buffer.read()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort or a crash leaves no core file behind
    lib = ctypes.CDLL(lib_path)
    init = lib.llama_sampler_init_grammar
    init.restype = ctypes.c_void_p
    init.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    free = lib.llama_sampler_free
    free.argtypes = [ctypes.c_void_p]
    _limit(limit)
    ptr = init(None, text, root.encode("utf-8"))  # no vocabulary: named tokens were replaced by <[0]>
    if not ptr:
        return REFUSED
    free(ptr)
    return ACCEPTED


if __name__ == "__main__":
    if sys.argv[1] == "--schema":
        sys.exit(convert(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
