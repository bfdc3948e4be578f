"""A draft row's top-k and log-normalizer computed inside llama.cpp's graph (backend sampling).

A draft tree needs, for every drafted row, its k best tokens and their log-probabilities: k values out of a
whole vocabulary (49k for SmolLM2, 151k for Qwen). Computed on the host that is a pass over every logit of
every row (~0.5 ms a tree level in numpy); inside the graph it is part of the draft's decode (free on a GPU),
and llama.cpp copies back only k token ids, k logits and k probabilities per row instead of the whole row.

How: llama.cpp applies a *backend sampler chain* per sequence to the logits of that sequence's output rows
while it builds the graph (``llama_sampler_i.backend_apply``). Our sampler adds four ggml operations per row:
``top_k`` (unordered indices), the row's ``soft_max``, and two ``get_rows`` gathering the k logits and the k
probabilities. The log-normalizer then follows from the best entry alone, exactly as the host computes it:
``lse = logit_best - log(p_best)`` (``p_best >= 1/V`` never underflows), and each log-probability is
``logit - lse`` in float64, as :func:`tree.top_k_log_probs` does. Only the float32 soft-max's own rounding
differs from the host's float64 sum (~1e-7 in a score).

A sampler is per sequence and llama.cpp calls every registered sampler's ``backend_apply`` at each graph build
(inactive ones on a dummy row). The callbacks are Python, so they return at once for a sequence that has no
output in the batch about to run (:meth:`BackendTopK.activate`): the cost is a few microseconds per sequence.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import time
from pathlib import Path

import llama_cpp
import numpy as np

from ..errors import ModelError
from .llama_ext import address
from .runtime import charge_llama, host_inside_llama

log = logging.getLogger(__name__)

_P = ctypes.c_void_p
_BACKEND_APPLY = ctypes.CFUNCTYPE(None, _P, _P, _P, _P)  # llama_sampler_i.backend_apply, untyped pointers

# Whether llama.cpp draft engines (EAGLE-3 heads, draft models) take each row's top-k and log-normalizer from
# the graph (True) or whole logit rows into numpy (False); None: decided per draft by :func:`in_graph_for`.
# benchmarks/host_time.py sets it for an A/B.
IN_GRAPH_TOP_K: bool | None = None


def in_graph_for(model) -> bool:
    """In the graph where the draft's layers run off the host (a GPU, Metal or RPC servers): there the top-k
    is nearly free and the host's numpy pass over whole rows is what limits a round. On a CPU-only run the
    numpy pass is the cheaper of the two (measured: a level of 10 head rows 9.4 ms with it, 10.7 ms in the
    graph), so rows come back whole there."""
    if IN_GRAPH_TOP_K is not None:
        return IN_GRAPH_TOP_K
    if model.n_gpu_layers == 0:
        return False
    return bool(model.rpc_servers) or bool(llama_cpp.llama_supports_gpu_offload())


class _TensorHead(ctypes.Structure):
    """The leading fields of ``struct ggml_tensor`` (ggml.h) up to the view source and offset."""

    _fields_ = [("type", ctypes.c_int), ("buffer", _P), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", _P * 10), ("view_src", _P), ("view_offs", ctypes.c_size_t)]


_I64 = ctypes.c_int64
_SIGNATURES = {
    "ggml_top_k": [_P, _P, ctypes.c_int], "ggml_soft_max": [_P, _P], "ggml_get_rows": [_P, _P, _P],
    "ggml_reshape_2d": [_P, _P, _I64, _I64], "ggml_reshape_3d": [_P, _P, _I64, _I64, _I64],
    "ggml_view_1d": [_P, _P, _I64, ctypes.c_size_t], "ggml_view_2d": [_P, _P, _I64, _I64, ctypes.c_size_t,
                                                                     ctypes.c_size_t],
}


@functools.lru_cache(maxsize=None)
def _ggml() -> ctypes.CDLL:
    """libggml-base from llama-cpp-python's own library folder (already loaded by libllama)."""
    # llama-cpp-python's own override (a separately built llama.cpp), else its package folder
    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        path = lib_dir / name
        if path.exists():
            lib = ctypes.CDLL(str(path))
            break
    else:
        raise ModelError(f"libggml-base not found in {lib_dir}; in-graph top-k needs llama-cpp-python's shared libs")
    for fn, argtypes in _SIGNATURES.items():
        f = getattr(lib, fn)
        f.argtypes = argtypes
        f.restype = _P
    return lib


