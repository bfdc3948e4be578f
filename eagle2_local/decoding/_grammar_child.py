"""The child process of :func:`eagle2_local.decoding.grammar_screen.compile_isolated`: compile one grammar with llama.cpp
under an address-space limit, and say by the exit status whether llama.cpp took it.

Run as a script (``python -I -S _grammar_child.py LIBLLAMA ROOT LIMIT_BYTES``, the GBNF on stdin): it imports
only the standard library and loads libllama with ctypes, so it starts in under 0.1 s. A grammar that hangs
llama.cpp is killed by the parent's timeout; one that needs too much memory fails an allocation here (an abort);
one that overflows the C stack crashes here. None of that reaches the parent. The child says ``compiling`` on
stdout once its limit is set, so the parent tells a failure of the grammar from a child that could not start.
"""

from __future__ import annotations

import ctypes
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


def main(lib_path: str, root: str, limit: int) -> int:
    text = sys.stdin.buffer.read()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort or a crash leaves no core file behind
    lib = ctypes.CDLL(lib_path)
    init = lib.llama_sampler_init_grammar
    init.restype = ctypes.c_void_p
    init.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    free = lib.llama_sampler_free
    free.argtypes = [ctypes.c_void_p]
    vm = _vm_bytes()
    if vm:  # the limit is what compiling may add to what is mapped already
        resource.setrlimit(resource.RLIMIT_AS, (vm + limit, vm + limit))
    sys.stdout.buffer.write(COMPILING)
    sys.stdout.buffer.flush()
    ptr = init(None, text, root.encode("utf-8"))  # no vocabulary: named tokens were replaced by <[0]>
    if not ptr:
        return REFUSED
    free(ptr)
    return ACCEPTED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
