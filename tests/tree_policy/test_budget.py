"""The tree budget on synthetic cost curves (no llama.cpp): flat (GPU-like) curves buy large trees, steep
(CPU-like) ones small trees or plain steps; the acceptance map converges on simulated acceptance; the cost
model learns from observed timings and is cached on disk under its key."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from eagle2_local.measure.calibration import Limits, adopt_cached, calibrate, cost_model, summarise
from eagle2_local.measure.cost_cache import CostKey, cached_or_measured, load_costs, save_costs
from eagle2_local.tree.proposals import LOOKUP
from eagle2_local.tree_policy import (PLAIN_STEP, AcceptanceMap, CostModel, ProbeSchedule, RoundPlan, RoundResult,
                                      RoundTimes, SourceAcceptance, TreeBudget, best_size, deeper_can_pay)
from eagle2_local.tree_policy.budget import LOOKUP_MIN_ROUNDS
from eagle2_local.tree_policy.costs import RECHECK_STEPS
from eagle2_local.tree_policy.learning import EXPLORED_AT_MOST, LOOKUP_ROUND, MODEL_ROUND
from tests.support.budget_helpers import set_tree_rate
from tests.support.budget_sim import CPU_SIZES, POISONED_SIZES, POISONED_VERIFY, Tally, World, run

SIZES = [1, 2, 4, 8, 16, 32, 64]
# a machine where trees pay: sublinear verify, a cheap draft (CPU_SIZES' sizes)
PAYING = dict(shape=[1, 1.3, 1.5, 1.7, 2.6, 4.5, 8, 14], plain_s=0.010, root_s=0.0003, level_s=0.0008)
STEEP = [1.0, 1.77, 2.72, 4.45, 7.94, 15.0, 28.1]  # SmolLM2 on this 2-core CPU (docs/design.md §4), x one token


def flat(one_token: float = 0.010, draft_level: float = 0.0005) -> CostModel:
    """GPU-like: 64 nodes cost what one token costs; a cheap head drafts."""
    return CostModel(SIZES, [one_token * (1 + 0.002 * n) for n in SIZES], draft_level, draft_level)


def steep(one_token: float = 0.009, draft_root: float = 0.001, draft_level: float = 0.002) -> CostModel:
    return CostModel(SIZES, [one_token * c for c in STEEP], draft_root, draft_level)


def eagle_like_scores(rng: np.random.Generator, k: int = 10, depth: int = 6) -> np.ndarray:
    """Candidate scores of an EAGLE-2 tree grown on a peaked synthetic draft: each node's children take
    probabilities from a Dirichlet draw (a level's mass sums to at most its parents'), the k best paths go on."""
    frontier = np.zeros(1)
    scores = []
    for _ in range(depth):
        child = np.log(np.sort(rng.dirichlet(np.full(k, 0.05), len(frontier)), axis=1)[:, ::-1] + 1e-300)
        cum = (frontier[:, None] + child).ravel()
        scores.append(cum)
        frontier = np.sort(cum)[::-1][:k]
    return np.sort(np.concatenate(scores))[::-1]


def observe_plain(budget: TreeBudget, seconds: float) -> None:
    """A plain step of ``seconds``, as the generator reports it."""
    budget.observe(RoundResult(PLAIN_STEP, RoundTimes(0.0, drafted=0.0, verified=seconds, done=seconds)))


def observe_tree(budget: TreeBudget, plan: RoundPlan, times: RoundTimes, scores: np.ndarray, accepted: np.ndarray,
                 verify_s: float, emitted: int) -> None:
    """A drafted round: ``times`` as the draft left them, then a verification of ``verify_s`` seconds."""
    times.drafted = times.levels[-1] if times.levels else times.start
    times.verified = times.done = times.drafted + verify_s
    budget.observe(RoundResult(plan, times, emitted, scores, accepted=np.asarray(accepted)))


def wants_tree(budget: TreeBudget, fresh_tokens: int = 1) -> bool:
    return budget.plan(fresh_tokens).drafts


def wants_tree_within(budget: TreeBudget, fresh_tokens: int, rounds: int, plain_s: float = 0.009) -> bool:
    """Does a tree come within ``rounds`` rounds as the loop runs them from a backlog of ``fresh_tokens``: each
    plan, and where it says plain, a plain step of ``plain_s`` observed and one more token of backlog?"""
    for i in range(rounds):
        if wants_tree(budget, fresh_tokens + i):
            return True
        observe_plain(budget, plain_s)
    return False


def test_flat_curve_picks_large_trees_and_steep_small_ones():
    picks = []
    for seed in range(10):
        p = np.exp(eagle_like_scores(np.random.default_rng(seed)))
        n_flat, rate_flat = best_size(p, 0.002, flat(), 60)
        n_steep, rate_steep = best_size(p, 0.002, steep(), 60)
        assert n_flat >= 30, seed
        assert rate_flat > 3 / 0.010  # GPU-like: several times plain decoding
        assert 1 <= n_steep <= 8, seed
        assert rate_steep >= 1 / 0.009 / (1 + 0.002 / 0.009) - 1e-9  # never below a plain step plus the draft
        picks.append(n_steep)
    assert max(picks) >= 4 and min(picks) <= 2  # the size follows the draft's confidence


def test_steep_curve_and_poor_draft_picks_no_tree():
    p = np.full(100, 0.05)  # an unconfident draft
    n, _ = best_size(p, 0.005, steep(), 60)
    assert n == 1


def test_deeper_levels_only_when_they_can_pay():
    p = np.exp(np.array([-0.05, -0.1, -0.3, -1.0, -2.0]))
    assert deeper_can_pay(p, frontier_mass=0.9, draft_s=0.001, levels_left=4, costs=flat(), max_nodes=60)
    expensive = steep(draft_level=0.040)  # a draft level costing 4 target tokens
    assert not deeper_can_pay(p, frontier_mass=0.9, draft_s=0.001, levels_left=4, costs=expensive, max_nodes=60)
    assert not deeper_can_pay(p, frontier_mass=0.0, draft_s=0.001, levels_left=4, costs=flat(), max_nodes=60)


def test_a_bushy_weak_frontier_is_not_grown_on_a_steep_curve():
    """Ten lookup continuations at 0.07 each have the mass of one sure one (0.7), but each costs a verify slot
    for 0.07 tokens: on a steep curve no deeper tree of them can pay, while one sure continuation can (levels
    free, as a lookup's). Bounding by the mass alone would grow the weak frontier for nothing."""
    p = np.array([0.3])
    assert not deeper_can_pay(p, 0.7, 0.0, 6, steep(), 60, level_s=0.0, frontier_best=0.07)
    assert deeper_can_pay(p, 0.7, 0.0, 6, steep(), 60, level_s=0.0)  # the mass-only bound
    assert deeper_can_pay(p, 0.7, 0.0, 6, steep(), 60, level_s=0.0, frontier_best=0.7)


def test_budget_go_deeper_and_size_read_the_round_times():
    budget = TreeBudget(flat(), max_nodes=60, max_depth=6)
    plan = budget.tree_plan()
    scores = np.array([-0.05, -0.5, -1.0, -2.0])
    times = RoundTimes(0.0, levels=[0.001])
    assert plan.go_deeper(scores, scores[:2], 1, times)
    assert plan.go_deeper(scores, scores[:2], 1, times)  # a question: asking twice changes nothing
    assert not plan.go_deeper(scores, scores[:2], 6, times)  # depth limit
    assert plan.nodes(eagle_like_scores(np.random.default_rng(1)), times) == 60
    slow = TreeBudget(steep(draft_level=0.040), max_nodes=60, max_depth=6)
    plan = slow.tree_plan()
    times = RoundTimes(0.0, levels=[0.0])
    assert not plan.go_deeper(scores, scores[:2], 1, times)
    assert plan.nodes(scores, times) <= 3


def test_a_round_is_judged_by_what_its_own_plan_says():
    """What a round was planned on travels in its plan, and the budget keeps nothing about the round in flight:
    rounds observed after later plans were made are still judged as planned, a backlog catch-up timed as one
    and an exploring round paid from its kind's account."""
    budget = TreeBudget(steep(), max_nodes=60, max_depth=6)
    catch_up = budget.tree_plan(500)
    exploring = budget.tree_plan(1, MODEL_ROUND, exploring=True)
    lookup = budget.tree_plan(1, LOOKUP_ROUND)
    assert (catch_up.fresh_tokens, catch_up.exploring, catch_up.free_only) == (500, False, False)
    assert exploring.exploring and (lookup.fresh_tokens, lookup.free_only) == (1, True)
    scores = np.array([-1.5])
    catch_up_s = 0.001 + 499 * 0.0002  # the root's cost and 0.2 ms a backlog token
    observe_tree(budget, catch_up, RoundTimes(0.0, levels=[catch_up_s]), scores, np.array([False]), 0.02, 1)
    assert budget.costs.draft_token_now == pytest.approx(0.0002, rel=0.01)
    assert budget.accounts[MODEL_ROUND].spent == 0.0
    observe_tree(budget, exploring, RoundTimes(0.0, levels=[0.001]), scores, np.array([False]), 0.02, 1)
    assert budget.accounts[MODEL_ROUND].spent > 1.0  # 1 token for ~2.3 plain steps


def test_a_stalled_probe_is_charged_at_most_twice_its_modelled_cost():
    """An exploring round pays its measured time from its kind's account, its catch-up included, but a pass
    stalled by another process costs plain steps as much: charged in full, one stalled probe overdrew the account
    for hundreds of steps. What it pays is capped at EXPLORED_AT_MOST times its modelled cost."""
    charged = []
    for stall in (1.0, 6.0):
        budget = TreeBudget(steep(), max_nodes=60, max_depth=6)
        plan = budget.tree_plan(1, MODEL_ROUND, exploring=True)
        scores = np.array([-1.5, -2.0])
        observe_tree(budget, plan, RoundTimes(0.0, levels=[0.001]), scores, np.array([False, False]),
                     stall * budget.costs.verify_s(3), 1)
        charged.append(budget.accounts[MODEL_ROUND].spent + 1)  # plain steps, the emitted token's back
    assert charged[0] > 1.0 and charged[1] <= EXPLORED_AT_MOST * charged[0] + 1e-9


def slower_after_trees(costs: CostModel, first: float = 0.08, second: float = 0.04) -> CostModel:
    """``costs`` after plain steps of 10 ms, three times the first and second after a tree slower by ``first`` and
    ``second`` of a step."""
    for _ in range(9):
        costs.observe_plain(0.010)
    for _ in range(3):
        costs.observe_plain(0.010 * (1 + first), after_tree=1)
        costs.observe_plain(0.010 * (1 + second), after_tree=2)
        costs.observe_plain(0.010)
    return costs


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


def test_an_unasked_round_that_keeps_its_root_alone_counts_as_a_plain_step_after_a_tree():
    """A round of the free drafts that verified only its root decoded one plain step: the plain step after it is
    the second after the tree, sampled as such, not a step after plain steps."""
    budget = TreeBudget(slower_after_trees(steep()), max_nodes=60, max_depth=6, free_lookup=True)
    places = []
    observe_plain_step = budget.costs.observe_plain
    budget.costs.observe_plain = lambda seconds, after_tree=0: (places.append(after_tree),
                                                                observe_plain_step(seconds, after_tree))
    sure = np.log(np.full(3, 0.9)).cumsum()
    observe_tree(budget, budget.tree_plan(1, LOOKUP_ROUND), RoundTimes(0.0, levels=[0.0]), sure,
                 np.ones(3, dtype=bool), 0.02, 4)
    observe_tree(budget, budget.free_plan(), RoundTimes(0.0), sure[:0], np.zeros(0, dtype=bool), 0.0101, 1)
    observe_plain(budget, 0.0104)
    observe_plain(budget, 0.0100)
    assert places == [2, 0]


def test_a_tree_that_gains_less_than_it_costs_the_plain_steps_after_it_is_not_drafted():
    """A lookup chain whose gain over plain steps is smaller than what a tree costs the plain steps after it is
    not worth starting a run for; the same chain continuing a run is. And a tree's size is chosen with that cost:
    where it makes the chain lose, the round keeps its root alone."""
    plain = TreeBudget(slower_after_trees(steep(), 0.0, 0.0), max_nodes=60, max_depth=6, model_draft=False)
    rate = float(next(r for r in np.arange(0.40, 0.99, 0.005) if plain.evidence_gain(float(r)) > 1.03))
    assert plain.sure_lookup(rate)
    assert plain.evidence_gain(rate, 0.15) <= 1.0  # no tree of the chain beats the root alone
    budget = TreeBudget(slower_after_trees(steep(), 0.10, 0.05), max_nodes=60, max_depth=6, model_draft=False)
    assert budget.evidence_gain(rate) == plain.evidence_gain(rate)  # the same curve otherwise
    assert not budget.sure_lookup(rate)
    plan = budget.tree_plan(1, LOOKUP_ROUND)
    chain = np.log(np.full(6, rate)).cumsum()
    assert plan.nodes(chain, RoundTimes(0.0)) == 1  # the chain does not pay for the switch: the root alone
    assert plain.tree_plan(1, LOOKUP_ROUND).nodes(chain, RoundTimes(0.0)) > 1
    sure = np.log(np.full(6, 0.95)).cumsum()
    observe_tree(budget, plan, RoundTimes(0.0, levels=[0.0]), sure, np.ones(6, dtype=bool),
                 budget.costs.verify_s(7), 7)
    assert budget.sure_lookup(rate)  # continuing a run costs no switch


def sealed_merged_budget(model_draft: bool = True) -> TreeBudget:
    """A head + lookup budget (the head too dear to draft; ``model_draft`` False: the lookup alone) whose lookup
    map learned, from chains that missed, that no chain pays."""
    budget = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6, free_lookup=True,
                        model_draft=model_draft)
    observe_plain(budget, 0.009)
    missed = np.linspace(-0.99, -0.0001, 200)
    budget.acceptance.observe(missed, np.full(200, LOOKUP, dtype=np.int8), np.zeros(200, dtype=bool))
    budget.begin_answer()
    assert budget.sealed() and not budget.sure_lookup(0.95)
    return budget


