"""Per-round tree sizing by expected tokens per second (``--budget auto``), and its online acceptance calibration.

EAGLE-2 keeps the ``total_tokens`` best draft nodes whatever they cost to verify. That is right on a GPU, where
60 nodes cost about one token, and wrong on a small CPU, where they cost ~25 (DESIGN §5) and speculation ends up
slower than plain decoding. Here each round picks the number of nodes n that maximises

    expected emitted tokens / round time = (1 + sum of the kept nodes' acceptance probabilities)
                                           / (draft time + verify_s(n))

and stops growing levels once no deeper level could pay for itself. Times are steady-state times: a round's
draft time counts the calibrated cost of a one-token catch-up, not the catch-up of a backlog (the prompt, or
tokens decoded plainly), which is paid once whatever the tree and must not skew the choice of its size. The acceptance probability of a node is
read from its path confidence (cumulative draft log-probability, EAGLE-2's ranking score) through a binned
reliability map that starts at exp(score) and learns the observed acceptance rate per bin. When trees stop
beating a plain decoding step, rounds become plain steps (the draft is not even run) and a tree is tried again
after a while, with exponential backoff, so a losing draft costs little. A draft that could not beat plain
decoding even if every drafted token were accepted (a chain of L tokens emits at most L + 1 per round) is
never run at all: probing it would only pay its catch-up.

Pure: numbers and a clock in, decisions out; unit-testable without llama.cpp.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .costs import CostModel

log = logging.getLogger(__name__)


class AcceptanceMap:
    """Path confidence (cumulative log-prob) -> probability that the node lies on the accepted path.

    Bins of ``width`` nats from ``low`` to 0; each bin holds pseudo-counts seeded with ``prior_weight``
    observations at exp(bin centre), so the map starts as EAGLE-2's own assumption and moves to the measured
    rate as rounds come in. Counts are capped (scaled down together) so the map keeps following a drifting
    conversation instead of freezing after the first thousand rounds. Estimates are made monotone in the
    score: the tree builder ranks by score, so a better score must never map to a lower probability.
    """

    def __init__(self, low: float = -8.0, width: float = 0.5, prior_weight: float = 4.0,
                 max_count: float = 400.0) -> None:
        self.edges = np.arange(low, 0.0 + 1e-9, width)  # bin i covers [edges[i-1], edges[i]); bin 0 is < low
        centres = np.concatenate([[low - width / 2], self.edges[:-1] + width / 2, [0.0]])
        self.counts = np.full(len(centres), prior_weight)
        self.hits = prior_weight * np.exp(np.minimum(centres, 0.0))
        self.max_count = max_count
        self.n_observed = 0

    def _bin(self, scores: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.edges, np.asarray(scores, dtype=np.float64), side="right")

    def rates(self) -> np.ndarray:
        """Per-bin acceptance estimate, monotone non-decreasing in the score."""
        return np.clip(np.maximum.accumulate(self.hits / self.counts), 0.0, 1.0)

    def prob(self, scores: np.ndarray) -> np.ndarray:
        return self.rates()[self._bin(scores)]

    def observe(self, scores: np.ndarray, accepted: np.ndarray) -> None:
        """One verified round: each drafted node's score and whether it ended on the accepted path."""
        bins = self._bin(scores)
        np.add.at(self.counts, bins, 1.0)
        np.add.at(self.hits, bins, np.asarray(accepted, dtype=np.float64))
        over = self.counts > self.max_count
        if over.any():
            scale = np.where(over, self.max_count / self.counts, 1.0)
            self.counts *= scale
            self.hits *= scale
        self.n_observed += len(bins)


