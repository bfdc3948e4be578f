"""Constrained output: llama.cpp's own grammar engine (GBNF) through its C API, and JSON schemas turned into GBNF
by the converter llama-cpp-python ships, so answers follow exactly the rules llama-server and llama-cpp-python
apply (``grammar``, ``json_schema``, ``response_format``).

A :class:`GrammarState` is one parse position: it says which tokens may come next and advances by one token.
Sampling under a grammar masks the disallowed tokens of the target's logits before the usual warpers, as
llama.cpp does; greedy decoding first checks the unconstrained argmax (microseconds) and builds the full mask
only when the grammar refuses it (milliseconds over a whole vocabulary: NOTES.md#structured-output-and-tools).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF

from ..llamacpp.llama import LlamaModel
from ..llamacpp.runtime import last_llama_errors
from ..tree.sampling import SamplingParams
from .grammar_parse import GrammarError
from .grammar_bounds import check_schema
from .grammar_screen import parse_error, schema_gbnf, screen_gbnf

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
STEP_LIMIT_S = 1.0
"""The longest one grammar operation (a mask, an accept) may take before the generation is ended. A grammar
ambiguous under recursion (``root ::= "x" root "y" | "x" root "z" | ""``) passes every static check, but llama.cpp
keeps one parse stack per reading, so each token multiplies them: measured, the 12th accepted "x" took 4 s and
the 13th 37 s. Real grammars take milliseconds; ending at the first step past 1 s bounds the damage to a few
seconds (the step after a 1 s one costs a few times more, the growth factor per token) instead of hours."""

__all__ = ["Grammar", "GrammarError", "GrammarState", "choose", "response_grammar"]


@dataclass(frozen=True)
class Grammar:
    """GBNF text with its start rule; :meth:`state` compiles it for a model's vocabulary."""

    gbnf: str
    root: str = "root"

    @classmethod
    def from_json_schema(cls, schema: dict | str, where: str = "schema") -> "Grammar":
        """The GBNF of a JSON schema (refused in one line, naming ``where`` and the field, when it cannot be):
        its counts and size judged before anything is expanded (:mod:`.grammar_bounds`), then converted with
        correct literals (:mod:`.grammar_schema`) in a memory-limited child, cached by the schema's text."""
        text = schema if isinstance(schema, str) else _schema_text(schema, where)
        return cls(schema_gbnf(text, where, lambda: _judge_schema(text, where)))

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (``response_format={"type": "json_object"}``)."""
        return cls(JSON_GBNF)

    def state(self, model: LlamaModel) -> "GrammarState":
        """A parse at the grammar's start, over ``model``'s vocabulary. The text first passes the screens of
        :mod:`eagle2_local.decoding.grammar_screen` (validator, then a compile in a child process; cached), so that no
        grammar can hang, bloat or crash this process in llama.cpp."""
        screen_gbnf(self.gbnf, self.root)
        last_llama_errors()
        with _c_stderr() as printed:
            ptr = llama_cpp.llama_sampler_init_grammar(model.vocab, self.gbnf.encode("utf-8"),
                                                       self.root.encode("utf-8"))
        if not ptr:
            raise GrammarError(f"invalid grammar: {parse_error(printed, last_llama_errors())}")
        return GrammarState(ptr, model.n_vocab)

    def check(self, model: LlamaModel) -> None:
        """Refuse, before a request is queued or a model loads for generation, what would only fail later: a
        grammar that does not compile, or one that allows no token of ``model``'s vocabulary (nor the end) at
        its start (e.g. only a token id beyond the vocabulary). One mask over the vocabulary: milliseconds."""
        state = self.state(model)
        try:
            if not state.mask().any():
                raise GrammarError("the grammar allows no token of this model's vocabulary at its start")
        finally:
            state.close()


def _judge_schema(text: str, where: str) -> None:
    """Refuse a schema text that is not a JSON object, or whose bounds :func:`check_schema` refuses."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{where}: the JSON schema is not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise GrammarError(f"{where}: the schema nests too deep") from None
    if not isinstance(parsed, dict):
        raise GrammarError(f"{where}: a JSON schema must be an object")
    check_schema(parsed, where)