def observe_lookup_chain(budget: TreeBudget, plan: RoundPlan, scores: np.ndarray, accepted: np.ndarray) -> None:
    """A lookup round verifying a chain of lookup nodes in its calibrated time."""
    n = len(scores) + 1
    times = RoundTimes(0.0, levels=[0.0])
    times.drafted = 0.0
    times.verified = times.done = float(budget.costs.verify_s(n))
    emitted = int(np.cumprod(accepted).sum()) + 1
    budget.observe(RoundResult(plan, times, emitted, scores, np.full(n - 1, LOOKUP, dtype=np.int8),
                               np.asarray(accepted)))


@pytest.mark.parametrize("model_draft", [True, False])
def test_a_sealed_lookup_map_is_probed_from_its_account_and_a_copying_chain_unseals_it(model_draft):
    """Prose answers whose chains missed can teach the lookups' map that no chain pays; then no lookup round runs
    on evidence and none could correct it (a code edit later in the process drafted nothing). Where the map is
    sealed, sure-looking evidence runs a probe sized as EAGLE-2 values nodes, at most what two plain steps verify,
    paid from the lookups' exploration account; chains that are accepted unseal the map. With the account spent,
    no probe."""
    budget = sealed_merged_budget(model_draft)
    assert not budget.plan(1, 0.3).drafts  # evidence that would not pay even on the prior: no probe
    plan = budget.plan(1, 0.95)
    assert plan.drafts and plan.free_only and plan.exploring and budget.sealed_probes == 1
    copied = np.log(np.full(6, 0.95)).cumsum()
    times = RoundTimes(0.0)
    # sized on the prior, within the probe's cap (c(2) 1.77, c(3) 2.25 on this curve); the sealed map would keep
    # the root alone
    assert plan.nodes(copied, times) == budget.probe_nodes() == 2 and plan.max_depth == 1
    assert budget.tree_plan(1, LOOKUP_ROUND).nodes(copied, times) == 1
    for chains in range(1, 20):  # chains that copy win: the account pays for the next probe at once
        n = plan.nodes(copied, times)
        observe_lookup_chain(budget, plan, copied[:n - 1], np.ones(n - 1, dtype=bool))
        if not budget.sealed():
            break
        plan = budget.plan(1, 0.95)
        assert plan.exploring
    assert chains <= 15 and budget.sure_lookup(0.99)

    spent = sealed_merged_budget(model_draft)
    spent.accounts[LOOKUP_ROUND].pay(1.0)
    assert not spent.plan(1, 0.95).drafts


def test_a_lookup_map_whose_chains_pay_only_without_the_switch_is_sealed_too():
    """A map through which a sure chain pays, but not once what a tree costs the plain steps after it is added (a
    switch learned at a slow moment), runs no round on evidence; and with no tree, neither the map nor the switch is
    ever measured again. Such a map is sealed as well: evidence that pays on the prior probes it."""
    budget = TreeBudget(CostModel(SIZES, [0.01 * n ** 0.5 for n in SIZES], 0.009, 0.045), max_nodes=60,
                        max_depth=6, free_lookup=True)  # a head too dear to draft, and its lookups
    observe_plain(budget, 0.01)
    scores = np.linspace(-0.99, -0.0001, 200)
    budget.acceptance.observe(scores, np.full(200, LOOKUP, dtype=np.int8), np.arange(200) % 4 == 0)  # a quarter hit
    budget.begin_answer()
    assert not budget.sealed() and budget.sure_lookup(0.999)
    for _ in range(9):  # the first two plain steps after trees measured 15% slower than the others
        for after in (1, 2):
            budget.costs.observe_plain(0.0115, after_tree=after)
            budget.costs.observe_plain(0.01)
            budget.costs.observe_plain(0.01)
    assert budget.costs.switch_steps == pytest.approx(0.3)
    assert budget.evidence_gain(0.999) > 1.0 >= budget.evidence_gain(0.999, budget.costs.switch_steps)
    assert budget.sealed() and not budget.sure_lookup(0.999)
    plan = budget.plan(1, 0.95)
    assert plan.drafts and plan.exploring and budget.sealed_probes == 1