class BackendTopK:
    """In-graph top-k + log-normalizer for the output rows of chosen sequences of one llama.cpp context.

    llama.cpp hands each sequence's sampler one row (a view of the batch's logit matrix); the operations are
    built once per graph for all output rows of the batch (``_batched``), and each row's sampler returns views of
    its row: three small ctypes calls per row instead of seven."""

    def __init__(self, ctx, n_vocab: int, k: int, seq_ids: range) -> None:
        self.ctx = ctx
        self.n_vocab = n_vocab
        self.k = k
        self.active: frozenset[int] = frozenset()
        self.n_rows = 0  # output rows of the batch about to run
        # this graph's logit row stride and its batch-wide (top ids, top logits, top probs)
        self._batched: tuple[int, int, int, int] | None = None
        self.carrier: int | None = None  # the output row whose slots hold the whole batch's values (this graph)
        self._views: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._row_index = np.arange(256)[:, None]
        self._g = _ggml()
        self._keep: list = []  # callbacks and iface structs must outlive the context
        self.chains = []
        self._probing = True  # llama.cpp sizes its graph by building each chain once on a probe row
        for i, seq in enumerate(seq_ids):
            chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            llama_cpp.llama_sampler_chain_add(chain, self._sampler(seq, resets=i == 0))
            if not llama_cpp.llama_set_sampler(ctx, seq, chain):
                raise ModelError(f"llama.cpp cannot run the in-graph top-k for sequence {seq} on this backend")
            self.chains.append(chain)
        self._probing = False

    def _sampler(self, seq: int, resets: bool):
        """One sequence's sampler. llama.cpp resets every sampler before building a graph's sampling part, so
        one of them (``resets``) is enough to mark a new graph."""
        def backend_init(_smpl, _buft, _n_out):
            return True

        def backend_reset(_smpl):
            self._batched = None
            self.carrier = None

        def backend_apply(_smpl, gctx, _gf, data_p):
            # an inactive sequence's call is timed by llama.cpp's clock: its own work is this test, and two more
            # clock reads would cost more than it (most calls are inactive: every registered sequence is called)
            if seq not in self.active and not self._probing:
                return
            t0 = time.perf_counter()
            if self._probing:
                self._build_row(gctx, llama_cpp.llama_sampler_data.from_address(data_p))
            else:
                self._build(gctx, llama_cpp.llama_sampler_data.from_address(data_p))
            host_inside_llama(time.perf_counter() - t0)

        def apply(_smpl, _cur_p):  # the CPU path: never used (the context reads our backend outputs)
            return

        iface = llama_cpp.llama_sampler_i()
        iface.apply = llama_cpp.llama_sampler_i_apply(apply)
        iface.backend_init = llama_cpp.llama_sampler_i_backend_init(backend_init)
        # every argument as a plain address: llama.cpp calls this for every sequence at every graph build, and
        # ctypes builds a pointer object per typed argument (the data pointer is read only for active rows)
        apply_fn = _BACKEND_APPLY(backend_apply)
        iface.backend_apply = ctypes.cast(apply_fn, llama_cpp.llama_sampler_i_backend_apply)
        if resets:
            iface.backend_reset = llama_cpp.llama_sampler_i_backend_reset(backend_reset)
        self._keep.append((iface, backend_init, apply_fn, backend_reset, apply))
        return llama_cpp.llama_sampler_init(ctypes.byref(iface), None)

    def _build_row(self, gctx, data) -> None:
        """One row's operations: its top-k ids, their k logits and k soft-max probabilities (the probe row, or
        a row that is not a view of a logit matrix)."""
        g, logits = self._g, data.logits
        n = int(np.prod(_TensorHead.from_address(logits).ne))  # the probe row is not vocabulary-wide
        top = g.ggml_top_k(gctx, logits, self.k)
        data.candidates = top
        data.logits = g.ggml_get_rows(gctx, g.ggml_reshape_2d(gctx, logits, 1, n), top)
        data.probs = g.ggml_get_rows(gctx, g.ggml_reshape_2d(gctx, g.ggml_soft_max(gctx, logits), 1, n), top)

    def _build(self, gctx, data) -> None:
        """The batch-wide top-k, built on the graph's first active row, which carries all of it (:attr:`carrier`)
        where it fits one row's slots; else views of each row's part."""
        head = _TensorHead.from_address(data.logits)
        if not head.view_src or self.n_rows < 1:
            self._build_row(gctx, data)
            return
        if self._batched is None:
            row_bytes = int(_TensorHead.from_address(head.view_src).nb[1])
            self._batched = (row_bytes, *self._build_batch(gctx, head.view_src, row_bytes))
            if self.n_rows * self.k <= self.n_vocab:  # llama.cpp copies at most a vocabulary per row and slot
                self.carrier = head.view_offs // row_bytes
                data.candidates, data.logits, data.probs = self._batched[1:]
                return
        if self.carrier is not None:  # this row's values travel in the carrier's slots
            data.logits = None
            return
        row_bytes, top, lg, pr = self._batched
        g, k, off = self._g, self.k, head.view_offs // row_bytes * self.k * 4
        data.candidates = g.ggml_view_1d(gctx, top, k, off)
        data.logits = g.ggml_view_1d(gctx, lg, k, off)
        data.probs = g.ggml_view_1d(gctx, pr, k, off)

    def _build_batch(self, gctx, matrix: int, row_bytes: int) -> tuple[int, int, int]:
        """top_k, soft_max and two get_rows over the batch's ``n_rows`` output rows of the logit matrix."""
        g, v, n = self._g, self.n_vocab, self.n_rows
        rows = g.ggml_view_2d(gctx, matrix, v, n, row_bytes, 0)  # without llama.cpp's padding row
        top = g.ggml_top_k(gctx, rows, self.k)  # (n, k) int32
        lg = g.ggml_get_rows(gctx, g.ggml_reshape_3d(gctx, rows, 1, v, n), top)  # (n, k, 1)
        pr = g.ggml_get_rows(gctx, g.ggml_reshape_3d(gctx, g.ggml_soft_max(gctx, rows), 1, v, n), top)
        return top, lg, pr

    def activate(self, seqs, n_rows: int) -> None:
        """The sequences whose output rows the next decode samples (all others skip their callbacks) and how
        many output rows it has."""
        self.active = frozenset(int(s) for s in seqs)
        self.n_rows = n_rows

    def read(self, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and float64 log-probabilities of the last decode's n output rows, best first (ties: lower id).

        llama.cpp copies what a row's sampler returns to the start of that row's vocabulary-wide slot, one slot
        per output row and buffer (row-major, in batch order for a batch of one micro-batch). The carrier row's
        slots hold every row's k values (:meth:`_build`): three copies for llama.cpp instead of three per row (on
        a GPU, three transfers instead of 3n) and three ggml views fewer per row in the callbacks. Its three
        buffers are allocated once per context, so their views are cached by the candidates' address (one
        llama.cpp call per read)."""
        cand, lg, pr = self._views_of(n_rows)
        order = np.lexsort((cand, -lg), axis=-1)
        rows = self._row_index[:n_rows]
        lg = lg[rows, order].astype(np.float64)
        # the best entry's probability is the row's largest (the soft-max is monotone; tied logits, tied values)
        lg -= lg[:, :1] - np.log(pr.max(axis=1, keepdims=True), dtype=np.float64)  # minus the log-normalizer
        return cand[rows, order].astype(np.int64), lg

    def _views_of(self, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first k columns of the first ``n_rows`` slots of llama.cpp's sampled candidates, logits and
        probabilities. Indices count from the end (the last n outputs): a positive index would be a *batch*
        position, and a prompt chunk's only output is its last token."""
        at = -n_rows if self.carrier is None else self.carrier - n_rows
        t0 = time.perf_counter()
        ptr = llama_cpp.llama_get_sampled_candidates_ith(self.ctx, at)  # waits for a GPU to finish
        charge_llama(t0)
        key = (address(ptr), n_rows, self.carrier is None)
        views = self._views.get(key)
        if views is None:
            pointers = (ptr, llama_cpp.llama_get_sampled_logits_ith(self.ctx, at),
                        llama_cpp.llama_get_sampled_probs_ith(self.ctx, at))
            if self.carrier is None:
                views = tuple(np.ctypeslib.as_array(p, shape=(n_rows, self.n_vocab))[:, :self.k] for p in pointers)
            else:
                views = tuple(np.ctypeslib.as_array(p, shape=(n_rows, self.k)) for p in pointers)
            self._views[key] = views
        return views
