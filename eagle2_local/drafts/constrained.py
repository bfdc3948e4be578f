"""Draft trees under a grammar: every tree node carries its grammar state, and the children it forbids are
dropped before they enter the tree (verifying them would be wasted: the constrained target never picks them).

:class:`ConstrainedDraft` wraps one round's draft (a model draft, its free part, or none) and the round's root
state. A frontier node's state is its parent's, cloned and advanced by the node's token, made when the node is
expanded; each row of draft output is then checked against its node's state in one grammar call for all its
candidates (microseconds, where a whole-vocabulary mask costs milliseconds). A :class:`~.forced.ForcedDraft`, when
given, proposes what the grammar forces at each node, merged into the rows with the model's.
"""

from __future__ import annotations

import numpy as np

from ..decoding.grammar import GrammarState
from ..decoding.tree import FORCED, DraftOutput, Proposals, top_k_log_probs
from .base import DraftEngine
from .forced import ForcedDraft
from .merged import merge_proposals

# Dense rows are cut to this many of their best tokens per kept child before the grammar check, so a row whose
# favourites the grammar forbids still offers allowed children.
POOL_FACTOR = 2


class ConstrainedDraft:
    """``inner`` (None: no model draft) and ``forced`` proposing under a grammar, for one round from ``root``."""

    def __init__(self, inner: DraftEngine | None, root: GrammarState, top_k: int,
                 forced: ForcedDraft | None = None) -> None:
        self.inner = inner
        self.root = root
        self.top_k = top_k
        self.forced = forced
        self.name = inner.name if inner is not None else "forced"
        self._states: dict[int, GrammarState] = {}  # candidate id -> its state (parents' advanced by its token)
        self._text: list[int] = []

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        self._close_states()
        self._text = np.asarray(tokens).tolist()
        out = self.inner.catch_up(tokens, features, features_from) if self.inner is not None else None
        if self.forced is not None:
            self.forced.start_round(self._text, self.root)
        return self._constrain(out, [self.root], [-1])

    def expand(self, cand_ids: np.ndarray, tokens: np.ndarray, parent_ids: np.ndarray, level: int) -> Proposals:
        states = []
        for cand, tok, parent in zip(np.asarray(cand_ids).tolist(), np.asarray(tokens).tolist(),
                                     np.asarray(parent_ids).tolist()):
            state = (self._states[parent] if parent >= 0 else self.root).clone()
            state.accept(tok)  # allowed: it entered the tree through a check against the parent's state
            self._states[cand] = state
            states.append(state)
        out = self.inner.expand(cand_ids, tokens, parent_ids, level) if self.inner is not None else None
        return self._constrain(out, states, np.asarray(cand_ids).tolist())

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        if self.inner is not None:
            self.inner.commit(accepted_cand_ids)
        if self.forced is not None:
            self.forced.end_round(np.asarray(accepted_cand_ids).tolist())
        self._close_states()

    def _constrain(self, out: DraftOutput | None, states: list[GrammarState], cands: list[int]) -> Proposals:
        """The rows' allowed candidates, with the forced drafter's proposals merged in (FORCED wins a tie)."""
        rows, refused = None, None
        if out is not None:
            rows, refused = allowed_proposals(out, states, self.top_k)
        if self.forced is None:
            return rows if rows is not None else _empty(len(states))
        forced = self.forced.propose(states, cands, refused)
        if rows is None:
            return forced
        merged = merge_proposals(forced, rows)
        is_forced = (merged.tokens[:, :, None] == forced.tokens[:, None, :]) & np.isfinite(forced.log_probs)[:, None]
        merged.sources = np.where(is_forced.any(axis=2), np.int8(FORCED), merged.sources).astype(np.int8)
        return merged

    def _close_states(self) -> None:
        for state in self._states.values():
            state.close()
        self._states.clear()


def allowed_proposals(out: DraftOutput, states: list[GrammarState], top_k: int) -> tuple[Proposals, np.ndarray]:
    """Each row's candidates (a dense row's best ``POOL_FACTOR * top_k``) with those its state forbids padded
    out (-inf): one grammar call per row. Scores stay the draft's own probabilities. Also per row: whether the
    grammar refused any candidate, or the row had none (a constrained spot rather than free text)."""
    props = out if isinstance(out, Proposals) else Proposals(*top_k_log_probs(np.atleast_2d(out),
                                                                              POOL_FACTOR * top_k))
    log_probs = props.log_probs.copy()
    refused = np.ones(len(states), dtype=bool)
    for row, state in enumerate(states):
        live = np.isfinite(log_probs[row])
        if live.any():
            ok = np.zeros(len(live), dtype=bool)
            ok[live] = state.allowed(props.tokens[row][live])
            log_probs[row][~ok] = -np.inf
            refused[row] = not ok[live].all()
    return Proposals(props.tokens, log_probs, props.sources), refused


def _empty(n_rows: int) -> Proposals:
    """Rows that propose nothing (the tree stops there)."""
    return Proposals(np.zeros((n_rows, 1), dtype=np.int64), np.full((n_rows, 1), -np.inf))