def test_a_probe_of_a_sealed_lookup_map_verifies_what_two_plain_steps_cost():
    """A probe bets against a map that says lookups lose, so a miss may cost no more than its first node's hit
    wins: the largest tree that costs at most two plain steps (the switch after it included), never less than one
    node below the root. On a curve where verifying is nearly free that is the whole tree."""
    assert sealed_merged_budget().probe_nodes() == 2  # steep: c(2) 1.77, c(3) 2.25
    assert sealed_merged_budget().probe_nodes(switch_steps=0.5) == 2  # c(2) + 0.5 > 2, yet one node is drafted
    free = TreeBudget(flat(), max_nodes=60, max_depth=6, free_lookup=True)
    assert free.probe_nodes() == 60
    mid = TreeBudget(CostModel(SIZES, [0.01 * n ** 0.5 for n in SIZES], 0.0, 0.0), max_nodes=60, max_depth=6,
                     free_lookup=True)
    assert mid.probe_nodes() == 4  # c(n) = sqrt(n): c(4) = 2


def test_probing_a_sealed_lookup_map_costs_prose_a_bounded_share():
    """Where the lookups never hit, probes of a sealed map cost no more than the account's bound: its allowance
    per answer, its share of the decoding, and one round's overshoot."""
    budget = sealed_merged_budget()
    steps = probes = 0
    for _ in range(20):
        budget.begin_answer()
        for step in range(100):
            plan = budget.plan(1, 0.95 if step % 10 == 0 else 0.0)
            if plan.drafts:
                probes += 1
                n = plan.nodes(np.log(np.full(6, 0.95)).cumsum(), RoundTimes(0.0))
                observe_lookup_chain(budget, plan, np.log(np.full(n - 1, 0.95)).cumsum(), np.zeros(n - 1, dtype=bool))
            else:
                observe_plain(budget, 0.009)
            steps += 1
    account = budget.accounts[LOOKUP_ROUND]
    assert probes > 0 and budget.sealed()
    assert account.spent <= 0.25 * 21 + 0.01 * steps + float(budget.costs.verify_s(7)) / 0.009


def test_an_exploring_round_pays_its_backlogs_catch_up():
    """A probe of a losing model draft first ingests every token decoded plainly since the draft last ran: that
    catch-up is what exploring costs, so the account pays it at its measured time, while the guard and the cost
    model still judge the tree at the steady catch-up of one token."""
    budget = TreeBudget(steep(), max_nodes=60, max_depth=6)
    observe_plain(budget, 0.009)
    scores = np.array([-1.5])
    catch_up_s = 0.001 + 199 * 0.0002  # the root's cost and 0.2 ms for each of 199 backlog tokens
    plan = budget.tree_plan(200, MODEL_ROUND, exploring=True)
    observe_tree(budget, plan, RoundTimes(0.0, levels=[catch_up_s]), scores, np.array([False]), 0.02, 1)
    spent = budget.accounts[MODEL_ROUND].spent
    assert spent == pytest.approx((catch_up_s + 0.02) / 0.009 - 1, rel=0.01)  # 6.8 steps for 1 token, not 2.3
    assert budget.guard.tree_rate() == pytest.approx(1 / (0.001 + 0.02))  # the tree, at its steady catch-up


def test_probes_of_a_losing_head_with_a_dear_catch_up_cost_a_bounded_share():
    """The default head on the Intel VM of 2026-12-05 (2 threads): the head's catch-up costs 3.3% of a plain step
    per token, so a probe after k plain steps pays 0.033 k for its backlog alone, more than the 1% share earns in
    that time. A head whose guesses do not pay (overconfident) over 20 answers of 128 tokens: its exploration,
    catch-ups included, costs at most the allowances, the share and one round, and the answers stay at >= 0.98x
    plain speed (charged at the steady catch-up, the probes' backlogs cost 3-4%)."""
    world = World(plain_s=0.0126, sizes=[1, 2, 3, 4, 8, 16, 32, 60],
                  shape=[1, 1.38, 1.75, 2.04, 3.48, 6.24, 11.9, 21.8], root_s=0.00235, level_s=0.0064,
                  token_s=0.000414, accept_power=8.0)
    budget = TreeBudget(true_costs(world), max_nodes=60, max_depth=6)
    assert budget.ceiling_rate() > budget.costs.plain_rate  # a tree could pay: the head is explored
    tally = answers(budget, world, 20, 128, prompt=40)
    steps = sum(tally.seconds) / world.plain_s
    assert budget.accounts[MODEL_ROUND].spent <= 20 * 0.25 + 0.01 * steps + 8.0
    assert tally.rate() >= 0.98 / world.plain_s and sum(tally.tree_rounds) >= 5  # it did keep exploring


def test_a_draft_that_cannot_pay_is_never_run():
    """Even accepting every drafted token cannot beat plain decoding when one level costs 5 target tokens."""
    budget = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6)
    assert budget.ceiling_rate() < budget.costs.plain_rate
    assert not any(wants_tree(budget) for _ in range(500))
    assert TreeBudget(flat(), max_nodes=60, max_depth=6).ceiling_rate() > 5 * flat().plain_rate


def test_free_lookup_branches_draft_alone_where_the_model_draft_cannot_pay():
    """The model draft costs 5 target tokens a level, so it sits out; its lookup branches cost nothing, so
    lookup-only trees are still drafted where the lookup is sure, sized without any draft time, and counted in
    the summary; without a sure match the round is a plain step."""
    costs = steep(draft_root=0.009, draft_level=0.045)
    merged = TreeBudget(costs, max_nodes=60, max_depth=6, free_lookup=True)
    assert merged.ceiling_rate() < costs.plain_rate < merged.ceiling_rate(lookup=True)
    assert not wants_tree(merged)  # the first round measures a plain step
    observe_plain(merged, 0.009)
    assert not merged.plan(500, 0.3).drafts  # a match this unsure cannot make a chain pay
    plan = merged.plan(500, 0.95)  # a lookup catch-up over a long backlog is free: no postponement, steady
    assert plan.drafts and plan.free_only
    times = RoundTimes(0.0)
    sure = np.log(np.full(8, 0.95)).cumsum()  # a copied span: a chain of confident lookup nodes
    assert plan.go_deeper(sure[:1], sure[:1], 1, times)
    assert plan.nodes(sure, times) == 9
    observe_tree(merged, plan, times, sure, np.ones(8, dtype=bool), costs.verify_s(9), 9)
    assert merged.summary()["lookup_rounds"] == 1
    assert costs.draft_root_now == pytest.approx(0.009)  # a lookup-only round teaches nothing of the model
    alone = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6)
    assert not alone.plan().drafts and not alone.plan().free_only
    cheap = TreeBudget(steep(), max_nodes=60, max_depth=6, free_lookup=True)
    cheap.plan()
    observe_plain(cheap, 0.009)
    plan = cheap.plan()
    assert plan.drafts and not plan.free_only  # a draft that can pay drafts with its lookups


def test_free_rounds_where_the_budget_said_plain_are_sized_and_teach_only_acceptance():
    """Where the budget says plain but a grammar forces the root, the loop runs a round of the free drafts:
    the budget sizes it on today's verify costs with no draft time (a sure forced chain is verified, a doubtful
    tail is not), and learns its nodes' acceptance from it, while its guard and probe schedule only count the
    plain step it replaced."""
    budget = TreeBudget(steep(), max_nodes=60, max_depth=6)
    plan = budget.free_plan()
    assert plan.drafts and plan.free_only and plan.unasked
    times = RoundTimes(0.0)
    chain = np.concatenate([np.zeros(4), np.log(np.full(6, 0.05)).cumsum()])  # 4 forced tokens, then guesses
    assert plan.go_deeper(chain[:1], chain[:1], 1, times)
    assert plan.nodes(chain, times) == 5
    observed = budget.acceptance.n_observed
    guard = budget.guard.summary()
    observe_tree(budget, plan, times, chain[:4], np.ones(4, dtype=bool), budget.costs.verify_s(5), 5)
    assert budget.acceptance.n_observed == observed + 4
    assert budget.guard.summary() == guard and budget.tree_rate is None
    assert budget.schedule.plain_steps == 1


