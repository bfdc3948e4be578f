"""What every draft returns for the nodes it ran: :class:`Proposals`, each node's next-token candidates with their
log-probabilities, and the one way two drafts' rows are merged (:func:`merge_row`).

A neural draft hands over whole logit rows (:meth:`Proposals.from_logits`) or the top-k it took in llama.cpp's
graph (:meth:`Proposals.from_arrays`); a drafter that already has its candidates (a lookup, forced tokens) lists
them. Rows are Python lists: a tree level is about ten rows of about ten entries, where each numpy call costs more
than the rows' own work.
"""

from __future__ import annotations

import numpy as np

from .top_k import top_k_log_probs

# Which drafter proposed a candidate (stats only: verification treats every node alike). A token that a neural
# draft and a lookup both proposed is BOTH; one the grammar forces (drafts/forced.py) is FORCED whoever else had it.
MODEL, LOOKUP, BOTH, FORCED = 0, 1, 2, 3
SOURCE_NAMES = ("model", "lookup", "both", "forced")

# the merge's entries for one row: (token, log-probability, source), in order
Entries = list[tuple[int, float, int]]


class Proposals:
    """Per drafted node (a row): candidate tokens, their log-probabilities (the draft's own, float64; a row's
    probabilities sum to at most 1) and which drafter proposed each (:data:`~.tree.SOURCE_NAMES` codes).

    Every row is best first (log-probabilities non-increasing; ties in the order a stable sort leaves them), holds no
    token twice and no padding (every log-probability finite). Read rows through :meth:`best`: rows made from
    whole logit rows take their top-k only then, as wide as the reader asks (the tree its ``top_k``, a grammar a
    wider pool)."""

    __slots__ = ("tokens", "log_probs", "sources", "log_prob_array", "_logits")

    def __init__(self, tokens: list[list[int]], log_probs: list[list[float]], sources: list[list[int]] | None = None,
                 log_prob_array: np.ndarray | None = None) -> None:
        """``log_prob_array``: the same log-probabilities as one (rows, k) array when the producer had them, as
        produced (a merge that then changes the rows has read it already: :meth:`row_mass`)."""
        self.tokens = tokens
        self.log_probs = log_probs
        self.sources = [[MODEL] * len(row) for row in tokens] if sources is None else sources
        self.log_prob_array = log_prob_array
        self._logits: np.ndarray | None = None

    @classmethod
    def from_logits(cls, logits: np.ndarray) -> "Proposals":
        """Dense logit rows (rows, V) or one row (V,), ranked when read. A view of a draft's output buffer stays
        valid only until its next decode: the tree and the merge read it at once."""
        out = cls.__new__(cls)
        out._logits = logits
        return out

    @classmethod
    def from_arrays(cls, tokens: np.ndarray, log_probs: np.ndarray) -> "Proposals":
        """A top-k taken elsewhere (llama.cpp's graph): (rows, k) int64 tokens and float64 log-probabilities, each
        row best first, every entry finite and distinct."""
        return cls(tokens.tolist(), log_probs.tolist(), None, log_probs)

    @property
    def logits(self) -> np.ndarray | None:
        """The dense logit rows these proposals were made from (None: listed rows)."""
        return self._logits

    def best(self, k: int) -> "Proposals":
        """Each row's ``k`` best entries (the rows themselves when none is longer)."""
        if self._logits is not None:
            tokens, log_probs = top_k_log_probs(np.atleast_2d(self._logits), k)
            if not np.isfinite(log_probs[:, -1]).all():  # a row of -inf logits (outside a head's vocabulary)
                keep = np.isfinite(log_probs)
                return Proposals([t[m].tolist() for t, m in zip(tokens, keep)],
                                 [lp[m].tolist() for lp, m in zip(log_probs, keep)])
            return Proposals(tokens.tolist(), log_probs.tolist(), None, log_probs)
        for row in self.tokens:
            if len(row) > k:
                break
        else:
            return self
        lp = self.log_prob_array
        return Proposals([row[:k] for row in self.tokens], [row[:k] for row in self.log_probs],
                         [row[:k] for row in self.sources], None if lp is None else lp[:, :k])

    def row_mass(self) -> list[float]:
        """Each row's total probability, summed by numpy (pairwise, in its order: the merged rows' scores, and so the
        trees, depend on these bits)."""
        lp = self.log_prob_array if self.log_prob_array is not None else np.array(self.log_probs, dtype=np.float64)
        return np.exp(lp).sum(axis=1).tolist()


def merge_row(tokens: list[int], log_probs: list[float], sources: list[int], entries: Entries,
              column: dict[int, int] | None = None, shared: int = BOTH) -> None:
    """Merge another draft's ``entries`` into one row (changed in place), then put the row best first: a new token
    is appended, a token already in the row keeps the higher log-probability and becomes ``shared`` (BOTH: two
    drafts proposed it). ``column``: the row's token -> column map, if the caller has it.

    The sort is stable (ties keep their columns' order), the order the tree's ranking has always given such a row."""
    if not entries:
        return
    if column is None:
        column = dict(zip(tokens, range(len(tokens))))
    for tok, lp, src in entries:
        j = column.get(tok)
        if j is None:
            column[tok] = len(tokens)
            tokens.append(tok)
            log_probs.append(lp)
            sources.append(src)
        else:
            log_probs[j] = max(log_probs[j], lp)
            sources[j] = shared
    order = sorted(range(len(tokens)), key=log_probs.__getitem__, reverse=True)
    tokens[:] = [tokens[j] for j in order]
    log_probs[:] = [log_probs[j] for j in order]
    sources[:] = [sources[j] for j in order]
