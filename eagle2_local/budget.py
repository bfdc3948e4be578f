"""Per-round tree sizing by expected tokens per second (``--budget auto``), and its online acceptance calibration.

EAGLE-2 keeps the ``total_tokens`` best draft nodes whatever they cost to verify. That is right on a GPU, where
60 nodes cost about one token, and wrong on a small CPU, where they cost ~25 (docs/design.md) and speculation ends up
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
never run at all: probing it would only pay its catch-up. And while trees are not known to win, a draft whose
first catch-up would ingest a long backlog (a new prompt) waits until that catch-up is a small share of the
plain decoding done since: a short answer to a long prompt on a slow machine stays plain decoding.

Pure: numbers and a clock in, decisions out; unit-testable without llama.cpp.
"""

from __future__ import annotations

import logging
import time
from collections import deque
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
                   costs: CostModel, max_nodes: int, level_s: float | None = None) -> bool:
    """Could one or more further levels beat the best tree available now?

    A level's nodes are children of the frontier, and children's path probabilities sum to at most their
    parent's, so j more levels add at most ``j * frontier_mass`` expected tokens. That optimistic gain, at
    the cost of j more draft levels plus verifying the larger tree, is compared with the best rate now.
    ``level_s``: a level's draft time (default: the cost model's; 0 for lookup branches).
    """
    level_s = costs.draft_level_now if level_s is None else level_s
    _, now = best_size(p_sorted, draft_s, costs, max_nodes)
    m = min(len(p_sorted), max_nodes - 1)
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(p_sorted[:m])])
    expected = np.concatenate([expected, np.full(max(max_nodes - len(expected), 0), expected[-1])])
    n = np.arange(1, len(expected) + 1)
    verify = costs.verify_s(n)
    for j in range(1, levels_left + 1):
        bound = (expected + j * frontier_mass) / (draft_s + j * level_s + verify)
        if float(bound.max()) > now:
            return True
    return False


class RateGuard:
    """The last line of defence: realised tokens per second of tree rounds against plain steps.

    Whatever the cost model believes, if the last ``window`` tree rounds emitted fewer tokens per second
    than the last ``window`` plain steps (at least ``min_rounds`` and ``min_plain`` of each), the guard
    trips: trees stop until probes, timed the same way, show otherwise. Sums, not means of rates: tokens over
    seconds is what the user waits for. Times are the measured round times (draft + verify, the draft's
    catch-up of a backlog counted at its steady cost; see TreeBudget.observe_tree) and plain decode times.
    """

    def __init__(self, window: int = 32, min_rounds: int = 4, min_plain: int = 2) -> None:
        self.tree: deque[tuple[int, float]] = deque(maxlen=window)
        self.plain: deque[float] = deque(maxlen=window)
        self.min_rounds, self.min_plain = min_rounds, min_plain
        self.tripped = False
        self.trips = 0

    @staticmethod
    def _rate(tokens: float, seconds: float) -> float:
        return tokens / seconds if seconds > 0 else float("inf")

    def tree_rate(self) -> float | None:
        if not self.tree:
            return None
        return self._rate(sum(t for t, _ in self.tree), sum(s for _, s in self.tree))

    def plain_rate(self) -> float | None:
        return self._rate(len(self.plain), sum(self.plain)) if self.plain else None

    def add_plain(self, seconds: float) -> None:
        self.plain.append(seconds)

    def add_tree(self, tokens: int, seconds: float) -> None:
        """One tree round; trips or releases the guard."""
        self.tree.append((tokens, seconds))
        if len(self.plain) < self.min_plain:
            return
        losing = self.tree_rate() < self.plain_rate()
        if not self.tripped and losing and len(self.tree) >= self.min_rounds:
            self.tripped, self.trips = True, self.trips + 1
            log.info("tree rounds realised %.1f tok/s against %.1f for plain steps: trees stop until a probe wins",
                     self.tree_rate(), self.plain_rate())
            self.tree.clear()  # from now on the window holds the probes only
        elif self.tripped and not losing:
            self.tripped = False

    def summary(self) -> dict:
        rt, rp = self.tree_rate(), self.plain_rate()
        return {"tripped": self.tripped, "trips": self.trips,
                "tree_tokens_per_s": round(rt, 2) if rt is not None and rt != float("inf") else None,
                "plain_tokens_per_s": round(rp, 2) if rp is not None and rp != float("inf") else None}