def test_losing_trees_explore_only_as_their_account_allows():
    """Once trees lose, a probe comes only while the model rounds' exploration account is positive: a quarter of
    a plain step per answer plus 1% of the decoding, paid by each probe's loss. So exploring costs a bounded share of
    the decoding, and no round count carried from an earlier answer decides it."""
    budget = TreeBudget(steep(), max_nodes=60, max_depth=6)
    scores = np.array([-1.5, -2.0, -2.5])
    assert not wants_tree(budget)  # no plain step measured yet: the first round is one
    for _ in range(3):
        observe_plain(budget, 0.009)

    def tree_round(plan: RoundPlan, accepted: bool) -> None:
        times = RoundTimes(0.0, levels=[0.0])
        plan.go_deeper(scores, scores, 1, times)
        observe_tree(budget, plan, times, scores, np.array([accepted, False, False]), 0.02, 1 + int(accepted))

    plan = budget.plan()
    assert plan.drafts  # nothing known yet: try a tree
    tree_round(plan, False)  # one token for 2.2 plain steps: trees lose (no probe yet: nothing paid)
    assert budget.losing(MODEL_ROUND) and budget.accounts[MODEL_ROUND].left == 0.25
    plan = budget.plan()
    assert plan.drafts  # the allowance pays for a probe, which loses 1.2 steps: overdrawn
    tree_round(plan, False)
    assert not budget.accounts[MODEL_ROUND].open
    pattern = []
    for _ in range(300):
        plan = budget.plan()
        pattern.append(plan.drafts)
        if plan.drafts:
            tree_round(plan, False)
        else:
            observe_plain(budget, 0.009)
    probes = [i for i, w in enumerate(pattern) if w]
    steps = 300 - len(probes) + 2.2 * (len(probes) + 2)
    lost = budget.accounts[MODEL_ROUND].spent  # what the probes lost (the first tree was no probe)
    assert lost == pytest.approx(1.2 * (len(probes) + 1), rel=0.05)
    assert lost <= 0.25 + 0.01 * steps + 1.2  # the allowance, the share, and the round that overdrew it
    assert len(probes) >= 2 and all(100 <= g <= 140 for g in np.diff(probes))  # ~1.2 / 0.01 steps apart
    budget.begin_answer()  # a new answer adds its allowance: at most a quarter step, debts stay
    assert budget.accounts[MODEL_ROUND].left <= 0.25
    set_tree_rate(budget, 10 * budget.costs.plain_rate)  # a probe that wins brings trees back at once
    tree_round_won = budget.tree_plan()
    times = RoundTimes(0.0, levels=[0.0])
    tree_round_won.go_deeper(scores, scores, 1, times)
    observe_tree(budget, tree_round_won, times, scores, np.array([True, True, True]), 0.001, 4)
    assert not budget.losing(MODEL_ROUND) and sum(wants_tree(budget) for _ in range(10)) >= 9


def test_acceptance_map_starts_at_path_confidence_and_converges():
    amap = AcceptanceMap()
    s = np.array([-3.0, -1.0, -0.2])
    assert np.allclose(amap.prob(s), np.exp(s), atol=0.2)  # the prior: EAGLE-2's exp(score)

    def truth(x):  # a draft that is overconfident: acceptance = exp(score)^2
        return np.exp(2 * x)

    rng = np.random.default_rng(0)
    for _ in range(400):
        scores = -rng.exponential(1.5, 60)
        amap.observe(scores, rng.random(60) < truth(scores))
    for lo in np.arange(-4.0, 0.0, 0.5):
        mid = lo + 0.25
        expected = np.mean(truth(np.linspace(lo, lo + 0.5, 101)))
        assert abs(amap.prob(np.array([mid]))[0] - expected) < 0.06, (lo, amap.prob(np.array([mid])), expected)
    assert np.all(np.diff(amap.rates()) >= 0)  # monotone: better scores never rank lower


def test_lookup_map_tells_a_chains_first_node_from_its_fifteenth():
    """A lookup chain's nodes all score within a nat of 0: the lookup's map learns their acceptance apart (a
    model draft's half-nat bins would value the first and the fifteenth node alike)."""
    rng = np.random.default_rng(1)
    depth = np.arange(1, 16)
    scores = depth * np.log(0.97)  # a copy the lookup rates 0.97 a token
    fine, coarse = SourceAcceptance(), SourceAcceptance(lookup_fine=None)
    lookup = np.full(len(depth), LOOKUP, dtype=np.int8)
    for _ in range(200):  # the answer goes on with the copy 0.9 of the time a token
        accepted = depth <= rng.geometric(0.1) - 1
        fine.observe(scores, lookup, accepted)
        coarse.observe(scores, lookup, accepted)
    first, last = fine.prob(scores[[0, -1]], lookup[:2])
    assert first > 0.8 and last < 0.4 and first - last > 0.5
    assert np.ptp(coarse.prob(scores, lookup)) < 0.05  # one bin: the reason for the fine ones
    assert np.all(np.diff(fine.maps[LOOKUP].rates()) >= 0)


def test_only_a_lookup_alone_values_its_chains_by_fine_bins():
    """A merged draft's lookup map keeps the wide bins, which learn from its many missing lookup-only children
    fast enough to keep lookup rounds off prose; a lookup alone gets the fine ones."""
    world = World(**QWEN_CPU)
    merged = TreeBudget(true_costs(world), max_nodes=16, max_depth=6, free_lookup=True)
    alone = TreeBudget(true_costs(world), max_nodes=16, max_depth=16, model_draft=False)
    chain = np.log(0.97) * np.array([1, 8])
    lookup = np.full(2, LOOKUP, dtype=np.int8)
    assert np.ptp(merged.acceptance.prob(chain, lookup)) == 0.0
    assert np.ptp(alone.acceptance.prob(chain, lookup)) > 0.1
    assert len(alone.summary()["acceptance_by_score"]) == len(alone.acceptance.maps[LOOKUP].edges)  # a key a bin


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


def test_poisoned_calibration_fails_its_checks_and_is_not_cached(tmp_path):
    """Verify times measured under load (3.04 s for 1 node, 2.90 for 2, 0.12 for 3, 3.16 for 32, 2.69 for 60):
    not monotone within tolerance, so a calibration like it is reported and never cached."""
    times = {n: [t] for n, t in zip(POISONED_SIZES, POISONED_VERIFY)}
    cal = summarise(times, [3.0], Limits())
    assert cal.problems == ["3 nodes (120.0 ms) cheaper than 2 (2900.0 ms)"]
    key = CostKey(model="m", draft="d", build="b", threads=2, n_gpu_layers=0, tree_top_k=10)
    costs, info = cached_or_measured(key, lambda: cost_model(cal, 0.0018, 0.0063), directory=tmp_path)
    assert info["source"] == "fresh, not cached (disturbed)" and info["problems"] == cal.problems
    assert not list(tmp_path.glob("*.json"))  # nothing cached (the calibration lock's file may stay)


def sim_timers(world: World, load_of_call):
    """Timing functions on a simulated machine whose load factor depends on the call's index."""
    calls = [0]

    def timed(seconds: float) -> float:
        calls[0] += 1
        return seconds * load_of_call(calls[0])

    return (lambda: timed(world.plain_s)), (lambda n: timed(world.verify_time(n))), calls


def test_calibration_is_interleaved_and_robust_to_a_burst_of_load():
    """A burst of load stalling every call for a stretch (llama.cpp's spin-waiting threads) spoils one round of
    each size, not some sizes entirely: the medians stay within a few percent and the checks pass."""
    world = World()
    per_round = len(CPU_SIZES) + 1  # every size, the plain step and a one-node tree
    time_plain, time_verify, calls = sim_timers(world, lambda i: 10.0 if 11 <= i < 17 else 1.0)  # in round 2
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert calls[0] == 5 * per_round and cal.attempts == 1 and not cal.problems
    for n in CPU_SIZES:
        assert cal.verify[n] == pytest.approx(world.verify_time(n), rel=1e-9), n
    # a longer burst, over two rounds, may stall one size twice: too much spread, so it is measured again
    time_plain, time_verify, calls = sim_timers(world, lambda i: 4.0 if 15 <= i < 24 else 1.0)
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert calls[0] == 10 * per_round and cal.attempts == 2 and not cal.problems
    assert all(cal.verify[n] == pytest.approx(world.verify_time(n), rel=1e-9) for n in CPU_SIZES)
    one_sweep = [world.verify_time(n) * (80.0 if 3 <= i < 6 else 1.0) for i, n in enumerate(CPU_SIZES)]
    assert summarise({n: [t] for n, t in zip(CPU_SIZES, one_sweep)}, [world.plain_s], Limits()).problems


