"""What a round did, as the auto budget (:class:`~eagle2_local.tree_policy.budget.TreeBudget`) learns from it:
the cost model pulled towards the round's timings, the realised-rate guards, the acceptance maps, the modelled
gain per kind of round and the exploration accounts; and the summary of it all that a generation's stats show.

The planning half (whether to draft, which kind, how many nodes) is in budget.py; this half only reads what the
plan said and what the round's clock readings were.
"""

from __future__ import annotations

import numpy as np

from ..tree.proposals import FORCED
from .base import RoundPlan, RoundResult
from .costs import AFTER_TREE, CostModel

MODEL_ROUND, LOOKUP_ROUND = 0, 1  # the kinds of drafted round; also the source code of each kind's own nodes
ROUND_KINDS = ("model", "lookup")  # their names in the summary
EXPLORED_AT_MOST = 2.0  # an exploring round is charged at most this many times its modelled cost (a stall's share)


def calibrated_round_s(costs: CostModel, n_nodes: int, levels: int) -> float:
    """What a round of ``n_nodes`` nodes whose model draft grew ``levels`` levels (0: no model draft ran) costs on
    ``costs``: verifying them, plus drafting the levels (a lookup round drafts free). A plain step is n_nodes 1."""
    return float(costs.verify_s(n_nodes)) + (costs.draft_s(levels) if levels else 0.0)


def steady(plan: RoundPlan) -> bool:
    """A normal round, not a backlog catch-up: the draft ingests at most what one round can emit."""
    return plan.fresh_tokens <= plan.max_depth + 1


