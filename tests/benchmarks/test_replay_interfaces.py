"""What a replay passes in instead of patching the package (benchmarks/budget_replay.py): frozen costs
(``CostModel.frozen``), rounds priced on the costs (``TreeBudget.calibrated_time``), a calibration supplied
(``Eagle2(costs=...)``) and a listener of the generation loop (``Generator(listener=...)``)."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local import Eagle2
from eagle2_local.generation.generator import Generator
from eagle2_local.measure.cost_cache import CostKey
from eagle2_local.tree.draft_tree import Candidates
from eagle2_local.tree_policy import PLAIN_STEP, CostModel, RoundPlan, RoundResult, RoundTimes, TreeBudget
from eagle2_local.tree_policy.learning import calibrated_round_s

SIZES = [1, 2, 4, 8, 16, 32, 64]


def flat(frozen: bool = False) -> CostModel:
    """GPU-like: 64 nodes cost what one token costs; a cheap draft."""
    return CostModel(SIZES, [0.010 * (1 + 0.002 * n) for n in SIZES], 0.0005, 0.0005, frozen=frozen)


def plain_step(seconds: float) -> RoundResult:
    return RoundResult(PLAIN_STEP, RoundTimes(0.0, drafted=0.0, verified=seconds, done=seconds, asked=-1e-4))


def tree_round(plan: RoundPlan, level_s: float, verify_s: float) -> RoundResult:
    """A model round of 3 nodes, its draft grown one level in ``level_s`` and verified in ``verify_s``: the first
    drafted token accepted."""
    times = RoundTimes(0.0, levels=[level_s])
    times.drafted = level_s
    times.verified = times.done = level_s + verify_s
    return RoundResult(plan, times, 2, np.log([0.9, 0.8]), accepted=np.array([True, False]))


def heard(budget: TreeBudget, slow: float) -> dict:
    """The budget's state after plain steps and a tree round whose clock ran ``slow`` times the calibration's."""
    for _ in range(3):
        budget.observe(plain_step(0.010 * slow))
    plan = budget.plan(1)
    assert plan.drafts, plan
    budget.observe(tree_round(plan, 0.001 * slow, 0.011 * slow))
    return budget.summary()


def test_a_frozen_cost_model_keeps_its_calibration_whatever_it_observes():
    for costs in (flat(frozen=True), flat()):
        costs.frozen = True  # as the replay freezes the costs a budget was given
        before = costs.summary(), float(costs.verify_s(8)), costs.draft_s(3)
        costs.observe_plain(0.5, after_tree=1)
        costs.observe_verify(8, 2.0)
        costs.observe_draft(0.3, [0.3, 0.3])
        costs.observe_catch_up(40, 1.0)
        assert (costs.summary(), float(costs.verify_s(8)), costs.draft_s(3)) == before
    learning = flat()
    learning.observe_plain(0.5)
    assert learning.verify_s(1) == pytest.approx(0.5)  # without it, the plain step follows the clock


def test_calibrated_round_s_is_verifying_plus_the_model_drafts_levels():
    costs = flat()
    assert calibrated_round_s(costs, 1, 0) == float(costs.verify_s(1))
    assert calibrated_round_s(costs, 12, 0) == float(costs.verify_s(12))  # a lookup round drafts free
    assert calibrated_round_s(costs, 12, 3) == pytest.approx(float(costs.verify_s(12)) + costs.draft_s(3))


def test_a_budget_on_calibrated_time_decides_the_same_whatever_the_clock_read():
    """Frozen costs and calibrated time: a machine twice as slow (or stalled) leaves the budget's state as it was;
    by default the budget judges the clock's readings."""
    def budget(calibrated: bool) -> TreeBudget:
        return TreeBudget(flat(frozen=calibrated), max_nodes=60, max_depth=6, calibrated_time=calibrated)

    assert heard(budget(True), 1.0) == heard(budget(True), 2.0) == heard(budget(True), 7.0)
    assert heard(budget(False), 1.0) != heard(budget(False), 2.0)


def test_calibrated_time_charges_a_plain_step_its_calibrated_cost():
    frozen = TreeBudget(flat(frozen=True), max_nodes=60, max_depth=6, calibrated_time=True)
    frozen.observe(plain_step(5.0))
    rate = frozen.guard.plain_rate()
    assert rate == pytest.approx(1.0 / float(frozen.costs.verify_s(1)))


class Recorder:
    """A :class:`~eagle2_local.generation.listeners.RoundListener` keeping what it hears."""

    def __init__(self) -> None:
        self.tokens_heard: list[list[int]] = []
        self.trees: list[tuple[int, Candidates]] = []
        self.rounds: list[RoundResult] = []

    def tokens(self, tokens: list[int]) -> None:
        self.tokens_heard.append(list(tokens))

    def tree(self, root: int, candidates: Candidates) -> None:
        self.trees.append((root, candidates))

    def round(self, result: RoundResult) -> None:
        self.rounds.append(result)


def test_a_listener_hears_every_round_tree_and_token_batch_and_changes_nothing(synth_q8):
    with Eagle2(synth_q8, draft_model_path=synth_q8, n_ctx=512, total_tokens=10, depth=4, tree_top_k=3) as llm:
        unheard = llm.create_completion("the cat", max_tokens=24, temperature=0)["choices"][0]["text"]
        rec = Recorder()
        llm.generator.listener = rec
        out = llm.create_completion("the cat", max_tokens=24, temperature=0)
        stats = llm.generator.last_stats
        assert out["choices"][0]["text"] == unheard
        heard = [t for batch in rec.tokens_heard for t in batch]
        assert heard[:stats.n_tokens] == llm.generator.transcript[-stats.n_tokens:]
        assert len(rec.rounds) == stats.target_passes and len(rec.tokens_heard) == len(rec.rounds) + 1
        drafted = [r for r in rec.rounds if r.plan.drafts]
        assert len(rec.trees) == len(drafted) > 0
        assert all(len(c.tokens) == len(c.scores) == len(c.parents) for _, c in rec.trees)
        assert Generator(llm.target, llm.generator.engine, llm.tree_params, listener=rec).listener is rec


def test_eagle2_takes_the_budgets_calibration_supplied(synth_q8):
    costs = flat()
    opened = dict(draft_model_path=synth_q8, n_ctx=512, depth=4, tree_top_k=3, budget="auto")
    with Eagle2(synth_q8, costs=costs, **opened) as llm:
        assert llm.generator.policy.costs is costs
        assert llm.generator.policy.calibration["source"] == "supplied"
    asked = []

    def supply(key: CostKey, measure) -> CostModel:
        asked.append((key, measure))
        return costs

    with Eagle2(synth_q8, costs=supply, **opened) as llm:
        assert llm.generator.policy.costs is costs
        llm.create_completion("the cat", max_tokens=8, temperature=0)
    (key, measure), = asked
    assert isinstance(key, CostKey) and key.extra["depth"] == 4 and callable(measure)