def test_calibration_under_persistent_load_is_remeasured_then_not_cached(tmp_path):
    rng = np.random.default_rng(5)
    stalls = rng.choice([1.0, 1.0, 5.0], size=10_000)  # a third of the passes stall
    world = World()
    time_plain, time_verify, calls = sim_timers(world, lambda i: stalls[i])
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert cal.attempts == 2 and cal.problems and calls[0] == 2 * 5 * (len(CPU_SIZES) + 1)
    # a machine so busy that the timings add up to over 15 s is not made to wait for more than 3 rounds
    time_plain, time_verify, calls = sim_timers(world, lambda i: 100 * stalls[i])
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert cal.attempts == 1 and cal.problems and calls[0] == 3 * (len(CPU_SIZES) + 1)
    key = CostKey(model="m", draft="d", build="b", threads=2, n_gpu_layers=0, tree_top_k=10)
    _, info = cached_or_measured(key, lambda: cost_model(cal, 0.0018, 0.0063), directory=tmp_path)
    assert info["source"] == "fresh, not cached (disturbed)" and load_costs(key, tmp_path) is None
    # the load goes away for the second attempt: re-measured, checked, cached
    time_plain, time_verify, calls = sim_timers(world, lambda i: stalls[i] if i <= 50 else 1.0)
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert cal.attempts == 2 and not cal.problems
    _, info = cached_or_measured(key, lambda: cost_model(cal, 0.0018, 0.0063), directory=tmp_path)
    assert info["source"] == "fresh" and load_costs(key, tmp_path) is not None


def run_budget(costs: CostModel, world: World, rounds: int = 600, seed: int = 0, **kw) -> tuple[TreeBudget, Tally]:
    budget = TreeBudget(costs, max_nodes=60, max_depth=6, **kw)
    return budget, run(budget, world, rounds, np.random.default_rng(seed))


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


def test_spiky_calibration_then_budget_chooses_plain():
    """Load spikes during calibration, then the budget on the calibrated costs: plain decoding."""
    world = World()
    time_plain, time_verify, _ = sim_timers(world, lambda i: 50.0 if i % 7 == 0 else 1.0)
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    budget, tally = run_budget(cost_model(cal, 0.0018, 0.0063), world, rounds=300)
    assert tally.tree_share(10) == 0.0 and tally.rate(10) == pytest.approx(1 / world.plain_s)


def test_cached_calibration_is_checked_cheaply_at_start():
    world = World()
    time_plain, time_verify, calls = sim_timers(world, lambda i: 2.0)  # twice as busy as at calibration
    good = CostModel(CPU_SIZES, [world.plain_s * s for s in world.shape], 0.0018, 0.0063)
    agrees, info = adopt_cached(good, time_plain, time_verify, 16)
    assert agrees and calls[0] == 8 and info["tree_over_plain"] == pytest.approx(9.46)
    assert good.load == pytest.approx(2.0) and good.n_plain == 5  # the budget starts from today's speed
    poisoned = CostModel(POISONED_SIZES, POISONED_VERIFY, 0.0018, 0.0063)
    agrees, info = adopt_cached(poisoned, time_plain, time_verify, 16)
    assert not agrees and "16 nodes cost 9.5 plain steps, the cache says 1.0" == info["reason"]


def test_budget_decisions_do_not_flip_when_the_machine_gets_busier():
    """Load scales plain steps and trees alike: a draft that cannot pay stays unused at any load."""
    budget = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6)
    for _ in range(100):
        assert not wants_tree(budget)
        observe_plain(budget, 0.080)  # 9x slower plain steps than calibrated
    assert budget.costs.load > 5 and budget.ceiling_rate() < budget.costs.plain_rate


def test_cost_cache_is_keyed_and_refreshable(tmp_path):
    key = CostKey(model="m.gguf:1:2", draft="d.gguf:3:4", build="0.3.36 CPU", threads=2, n_gpu_layers=0,
                  tree_top_k=10)
    calls = []

    def measure() -> CostModel:
        calls.append(1)
        return steep()

    costs, info = cached_or_measured(key, measure, directory=tmp_path)
    assert info["source"] == "fresh" and len(calls) == 1
    again, info = cached_or_measured(key, measure, directory=tmp_path)
    assert info["source"] == "cached" and len(calls) == 1 and again.to_dict() == costs.to_dict()
    _, info = cached_or_measured(key, measure, refresh=True, directory=tmp_path)
    assert info["source"] == "fresh" and len(calls) == 2
    _, info = cached_or_measured(key, measure, directory=tmp_path, check=lambda c: (True, {"tree_over_plain": 7.9}))
    assert info["source"] == "cached-verified" and info["check"] == {"tree_over_plain": 7.9} and len(calls) == 2
    disagree = (False, {"reason": "16 nodes cost 2.0 plain steps, the cache says 7.9"})
    _, info = cached_or_measured(key, measure, directory=tmp_path, check=lambda c: disagree)
    assert info["source"] == "re-measured" and info["check"] == disagree[1] and len(calls) == 3

    def disturbed() -> CostModel:
        cm = flat()
        cm.quality = {"problems": ["60 nodes spread 300%"]}
        return cm

    kept, info = cached_or_measured(key, disturbed, directory=tmp_path, check=lambda c: disagree)
    assert info["source"] == "cached, kept (re-measure disturbed)" and kept.to_dict() == steep().to_dict()
    assert load_costs(key, tmp_path).to_dict() == steep().to_dict()  # the disturbed one was not written
    other = CostKey(model="m.gguf:1:2", draft="d.gguf:3:4", build="0.3.36 CPU", threads=1, n_gpu_layers=0,
                    tree_top_k=10)
    assert other.file_name() != key.file_name() and load_costs(other, tmp_path) is None
    (tmp_path / key.file_name()).write_text("{not json")
    assert load_costs(key, tmp_path) is None  # a corrupt cache means recalibrating, not crashing
    assert save_costs(key, steep(), tmp_path / "f" / "g") is not None


def fake_clock(steps):
    """A clock that advances by the next of ``steps`` (cycled) at every reading: real llama.cpp calls, timed
    deterministically."""
    state = {"t": 0.0, "i": 0}

    def clock() -> float:
        state["t"] += steps[state["i"] % len(steps)]
        state["i"] += 1
        return state["t"]

    return clock


def test_eagle2_calibrates_once_then_checks_the_cache(synth_q8, tmp_path, monkeypatch):
    """budget="auto" (the default) measures costs on first use and caches them if they pass the consistency
    checks, checks a cached calibration at start, never caches a disturbed one, and stays lossless."""
    from functools import partial

    from eagle2_local import api
    from eagle2_local.api import Eagle2
    from eagle2_local.measure import microbench

    def timing(steps) -> None:  # every timed call of calibration and start check takes the next step
        monkeypatch.setattr(api, "measure_costs", partial(microbench.measure_costs, clock=fake_clock(steps)))
        monkeypatch.setattr(api, "check_costs", partial(microbench.check_costs, clock=fake_clock(steps)))

    monkeypatch.setenv("EAGLE2_LOCAL_CACHE", str(tmp_path))
    lines: list[str] = []
    kw = dict(draft_model_path=synth_q8, n_ctx=512, n_threads=1, depth=4, tree_top_k=3)
    timing([0.01])  # a steady machine: every size costs the same, which passes the checks
    with Eagle2(synth_q8, progress=lines.append, **kw) as llm:
        assert llm.budget_mode == "auto" and lines  # progress was reported
        out = llm.create_completion("the cat", max_tokens=24, temperature=0)
        stats = out["eagle"]
        assert stats["budget"]["calibration"]["source"] == "fresh"
        assert set(stats["budget"]["calibration"]["verify_ms"]) >= {1, 8, 16, 32, 60}
        assert stats["n_tokens"] == 24
        plain = llm.create_completion("the cat", max_tokens=24, temperature=0, speculative=False)
        assert plain["choices"][0]["text"] == out["choices"][0]["text"]
    assert len(list(tmp_path.glob("costs-*.json"))) == 1
    with Eagle2(synth_q8, **kw) as llm:
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert llm.stats()["budget"]["calibration"]["source"] == "cached-verified"
    timing([0.01, 0.01, 0.01, 0.01, 0.01, 0.5])  # every third timing stalls
    with Eagle2(synth_q8, recalibrate=True, **kw) as llm:
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        cal = llm.stats()["budget"]["calibration"]
        assert cal["source"] == "fresh, not cached (disturbed)" and cal["problems"]
    assert load_costs_any(tmp_path)["verify_s"][-1] == pytest.approx(0.01)  # the steady one stays cached
    with Eagle2(synth_q8, total_tokens=8, **kw) as llm:  # an explicit size means EAGLE-2's fixed tree
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert llm.budget_mode == "fixed" and llm.stats()["budget"] is None
    with pytest.raises(Exception, match="budget"):
        Eagle2(synth_q8, budget="sometimes", **kw)


