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

Pure: the round's plan out, what it did (its clock readings included) in; unit-testable without llama.cpp. The
sizing maths is in sizing.py, the draft-or-plain schedule in schedule.py, the realised-rate guard in guard.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .costs import CostModel
from .base import PLAIN_STEP, RoundPlan, RoundResult, RoundTimes
from .guard import RateGuard
from .schedule import ProbeSchedule
from .sizing import AcceptanceMap, best_size, deeper_can_pay


@dataclass
class TreeBudget:
    """The auto tree policy (a :class:`~eagle2_local.tree_policy.base.TreePolicy`): whether to draft, how deep,
    and how many nodes to verify, by expected tokens per second.

    Trees stop (plain steps, with tree probes after exponentially growing gaps: the :class:`ProbeSchedule`)
    when the modelled tree rate falls below the plain rate, or when the :class:`RateGuard` sees realised tree
    rounds slower than realised plain steps.
    """

    costs: CostModel
    max_nodes: int
    max_depth: int
    acceptance: AcceptanceMap = field(default_factory=AcceptanceMap)
    schedule: ProbeSchedule = field(default_factory=ProbeSchedule)
    rate_alpha: float = 0.3
    free_lookup: bool = False  # the draft has free lookup branches, which cost ~nothing: rounds may run them alone
    calibration: dict = field(default_factory=dict)  # how the costs were obtained (shown in stats)
    guard: RateGuard = field(default_factory=RateGuard)

    def __post_init__(self) -> None:
        self._gain: float | None = None  # EMA of modelled tree rounds' tokens/s over the plain rate at the time
        self._steady = True
        self.rounds = 0
        self._draft_can_pay: bool | None = None
        self._lookup_can_pay = False
        self._free = False  # this round runs only the free lookup branches (the model draft sits out)
        self.lookup_only_rounds = 0
        self._fresh = 1  # tokens the current round's catch-up ingests

    @property
    def tree_rate(self) -> float | None:
        """Tokens/s the tree rounds realise by the cost model, at today's plain speed (None: no tree yet)."""
        return None if self._gain is None else self._gain * self.costs.plain_rate

    @tree_rate.setter
    def tree_rate(self, rate: float | None) -> None:
        self._gain = None if rate is None else rate / self.costs.plain_rate

    @property
    def plain_steps(self) -> int:
        return self.schedule.plain_steps

    @property
    def plain_probes(self) -> int:
        return self.schedule.plain_probes

    @property
    def catch_up_postponed(self) -> int:
        return self.schedule.catch_up_postponed

    def trees_losing(self) -> bool:
        return self.guard.tripped or (self._gain is not None and self._gain < 1.0)

    # ------------------------------------------------------------ the plan
    def plan(self, fresh_tokens: int = 1) -> RoundPlan:
        """This round's plan: a plain step while trees lose to plain decoding (except for a periodic probe),
        else a tree, of only the free lookup branches when the model draft could not pay even with every token
        accepted but they could.

        ``fresh_tokens``: how much text the draft would first have to catch up on. A probe is postponed while
        that backlog is long (a new prompt, many plain steps): catching a head up on hundreds of tokens costs
        more than a probe can win, and is the main way probing would make plain-speed generation slower. The
        same backlog, while no tree has proved it wins, waits for :meth:`ProbeSchedule.catch_up_too_dear`."""
        self.rounds += 1
        self.schedule.note_backlog(fresh_tokens)
        if self._draft_can_pay is None:  # the plain step is the unit: recomputed only when the shape changes
            self._draft_can_pay = self.ceiling_rate() >= self.costs.plain_rate
            self._lookup_can_pay = self.free_lookup and self.ceiling_rate(free=True) >= self.costs.plain_rate
        self._free = self.free_lookup and not self._draft_can_pay
        if not self._draft_can_pay and not (self._free and self._lookup_can_pay):
            return PLAIN_STEP
        if not self.schedule.draft_now(fresh_tokens, self.costs, self.trees_losing(), self._gain is not None,
                                       self._free, self.max_depth + 1):
            return PLAIN_STEP
        return self.tree_plan(1 if self._free else fresh_tokens)

    def tree_plan(self, fresh_tokens: int = 1) -> RoundPlan:
        """The plan of a drafted round whose catch-up ingests ``fresh_tokens`` (what :meth:`plan` returns when
        it drafts; called alone, a tree round forced whatever the schedule says)."""
        self._fresh = fresh_tokens
        self.schedule.round_started()
        self._steady = fresh_tokens <= self.max_depth + 1  # a normal round, not a backlog catch-up
        self.lookup_only_rounds += self._free
        return RoundPlan(drafts=True, max_nodes=self.max_nodes, max_depth=self.max_depth, free_only=self._free,
                         go_deeper=self.go_deeper, size=self.best_nodes)

    def free_plan(self) -> RoundPlan:
        """A round of free drafts where :meth:`plan` said plain: levels and size chosen as for a lookup-only
        round (no draft time), by the acceptance map and today's verify costs."""
        return RoundPlan(drafts=True, max_nodes=self.max_nodes, max_depth=self.max_depth, free_only=True,
                         go_deeper=self._free_go_deeper, size=self._free_nodes, unasked=True)

    def _free_go_deeper(self, cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int,
                        times: RoundTimes) -> bool:
        if levels_done >= self.max_depth:
            return False
        p = np.sort(self.acceptance.prob(cand_scores))[::-1]
        return deeper_can_pay(p, float(self.acceptance.prob(frontier_scores).sum()), 0.0,
                              self.max_depth - levels_done, self.costs, self.max_nodes, level_s=0.0)

    def _free_nodes(self, cand_scores: np.ndarray, times: RoundTimes) -> int:
        return best_size(np.sort(self.acceptance.prob(cand_scores))[::-1], 0.0, self.costs, self.max_nodes)[0]

    def _root_s(self) -> float:
        """The steady draft time of a round's root: none when only lookups draft."""
        return 0.0 if self._free else self.costs.draft_root_now

    def ceiling_rate(self, free: bool = False) -> float:
        """Tokens/s of the best conceivable round: a chain of L drafted tokens, all accepted (L + 1 emitted)."""
        levels = np.arange(1, self.max_depth + 1)
        draft = np.zeros(len(levels)) if free else np.array([self.costs.draft_s(int(n)) for n in levels])
        times = draft + self.costs.verify_s(levels + 1)
        return float(np.max((levels + 1) / times))

    def _draft_so_far(self, times: RoundTimes) -> float:
        """Steady-state draft time of this round: the calibrated root cost plus the levels measured so far."""
        return self._root_s() + times.deeper_s

    # ------------------------------------------------------------ while drafting (the plan's callables)
    def go_deeper(self, cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int,
                  times: RoundTimes) -> bool:
        """Is another level worth its cost? A question: asking changes nothing."""
        if levels_done >= self.max_depth:
            return False
        p = np.sort(self.acceptance.prob(cand_scores))[::-1]
        frontier_mass = float(self.acceptance.prob(frontier_scores).sum())
        return deeper_can_pay(p, frontier_mass, self._draft_so_far(times), self.max_depth - levels_done,
                              self.costs, self.max_nodes, level_s=0.0 if self._free else None)

    def best_nodes(self, cand_scores: np.ndarray, times: RoundTimes) -> int:
        """Nodes to verify (root included) among the ranked candidates."""
        p = np.sort(self.acceptance.prob(cand_scores))[::-1]
        n, _ = best_size(p, self._draft_so_far(times), self.costs, self.max_nodes)
        return n

    # ------------------------------------------------------------ what the round did
    def observe(self, result: RoundResult) -> None:
        times = result.times
        if result.plan.unasked:  # in place of a plain step: the schedule counts that step
            self.schedule.plain_taken()
            self.acceptance.observe(result.node_scores, result.accepted)
            return
        if not result.plan.drafts:
            self.schedule.plain_taken()
            self.costs.observe_plain(times.verify_s)
            self.guard.add_plain(times.verify_s)
            return
        self.acceptance.observe(result.node_scores, result.accepted)
        realised_s = self._realised_s(times)
        self.guard.add_tree(result.n_emitted, realised_s)
        self.costs.observe_verify(result.n_nodes, times.verify_s)
        if times.levels and not self._free:  # a lookup-only round says nothing of the model draft's costs
            if self._steady:
                self.costs.observe_draft(times.catch_up_s, times.level_s)
            else:
                self.costs.observe_catch_up(self._fresh, times.catch_up_s)
        self._draft_can_pay = None  # the learned shape moved
        # steady-state rate: the tokens really emitted over the round's modelled cost, which the lines above just
        # pulled towards this round's timings (modelled, so a backlog catch-up or one slow pass does not count);
        # kept relative to the plain rate, so a change of load between rounds does not skew the comparison
        levels_grown = max(len(times.levels), 1)
        draft_s = 0.0 if self._free else self.costs.draft_s(levels_grown)
        round_s = draft_s + float(self.costs.verify_s(result.n_nodes))
        gain = result.n_emitted / max(round_s, 1e-12) / self.costs.plain_rate
        a = self.rate_alpha
        self._gain = gain if self._gain is None else (1 - a) * self._gain + a * gain
        if self.schedule.probing:
            # a probe while trees lose costs about (1 - tree gain) x its length in plain steps (the smoothed gain,
            # not this probe's luck)
            gain = min(self._gain, self.guard_gain())
            self.schedule.after_probe(realised_s * self.costs.plain_rate * (1.0 - gain))

    def guard_gain(self) -> float:
        """Realised tree rounds' tokens/s over plain steps' (1.0 while either is unknown)."""
        rt, rp = self.guard.tree_rate(), self.guard.plain_rate()
        return 1.0 if rt is None or rp is None or not np.isfinite(rt) or not np.isfinite(rp) else rt / rp

    def _realised_s(self, times: RoundTimes) -> float:
        """The round's measured time (drafting, verifying, accepting, committing), with a backlog catch-up
        counted at the steady root cost (paid once whatever the tree, and the tree is what the guard judges); at
        least the draft levels plus the verification."""
        if not times.levels:
            return max(times.done - times.start, self._root_s() + times.verify_s)
        root = times.catch_up_s
        steady_root = root if self._steady else self._root_s()
        return max(times.done - times.start - root, times.deeper_s + times.verify_s) + steady_root

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
