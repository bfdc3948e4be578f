"""Drafting under a grammar: a draft that wraps any other (or none) for one generation, so that the loop runs the
same rounds with a grammar as without one.

Every tree node carries its grammar state, and the children it forbids are dropped before they enter the tree
(verifying them would be wasted: the constrained target never picks them). A frontier node's state is its
parent's, cloned and advanced by the node's token, made when the node is expanded; each row of draft output is then
checked against its node's state in one grammar call for all its candidates (microseconds, where a whole-vocabulary
mask costs milliseconds). The :class:`~.forced.ForcedDraft` proposes what the grammar forces at each node, merged
into the rows with the wrapped draft's; its rounds cost no draft, so the draft's free part is the forced tokens
joined by the lookup's branches, and a plain step at a forced spot becomes a round of them (:meth:`has_free_round`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..decoding.grammar import GrammarState
from ..tree.proposals import FORCED, Proposals, merge_row
from .base import DraftEngine
from .forced import ForcedDraft

# Dense rows are cut to this many of their best tokens per kept child before the grammar check, so a row whose
# favourites the grammar forbids still offers allowed children.
POOL_FACTOR = 2


class GrammarDraft(DraftEngine):
    """``inner`` (None: no draft but the forced tokens) under the grammar whose committed state is ``root`` (the
    generation's state, which the loop advances by every token it commits: each round starts from it)."""

    def __init__(self, inner: DraftEngine | None, root: GrammarState, top_k: int, forced: ForcedDraft) -> None:
        self.inner = inner
        self.root = root
        self.top_k = top_k
        self.forced = forced
        self.name = inner.name if inner is not None else "forced"
        self.needs_features = inner is not None and inner.needs_features
        self.weights_path = inner.weights_path if inner is not None else None
        self.draft_model = inner.draft_model if inner is not None else None
        self.lookup = inner.lookup if inner is not None else None
        # a free-only round: the forced tokens with the lookup's branches (a draft that is all free is its own)
        all_free = inner is None or inner is self.lookup
        self.free_part = self if all_free else GrammarDraft(self.lookup, root, top_k, forced)
        self._states: dict[int, GrammarState] = {}  # candidate id -> its state (parents' advanced by its token)

    @property
    def n_read(self) -> int | None:
        return self.inner.n_read if self.inner is not None else None

    @property
    def n_features(self) -> int:
        return self.inner.n_features if self.inner is not None else 0

    def next_rate(self, tokens: list[int], allowed: Callable[[int], bool] | None = None) -> float:
        """The lookup's evidence, where a token the grammar forbids is none (the round would drop it)."""
        return self.inner.next_rate(tokens, self.root.allows) if self.inner is not None else 0.0

    def has_free_round(self) -> bool:
        """Whether the grammar forces anything at the root (one search, ~0.1 ms)."""
        return self.forced.proposes_at(self.root)

    def target_chose(self, token: int) -> None:
        self.forced.chose(token)

    def begin_answer(self, prompt_tokens: int) -> None:
        if self.inner is not None:
            self.inner.begin_answer(prompt_tokens)

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        self._close_states()
        out = self.inner.catch_up(tokens, features, features_from) if self.inner is not None else None
        self.forced.start_round(np.asarray(tokens).tolist(), self.root)
        return self._constrain(out, [self.root], [-1])

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        states = []
        for cand, tok, parent in zip(cand_ids, tokens, parent_ids):
            state = (self._states[parent] if parent >= 0 else self.root).clone()
            state.accept(tok)  # allowed: it entered the tree through a check against the parent's state
            self._states[cand] = state
            states.append(state)
        out = self.inner.expand(cand_ids, tokens, parent_ids, level) if self.inner is not None else None
        return self._constrain(out, states, cand_ids)

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        if self.inner is not None:
            self.inner.commit(accepted_cand_ids)
        self.forced.end_round(np.asarray(accepted_cand_ids).tolist())
        self._close_states()

    def close(self) -> None:
        """The generation is over: free the tree's grammar states (the wrapped draft is the generator's)."""
        self._close_states()
        if self.free_part is not self:
            self.free_part.close()

    def _constrain(self, out: Proposals | None, states: list[GrammarState], cands: list[int]) -> Proposals:
        """The rows' allowed candidates, with the forced drafter's proposals merged in (FORCED wins a tie)."""
        if out is None:
            return self.forced.propose(states, cands)
        rows, refused = allowed(out.best(POOL_FACTOR * self.top_k), states)
        merged = self.forced.propose(states, cands, refused)
        for r in range(len(states)):
            entries = list(zip(rows.tokens[r], rows.log_probs[r], rows.sources[r]))
            merge_row(merged.tokens[r], merged.log_probs[r], merged.sources[r], entries, shared=FORCED)
        return merged

    def _close_states(self) -> None:
        for state in self._states.values():
            state.close()
        self._states.clear()


def allowed(rows: Proposals, states: list[GrammarState]) -> tuple[Proposals, list[bool]]:
    """Each row's candidates without those its state forbids: one grammar call per row. Scores stay the draft's
    own probabilities. Also per row: whether the grammar refused any candidate, or the row had none (a constrained
    spot rather than free text)."""
    tokens, log_probs, sources, refused = [], [], [], []
    for toks, lps, srcs, state in zip(rows.tokens, rows.log_probs, rows.sources, states):
        ok = state.allowed(np.array(toks, dtype=np.int64)).tolist() if toks else []
        tokens.append([t for t, keep in zip(toks, ok) if keep])
        log_probs.append([lp for lp, keep in zip(lps, ok) if keep])
        sources.append([s for s, keep in zip(srcs, ok) if keep])
        refused.append(not all(ok) if ok else True)
    return Proposals(tokens, log_probs, sources), refused


def grammar_draft(draft: DraftEngine | None, root: GrammarState, top_k: int, forced: ForcedDraft) -> GrammarDraft:
    """``draft`` (or none) drafting under a grammar for one generation; ``forced``: the target's forced-token
    drafter, kept across generations (what the target chose among small allowed sets is its habit)."""
    forced.reset()
    return GrammarDraft(draft, root, top_k, forced)