def load_costs_any(directory) -> dict:
    import json

    (path,) = directory.glob("costs-*.json")
    return json.loads(path.read_text())["costs"]


def test_probes_wait_while_the_draft_has_a_long_backlog():
    """Catching a head up on a long backlog (a new prompt, many plain steps) costs more than a probe can win:
    once trees have lost, a probe is postponed until the backlog is short; winning trees ignore the backlog."""
    budget = TreeBudget(steep(), max_nodes=60, max_depth=6,
                        schedule=ProbeSchedule(explore_allowance=100.0))
    scores = np.array([-1.5, -2.0, -2.5])
    for _ in range(3):
        observe_plain(budget, 0.009)
    # nothing known about trees yet, but 500 tokens cost the draft ~55 plain steps (a token as dear as its root):
    # that catch-up waits (test_long_prompt_on_a_loaded_cpu_stays_plain); here the tree round is forced
    assert not wants_tree(budget, fresh_tokens=500)
    plan = budget.tree_plan(500)
    times = RoundTimes(0.0, levels=[0.0])
    plan.go_deeper(scores, scores, 1, times)
    observe_tree(budget, plan, times, scores, np.array([False, False, False]), 0.02, 1)
    assert not any(wants_tree(budget, fresh_tokens=100 + i) for i in range(20))
    assert any(wants_tree(budget, fresh_tokens=3) for _ in range(4))
    set_tree_rate(budget, 10 * budget.costs.plain_rate)
    assert wants_tree(budget, fresh_tokens=500)


def test_a_lookup_probe_ignores_a_long_backlog_it_ingests_for_free():
    """The backlog rule spares the draft a dear catch-up; a lookup ingests 500 tokens in a fraction of a plain
    step, so after losing rounds its probes come on time whatever the backlog."""
    def losing_budget(token_s: float) -> TreeBudget:
        costs = CostModel(SIZES, [0.009 * c for c in STEEP], 0.0005, 0.0005, token_s)
        budget = TreeBudget(costs, max_nodes=60, max_depth=6,
                            schedule=ProbeSchedule(explore_allowance=100.0))
        for _ in range(3):
            observe_plain(budget, 0.009)
        set_tree_rate(budget, 0.5 * budget.costs.plain_rate)  # trees lost, modelled and realised
        budget.guard.add_tree(1, 0.05)
        return budget
    lookup, head = losing_budget(token_s=0.000001), losing_budget(token_s=0.0009)
    assert wants_tree_within(lookup, 500, 10)
    assert not wants_tree_within(head, 500, 10)