def _schema_text(schema: dict, where: str) -> str:
    try:
        return json.dumps(schema, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise GrammarError(f"{where}: the schema is not JSON (or nests too deep)") from None


_STDERR_LOCK = threading.Lock()  # fd 2 is process-wide: two threads redirecting it at once would lose it


@contextlib.contextmanager
def _c_stderr() -> Iterator[list[str]]:
    """Capture what C code writes to file descriptor 2 meanwhile: llama.cpp's grammar parser prints its errors
    there (not through the log callback), several lines that would break a one-line error. One thread at a
    time (the server compiles grammars on worker threads)."""
    lines: list[str] = []
    sys.stderr.flush()
    with _STDERR_LOCK, tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", "replace").splitlines())


class GrammarState:
    """One position in a grammar: which tokens may come next (:meth:`allows`, :meth:`mask`), and :meth:`accept`."""

    def __init__(self, ptr, n_vocab: int) -> None:
        self._ptr = ptr
        self.n_vocab = n_vocab
        self._buf = np.zeros(0, dtype=TOKEN_DATA)  # grown on demand: a tree clones a state per drafted node

    def _apply(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the grammar allows now (llama.cpp sets a refused entry's logit to -inf)."""
        if len(self._buf) < len(ids):
            self._buf = np.zeros(len(ids), dtype=TOKEN_DATA)
        buf = self._buf[:len(ids)]
        buf["id"] = ids
        buf["logit"] = 0.0
        arr = llama_cpp.llama_token_data_array(data=buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
                                               size=len(ids), selected=-1, sorted=False)
        t0 = time.perf_counter()
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(arr))
        _check_step(time.perf_counter() - t0)
        return np.isfinite(buf["logit"])

    def allows(self, token: int) -> bool:
        return bool(self._apply(np.array([token], dtype=np.int32))[0])

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """A boolean per entry of ``ids``: allowed next (ids outside the vocabulary never are). One call for all
        of them: checking a tree row's candidates costs microseconds, the whole vocabulary milliseconds."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        inside = (ids >= 0) & (ids < self.n_vocab)
        out = np.zeros(len(ids), dtype=bool)
        if inside.any():
            out[inside] = self._apply(ids[inside].astype(np.int32))
        return out

    def mask(self) -> np.ndarray:
        """A boolean vector over the vocabulary: the tokens allowed next."""
        return self._apply(np.arange(self.n_vocab, dtype=np.int32))

    def constrain(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every disallowed token at -inf (a copy)."""
        allowed = self.mask()
        if not allowed.any():
            raise GrammarError("the grammar allows no token here (it cannot be completed)")
        return np.where(allowed, logits, -np.inf)

    def accept(self, token: int) -> None:
        t0 = time.perf_counter()
        llama_cpp.llama_sampler_accept(self._ptr, int(token))
        _check_step(time.perf_counter() - t0)

    def clone(self) -> "GrammarState":
        return GrammarState(llama_cpp.llama_sampler_clone(self._ptr), self.n_vocab)

    def close(self) -> None:
        if self._ptr:
            llama_cpp.llama_sampler_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _check_step(elapsed_s: float) -> None:
    if elapsed_s > STEP_LIMIT_S:
        raise GrammarError(f"following the grammar took {elapsed_s:.1f} s for one token (its parses multiply "
                           "with each token: an ambiguous recursion); stopped")


def choose(sampling: SamplingParams, grammar: GrammarState | None, logits: np.ndarray, history: np.ndarray,
           rng: np.random.Generator) -> int:
    """The next token under ``grammar`` (None: unconstrained): the warpers applied to the logits with every
    disallowed token masked, as llama.cpp samples under a grammar. Greedy takes the unconstrained argmax when the
    grammar allows it (masking only removes tokens, so it is the constrained argmax too) and masks only if not."""
    if grammar is None:
        return sampling.choose(logits, history, rng)
    if sampling.greedy:
        token = sampling.choose(logits, history, rng)
        if grammar.allows(token):
            return token
    return sampling.choose(grammar.constrain(logits), history, rng)


def response_grammar(grammar: str | Grammar | None = None, json_schema: dict | None = None,
                     response_format: dict | None = None) -> Grammar | None:
    """The one constraint a request names: GBNF text (or a ready :class:`Grammar`), a JSON schema, or an OpenAI
    ``response_format`` (``{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}}``);
    None: free text."""
    if response_format is not None and response_format.get("type", "text") == "text":
        response_format = None  # free text, OpenAI's default
    if sum(g is not None for g in (grammar, json_schema, response_format)) > 1:
        raise GrammarError("give one of grammar, json_schema and response_format")
    if isinstance(grammar, Grammar):
        return grammar
    if grammar is not None:
        if not grammar.strip():
            raise GrammarError("the grammar is empty")
        return Grammar(grammar)
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema, "json_schema")
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_object":
            schema = response_format.get("schema")  # llama-cpp-python's extension
            return Grammar.from_json_schema(schema, "response_format.schema") if schema else Grammar.json_object()
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise GrammarError("response_format json_schema needs {\"json_schema\": {\"schema\": {...}}}")
            return Grammar.from_json_schema(spec["schema"], "response_format.json_schema.schema")
        raise GrammarError(f"response_format type {kind!r} is not one of text, json_object, json_schema")
    return None