@dataclass
class TreeBudget:
    """Decides, round by round, whether to draft, how deep, and how many nodes to verify: a
    :class:`~eagle2_local.tree_policy.TreePolicy` (the calls and their order are listed there).

    Trees stop (plain steps, with tree probes after exponentially growing gaps) when the modelled tree rate
    falls below the plain rate, or when the :class:`RateGuard` sees realised tree rounds slower than realised
    plain steps. While trees win, one round in ``plain_probe_every`` is a plain step anyway (every other
    round until three are measured), so the plain rate and the guard rest on plain steps actually taken.
    """

    costs: CostModel
    max_nodes: int
    max_depth: int
    acceptance: AcceptanceMap = field(default_factory=AcceptanceMap)
    probe_every: int = 8
    max_probe_every: int = 128
    probe_backlog: int = 32  # probe only when the draft has at most this many tokens to catch up on
    rate_alpha: float = 0.3
    probe_share: float = 0.02  # a losing probe is followed by enough plain steps to cost at most this share
    max_probe_wait: int = 2048
    plain_probe_every: int = 16
    catch_up_share: float = 0.02  # unproven trees wait until a long backlog's catch-up costs at most this share
    # of the plain decoding done since the backlog began
    free_lookup: bool = False  # the draft merges lookup branches, which cost ~nothing: rounds may run them alone
    clock: Callable[[], float] = time.perf_counter
    calibration: dict = field(default_factory=dict)  # how the costs were obtained (shown in stats)
    guard: RateGuard = field(default_factory=RateGuard)

    def __post_init__(self) -> None:
        self._gain: float | None = None  # EMA of modelled tree rounds' tokens/s over the plain rate at the time
        self._backoff = self.probe_every
        self._plain_left = 0
        self._gap = 0  # plain rounds planned after the last probe
        self._probing = False  # the current tree round is a probe while trees lose
        self._since_plain = 0
        self._t0 = 0.0
        self._marks: list[float] = []
        self._steady = True
        self.rounds = 0
        self.plain_steps = 0
        self.plain_probes = 0
        self._draft_can_pay: bool | None = None
        self._lookup_can_pay = False
        self._free = False  # this round runs only the free lookup branches (the model draft sits out)
        self.lookup_only_rounds = 0
        self._fresh = 1  # tokens the current round's catch-up ingests
        self._last_fresh: int | None = None  # the previous round's backlog, when it was a plain step
        self._backlog_start = 1  # the backlog when its plain steps began (a new prompt: the prompt)
        self.catch_up_postponed = 0  # rounds that would have drafted but stayed plain for the catch-up

    @property
    def tree_rate(self) -> float | None:
        """Tokens/s the tree rounds realise by the cost model, at today's plain speed (None: no tree yet)."""
        return None if self._gain is None else self._gain * self.costs.plain_rate

    @tree_rate.setter
    def tree_rate(self, rate: float | None) -> None:
        self._gain = None if rate is None else rate / self.costs.plain_rate

    def trees_losing(self) -> bool:
        return self.guard.tripped or (self._gain is not None and self._gain < 1.0)

    # ------------------------------------------------------------ before drafting
    def wants_tree(self, fresh_tokens: int = 1) -> bool:
        """Draft this round? No while trees lose to plain decoding, except for a periodic probe.

        ``fresh_tokens``: how much text the draft would first have to catch up on. A probe is postponed while
        that backlog is long (a new prompt, many plain steps): catching a head up on hundreds of tokens costs
        more than a probe can win, and is the main way probing would make plain-speed generation slower. The
        same backlog, while no tree has proved it wins, waits for :meth:`catch_up_too_dear`."""
        self.rounds += 1
        if self._last_fresh is None or fresh_tokens != self._last_fresh + 1:  # not one plain step later
            self._backlog_start = fresh_tokens
        self._last_fresh = fresh_tokens
        if self._draft_can_pay is None:  # the plain step is the unit: recomputed only when the shape changes
            self._draft_can_pay = self.ceiling_rate() >= self.costs.plain_rate
            self._lookup_can_pay = self.free_lookup and self.ceiling_rate(free=True) >= self.costs.plain_rate
        self._free = self.free_lookup and not self._draft_can_pay
        if not self._draft_can_pay and not (self._free and self._lookup_can_pay):
            return False
        if not self.trees_losing():
            self._backoff = self.probe_every
            self._plain_left = self._gap = 0
            if self._since_plain >= self._plain_probe_gap():
                self.plain_probes += 1
                return False
            if self._gain is None and self._postpone_for_catch_up(fresh_tokens):
                return False
            self._since_plain += 1
            return True
        if self._plain_left > 0:
            self._plain_left -= 1
            return False
        if self._backlog_too_long(fresh_tokens):
            return False
        if self._postpone_for_catch_up(fresh_tokens):
            return False
        # a probe is due: go plain for `backoff` rounds after it if it loses again
        self._plain_left = self._gap = self._backoff
        self._backoff = min(2 * self._backoff, self.max_probe_every)
        self._probing = True
        return True

    def _backlog_too_long(self, fresh_tokens: int) -> bool:
        """A probe waits while the draft would first ingest more than ``probe_backlog`` tokens (plain steps since
        the last probe do not count) that cost it more than a plain step: a lookup's catch-up costs nothing."""
        if self._free or fresh_tokens <= self.probe_backlog + self._gap:
            return False
        return self.costs.catch_up_steps(fresh_tokens) > 1.0

    def catch_up_too_dear(self, fresh_tokens: int) -> bool:
        """Would drafting now pay a catch-up out of proportion to what plain decoding has spent since?

        A backlog that began long (more than a normal round's ``max_depth + 1`` tokens: a new prompt) costs the
        draft ``costs.catch_up_steps`` plain steps to ingest, and only trees that win pay that back. So before
        any tree has shown it wins, that cost must be at most ``catch_up_share`` of the plain steps taken in this
        backlog: on a loaded CPU, where ingesting a 700-token prompt costs dozens of plain steps, a short answer
        stays plain; where it costs a fraction of one (a GPU), trees start after a few tokens. What is charged is
        the backlog at its start, not the plain steps' own tokens: each adds a token to the catch-up and a step
        to the plain time, and charging them too would postpone for ever a draft whose catch-up costs more than
        ``catch_up_share`` of a plain step per token."""
        start = self._backlog_start
        if start <= self.max_depth + 1:
            return False
        return self.costs.catch_up_steps(start) > self.catch_up_share * (fresh_tokens - start)

    def _postpone_for_catch_up(self, fresh_tokens: int) -> bool:
        """Count and say yes when drafting waits for the catch-up (a lookup-only round's costs nothing)."""
        if self._free or not self.catch_up_too_dear(fresh_tokens):
            return False
        self.catch_up_postponed += 1
        return True

    def _plain_probe_gap(self) -> int:
        """Tree rounds between plain probes: none before the first plain step is measured (the calibration's
        plain step may be the spoiled number), one until three are, then ``plain_probe_every``."""
        measured = max(self.plain_steps, self.costs.n_plain)
        return 0 if measured == 0 else 1 if measured < 3 else self.plain_probe_every

    def model_sits_out(self) -> bool:
        """Does this drafted round run only the lookup branches? Yes when the model draft could not pay even
        with every token accepted, but free lookup branches could (asked after :meth:`wants_tree`)."""
        return self._free

    def _root_s(self) -> float:
        """The steady draft time of a round's root: none when only lookups draft."""
        return 0.0 if self._free else self.costs.draft_root_now

    def ceiling_rate(self, free: bool = False) -> float:
        """Tokens/s of the best conceivable round: a chain of L drafted tokens, all accepted (L + 1 emitted)."""
        levels = np.arange(1, self.max_depth + 1)
        draft = np.zeros(len(levels)) if free else np.array([self.costs.draft_s(int(n)) for n in levels])
        times = draft + self.costs.verify_s(levels + 1)
        return float(np.max((levels + 1) / times))

    def start_round(self, fresh_tokens: int = 1) -> None:
        """A drafted round begins; ``fresh_tokens`` is how many tokens the draft's catch-up must ingest."""
        self._t0 = self.clock()
        self._marks = []
        self._fresh = fresh_tokens
        self._last_fresh = None  # the next round's backlog starts anew
        self._steady = fresh_tokens <= self.max_depth + 1  # a normal round, not a backlog catch-up
        self.lookup_only_rounds += self._free

    def _draft_so_far(self, now: float) -> float:
        """Steady-state draft time of this round: the calibrated root cost plus the levels measured so far."""
        return self._root_s() + (now - self._marks[0] if self._marks else 0.0)

    # ------------------------------------------------------------ while drafting
    def level_done(self, levels_done: int) -> None:
        """The tree builder finished a level: the clock mark that times the draft."""
        self._marks.append(self.clock())

    def should_expand(self, cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int) -> bool:
        """Is another level worth its cost (asked after :meth:`level_done`)?"""
        now = self._marks[-1] if self._marks else self.clock()
        if levels_done >= self.max_depth:
            return False
        p = np.sort(self.acceptance.prob(cand_scores))[::-1]
        frontier_mass = float(self.acceptance.prob(frontier_scores).sum())
        return deeper_can_pay(p, frontier_mass, self._draft_so_far(now), self.max_depth - levels_done,
                              self.costs, self.max_nodes, level_s=0.0 if self._free else None)

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
        n_nodes = len(node_scores) + 1
        realised_s = self._realised_s(verify_s)
        self.guard.add_tree(n_emitted, realised_s)
        self.costs.observe_verify(n_nodes, verify_s)
        levels = np.diff(np.asarray(self._marks)).tolist() if self._marks else []
        if self._marks and not self._free:  # a lookup-only round says nothing of the model draft's costs
            if self._steady:
                self.costs.observe_draft(self._marks[0] - self._t0, levels)
            else:
                self.costs.observe_catch_up(self._fresh, self._marks[0] - self._t0)
        self._draft_can_pay = None  # the learned shape moved
        # steady-state rate: the tokens really emitted over the round's modelled cost, which the lines above just
        # pulled towards this round's timings (modelled, so a backlog catch-up or one slow pass does not count);
        # kept relative to the plain rate, so a change of load between rounds does not skew the comparison
        levels_grown = max(len(self._marks), 1)
        draft_s = 0.0 if self._free else self.costs.draft_s(levels_grown)
        round_s = draft_s + float(self.costs.verify_s(n_nodes))
        gain = n_emitted / max(round_s, 1e-12) / self.costs.plain_rate
        a = self.rate_alpha
        self._gain = gain if self._gain is None else (1 - a) * self._gain + a * gain
        if self._probing:
            self._after_probe(realised_s)

    def _after_probe(self, seconds: float) -> None:
        """A probe while trees lose costs about (1 - tree gain) x its length in plain steps (the smoothed gain,
        not this probe's luck); wait long enough after it that probing costs at most ``probe_share`` of plain
        speed (a 60-node probe on this CPU costs ~25 steps for ~3 tokens)."""
        self._probing = False
        gain = min(self._gain if self._gain is not None else 0.0, self.guard_gain())
        lost = seconds * self.costs.plain_rate * (1.0 - gain)
        if lost > 0:
            wait = min(int(np.ceil(lost / self.probe_share)), self.max_probe_wait)
            self._plain_left = max(self._plain_left, wait)
            self._gap = max(self._gap, self._plain_left)

    def guard_gain(self) -> float:
        """Realised tree rounds' tokens/s over plain steps' (1.0 while either is unknown)."""
        rt, rp = self.guard.tree_rate(), self.guard.plain_rate()
        return 1.0 if rt is None or rp is None or not np.isfinite(rt) or not np.isfinite(rp) else rt / rp

    def _realised_s(self, verify_s: float) -> float:
        """This round's measured time from :meth:`start_round` until now (drafting, verifying, accepting,
        committing), with a backlog catch-up counted at the steady root cost (paid once whatever the tree, and
        the tree is what the guard judges); at least the draft levels plus ``verify_s``."""
        now = self.clock()
        if not self._marks:
            return max(now - self._t0, self._root_s() + verify_s)
        root = self._marks[0] - self._t0
        steady_root = root if self._steady else self._root_s()
        return max(now - self._t0 - root, self._marks[-1] - self._marks[0] + verify_s) + steady_root

    def observe_plain(self, verify_s: float) -> None:
        self.plain_steps += 1
        self._since_plain = 0
        self.costs.observe_plain(verify_s)
        self.guard.add_plain(verify_s)

    def summary(self) -> dict:
        """The budget's state for GenerationStats: costs now, how they were calibrated, acceptance map, guard."""
        rates = self.acceptance.rates()
        tree_rate = self.tree_rate
        return {"mode": "auto", "max_nodes": self.max_nodes, "calibration": dict(self.calibration),
                "costs_now": self.costs.summary(),
                "plain_tokens_per_s": round(self.costs.plain_rate, 2),
                "ceiling_tokens_per_s": round(self.ceiling_rate(), 2),
                "tree_tokens_per_s": round(tree_rate, 2) if tree_rate is not None else None,
                "realised": self.guard.summary(), "plain_probes": self.plain_probes,
                "lookup_only_rounds": self.lookup_only_rounds,
                "catch_up_postponed": self.catch_up_postponed,
                "acceptance_by_score": {f"{e:.1f}": round(float(r), 3)
                                        for e, r in zip(self.acceptance.edges, rates[1:])},
                "nodes_observed": self.acceptance.n_observed}
