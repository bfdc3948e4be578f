"""What the generation loop and a tree policy say to each other, once each per round, and EAGLE-2's fixed tree.

Every round the loop asks its :class:`TreePolicy` for one :class:`RoundPlan` and, once the round is over, hands
it one :class:`RoundResult`:

* a plain step (``plan.drafts`` False): the target decodes the root alone; the draft does not run; a plan may let
  the loop take ``plan.steps`` of them before it asks again (a *plain run*), each step still handed back alone;
* a drafted round: the draft (only its free part when ``plan.free_only``) grows at most ``plan.max_depth``
  levels, ``plan.go_deeper`` deciding before each deeper one, and ``plan.size`` picks how many of the ranked
  candidates (root included) to verify, at most ``plan.max_nodes``.

The round's :class:`RoundTimes`, read from the loop's one clock, is what the statistics, the policy (through the
plan's callables and the result) and a draft timer all see. A policy keeps nothing about the round in flight: what
it decided and why travels in the plan, and :meth:`TreePolicy.observe` reads it back from ``result.plan``.

Words used the same way throughout: the *free drafts* are the drafters that cost nothing to run (lookups, a
grammar's forced tokens; a draft's ``free_part``); a *lookup round* is a drafted round of the free drafts alone
(``free_only``: the model draft sits it out), one of the two kinds of round the auto budget judges apart, the other
being *model rounds*; an *unasked* round is a round of the free drafts that the loop runs where the plan said
plain (:meth:`TreePolicy.free_plan`).

:class:`FixedTree` is EAGLE-2 as published: always a tree, all levels, ``max_nodes`` nodes.
:class:`~eagle2_local.tree_policy.budget.TreeBudget` (``--budget auto``) sizes trees by measured cost and draft
confidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np


@dataclass
class RoundTimes:
    """Clock readings of one round: when it started, when each draft level was in (level 1: the root's output,
    after the catch-up), when the tree was chosen, verified, and the round committed. A plain step has no
    levels and is "drafted" at its start.

    Beside the clock, the seconds spent inside llama.cpp so far (:func:`~eagle2_local.llamacpp.runtime.llama_seconds`) are
    read at the start, when the tree was chosen and at the end, so the round's wall time splits into llama.cpp
    and the host's own work on each side: the host part is what a faster backend (a GPU) cannot take away."""

    start: float
    levels: list[float] = field(default_factory=list)
    drafted: float = 0.0
    verified: float = 0.0
    done: float = 0.0
    llama_start: float = 0.0
    llama_drafted: float = 0.0
    llama_done: float = 0.0
    # when the loop began deciding the round (the lookup's evidence, the plan); None for the later steps of a plain
    # run, which were decided with its first
    asked: float | None = None

    @property
    def decide_s(self) -> float | None:
        """Seconds the loop spent deciding the round before it started (None: decided with an earlier one)."""
        return None if self.asked is None else self.start - self.asked

    @property
    def catch_up_s(self) -> float:
        """The draft's catch-up up to the root's output (0 when nothing was drafted)."""
        return self.levels[0] - self.start if self.levels else 0.0

    @property
    def level_s(self) -> list[float]:
        """Seconds of each deeper level (one ``expand`` and its top-k), in order."""
        return np.diff(np.asarray(self.levels)).tolist() if self.levels else []

    @property
    def deeper_s(self) -> float:
        """Seconds of the levels below the first grown so far."""
        return self.levels[-1] - self.levels[0] if self.levels else 0.0

    @property
    def draft_s(self) -> float:
        return self.drafted - self.start

    @property
    def verify_s(self) -> float:
        return self.verified - self.drafted

    @property
    def llama_draft_s(self) -> float:
        """Draft side (catch-up, levels, tree selection): seconds inside llama.cpp."""
        return self.llama_drafted - self.llama_start

    @property
    def llama_verify_s(self) -> float:
        """Verify side (verify, accept, commit): seconds inside llama.cpp."""
        return self.llama_done - self.llama_drafted

    @property
    def host_draft_s(self) -> float:
        """Draft side: wall time minus llama.cpp (top-k, log-normalizers, tree building, batch filling)."""
        return self.draft_s - self.llama_draft_s

    @property
    def host_verify_s(self) -> float:
        """Verify side: wall time minus llama.cpp (the tree's batch, acceptance, commit bookkeeping)."""
        return self.done - self.drafted - self.llama_verify_s


# go_deeper(candidate scores so far, frontier scores, levels grown, the round's times[, the candidates' sources, the
# frontier's sources]) -> grow another level?
GoDeeperFn = Callable[..., bool]
# size(candidate scores, the round's times, their sources or None) -> nodes to verify, root included
SizeFn = Callable[[np.ndarray, RoundTimes, "np.ndarray | None"], int]


