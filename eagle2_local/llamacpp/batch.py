"""The batches a llama.cpp context decodes, filled from numpy arrays: positions, sequence sets and embedding rows
for a whole tree level in a few array writes instead of a C call per token.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from ..errors import TreeError


def batch_entries(tokens: np.ndarray | None, embd: np.ndarray | None, embd_rows: list[int] | None) -> int:
    """How many entries a batch of these inputs has: one per token, else one per embedding row taken."""
    return len(tokens) if tokens is not None else len(embd if embd_rows is None else embd_rows)


class Batch:
    """A reusable llama_batch whose arrays are numpy-owned, so filling it needs no per-token Python loop.

    An entry may carry an embedding row next to its token (an EAGLE-3 head's decoder input: the token and its
    parent's pre-norm state) or instead of it (the head's encoder input): llama.cpp turns a llama_batch with both
    arrays into the same extended batch that one ``llama_batch_ext`` call per entry and field would build, so a
    tree level is one numpy write per array instead of four C calls per node."""

    def __init__(self, capacity: int, n_seq_max: int) -> None:
        self.capacity = capacity
        self.n_seq_max = n_seq_max
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.zeros(capacity, dtype=np.int32)
        self.seq_ids = np.zeros((capacity, n_seq_max), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self.embd = np.zeros(0, dtype=np.float32)  # grown on the first batch with embedding rows
        row_addr = self.seq_ids.ctypes.data + np.arange(capacity, dtype=np.uint64) * self.seq_ids.strides[0]
        self._row_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *[ctypes.cast(int(a), ctypes.POINTER(ctypes.c_int32)) for a in row_addr])
        self.struct = llama_cpp.llama_batch()
        self._token_p = self.token.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
        self._no_token = ctypes.POINTER(llama_cpp.llama_token)()
        self._embd_p = self._no_embd = ctypes.POINTER(ctypes.c_float)()
        self.struct.token = self._token_p
        self.struct.embd = self._no_embd
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = ctypes.cast(self._row_ptrs, ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id)))
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(self, tokens: np.ndarray | None, pos: np.ndarray | int, seq_mask: np.ndarray | None,
             seq_ids: np.ndarray | list[int] | None, single_seq: int, outputs: np.ndarray | int,
             embd: np.ndarray | None = None, embd_rows: list[int] | None = None) -> int:
        """Write n entries. Every token belongs to ``single_seq``, or (``seq_mask`` None, ``seq_ids`` given)
        token i to ``seq_ids[i]`` alone (a draft's tree level), or ``seq_mask[i, j]`` says whether token i
        belongs to sequence ``seq_ids[j]``. ``outputs`` marks tokens whose logits we want (``pos`` and
        ``outputs`` may be one value for all). ``embd``: one row per entry, beside its token, or alone where
        ``tokens`` is None; or, with ``embd_rows``, the rows ``embd_rows`` of it, in that order."""
        n = batch_entries(tokens, embd, embd_rows)
        self._fill_inputs(tokens, embd, embd_rows, n)
        self.pos[:n] = pos
        self.logits[:n] = outputs
        if seq_mask is None:
            self.n_seq_id[:n] = 1
            self.seq_ids[:n, 0] = single_seq if seq_ids is None else seq_ids
        else:
            counts = seq_mask.sum(axis=1)
            if counts.max(initial=0) > self.n_seq_max:
                raise TreeError(f"a node belongs to {int(counts.max())} sequences; n_seq_max is {self.n_seq_max}")
            # members first, in leaf order: nonzero walks the mask row by row, columns ascending, so each
            # member's rank in its row is its index minus the index of its row's first member
            rows, cols = np.nonzero(seq_mask)
            firsts = np.cumsum(counts) - counts
            self.seq_ids[rows, np.arange(len(rows)) - firsts[rows]] = seq_ids[cols]
            self.n_seq_id[:n] = counts
        self.struct.n_tokens = n
        return n

    def _fill_inputs(self, tokens: np.ndarray | None, embd: np.ndarray | None, embd_rows: list[int] | None,
                     n: int) -> None:
        """The token ids and embedding rows, and which of the two arrays llama.cpp reads (a null pointer: none)."""
        if tokens is not None:
            self.token[:n] = tokens
        self.struct.token = self._token_p if tokens is not None else self._no_token
        if embd is None:
            self.struct.embd = self._no_embd
            return
        size = n * embd.shape[1]
        if self.embd.size < size:
            self.embd = np.zeros(self.capacity * embd.shape[1], dtype=np.float32)
            self._embd_p = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if embd_rows is None:
            self.embd[:size].reshape(n, -1)[:] = embd
        else:
            np.take(embd, embd_rows, axis=0, out=self.embd[:size].reshape(n, -1))
        self.struct.embd = self._embd_p
