"""How big each round's draft tree is: the interface the generation loop asks, and EAGLE-2's fixed size.

The loop asks a :class:`TreePolicy` the same questions every round, whichever policy it holds:

1. :meth:`~TreePolicy.wants_tree` before drafting (False: take a plain decoding step, do not run the draft);
2. :meth:`~TreePolicy.model_sits_out` (a draft with lookup branches: run only those?), then
   :meth:`~TreePolicy.start_round` when a drafted round begins;
3. while the tree grows, :meth:`~TreePolicy.level_done` after every drafted level (the policy's clock) and
   :meth:`~TreePolicy.should_expand` before every deeper one (a question without side effects);
4. :meth:`~TreePolicy.choose_size` once the candidates are in: how many nodes (root included) to verify;
5. :meth:`~TreePolicy.observe_tree` or :meth:`~TreePolicy.observe_plain` with what the round cost and gave.

:class:`FixedTree` is EAGLE-2 as published: always a tree, all levels, ``total_tokens`` nodes.
:class:`eagle2_local.budget.TreeBudget` sizes trees by measured cost and draft confidence.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class TreePolicy(Protocol):
    """Decides, round by round, whether to draft, how deep, and how many nodes to verify."""

    max_nodes: int  # the most nodes (root included) a round may verify

    def wants_tree(self, fresh_tokens: int = 1) -> bool:
        """Draft this round? ``fresh_tokens``: the text the draft must first catch up on, root included."""

    def model_sits_out(self) -> bool:
        """Asked after :meth:`wants_tree` said yes, for a draft that merges lookup branches: run only those
        this round (the model draft costs more than it could win now, the lookups cost nothing)?"""

    def start_round(self, fresh_tokens: int = 1) -> None:
        """A drafted round begins."""

    def level_done(self, levels_done: int) -> None:
        """The tree builder finished drafting level ``levels_done`` (1 = the root's children)."""

    def should_expand(self, cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int) -> bool:
        """Is one more level worth its cost? Candidate and frontier path scores so far; no side effects."""

    def choose_size(self, cand_scores: np.ndarray) -> int:
        """Nodes to verify (root included) among the ranked candidates."""

    def observe_tree(self, node_scores: np.ndarray, accepted: np.ndarray, verify_s: float, n_emitted: int) -> None:
        """A verified tree round: drafted nodes' scores, which were accepted, verify time, tokens produced."""

    def observe_plain(self, verify_s: float) -> None:
        """A plain decoding step taken instead of a tree."""

    def summary(self) -> dict | None:
        """The policy's state for the generation statistics (None: nothing to report)."""


class FixedTree:
    """EAGLE-2's fixed size: every round drafts all levels and verifies the ``max_nodes`` best nodes."""

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = max_nodes

    def wants_tree(self, fresh_tokens: int = 1) -> bool:
        return True

    def model_sits_out(self) -> bool:
        return False

    def start_round(self, fresh_tokens: int = 1) -> None:
        pass

    def level_done(self, levels_done: int) -> None:
        pass

    def should_expand(self, cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int) -> bool:
        return True  # the tree builder stops at its depth limit

    def choose_size(self, cand_scores: np.ndarray) -> int:
        return self.max_nodes

    def observe_tree(self, node_scores: np.ndarray, accepted: np.ndarray, verify_s: float, n_emitted: int) -> None:
        pass

    def observe_plain(self, verify_s: float) -> None:
        pass

    def summary(self) -> None:
        return None  # shown as "budget": null, i.e. the fixed tree