def _always(cand_scores: np.ndarray, frontier_scores: np.ndarray, levels: int, times: RoundTimes,
            sources: np.ndarray | None = None, frontier_sources: np.ndarray | None = None) -> bool:
    return True  # the tree builder stops at the plan's depth


@dataclass(frozen=True)
class RoundPlan:
    """What one round does: a plain step, or a tree within these limits (see the module docstring)."""

    drafts: bool
    max_nodes: int = 1
    max_depth: int = 0
    free_only: bool = False  # only the free drafts run (a lookup round); the model draft sits out
    # a round of free drafts the loop runs where plan() said plain (tokens a grammar forces): the policy sizes
    # it (free_plan) and learns only its acceptance from it; its schedule and guards never hear of it
    unasked: bool = False
    # what the policy decided it on, for its own observe() (the loop reads neither): the text the draft's
    # catch-up ingests, root included (1 where only free drafts run: they read nothing ahead), and whether the
    # round was drafted while rounds of its kind lose to plain steps (its loss is then paid from their
    # exploration account)
    fresh_tokens: int = 1
    exploring: bool = False
    switch_steps: float = 0.0  # plain steps charged to a tree that starts a run (CostModel.switch_steps)
    go_deeper: GoDeeperFn = _always
    size: SizeFn | None = None  # None: max_nodes
    # a plain step: how many the loop may take before it asks again (a plain run; without a grammar, whose forced
    # tokens are looked for at every step)
    steps: int = 1

    def nodes(self, cand_scores: np.ndarray, times: RoundTimes, sources: np.ndarray | None = None) -> int:
        """Nodes to verify (root included) among the ranked candidates, within ``max_nodes``; ``sources``: which
        drafter proposed each candidate (tree.SOURCE_NAMES), so each is valued by its own evidence."""
        return self.max_nodes if self.size is None else min(self.size(cand_scores, times, sources), self.max_nodes)


PLAIN_STEP = RoundPlan(drafts=False)


def _none_of(dtype) -> np.ndarray:
    """An empty array no reader can change: shared by every plain step's result (three arrays a step otherwise)."""
    empty = np.zeros(0, dtype=dtype)
    empty.flags.writeable = False
    return empty


NO_SCORES, NO_SOURCES, NONE_ACCEPTED = _none_of(np.float64), _none_of(np.int8), _none_of(bool)


@dataclass
class RoundResult:
    """What one round did: its plan and times, the drafted nodes verified (root excluded) with their scores,
    sources and whether each lies on the accepted path, and the tokens it produced (accepted + the target's)."""

    plan: RoundPlan
    times: RoundTimes
    n_emitted: int = 1
    node_scores: np.ndarray = field(default_factory=lambda: NO_SCORES)
    node_sources: np.ndarray = field(default_factory=lambda: NO_SOURCES)
    accepted: np.ndarray = field(default_factory=lambda: NONE_ACCEPTED)

    @property
    def n_nodes(self) -> int:
        """Nodes verified, root included (1 for a plain step)."""
        return len(self.node_scores) + 1


class TreePolicy(Protocol):
    """Decides, round by round, whether to draft, how deep, and how many nodes to verify."""

    max_nodes: int  # the most nodes (root included) a round may verify

    def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
        """This round's plan. ``fresh_tokens``: the text the draft would first catch up on, root included;
        ``lookup_rate``: how sure the draft's lookup is of the root's next token (0.0: no match, or no lookup)."""

    def free_plan(self) -> RoundPlan:
        """A round of the free drafts alone (forced tokens, lookups) where :meth:`plan` said plain, sized by
        what verifying costs (drafting them costs ~nothing); ``unasked``."""

    def observe(self, result: RoundResult) -> None:
        """What the round did (a planned one, or a :meth:`free_plan` one)."""

    def begin_answer(self) -> None:
        """A new answer starts (a policy that bounds its exploration per answer renews its allowance)."""

    def summary(self) -> dict | None:
        """The policy's state for the generation statistics (None: nothing to report)."""


class FixedTree:
    """EAGLE-2's fixed size: every round drafts all levels and verifies the ``max_nodes`` best nodes."""

    def __init__(self, max_nodes: int, max_depth: int = 32) -> None:
        self.max_nodes = max_nodes
        self.max_depth = max_depth  # the generator caps it at the tree's depth

    def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
        return RoundPlan(drafts=True, max_nodes=self.max_nodes, max_depth=self.max_depth)

    def free_plan(self) -> RoundPlan:
        return RoundPlan(drafts=True, max_nodes=self.max_nodes, max_depth=self.max_depth, free_only=True,
                         unasked=True)

    def observe(self, result: RoundResult) -> None:
        pass

    def begin_answer(self) -> None:
        pass

    def summary(self) -> None:
        return None  # shown as "budget": null, i.e. the fixed tree
