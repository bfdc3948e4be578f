"""What the auto budget learns from a round (tree_policy/learning.py): a round judged by what its own plan says,
exploring rounds charged to their kind's account (the catch-up included, a stall capped), free and forced-only rounds
that teach only acceptance, a root kept alone counted as a plain step after a tree."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.tree_policy import RoundResult, RoundTimes, TreeBudget
from eagle2_local.tree_policy.learning import EXPLORED_AT_MOST, LOOKUP_ROUND, MODEL_ROUND
from tests.support.budget_helpers import observe_plain, observe_tree, slower_after_trees, steep


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