class LearnsFromRounds:
    """:meth:`observe` and what it updates; mixed into :class:`~eagle2_local.tree_policy.budget.TreeBudget`, whose
    fields (costs, acceptance, guards, accounts, schedule) it reads and writes."""

    def observe(self, result: RoundResult) -> None:
        """What a round did, judged by what its plan says it was planned on (kind, catch-up, exploring)."""
        times, plan = result.times, result.plan
        if plan.unasked:  # in place of a plain step: the schedule counts that step
            self.schedule.plain_taken()
            self.acceptance.observe(result.node_scores, result.node_sources, result.accepted)
            self._after_tree = 1 if result.n_nodes > 1 else self._next_after_tree()
            return
        if not plan.drafts:
            self._plain(times.verify_s, times.decide_s)
            self._earn(1.0)
            return
        kind = LOOKUP_ROUND if plan.free_only else MODEL_ROUND
        self.acceptance.observe(result.node_scores, result.node_sources, result.accepted)
        realised_s = self._realised_s(result)
        if result.n_nodes == 1:  # only the root: the generator decoded it as a plain step
            self.root_only_rounds += 1
            self._plain(times.verify_s)
            # judged as what it is, a plain step (at today's median, not this one's noise) plus the cost of
            # drafting: a slow decode must not count against the draft, nor a fast one for it
            realised_s = float(self.costs.verify_s(1)) + max(realised_s - times.verify_s, 0.0)
        else:
            self.costs.observe_verify(result.n_nodes, times.verify_s)
            self._after_tree = 1
        if len(result.node_sources) and (np.asarray(result.node_sources) == FORCED).all():
            # only forced tokens were verified: free and certain, like the grammar's forced-only rounds, so
            # they neither judge the round's kind nor spend its exploration account
            self._earn(realised_s * self.costs.plain_rate)
            return
        # the guard sees times at calibration speed (divided by today's load: the plain step now over the
        # calibrated one), so a change of load between its windows does not pass for a draft winning or losing
        self.guard_of(kind).add_tree(result.n_emitted, realised_s / self.costs.load)
        if times.levels and kind == MODEL_ROUND:  # a lookup round says nothing of the model draft's costs
            if steady(plan):
                self.costs.observe_draft(times.catch_up_s, times.level_s)
            else:
                self.costs.observe_catch_up(plan.fresh_tokens, times.catch_up_s)
        # steady-state rate: the tokens really emitted over the round's modelled cost, which the lines above just
        # pulled towards this round's timings (modelled, so a backlog catch-up or one slow pass does not count);
        # kept relative to the plain rate, so a change of load between rounds does not skew the comparison
        levels_grown = max(len(times.levels), 1)
        # a lookup's draft time is its host time (the model's cost curve says nothing of it): measured
        draft_s = max(times.draft_s, 0.0) if kind == LOOKUP_ROUND else self.costs.draft_s(levels_grown)
        round_s = draft_s + float(self.costs.verify_s(result.n_nodes)) + plan.switch_steps * self.costs.verify_s(1)
        gain = result.n_emitted / max(round_s, 1e-12) / self.costs.plain_rate
        a, old = self.rate_alpha, self._gain[kind]
        self._gain[kind] = gain if old is None else (1 - a) * old + a * gain
        steps = realised_s * self.costs.plain_rate  # the round in plain steps at today's speed
        if plan.exploring:  # rounds of a kind that wins are the guard's to judge, not exploration
            # a stalled pass costs plain steps as much: charged in full, one stalled probe overdrew the account for
            # hundreds of steps, so at most EXPLORED_AT_MOST times its modelled cost, its catch-up included
            modelled_s = round_s + self.costs.catch_up_steps(plan.fresh_tokens) * self.costs.verify_s(1)
            explored_s = min(self._explored_s(result, realised_s), EXPLORED_AT_MOST * modelled_s)
            self.accounts[kind].pay(explored_s * self.costs.plain_rate - result.n_emitted)
        self._earn(steps)

    def _explored_s(self, result: RoundResult, realised_s: float) -> float:
        """What an exploring round cost the answer: its measured time, its backlog's catch-up included (a probe of
        a losing draft first ingests every token decoded plainly since it last ran, a cost that only exploring
        incurs), and at least the steady time ``realised_s`` that the guard judges (with ``calibrated_time``: that
        time, the catch-up left out)."""
        return realised_s if self.calibrated_time else max(result.times.done - result.times.start, realised_s)

    def _plain(self, seconds: float, decide_s: float | None = None) -> None:
        """A plain decoding step was taken (a plain round, or a lookup round that verified only its root);
        ``decide_s``: what deciding a planned plain step cost the loop. With ``calibrated_time`` the step takes its
        calibrated cost, whatever ``seconds`` the clock read (deciding it still takes ``decide_s``)."""
        if self.calibrated_time:
            seconds = calibrated_round_s(self.costs, 1, 0)
        self.schedule.plain_taken(decide_s)
        after = self._after_tree
        self._after_tree = self._next_after_tree()
        self.costs.observe_plain(seconds, after)
        self.guard.add_plain(seconds / self.costs.load)
        self.lookup_guard.add_plain(seconds / self.costs.load)

    def _next_after_tree(self) -> int:
        """The after-tree place of the step after a plain one (its root alone, whether planned or unasked): one
        further from the run of trees, 0 once past the steps a run is charged for."""
        after = self._after_tree
        return after + 1 if 0 < after < AFTER_TREE else 0

    def _earn(self, steps: float) -> None:
        for account in self.accounts:
            account.earn(steps)

    def guard_gain(self, kind: int | None = None) -> float:
        """Realised rounds' tokens/s of a kind (default: the main one) over plain steps' (1.0 while either is
        unknown)."""
        guard = self.guard_of(self._main if kind is None else kind)
        rt, rp = guard.tree_rate(), guard.plain_rate()
        return 1.0 if rt is None or rp is None or not np.isfinite(rt) or not np.isfinite(rp) else rt / rp

    def _realised_s(self, result: RoundResult) -> float:
        """A drafted round's measured time (drafting, verifying, accepting, committing), with a backlog catch-up
        counted at the steady root cost (paid once whatever the tree, and the tree is what the guard judges); at
        least the draft levels plus the verification. With ``calibrated_time``: :func:`calibrated_round_s` of the
        round (its nodes, and the levels its model draft grew)."""
        times, plan = result.times, result.plan
        if self.calibrated_time:
            return calibrated_round_s(self.costs, result.n_nodes, 0 if plan.free_only else len(times.levels))
        kind = LOOKUP_ROUND if plan.free_only else MODEL_ROUND
        if not times.levels:
            return max(times.done - times.start, self._root_s(kind) + times.verify_s)
        root = times.catch_up_s
        steady_root = root if steady(plan) or kind == LOOKUP_ROUND else self._root_s(kind)
        return max(times.done - times.start - root, times.deeper_s + times.verify_s) + steady_root

    def summary(self) -> dict:
        """The budget's state for GenerationStats: costs now, how they were calibrated, acceptance maps, guards,
        and per kind of round its realised rates and exploration account."""
        main = self.acceptance.maps[self._main]
        tree_rate = self.tree_rate
        kinds = {}
        for kind, name in enumerate(ROUND_KINDS):
            if (kind == MODEL_ROUND and not self.model_draft) or (kind == LOOKUP_ROUND and not self.free_lookup):
                continue
            gain = self._gain[kind]
            kinds[name] = {"realised": self.guard_of(kind).summary(), "losing": self.losing(kind),
                           "modelled_gain": round(gain, 3) if gain is not None else None,
                           "explore_left_steps": round(self.accounts[kind].left, 3),
                           "explore_spent_steps": round(self.accounts[kind].spent, 3)}
        return {"mode": "auto", "max_nodes": self.max_nodes, "calibration": dict(self.calibration),
                "costs_now": self.costs.summary(),
                "plain_tokens_per_s": round(self.costs.plain_rate, 2),
                "ceiling_tokens_per_s": round(self.ceiling_rate(), 2),
                "tree_tokens_per_s": round(tree_rate, 2) if tree_rate is not None else None,
                "realised": self.guard.summary(), "kinds": kinds, "plain_probes": self.plain_probes,
                "lookup_rounds": self.lookup_rounds, "root_only_rounds": self.root_only_rounds,
                "evidence_rounds": self.evidence_rounds, "sealed_probes": self.sealed_probes,
                "catch_up_postponed": self.catch_up_postponed,
                "acceptance_by_score": {f"{e:.2f}": round(float(r), 3)
                                        for e, r in zip(main.edges, main.rates()[1:])},
                "nodes_observed": self.acceptance.n_observed}
