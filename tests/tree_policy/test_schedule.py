"""When the auto budget drafts at all (tree_policy/schedule.py): losing drafts explored only as their account allows,
a bounded share of the decoding; probes postponed while a draft's catch-up on a long backlog costs more than it can
win back; plain runs where nothing pays."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.tree_policy import (PLAIN_STEP, CostModel, ProbeSchedule, RoundPlan, RoundResult, RoundTimes,
                                      TreeBudget)
from eagle2_local.tree_policy.learning import LOOKUP_ROUND, MODEL_ROUND
from tests.support.budget_helpers import (GPU, LOADED, QWEN_CPU, SIZES, STEEP, answers, observe_lookup_chain,
                                          observe_plain, observe_tree, sealed_merged_budget, set_tree_rate, steep,
                                          true_costs, wants_tree)
from tests.support.budget_sim import World, run


def wants_tree_within(budget: TreeBudget, fresh_tokens: int, rounds: int, plain_s: float = 0.009) -> bool:
    """Does a tree come within ``rounds`` rounds as the loop runs them from a backlog of ``fresh_tokens``: each
    plan, and where it says plain, a plain step of ``plain_s`` observed and one more token of backlog?"""
    for i in range(rounds):
        if wants_tree(budget, fresh_tokens + i):
            return True
        observe_plain(budget, plain_s)
    return False


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
