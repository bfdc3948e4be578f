"""The cost model (tree_policy/costs.py) learns from observed timings: load and shape online, the plain steps after a
tree, and stalls (one, or at random) that neither turn trees off nor seal a size for good; a poisoned or flat start
is corrected within a few rounds, a busier machine flips no decision."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from eagle2_local.tree_policy import CostModel, RoundTimes, TreeBudget, best_size
from eagle2_local.tree_policy.costs import RECHECK_STEPS
from eagle2_local.tree_policy.learning import LOOKUP_ROUND, MODEL_ROUND
from tests.support.budget_helpers import (LOADED, SIZES, STEEP, observe_plain, observe_tree, run_budget,
                                          slower_after_trees, steep, true_costs, wants_tree)
from tests.support.budget_sim import CPU_SIZES, POISONED_SIZES, POISONED_VERIFY, Tally, World, run

# a machine where trees pay: sublinear verify, a cheap draft (CPU_SIZES' sizes)
PAYING = dict(shape=[1, 1.3, 1.5, 1.7, 2.6, 4.5, 8, 14], plain_s=0.010, root_s=0.0003, level_s=0.0008)


def test_the_plain_steps_after_a_tree_are_charged_to_the_run_of_trees_it_ends():
    """On a CPU the first plain steps after a tree decode slower than after a plain step. The cost model learns
    that extra time (a lone stall moves nothing), and the budget charges it to a tree that starts a run of trees,
    not to one that continues a run; a new answer starts none."""
    costs = steep()
    for _ in range(9):
        costs.observe_plain(0.010)
    costs.observe_plain(0.050, after_tree=1)  # one stalled step after a tree: not believed alone
    assert costs.switch_steps == 0.0
    slower_after_trees(costs)
    assert costs.switch_steps == pytest.approx(0.08 + 0.04, abs=0.005)
    assert costs.summary()["switch_steps"] == pytest.approx(0.12, abs=0.005)

    budget = TreeBudget(slower_after_trees(steep()), max_nodes=60, max_depth=6, free_lookup=True)
    first = budget.tree_plan(1, LOOKUP_ROUND)
    assert first.switch_steps == pytest.approx(0.12, abs=0.005)  # a run starts: it pays the steps after its end
    sure = np.log(np.full(3, 0.9)).cumsum()
    observe_tree(budget, first, RoundTimes(0.0, levels=[0.0]), sure, np.ones(3, dtype=bool), 0.02, 4)
    assert budget.tree_plan(1, LOOKUP_ROUND).switch_steps == 0.0  # a tree after a tree: the run goes on
    observe_plain(budget, 0.0108)
    assert budget.tree_plan(1, LOOKUP_ROUND).switch_steps == pytest.approx(0.12, abs=0.005)
    budget.begin_answer()
    assert budget.tree_plan(1, LOOKUP_ROUND).switch_steps == pytest.approx(0.12, abs=0.005)


def test_cost_model_interpolates_and_learns_load_and_shape_online():
    cm = steep()
    assert cm.verify_s(3) == pytest.approx((cm.verify[1] + cm.verify[2]) / 2)
    assert cm.verify_s(128) > cm.verify_s(64)  # linear extrapolation past the last measured size
    shape = cm.verify_s(np.array(SIZES)) / cm.verify_s(1)
    for _ in range(9):
        cm.observe_plain(3 * 0.009)  # the machine got 3x busier: the plain steps taken say so
    assert cm.load == pytest.approx(3.0) and cm.plain_rate == pytest.approx(1 / 0.027)
    assert np.allclose(cm.verify_s(np.array(SIZES)) / cm.verify_s(1), shape)  # every size slows alike
    cm.observe_plain(100 * 0.009)  # one stalled step moves the median of the window by nothing
    assert cm.load == pytest.approx(3.0)
    for _ in range(5):
        cm.observe_verify(16, 2 * 3 * 0.009 * 7.94)  # 16 nodes cost twice the calibrated shape
    assert cm.verify_s(16) == pytest.approx(2 * 3 * 0.009 * 7.94)
    assert cm.verify_s(1) == pytest.approx(0.027)  # the plain step is the unit, not learned from trees
    assert cm.verify_s(8) / cm.verify_s(1) == pytest.approx(4.45 * 2 ** (np.log(8) / np.log(16)), rel=1e-6)
    assert cm.verify_s(64) / cm.verify_s(1) == pytest.approx(2 * 28.1)  # past the last observed size: its factor
    for _ in range(9):
        cm.observe_draft(3 * 0.004, [3 * 0.010, 3 * 0.012])
    assert cm.draft_root_now == pytest.approx(0.012) and cm.draft_level_now == pytest.approx(0.036)
    assert cm.draft_s(3) == pytest.approx(cm.draft_root_now + 2 * cm.draft_level_now)
    with pytest.raises(ValueError):
        CostModel([2, 4], [0.1, 0.2], 0.0, 0.0)  # no n=1 anchor: no plain rate
    spoiled = CostModel([1, 2, 8, 16], [0.010, 0.011, 3.0, 0.1], 0.0, 0.0)  # one pass stalled by other load
    assert spoiled.verify_s(8) == pytest.approx(0.080)  # capped at decoding the 8 nodes one by one
    assert spoiled.verify_s(16) == pytest.approx(0.1)  # a larger tree may cost less: kernels batch in groups
    teeth = CostModel([1, 2, 3, 4, 5], [0.010, 0.016, 0.025, 0.017, 0.027], 0.0, 0.0)  # repacked Q4_0 on a CPU
    assert teeth.verify_s(4) < teeth.verify_s(3)
    assert best_size(np.array([1.0, 1.0, 0.2]), 0.0, teeth, 60)[0] == 4  # the cheap batch of four is chosen
    frozen = CostModel(SIZES, [0.009 * c for c in STEEP], 0.001, 0.002, frozen=True)
    frozen.observe_plain(1.0)
    frozen.observe_verify(8, 1.0)
    assert frozen.verify_s(8) == pytest.approx(0.009 * 4.45) and frozen.load == 1.0


def test_one_stalled_tree_pass_moves_no_correction_and_a_second_dear_round_confirms():
    """A size made dearer by one observation would never be run again (nothing would correct it), so one stalled
    pass is outvoted by the calibration; a second dear round, of any size, says the curve is dear and is believed."""
    cm = steep()
    cm.observe_verify(16, 6 * 0.009 * 7.94)  # one pass stalled 6x by another process
    assert cm.verify_s(16) == pytest.approx(0.009 * 7.94) and cm.verify_s(64) == pytest.approx(0.009 * 28.1)
    cm.observe_verify(4, 0.5 * 0.009 * 2.72)  # a cheaper size is believed at once: the next rounds run it
    assert cm.verify_s(4) == pytest.approx(0.5 * 0.009 * 2.72)
    cm.observe_verify(8, 1.5 * 0.009 * 4.45)  # a second dear round: both dear sizes are believed
    assert cm.verify_s(8) == pytest.approx(1.5 * 0.009 * 4.45)
    assert cm.verify_s(16) == pytest.approx(0.009 * 16)  # 6x, capped at decoding the 16 nodes one by one
    noisy = steep()
    noisy.observe_verify(16, 6 * 0.009 * 7.94)
    for _ in range(3):
        noisy.observe_verify(4, 0.009 * 2.72)
    noisy.observe_verify(8, 6 * 0.009 * 4.45)  # two stalls, of two sizes, among rounds as calibrated: not most
    assert noisy.verify_s(16) == pytest.approx(0.009 * 7.94) and noisy.verify_s(8) == pytest.approx(0.009 * 4.45)
    alone = steep()
    for _ in range(2):  # or a second of the size's own, each among rounds as calibrated
        assert alone.verify_s(16) == pytest.approx(0.009 * 7.94)
        alone.observe_verify(16, 1.5 * 0.009 * 7.94)
        for _ in range(alone.window):
            alone.observe_verify(4, 0.009 * 2.72)
    assert alone.verify_s(16) == pytest.approx(1.5 * 0.009 * 7.94)


@dataclass
class StallsOnce(World):
    """A machine whose first verification of ``at_least`` nodes or more is stalled ``stall`` times by another
    process (a scheduler slice, a page-in): every other pass takes its true time."""

    stall: float = 6.0
    at_least: int = 8
    stalled: int = 0

    def verify_time(self, n: int) -> float:
        seconds = super().verify_time(n)
        if n >= self.at_least and not self.stalled:
            self.stalled = n
            return self.stall * seconds
        return seconds


def test_one_stalled_large_round_does_not_turn_trees_off():
    """Trees pay (a cheap head, lookups that copy); the first large tree's pass is stalled 6x. Before, that one
    pass made every size look as dear as decoding its nodes one by one, and the run decoded plainly to its end
    (0.54x the unstalled run). Now the run goes on as if the stall had not been."""
    kw = dict(PAYING, copy_rate=0.5, lookup_p=0.95, copy_p=0.97)
    for seed in (0, 2):
        world = StallsOnce(**kw)
        _, tally = run_budget(true_costs(world), world, seed=seed)
        unstalled = World(**kw)
        _, reference = run_budget(true_costs(unstalled), unstalled, seed=seed)
        assert world.stalled >= 8
        assert tally.rate(100) >= 0.95 * reference.rate(100) and tally.tree_share(100) > 0.5


@dataclass
class DraftStallsOnce(World):
    """A machine whose first draft catch-up is stalled ``stall`` times (20 ms of another process on a 1 ms root)."""

    stall: float = 20.0
    stalled: bool = False

    def catch_up_time(self, fresh: int) -> float:
        seconds = super().catch_up_time(fresh)
        if not self.stalled:
            self.stalled = True
            return self.stall * seconds
        return seconds


def test_one_stalled_draft_root_does_not_turn_the_draft_off():
    """A draft that pays (a cheap head on a flat-ish curve) whose first root is stalled 20x: before, the root's cost
    was that one observation (the median of one) and the head never drafted again (0.82-0.85x the unstalled run);
    now the calibration outvotes it until a second observation agrees."""
    kw = dict(PAYING, root_s=0.002, level_s=0.002)
    world, unstalled = DraftStallsOnce(**kw), World(**kw)
    budget, tally = run_budget(true_costs(world), world)
    _, reference = run_budget(true_costs(unstalled), unstalled)
    assert world.stalled and budget.costs.draft_root_now == pytest.approx(0.002)
    assert tally.rate(100) >= 0.95 * reference.rate(100) and tally.tree_share(100) > 0.5
    dear = steep(draft_root=0.001)
    for _ in range(2):  # a root that is really dear: believed at its second observation
        dear.observe_draft(0.004, [])
    assert dear.draft_root_now == pytest.approx(0.004)


@dataclass
class StallsAtRandom(World):
    """A loaded machine: each pass (plain, tree or the draft's catch-up) is stalled ``factor`` times with
    probability ``p``."""

    p: float = 0.1
    factor: float = 6.0
    seed: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def _stall(self) -> float:
        return self.factor if self.rng.random() < self.p else 1.0

    def plain_time(self) -> float:
        return super().plain_time() * self._stall()

    def verify_time(self, n: int) -> float:
        return super().verify_time(n) * self._stall()

    def catch_up_time(self, fresh: int) -> float:
        return super().catch_up_time(fresh) * self._stall()


def learning_and_frozen(world: StallsAtRandom, rounds: int = 1000) -> tuple[Tally, Tally]:
    """``rounds`` rounds on ``world`` with a cost model that learns, and on a twin of it (the same stalls) with a
    cost model frozen at the true curve: both calibrated true, both paying for the stalls."""
    frozen_world = replace(world)
    frozen = true_costs(frozen_world)
    frozen.frozen = True
    _, tally = run_budget(true_costs(world), world, rounds=rounds, seed=2)
    _, reference = run_budget(frozen, frozen_world, rounds=rounds, seed=2)
    return tally, reference


def test_stalls_at_random_keep_the_trees_a_frozen_true_curve_keeps():
    """One pass in ten stalled 6x: the learning cost model keeps the trees that a cost model frozen at the true
    curve keeps (both pay for the stalls). Two stalls among the last nine tree rounds used to confirm each other
    and seal the sizes they hit (0.90x of the frozen model on this seed)."""
    tally, reference = learning_and_frozen(StallsAtRandom(**PAYING, seed=102))
    assert tally.rate(100) >= 0.97 * reference.rate(100) and tally.tree_share(100) >= 0.9


def sealed_by_two_stalls(stalled_plain_steps: int) -> CostModel:
    """A steep curve whose 4-node size two stalled passes made dear (it is believed: two observations of its own),
    then ``RECHECK_STEPS`` plain steps of 9 ms of which ``stalled_plain_steps`` stalled 6x."""
    costs = steep()
    for _ in range(9):
        costs.observe_plain(0.009)
    for _ in range(2):
        costs.observe_verify(4, 6 * costs.verify_s(4))
    assert costs.shape(4) > 1.4 * steep().shape(4)
    for i in range(RECHECK_STEPS):
        costs.observe_plain(0.054 if i < stalled_plain_steps else 0.009)
    return costs


def test_a_size_sealed_on_a_stalling_machine_is_timed_again():
    """A size believed dear is never run again, so no round would correct it: on a machine whose plain steps stall
    too, the stalls explain its dear window as well as a dear curve does, and it is forgotten after
    RECHECK_STEPS plain steps. Where no plain step stalled, the belief stands: a wrong calibration stays
    corrected."""
    rechecked, kept = sealed_by_two_stalls(stalled_plain_steps=3), sealed_by_two_stalls(stalled_plain_steps=0)
    assert rechecked.shape(4) == pytest.approx(steep().shape(4)) and rechecked.summary()["dear_rechecks"] == 1
    assert kept.shape(4) > 1.4 * steep().shape(4) and kept.summary()["dear_rechecks"] == 0


@pytest.mark.parametrize("p, mean, worst", [(0.2, 0.86, 0.70), (0.1, 0.97, 0.90)])
def test_stalls_at_random_do_not_seal_the_trees(p, mean, worst):
    """One pass in five (or ten) stalled 6x, eight seeds each, against a cost model frozen at the true curve. Sizes
    and the steps after a tree, made dear by chance, used to stay dear for the rest of the run (one in five: 0.73 of
    the frozen model on average, 0.61 at worst), and one stalled probe overdrew the exploration account for ~900
    steps (one in ten: 0.67). Now dear beliefs are rechecked after plain steps that stalled too, and a probe is
    charged at most EXPLORED_AT_MOST times its modelled cost."""
    shares = []
    for seed in range(100, 108):
        tally, reference = learning_and_frozen(StallsAtRandom(**PAYING, p=p, seed=seed))
        shares.append(tally.rate(100) / reference.rate(100))
    assert np.mean(shares) >= mean and min(shares) >= worst


@pytest.mark.parametrize("draft", [(0.0018, 0.0063), (2.5, 2.5)])
def test_poisoned_costs_end_in_plain_steps_within_a_few_rounds(draft):
    """The poisoned curve (flat: a 60-node tree as dear as one token) on a machine where no tree pays:
    the plain step is measured first, the shape is learned from the trees actually run, and after at most a
    handful of tree rounds the budget decodes plainly (a rare probe aside) at plain speed."""
    world = World()
    budget, tally = run_budget(CostModel(POISONED_SIZES, POISONED_VERIFY, *draft), world)
    assert not tally.tree_rounds[0]  # the first round measures the plain step
    first_trees = [i for i, t in enumerate(tally.tree_rounds) if t]
    assert len(first_trees) <= 5
    assert sum(tally.tree_rounds[10:]) <= 2
    assert tally.rate(50) >= 0.97 / world.plain_s
    assert tally.rate(0) >= 0.9 / world.plain_s  # all the trees tried cost less than 10% of 600 tokens


def test_poisoned_costs_still_find_the_trees_that_pay():
    """The same poisoned start where trees do pay (sublinear verify, cheap draft): trees come back, of sizes
    the learned shape says pay, and realise what a true calibration realises."""
    world = World(**PAYING)
    budget, tally = run_budget(CostModel(POISONED_SIZES, POISONED_VERIFY, 0.0018, 0.0063), world)
    truth = World(**PAYING)
    _, reference = run_budget(true_costs(truth), truth)
    assert tally.rate(100) >= 1.25 / world.plain_s and tally.rate(100) >= 0.95 * reference.rate(100)
    assert np.median(tally.sizes[-100:]) <= 12  # small trees: 60 nodes cost 14 plain steps here
    assert budget.costs.shape(32) == pytest.approx(8.0, rel=0.25)  # the learned shape, from ~1.04 calibrated


def test_a_flat_cost_model_learns_and_trees_stop():
    """A flat cost model (trees look nearly free) on a machine where they are dear: the trees' verify times
    correct its shape, the modelled and the realised rates then agree that trees lose, and plain speed holds
    apart from rare probes. Neither measure alone decides: a curve frozen wrong keeps trees (the realised guard
    cannot stop them alone), so that one is a cost model that does not learn, not a machine."""
    world = World()
    flat_costs = CostModel(SIZES, [world.plain_s * (1 + 0.001 * n) for n in SIZES], 0.0001, 0.0001)
    budget, tally = run_budget(flat_costs, world, rounds=1000)
    assert budget.losing(MODEL_ROUND)  # both measures: the modelled gain and the realised one (or the guard)
    assert sum(tally.tree_rounds[:30]) <= 12 and tally.tree_share(100) < 0.01
    assert tally.rate(100) >= 0.95 / world.plain_s


def test_load_spikes_while_generating_do_not_flip_to_trees():
    world = World()
    costs = CostModel(CPU_SIZES, [world.plain_s * s for s in world.shape], world.root_s, world.level_s)
    budget = TreeBudget(costs, max_nodes=60, max_depth=6)
    tally = run(budget, world, 600, np.random.default_rng(1), load_at=lambda i: 8.0 if 200 <= i < 260 else 1.0)
    assert not any(tally.tree_rounds)


def test_budget_decisions_do_not_flip_when_the_machine_gets_busier():
    """Load scales plain steps and trees alike: a draft that cannot pay stays unused at any load."""
    budget = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6)
    for _ in range(100):
        assert not wants_tree(budget)
        observe_plain(budget, 0.080)  # 9x slower plain steps than calibrated
    assert budget.costs.load > 5 and budget.ceiling_rate() < budget.costs.plain_rate


def test_catch_up_cost_is_learned_from_the_first_long_catch_up():
    """A calibration that found the catch-up free (a spoiled timing) lets the first long prompt draft at once
    on the loaded CPU; that round's timing teaches the real cost, and a budget on those costs (trees not yet
    judged) waits on the next prompt."""
    world = World(**LOADED)
    budget = TreeBudget(true_costs(world, token_s=0.0), max_nodes=60, max_depth=6)
    first = run(budget, world, 63, np.random.default_rng(0), prompt=769)
    assert first.tree_rounds[1] and budget.catch_up_postponed == 0
    assert budget.costs.catch_up_steps(769) == pytest.approx(768 * 0.0031 / 0.083, rel=0.05)
    fresh = TreeBudget(budget.costs, max_nodes=60, max_depth=6)
    second = run(fresh, world, 63, np.random.default_rng(1), prompt=769)
    assert not any(second.tree_rounds) and fresh.catch_up_postponed == 63  # plain steps known: no plain probe