def best_size(p_sorted: np.ndarray, draft_s: float, costs: CostModel, max_nodes: int) -> tuple[int, float]:
    """The node count (root included) with the highest expected tokens per second, and that rate.

    ``p_sorted``: acceptance probabilities of the ranked candidates, best first. n = 1 (root only, i.e. the
    round's draft wasted) is always a choice.
    """
    m = min(len(p_sorted), max_nodes - 1)
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(p_sorted[:m])])
    n = np.arange(1, m + 2)
    rate = expected / (draft_s + costs.verify_s(n))
    i = int(np.argmax(rate))
    return int(n[i]), float(rate[i])


def deeper_can_pay(p_sorted: np.ndarray, frontier_mass: float, draft_s: float, levels_left: int,
                   costs: CostModel, max_nodes: int) -> bool:
    """Could one or more further levels beat the best tree available now?

    A level's nodes are children of the frontier, and children's path probabilities sum to at most their
    parent's, so j more levels add at most ``j * frontier_mass`` expected tokens. That optimistic gain, at
    the cost of j more draft levels plus verifying the larger tree, is compared with the best rate now.
    """
    _, now = best_size(p_sorted, draft_s, costs, max_nodes)
    m = min(len(p_sorted), max_nodes - 1)
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(p_sorted[:m])])
    expected = np.concatenate([expected, np.full(max(max_nodes - len(expected), 0), expected[-1])])
    n = np.arange(1, len(expected) + 1)
    verify = costs.verify_s(n)
    for j in range(1, levels_left + 1):
        bound = (expected + j * frontier_mass) / (draft_s + j * costs.draft_level_now + verify)
        if float(bound.max()) > now:
            return True
    return False


