"""The auto budget's planning (tree_policy/budget.py) on synthetic cost curves (no llama.cpp): a draft that cannot
pay is never run, a round's go-deeper and size read its times, lookup-only trees draft where the model draft cannot
pay, sure lookup chains are drafted from an answer's first rounds, sealed lookup maps are probed and unsealed, and a
tree that gains less than it costs the plain steps after it is not drafted."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.tree.proposals import LOOKUP
from eagle2_local.tree_policy import CostModel, RoundResult, RoundTimes, TreeBudget
from eagle2_local.tree_policy.learning import LOOKUP_ROUND
from tests.support.budget_helpers import (QWEN_CPU, SIZES, answers, eagle_like_scores, flat, observe_lookup_chain,
                                          observe_plain, observe_tree, sealed_merged_budget, set_tree_rate,
                                          slower_after_trees, steep, true_costs, wants_tree)
from tests.support.budget_sim import World


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