# ------------------------------------------------------------------ plain runs (the loop's decision paid once)
def test_a_plain_run_is_as_long_as_makes_the_decision_cheap_and_grows_only_after_plain_steps():
    """A run pays one decision for k steps: k brings the decision's median under ``deciding_share`` of the steps,
    within ``max_plain_run``, and at most a ``run_growth``-th of the plain steps since the last drafted round (a
    copy that resumes after a few edited tokens is looked for at every step)."""
    schedule = ProbeSchedule()
    assert schedule.plain_run(0.010) == 1  # no decision timed yet
    for _ in range(80):
        schedule.plain_taken(0.00019)  # 0.19 ms to decide a 10 ms step: 1.9%
    assert schedule.plain_run(0.010) == 8  # the fewest steps that bring it under 0.25%
    assert schedule.plain_run(0.080) == 1  # a large model's step: under 0.25% already
    assert schedule.plain_run(0.001) == schedule.max_plain_run  # a GPU's: as long as allowed
    schedule.round_started()  # a drafted round: runs start again one step at a time
    runs = []
    for _ in range(12):
        schedule.plain_taken(None)  # a run's later steps carry no decision
        runs.append(schedule.plain_run(0.001))
    assert runs == [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    schedule.begin_answer()
    assert schedule.plain_run(0.001) == 1  # a new answer may copy from its first token


def test_where_no_tree_pays_the_budget_plans_plain_runs_and_hears_each_of_their_steps():
    """Where no round of either kind can pay (every node costs a plain step), the budget plans plain runs, longer as
    the plain steps go by; every step still reaches the cost model and the schedule."""
    costs = CostModel(SIZES, [0.010 * n for n in SIZES], 0.001, 0.002)
    budget = TreeBudget(costs, max_nodes=60, max_depth=6, free_lookup=True)
    budget.begin_answer()
    runs = []
    while sum(runs) < 300:
        plan = budget.plan(1, lookup_rate=0.9)
        assert not plan.drafts
        runs.append(plan.steps)
        for step in range(plan.steps):
            times = RoundTimes(0.0, drafted=0.0, verified=0.010, done=0.010, asked=-0.0004 if step == 0 else None)
            budget.observe(RoundResult(plan, times))
    assert runs[:4] == [1, 1, 1, 1] and max(runs) == budget.schedule.max_plain_run
    assert runs == sorted(runs)
    assert budget.schedule.plain_steps == sum(runs) and budget.costs.n_plain > 0
    cheap = TreeBudget(CostModel(SIZES, [0.010 * n for n in SIZES], 0.001, 0.002), max_nodes=60, max_depth=6)
    for _ in range(100):
        assert cheap.plan(1).steps == 1
        cheap.observe(RoundResult(PLAIN_STEP, RoundTimes(0.0, drafted=0.0, verified=0.010, done=0.010,
                                                         asked=-0.00001)))


# ------------------------------------------------------------------ a long prompt's catch-up (the catch-up rule)
# SmolLM2 and its EAGLE-3 head, 1 thread, 3 busy loops on the 2 cores (benchmarks/results/
# bench-budget-default-head-auto-under-busy-loops-sum-n8.json): plain step 83 ms, draft root 11.5 ms, level 57 ms,
# and the head's catch-up over a 769-token prompt 2.4 s, i.e. 3.1 ms a token.
LOADED = dict(plain_s=0.083, root_s=0.0115, level_s=0.057, token_s=0.0031)
# GPU-like: verifying 60 nodes costs ~1.3 tokens, the head is cheap and ingests a prompt in a fraction of a step
GPU = dict(plain_s=0.015, shape=[1.0, 1.01, 1.02, 1.03, 1.05, 1.1, 1.2, 1.3], root_s=0.0008, level_s=0.0008,
           token_s=0.000003)


def true_costs(world: World, token_s: float | None = None) -> CostModel:
    """What a calibration on ``world`` measures (``token_s``: the per-token catch-up it found)."""
    return CostModel(CPU_SIZES, [world.plain_s * s for s in world.shape], world.root_s, world.level_s,
                     world.token_s if token_s is None else token_s)


def test_long_prompt_on_a_loaded_cpu_stays_plain():
    """Catching the head up on a 769-token prompt costs 29 plain steps here, more than trees could save in a
    64-token answer: with nothing known about trees yet, the draft waits (catch-up at most 2% of the plain
    time since), so the answer is plain decoding and costs no catch-up. Without the wait, round 2 drafts."""
    world = World(**LOADED)
    budget = TreeBudget(true_costs(world), max_nodes=60, max_depth=6)
    assert budget.ceiling_rate() > budget.costs.plain_rate  # a tree could pay, so only the catch-up holds it
    tally = run(budget, world, 63, np.random.default_rng(0), prompt=769)
    assert not any(tally.tree_rounds) and tally.rate() == pytest.approx(1 / world.plain_s)
    assert budget.catch_up_postponed == 63  # every round
    assert budget.summary()["catch_up_postponed"] == 63
    assert budget.costs.catch_up_steps(769) == pytest.approx(768 * 0.0031 / 0.083)
    # a long answer: the draft is tried once the catch-up is 2% of the plain time spent, and not before
    tally = run(budget, world, 1500, np.random.default_rng(0), tally=tally, prompt=769 + 63)  # the same backlog
    first = tally.tree_rounds.index(True)
    assert 1430 <= first <= 1445  # 28.7 plain steps of catch-up <= 0.02 x (steps since the prompt)


def test_long_prompt_on_a_gpu_starts_trees_after_a_few_tokens():
    """The same 700-token prompt where ingesting it costs 0.14 plain steps and trees win: the draft waits
    seven plain steps, then trees run and realise several tokens per plain step's time."""
    world = World(**GPU)
    budget = TreeBudget(true_costs(world), max_nodes=60, max_depth=6)
    tally = run(budget, world, 64, np.random.default_rng(0), prompt=700)
    first = tally.tree_rounds.index(True)
    assert first <= 9 and budget.catch_up_postponed >= 1  # postponed, but only briefly
    assert tally.tree_share(first) > 0.85 and tally.rate() > 2 / world.plain_s


def test_once_trees_win_a_long_backlog_is_caught_up_at_once():
    """When trees are known to win, the catch-up of a new prompt is an investment: paid in the first round
    (after a plain probe at most), even where it costs dozens of plain steps."""
    world = World(**GPU)
    budget = TreeBudget(true_costs(world, token_s=0.001), max_nodes=60, max_depth=6)
    world.token_s = 0.001  # 700 tokens: 47 plain steps, which a postponed draft would wait 470 rounds on
    set_tree_rate(budget, 3 * budget.costs.plain_rate)
    run(budget, world, 30, np.random.default_rng(0), prompt=5)
    assert not budget.losing(MODEL_ROUND)
    postponed = budget.catch_up_postponed
    tally = run(budget, world, 8, np.random.default_rng(1), prompt=700)
    assert any(tally.tree_rounds[:2]) and budget.catch_up_postponed == postponed
    assert budget.costs.draft_token_now == pytest.approx(0.001, rel=0.2)  # the catch-up timed online


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


def test_catch_up_cost_is_calibrated_and_cached(tmp_path):
    """The per-token catch-up cost travels through the cache; a cost model without it takes a backlog token
    to cost as much as the root (an upper bound) until a real catch-up is timed."""
    key = CostKey(model="m", draft="d", build="b", threads=1, n_gpu_layers=0, tree_top_k=10)
    costs = CostModel(SIZES, STEEP, 0.001, 0.002, 0.00025)
    save_costs(key, costs, tmp_path)
    again = load_costs(key, tmp_path)
    assert again.draft_token_s == 0.00025 and again.catch_up_steps(101) == pytest.approx(100 * 0.00025)
    assert "draft_token_s" not in steep().to_dict()
    assert steep().catch_up_steps(11) == pytest.approx(10 * 0.001 / 0.009)  # unmeasured: a token = a root


# ------------------------------------------------------------------ kinds of round: model draft and lookups apart
# Qwen2.5-Coder-1.5B on this 2-core CPU, 2 threads (BENCHMARKS.md): verifying n tokens costs c(2) ~1.75, c(4) ~2.4,
# c(8) ~4, c(16) ~5.5 plain steps; asking the lookup costs a fraction of a millisecond against a ~60 ms step.
QWEN_CPU = dict(plain_s=0.060, shape=[1.0, 1.75, 2.1, 2.4, 4.0, 5.5, 9.0, 16.0], root_s=0.004, level_s=0.004,
                look_s=0.0003)


def answers(budget: TreeBudget, world: World, n_answers: int, rounds: int, seed: int = 0, **kw) -> Tally:
    """``n_answers`` answers of ``rounds`` rounds each, every one announced as the generator does."""
    tally = Tally()
    for a in range(n_answers):
        budget.begin_answer()
        run(budget, world, rounds, np.random.default_rng(seed + a), tally=tally, **kw)
    return tally


def test_a_sure_lookup_chain_is_drafted_from_the_first_rounds_of_a_short_answer():
    """A lookup draft on the Qwen-like CPU, copying text it is sure of: after the one plain step that measures
    the unit, the first rounds draft chains (no round has run yet: the lookup's own confidence is the evidence;
    the plain probes that measure the plain step and a round without a match aside), and the 64-token answer
    runs well above plain speed."""
    world = World(**QWEN_CPU, copy_rate=0.9, lookup_p=0.9, copy_p=0.97)
    budget = TreeBudget(true_costs(world), max_nodes=16, max_depth=12, model_draft=False)
    tally = answers(budget, world, 1, 30, model_draft=False)
    assert not tally.tree_rounds[0] and sum(tally.tree_rounds[1:6]) >= 3
    assert 4 <= np.median([n for n in tally.sizes if n > 1]) <= 16  # chains of a few to 16 nodes
    assert tally.rate() > 1.5 / world.plain_s and sum(tally.tokens) >= 64


def test_a_losing_model_draft_does_not_stop_sure_lookups():
    """A merged draft whose model part is badly overconfident beside lookups that copy surely: lookup rounds
    realise more than merged ones (no draft time, no wasted model nodes), so they carry the answers, well above
    plain speed. And once the model rounds' guard has tripped and their account is spent, lookup rounds go on."""
    world = World(**QWEN_CPU, accept_power=6.0, copy_rate=0.6, lookup_p=0.9, copy_p=0.97)
    budget = TreeBudget(true_costs(world), max_nodes=16, max_depth=6, free_lookup=True)
    tally = answers(budget, world, 8, 64)
    assert not budget.losing(LOOKUP_ROUND) and budget.lookup_rounds > 0.5 * len(tally.tokens)  # 60% match
    assert tally.rate(64) > 1.3 / world.plain_s
    budget.guard.tripped, budget.accounts[MODEL_ROUND].left = True, -5.0  # model rounds lost, nothing left
    set_tree_rate(budget, 0.5 * budget.costs.plain_rate)
    tally = answers(budget, world, 2, 64, seed=100)
    assert budget.losing(MODEL_ROUND) and tally.tree_share() > 0.4 and tally.rate() > 1.3 / world.plain_s


def test_lookups_that_lose_do_not_stop_a_winning_model_draft():
    """The reverse: on a GPU-like machine the model draft wins; lookup-only rounds, whose lookups find nothing,
    lose (they are only the root and the lookup's cost). The model rounds keep drafting, no lookup round runs
    without a match, and the answers run at several times plain speed."""
    world = World(**{**GPU, "accept_power": 1.0}, copy_rate=0.0, look_s=0.0015)
    budget = TreeBudget(true_costs(world), max_nodes=60, max_depth=6, free_lookup=True)
    for _ in range(LOOKUP_MIN_ROUNDS):  # lookup rounds alone that find nothing: realised below plain steps
        plan = budget.tree_plan(kind=LOOKUP_ROUND)
        times = RoundTimes(0.0, levels=[0.0015])
        observe_tree(budget, plan, times, np.zeros(0), np.zeros(0, dtype=bool), 0.015, 1)
        observe_plain(budget, 0.015)
    assert budget.losing(LOOKUP_ROUND)
    tally = answers(budget, world, 4, 64)
    assert not budget.losing(MODEL_ROUND)
    assert budget.lookup_rounds == LOOKUP_MIN_ROUNDS  # no match: no lookup round of their own
    assert tally.tree_share(8) > 0.8 and tally.rate(8) > 2 / world.plain_s


def test_lookups_that_rarely_find_a_span_stay_at_plain_speed():
    """The default model and head on this CPU: the head cannot pay, lookups run alone, and on ordinary text they
    rarely find a span (2% of rounds) while each look costs 4% of a plain step. Looking is judged by what it
    realises, and looks after it loses are paid from its account, so over many short answers the speed stays at
    plain speed (>= 0.98x)."""
    world = World(copy_rate=0.02, lookup_p=0.5, copy_p=0.6, look_s=0.0003)
    budget = TreeBudget(true_costs(world), max_nodes=60, max_depth=6, free_lookup=True)
    assert budget.ceiling_rate() < budget.costs.plain_rate  # the head sits out
    tally = answers(budget, world, 16, 64)
    assert tally.rate() >= 0.98 / world.plain_s
    steps = sum(tally.seconds) / world.plain_s
    assert budget.accounts[LOOKUP_ROUND].spent <= 16 * 0.25 + 0.01 * steps + 5.5


def test_exploring_a_losing_model_draft_costs_a_bounded_share_of_every_short_answer():
    """A model draft whose ceiling pays but whose guesses do not (overconfident) on the Qwen-like CPU: over 20
    answers of 64 tokens its exploration costs at most the allowance and 1% per answer, not a backoff carried
    across answers: the answers run at >= 0.95x plain speed."""
    world = World(**QWEN_CPU, accept_power=6.0)
    budget = TreeBudget(true_costs(world), max_nodes=16, max_depth=6)
    tally = answers(budget, world, 20, 64)
    spent = budget.accounts[MODEL_ROUND].spent
    steps = sum(tally.seconds) / world.plain_s
    assert spent <= 20 * 0.25 + 0.01 * steps + 5.5  # allowances, the share, one 16-node round that overdrew
    assert tally.rate() >= 0.95 / world.plain_s and sum(tally.tree_rounds) >= 5  # it did keep exploring


def test_noisy_plain_decodes_of_root_only_rounds_do_not_judge_the_lookup():
    """On a loaded machine one pass in ten stalls (6x its time). A lookup round whose best tree is the root alone
    is a plain decode plus the look: it is judged at the median plain step plus what looking cost, so a stalled
    decode in such a round does not trip the lookup's guard, and the copied spans keep paying."""
    world = World(**QWEN_CPU, copy_rate=0.3, lookup_p=0.9, copy_p=0.97)
    budget = TreeBudget(true_costs(world), max_nodes=16, max_depth=12, model_draft=False)
    noise = np.where(np.random.default_rng(5).random(4000) < 0.1, 6.0, 1.0)
    tally = Tally()
    for a in range(8):
        budget.begin_answer()
        run(budget, world, 64, np.random.default_rng(a), tally=tally, model_draft=False,
            load_at=lambda i, a=a: noise[64 * a + i])
    assert budget.guard.trips <= 2 and budget.evidence_rounds > 0.2 * len(tally.tokens)  # 30% of rounds match
    assert sum(tally.tokens) / len(tally.tokens) > 1.5  # tau


def test_a_copying_answer_after_prose_answers_drafts_from_its_first_rounds():
    """Prose answers whose rare, short matches carry the low rates prose taught the lookup run no lookup round;
    and even where the lookups' record says they lose (guard tripped, account overdrawn), a new answer that
    copies its prompt drafts sure chains from its first rounds: its long exact matches carry the high rate the
    lookup learned for such matches (per kind and length, from the text), and that evidence alone makes a
    chain pay on the calibrated curve."""
    prose = World(**QWEN_CPU, copy_rate=0.05, lookup_p=0.3, copy_p=0.3)
    budget = TreeBudget(true_costs(prose), max_nodes=16, max_depth=12, model_draft=False)
    answers(budget, prose, 6, 64, model_draft=False)
    assert budget.lookup_rounds == 0 and budget.evidence_rounds == 0
    budget.guard.tripped, budget.accounts[LOOKUP_ROUND].left = True, -5.0  # a record of lookups losing
    set_tree_rate(budget, 0.5 * budget.costs.plain_rate)
    assert budget.losing(LOOKUP_ROUND)
    copying = World(**QWEN_CPU, copy_rate=0.9, lookup_p=0.9, copy_p=0.97)
    copying.now = prose.now
    tally = answers(budget, copying, 1, 30, seed=50, model_draft=False)
    assert sum(tally.tree_rounds[:4]) >= 2 and tally.rate() > 1.5 / copying.plain_s
    assert not budget.losing(LOOKUP_ROUND)  # the copied spans' rounds won: lookups are back for what follows


def test_prose_answers_after_prose_answers_pay_nothing_for_lookups():
    """The default model and head on this CPU (the head cannot pay; a look costs 4% of a plain step) over prose
    whose matches are frequent but short and learned unsure: no match is evidence enough for a chain to pay on
    the steep curve, so no answer runs a lookup round (none to judge lookups on, as when every answer judged
    them afresh by looking), and the answers run at plain speed."""
    world = World(copy_rate=0.3, lookup_p=0.3, copy_p=0.3, look_s=0.0003)
    budget = TreeBudget(true_costs(world), max_nodes=60, max_depth=6, free_lookup=True)
    tally = answers(budget, world, 12, 64)
    assert budget.lookup_rounds == 0 and budget.evidence_rounds == 0
    assert tally.rate() >= 0.999 / world.plain_s
    assert budget.plan(1, 0.97).free_only  # a sure match would be drafted at once


def test_a_new_answer_weighs_the_lookup_maps_rates_as_its_prior():
    """The lookups' acceptance map keeps what one answer's chains taught (its rates), at no more than the prior's
    weight in the next answer, so that answer's own chains move it as fast as they moved a new map: after an
    answer whose 16-node chains were all accepted, three chains of a paraphrasing answer that miss at once stop
    the chains that the first answer's full count would still run. The model draft's map (a
    property of the draft, not of the text) keeps its counts."""
    chain = np.log(0.97) * np.arange(1, 16)
    lookup = np.full(15, LOOKUP, dtype=np.int8)
    # Qwen2.5-Coder-1.5B Q4_0 at 2 threads on the AVX2 EPYC, as calibrated there (NOTES.md, 2026-12-03)
    avx2 = World(**{**QWEN_CPU, "shape": [1.0, 1.73, 2.71, 3.16, 7.28, 10.2, 20.4, 39.0]})

    def after_a_copying_answer() -> TreeBudget:
        budget = TreeBudget(true_costs(avx2), max_nodes=16, max_depth=12, model_draft=False)
        for _ in range(60):  # every chain accepted whole
            budget.acceptance.observe(chain, lookup, np.ones(15, dtype=bool))
        budget.acceptance.observe(np.array([-0.5, -1.0]), np.zeros(2, dtype=np.int8), np.array([True, False]))
        return budget

    budget, kept = after_a_copying_answer(), after_a_copying_answer()
    lookup_map = budget.acceptance.maps[LOOKUP]
    rates, model_counts = lookup_map.rates().copy(), budget.acceptance.maps[0].counts.copy()
    assert budget.evidence_gain(0.97) > 1.3
    budget.begin_answer()
    assert (lookup_map.counts <= lookup_map.prior_counts + 1e-9).all()
    assert np.abs(lookup_map.rates() - rates).max() < 0.02
    np.testing.assert_array_equal(budget.acceptance.maps[0].counts, model_counts)
    assert budget.evidence_gain(0.97) > 1.3  # a copying answer after it starts as sure
    missed = np.zeros(15, dtype=bool)
    for b in (budget, kept):
        for _ in range(3):
            b.acceptance.observe(chain, lookup, missed)
    assert budget.evidence_gain(0.97) <= 1.0
    assert kept.evidence_gain(0.97) > 1.3  # at the full count the copying answer's wins still run chains


def test_rounds_that_verified_only_forced_tokens_judge_no_kind():
    """Under a grammar a drafted round may verify only forced tokens (free and certain): it has its own
    acceptance map and leaves the kind's record and exploration account alone, even where a forced guess
    missed; a round with lookup nodes among them is judged as a lookup round."""
    from eagle2_local.tree.proposals import FORCED, LOOKUP

    budget = TreeBudget(steep(), max_nodes=16, max_depth=6, model_draft=False)
    observe_plain(budget, 0.009)
    before = (budget._gain[LOOKUP_ROUND], len(budget.guard.tree), budget.accounts[LOOKUP_ROUND].left)
    plan = budget.tree_plan(kind=LOOKUP_ROUND)
    forced = RoundResult(plan, RoundTimes(0.0, levels=[0.0], drafted=0.0, verified=0.05, done=0.05), 1,
                         np.array([0.0, 0.0]), np.full(2, FORCED, dtype=np.int8), np.array([False, False]))
    budget.observe(forced)
    assert (budget._gain[LOOKUP_ROUND], len(budget.guard.tree), budget.accounts[LOOKUP_ROUND].left) == before
    assert budget.acceptance.maps[FORCED].n_observed == 2 and budget.acceptance.maps[LOOKUP].n_observed == 0
    mixed = RoundResult(plan, RoundTimes(0.0, levels=[0.0], drafted=0.0, verified=0.05, done=0.05), 1,
                        np.array([0.0, -0.1]), np.array([FORCED, LOOKUP], dtype=np.int8), np.array([False, False]))
    budget.observe(mixed)
    assert len(budget.guard.tree) == 1 and budget._gain[LOOKUP_ROUND] is not None


def test_evidence_gain_kept_per_rate_equals_it_computed_afresh():
    """The lookup's evidence is valued once per rate until the acceptance maps or the cost shape move: between
    plain steps that change only the plain rate, nodes that teach the maps alone, verify times that correct only
    the shape and lookup rounds that do both, every kept value equals a fresh computation."""
    rng = np.random.default_rng(5)
    budget = TreeBudget(steep(), max_nodes=16, max_depth=16, model_draft=False)
    rates = [0.5, 0.9, 0.97, 0.99, 0.999]
    for step in range(80):
        for rate in rates:
            for switch, prior in ((0.0, False), (0.123, False), (0.123, True)):
                gain = budget.evidence_gain(rate, switch, prior)
                assert gain == (budget._chain_gain(rate, round(switch, 2), prior) if gain else 0.0)
        if step % 4 == 0:
            observe_plain(budget, 0.009 * float(rng.uniform(0.8, 1.3)))
        elif step % 4 == 1:  # the maps alone (a free round in place of a plain step teaches them so)
            n = int(rng.integers(1, 8))
            budget.acceptance.observe(np.log(rng.uniform(0.9, 1.0, n)), np.full(n, LOOKUP, dtype=np.int8),
                                      rng.random(n) < 0.3)
        elif step % 4 == 2:  # the shape alone
            budget.costs.observe_verify(int(rng.integers(2, 16)), 0.009 * float(rng.uniform(2.0, 9.0)))
        else:
            n = int(rng.integers(1, 8))
            plan = budget.tree_plan(1, LOOKUP_ROUND)
            accepted = np.arange(n) < int(rng.integers(0, n + 1))
            times = RoundTimes(0.0, levels=[0.0])
            times.drafted = 0.0
            times.verified = times.done = 0.009 * (1 + 0.3 * n)
            budget.observe(RoundResult(plan, times, int(accepted.sum()) + 1, np.log(rng.uniform(0.5, 1.0, n)),
                                       np.full(n, LOOKUP, dtype=np.int8), accepted))
    assert len(budget._evidence) > 0 and budget.acceptance.n_observed > 0
