"""The realised-rate guards (tree_policy/guard.py), one per kind of round: a losing model draft does not stop sure
lookups, lookups that lose do not stop a winning model draft, and noisy plain decodes do not judge the lookup."""

from __future__ import annotations

import numpy as np

from eagle2_local.tree_policy import RoundTimes, TreeBudget
from eagle2_local.tree_policy.budget import LOOKUP_MIN_ROUNDS
from eagle2_local.tree_policy.learning import LOOKUP_ROUND, MODEL_ROUND
from tests.support.budget_helpers import GPU, QWEN_CPU, answers, observe_plain, observe_tree, set_tree_rate, true_costs
from tests.support.budget_sim import Tally, World, run


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