@dataclass
class TreeBudget:
    """Decides, round by round, whether to draft, how deep, and how many nodes to verify.

    The generation loop calls, per round: :meth:`wants_tree` (before drafting; False means take a plain step
    and do not run the draft), :meth:`start_round`, :meth:`keep_expanding` (from the tree builder before each
    deeper level), :meth:`choose_size`, then :meth:`observe_tree` or :meth:`observe_plain` with the measured
    verify time and the outcome.
    """

    costs: CostModel
    max_nodes: int
    max_depth: int
    acceptance: AcceptanceMap = field(default_factory=AcceptanceMap)
    probe_every: int = 8
    max_probe_every: int = 128
    probe_backlog: int = 32  # probe only when the draft has at most this many tokens to catch up on
    rate_alpha: float = 0.3
    clock: Callable[[], float] = time.perf_counter
    calibration: dict = field(default_factory=dict)  # how the costs were obtained (shown in stats)

    def __post_init__(self) -> None:
        self.tree_rate: float | None = None  # EMA of tokens/s realised by tree rounds
        self._backoff = self.probe_every
        self._plain_left = 0
        self._t0 = 0.0
        self._marks: list[float] = []
        self.rounds = 0
        self.plain_steps = 0
        self._draft_can_pay: bool | None = None

    # ------------------------------------------------------------ before drafting
    def wants_tree(self, fresh_tokens: int = 1) -> bool:
        """Draft this round? No while trees lose to plain decoding, except for a periodic probe.

        ``fresh_tokens``: how much text the draft would first have to catch up on. A probe is postponed while
        that backlog is long (a new prompt, many plain steps): catching a head up on hundreds of tokens costs
        more than a probe can win, and is the main way probing would make plain-speed generation slower."""
        self.rounds += 1
        if self._draft_can_pay is None:  # load scales both sides alike: recomputed only when draft costs change
            self._draft_can_pay = self.ceiling_rate() >= self.costs.plain_rate
        if not self._draft_can_pay:
            return False
        if self.tree_rate is None or self.tree_rate >= self.costs.plain_rate:
            self._backoff = self.probe_every
            self._plain_left = 0
            return True
        if self._plain_left > 0:
            self._plain_left -= 1
            return False
        if fresh_tokens > self.probe_backlog:
            return False
        # a probe is due: go plain for `backoff` rounds after it if it loses again
        self._plain_left = self._backoff
        self._backoff = min(2 * self._backoff, self.max_probe_every)
        return True

    def ceiling_rate(self) -> float:
        """Tokens/s of the best conceivable round: a chain of L drafted tokens, all accepted (L + 1 emitted)."""
        levels = np.arange(1, self.max_depth + 1)
        times = np.array([self.costs.draft_s(int(n)) for n in levels]) + self.costs.verify_s(levels + 1)
        return float(np.max((levels + 1) / times))

    def start_round(self, fresh_tokens: int = 1) -> None:
        """A drafted round begins; ``fresh_tokens`` is how many tokens the draft's catch-up must ingest."""
        self._t0 = self.clock()
        self._marks = []
        self._steady = fresh_tokens <= self.max_depth + 1  # a normal round, not a backlog catch-up

    def _draft_so_far(self, now: float) -> float:
        """Steady-state draft time of this round: the calibrated root cost plus the levels measured so far."""
        return self.costs.draft_root_now + (now - self._marks[0] if self._marks else 0.0)

    # ------------------------------------------------------------ while drafting
    def keep_expanding(self, cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int) -> bool:
        """Called after each drafted level: is another level worth its cost?"""
        now = self.clock()
        self._marks.append(now)
        if levels_done >= self.max_depth:
            return False
        p = np.sort(self.acceptance.prob(cand_scores))[::-1]
        frontier_mass = float(self.acceptance.prob(frontier_scores).sum())
        return deeper_can_pay(p, frontier_mass, self._draft_so_far(now), self.max_depth - levels_done,
                              self.costs, self.max_nodes)

    def choose_size(self, cand_scores: np.ndarray) -> int:
        """Nodes to verify (root included) among the ranked candidates."""
        p = np.sort(self.acceptance.prob(cand_scores))[::-1]
        n, _ = best_size(p, self._draft_so_far(self.clock()), self.costs, self.max_nodes)
        return n

    # ------------------------------------------------------------ after verifying
    def observe_tree(self, node_scores: np.ndarray, accepted: np.ndarray, verify_s: float, n_emitted: int) -> None:
        """A tree round: draft nodes' scores (root excluded), which were accepted, the measured verify time and
        the tokens emitted. Draft times come from the clock marks taken while the tree grew."""
        self.acceptance.observe(node_scores, accepted)
        self.costs.observe_verify(len(node_scores) + 1, verify_s)
        levels = np.diff(np.asarray(self._marks)).tolist() if self._marks else []
        if self._marks and self._steady:
            self.costs.observe_draft(self._marks[0] - self._t0, levels)
            self._draft_can_pay = None
        # steady-state rate: the tokens really emitted over the round's modelled cost, which the lines above just
        # pulled towards this round's timings (modelled, so a backlog catch-up or one slow pass does not count)
        levels_grown = max(len(self._marks), 1)
        round_s = self.costs.draft_s(levels_grown) + float(self.costs.verify_s(len(node_scores) + 1))
        rate = n_emitted / max(round_s, 1e-9)
        a = self.rate_alpha
        self.tree_rate = rate if self.tree_rate is None else (1 - a) * self.tree_rate + a * rate

    def observe_plain(self, verify_s: float) -> None:
        self.plain_steps += 1
        self.costs.observe_verify(1, verify_s)

    def summary(self) -> dict:
        """The budget's state for GenerationStats: costs now, how they were calibrated, acceptance map."""
        rates = self.acceptance.rates()
        return {"mode": "auto", "max_nodes": self.max_nodes, "calibration": dict(self.calibration),
                "costs_now": self.costs.summary(),
                "plain_tokens_per_s": round(self.costs.plain_rate, 2),
                "ceiling_tokens_per_s": round(self.ceiling_rate(), 2),
                "tree_tokens_per_s": round(self.tree_rate, 2) if self.tree_rate is not None else None,
                "acceptance_by_score": {f"{e:.1f}": round(float(r), 3)
                                        for e, r in zip(self.acceptance.edges, rates[1:])},
                "nodes_observed": self.acceptance.n_observed}
