"""What a grammar goes through before llama.cpp compiles it in this process (issue 45: one request must not hang,
bloat or kill the server, nor the CLI or a program using the API).

1. :func:`~eagle2_local.decoding.grammar_check.check_gbnf`, a validator in pure Python: the length, the nesting, the
   expanded size, left recursion behind rules that match nothing, parse-path blow-ups, dead ends. It refuses
   every form known to hang or crash llama.cpp, in milliseconds.
2. :func:`compile_isolated`: llama.cpp compiles the grammar in a child process, with a wall-clock limit
   (:data:`PROBE_TIMEOUT_S`) and an address-space limit (:data:`PROBE_MEMORY_BYTES`), neither of which can be
   enforced on C code running in this process. A form the validator does not know then costs a child, not this
   process. The child loads only libllama (no Python package), so it takes about 0.1 s.

Both run for every grammar at every entry point (the server, ``generate``/``chat`` and the Python API: all
compile through :meth:`eagle2_local.decoding.grammar.Grammar.state`), the first time a text is seen: verdicts are cached
by the text's hash (:data:`CACHE_SIZE` of them), so a grammar used for every request, or the same JSON schema
sent again, costs a dictionary lookup. 0.1 s once per distinct grammar is cheap next to what a grammar is for
(a generation), and it keeps the three entry points' guarantees the same; the test suite, which compiles a few
dozen distinct grammars, pays a few seconds.

Where no child can be started (no usable ``sys.executable``, say an embedding interpreter), the validator alone
stands and a warning says so once.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from .grammar_check import MAX_GRAMMAR_BYTES, check_gbnf
from .grammar_parse import GrammarError

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
"""A grammar llama.cpp cannot set up in 3 s is refused: real ones take milliseconds (a 256 KB grammar, the
validator's limit, about 50 ms); the known hang grows memory by ~70 MB/s, so the memory limit may end it first."""
PROBE_MEMORY_BYTES = 512 << 20
"""Address space compiling may add in the child: the largest grammar the validator lets through (a million
elements, about 8 MB a copy) needs well under 100 MB."""
MAX_PROBES = 2  # children at once: a burst of new grammars cannot fork the machine out of memory
PROBE_WAIT_S = 10.0  # how long a check waits for a free slot before it is refused as busy
CACHE_SIZE = 512

_CHILD = Path(__file__).with_name("_grammar_child.py")
_ACCEPTED, _REFUSED = 0, 3  # the child's exit statuses (see _grammar_child.py)
_COMPILING = b"compiling\n"  # the child's first line on stdout once its limit is set (see _grammar_child.py)
# what running out of the child's memory prints: the C++ exception, or glibc's abort (exit 127) where the first
# use of a library's thread-local data after the limit finds no memory
_OUT_OF_MEMORY = ("bad_alloc", "cannot allocate memory")
_slots = threading.BoundedSemaphore(MAX_PROBES)
_verdicts: OrderedDict[bytes, str] = OrderedDict()  # hash -> "checked" / "isolated" / a refusal's message
_schemas: OrderedDict[bytes, tuple[bool, str]] = OrderedDict()  # hash -> (True, GBNF) / (False, why not)
_verdicts_lock = threading.Lock()
_warned = threading.Event()


class GrammarCheckBusy(GrammarError):
    """Too many new grammars are being checked at once: nothing is wrong with this one; retry."""


def screen_gbnf(text: str, root: str = "root") -> None:
    """Refuse ``text`` (a :class:`GrammarError`, one line) unless the validator passes it and llama.cpp compiled
    it in a child within the limits (where no child can run, the validator's word stands). Cached: a text already
    judged costs a lookup."""
    verdict = _cached(_verdicts, f"{root}\0{text}", lambda: _judge(text, root))
    if verdict not in ("checked", "isolated"):
        raise GrammarError(verdict)


def schema_gbnf(text: str, where: str, judge: Callable[[], None]) -> str:
    """The GBNF of the JSON schema ``text``: first ``judge()`` (the bounds, which raises a :class:`GrammarError`
    naming ``where``), then :mod:`.grammar_schema` in a memory- and time-limited child (in this process only
    where no child can run). Cached like the grammars' verdicts: a schema sent again costs a lookup, neither a
    second judgement nor a second conversion."""
    def convert() -> tuple[bool, str]:
        try:
            judge()
        except GrammarError as exc:
            return False, str(exc)
        return _convert(text)

    ok, gbnf_or_why = _cached(_schemas, f"schema\0{where}\0{text}", convert)
    if not ok:
        raise GrammarError(gbnf_or_why if gbnf_or_why.startswith(where) else f"{where}: {gbnf_or_why}")
    return gbnf_or_why


def _cached(cache: OrderedDict, text: str, make: Callable):
    """``cache``'s entry for ``text`` (by its hash), made by ``make()`` the first time; the last
    :data:`CACHE_SIZE` kept. ``make`` runs outside the lock: two threads may both judge a new text."""
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    with _verdicts_lock:
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
            return value
    value = make()
    with _verdicts_lock:
        cache[key] = value
        while len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
    return value


def _convert(text: str) -> tuple[bool, str]:
    """(True, the GBNF) or (False, why not), for the cache; a busy refusal is raised, not cached."""
    try:
        proc = _run_child(["--schema", _llama_grammar_file(), str(PROBE_MEMORY_BYTES), str(MAX_GRAMMAR_BYTES)],
                          text, "the JSON schema could not be turned into a grammar")
        if proc is None:  # no child: the bounds were checked, convert here
            from .grammar_schema import schema_to_gbnf

            try:
                return True, schema_to_gbnf(text)
            except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions of several kinds
                return False, f"unsupported JSON schema: {exc}"
        out = proc.stdout
        if proc.returncode == _ACCEPTED and out.startswith(_COMPILING):
            return True, out[len(_COMPILING):].decode("utf-8")
        err = " ".join(proc.stderr.decode("utf-8", "replace").split())[-300:]
        if any(word in err for word in _OUT_OF_MEMORY) or proc.returncode < 0:
            return False, (f"unsupported JSON schema: turning it into a grammar needs more than "
                           f"{PROBE_MEMORY_BYTES >> 20} MB; simplify it")
        return False, f"unsupported JSON schema: {err or f'the converter failed (exit {proc.returncode})'}"
    except GrammarCheckBusy:
        raise
    except GrammarError as exc:
        return False, str(exc)


def _llama_grammar_file() -> str:
    from llama_cpp import llama_grammar

    return llama_grammar.__file__


def _judge(text: str, root: str) -> str:
    """The verdict on a text not judged yet: "checked" (validator), "isolated" (and a child), or why not."""
    try:
        summary = check_gbnf(text, root)
        if compile_isolated(summary.probe_text, root):
            return "isolated"
        return "checked"
    except GrammarCheckBusy:
        raise  # says nothing about the grammar: not cached
    except GrammarError as exc:
        return str(exc)


def compile_isolated(text: str, root: str = "root", timeout_s: float = PROBE_TIMEOUT_S,
                     memory_bytes: int = PROBE_MEMORY_BYTES) -> bool:
    """Compile ``text`` with llama.cpp in a child process (no vocabulary: named tokens must already be
    ``<[id]>``). Raises :class:`GrammarError` when llama.cpp refuses it, runs past ``timeout_s``, runs out of
    ``memory_bytes`` or crashes; returns False when no child could be run (the caller relies on the validator)."""
    lib = _libllama()
    if lib is None:
        return False
    proc = _run_child([lib, root, str(memory_bytes)], text, "llama.cpp could not set the grammar up", timeout_s)
    return False if proc is None else _read_outcome(proc, memory_bytes)


def _run_child(args: list[str], text: str, what: str,
               timeout_s: float = PROBE_TIMEOUT_S) -> subprocess.CompletedProcess | None:
    """Run :mod:`._grammar_child` with ``args`` and ``text`` on stdin, one of :data:`MAX_PROBES` at once; None
    where no child can run. A child past ``timeout_s`` is killed and refused (``what`` it could not do)."""
    if not sys.executable:
        _unavailable("no Python executable to run a child with")
        return None
    if not _slots.acquire(timeout=PROBE_WAIT_S):
        raise GrammarCheckBusy(f"too many new grammars are being checked at once; retry in {PROBE_WAIT_S:.0f} s")
    try:
        return subprocess.run([sys.executable, "-I", "-S", str(_CHILD), *args], input=text.encode("utf-8"),
                              capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:  # run() has killed the child
        raise GrammarError(f"{what} within {timeout_s:g} s (a form that makes it loop); simplify it") from None
    except OSError as exc:
        _unavailable(f"cannot start a child process ({exc})")
        return None
    finally:
        _slots.release()


def _read_outcome(proc: subprocess.CompletedProcess, memory_bytes: int) -> bool:
    """The child's verdict: True (llama.cpp took the grammar), a GrammarError (llama.cpp refused it, ran out of
    the child's memory, crashed or failed otherwise while compiling), or False where the child failed before it
    began compiling (the validator alone stands). How an allocation failure shows depends on the build: a
    bad_alloc on one, glibc's thread-local-data abort (exit 127) on another."""
    err = proc.stderr.decode("utf-8", "replace")
    code = proc.returncode
    if code == _ACCEPTED:
        return True
    compiling = proc.stdout.startswith(_COMPILING)
    if (code == _REFUSED or code < 0 or compiling) and any(word in err for word in _OUT_OF_MEMORY):
        raise GrammarError(f"llama.cpp needs more than {memory_bytes >> 20} MB to set the grammar up; simplify it")
    if code == _REFUSED:
        raise GrammarError(f"invalid grammar: {parse_error(err.splitlines(), '')}")
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else "a signal"
        raise GrammarError(f"llama.cpp crashed setting the grammar up ({name}); simplify it")
    if compiling:
        raise GrammarError(f"llama.cpp failed setting the grammar up (exit {code}); simplify it")
    _unavailable(f"the child process failed before compiling (exit {code}: {err.strip()[-200:]})")
    return False


def _libllama() -> str | None:
    """The path of the libllama llama-cpp-python loaded (the very library this process compiles with)."""
    if not sys.executable:
        _unavailable("no Python executable to run a child with")
        return None
    import llama_cpp.llama_cpp as bindings

    return getattr(bindings._lib, "_name", None) or None


def _unavailable(why: str) -> None:
    if not _warned.is_set():
        _warned.set()
        log.warning("grammars are checked by the validator only: %s", why)


def parse_error(printed: list[str], logged: str) -> str:
    """One line from what llama.cpp's grammar parser printed: its reason and where (``expecting ')' at:
    root ::= (``)."""
    for i, line in enumerate(printed):
        if "error parsing grammar:" in line:
            where = next((x.strip() for x in printed[i + 1:] if x.strip()), "")
            reason = line.split("error parsing grammar:", 1)[1].strip().rstrip(" at").strip()
            return f"{reason} at: {where[:60]}" if where else reason
    lines = [x for x in printed + logged.splitlines() if x.strip()]
    return lines[-1].strip() if lines else "llama.cpp could not parse it"
