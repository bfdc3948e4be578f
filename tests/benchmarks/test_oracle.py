"""The best schedule in hindsight (benchmarks/oracle.py): hand-computed cases and a brute-force check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.oracle import (SizeTable, accepted_length, best_schedule, confidence_schedule,
                               hindsight_acceptance, hindsight_history_acceptance, on_accepted_path, recent_hits,
                               size_table)
from eagle2_local.tree.draft_tree import DraftTree
from eagle2_local.tree.proposals import LOOKUP, MODEL

ROOT = Path(__file__).resolve().parents[2]


def brute_force(acc: np.ndarray, cost: np.ndarray, draft: np.ndarray) -> float:
    """Least cost over every schedule, by plain recursion (small cases only)."""
    n_tok = len(acc)

    def least(i: int) -> float:
        if i >= n_tok:
            return 0.0
        return min(cost[n - 1] + (draft[i, n - 1] if n > 1 else 0.0) + least(i + min(acc[i, n - 1] + 1, n_tok - i))
                   for n in range(1, acc.shape[1] + 1))

    return least(0)


@pytest.mark.parametrize("c2, cost, sizes", [(2.5, 4.0, (1, 1, 1, 1)),  # dearer than the 2 tokens it emits
                                              (2.0, 4.0, (1, 1, 1, 1)),  # a tie goes to the plain step
                                              (1.5, 3.0, (2, 2))])
def test_a_tree_pays_only_when_it_costs_less_than_what_it_emits(c2, cost, sizes):
    acc = np.array([[0, 1]] * 4)  # every 2-node round accepts its one drafted token
    s = best_schedule(acc, np.array([1.0, c2]))
    assert s.cost == pytest.approx(cost) and s.sizes == sizes and s.tokens == 4


def test_a_round_emits_nothing_past_the_answer():
    s = best_schedule(np.array([[0, 5]] * 3), np.array([1.0, 1.2]))
    assert s.sizes == (2,) and s.cost == pytest.approx(1.2) and s.speedup == pytest.approx(3 / 1.2)


def test_hindsight_beats_the_greedy_choice():
    # at state 0 a 2-node round (2 tokens for 1.5) is the best local rate, but it lands on state 2 where nothing
    # pays; a plain step to state 1 reaches a 4-token round: 1 + 1.5 for all 5 tokens
    acc = np.array([[0, 1, 1], [0, 3, 3], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    s = best_schedule(acc, np.array([1.0, 1.5, 2.5]))
    assert s.sizes == (1, 2) and s.cost == pytest.approx(2.5)


def test_drafting_costs_count_and_the_plain_step_drafts_nothing():
    acc = np.array([[0, 1]] * 4)
    draft = np.full((4, 2), 0.6)  # column 0 (plain step) is ignored
    s = best_schedule(acc, np.array([1.0, 1.5]), draft)
    assert s.sizes == (1, 1, 1, 1) and s.cost == pytest.approx(4.0)
    s = best_schedule(acc, np.array([1.0, 1.5]), np.full((4, 2), 0.4))
    assert s.sizes == (2, 2) and s.cost == pytest.approx(3.8)


def test_matches_brute_force_on_random_cases():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_tok, n_sizes = int(rng.integers(1, 8)), int(rng.integers(1, 5))
        acc = np.sort(rng.integers(0, 4, size=(n_tok, n_sizes)), axis=1)
        acc[:, 0] = 0
        cost = np.concatenate([[1.0], 1.0 + np.cumsum(rng.uniform(0.1, 1.5, n_sizes - 1))])
        draft = rng.uniform(0, 0.5, size=(n_tok, n_sizes))
        s = best_schedule(acc, cost, draft)
        assert s.cost == pytest.approx(brute_force(acc, cost, draft))
        # the schedule's own rounds add up to its cost and emit exactly the answer
        i, total = 0, 0.0
        for n in s.sizes:
            total += cost[n - 1] + (draft[i, n - 1] if n > 1 else 0.0)
            i += min(acc[i, n - 1] + 1, n_tok - i)
        assert i == n_tok and total == pytest.approx(s.cost)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        best_schedule(np.array([[1, 1]]), np.array([1.0, 2.0]))  # the root alone accepts nothing
    with pytest.raises(ValueError):
        best_schedule(np.array([[0, 1]]), np.array([1.0]))


def test_accepted_length_follows_one_path():
    r, a, b, c, d = 1, 2, 3, 4, 5
    tree = DraftTree.from_parents([r, a, b, c, d], [-1, 0, 0, 1, 2])
    assert accepted_length(tree, np.array([b, d, 9])) == 2
    assert accepted_length(tree, np.array([a, 9])) == 1
    assert accepted_length(tree, np.array([a, d])) == 1  # d hangs under b, off the accepted path
    assert accepted_length(tree, np.array([b])) == 1  # the continuation ends
    assert accepted_length(tree, np.array([], dtype=np.int64)) == 0


def test_size_table_takes_the_drafts_ranking():
    tok, score, parent = np.array([5, 6, 7]), np.array([-0.1, -0.5, -0.2]), np.array([-1, -1, 0])
    table = size_table(0, tok, score, parent, np.array([MODEL, LOOKUP, LOOKUP], dtype=np.int8), np.array([5, 7]), 4)
    # ranked 5, 7 (child of 5), 6: n = 2 keeps 5, n = 3 adds 7 below it, n = 4 adds 6
    assert table.accepted.tolist() == [0, 1, 2, 2]
    assert table.depth.tolist() == [0, 1, 2, 2]
    assert table.model.tolist() == [False, True, True, True]
    lookups = size_table(0, tok, score, parent, np.full(3, LOOKUP, dtype=np.int8), np.array([6]), 4)
    assert lookups.accepted.tolist() == [0, 0, 0, 1] and not lookups.model.any()


def test_schedule_of_nothing():
    s = best_schedule(np.zeros((0, 3), dtype=np.int64), np.array([1.0, 2.0, 3.0]))
    assert s.cost == 0.0 and s.sizes == () and s.speedup == 1.0


def _table(accepted, scores, on_path, model=False):
    """A SizeTable of one position: trees of 1..N nodes accept ``accepted``; ranked candidates as given."""
    n = len(accepted)
    return SizeTable(np.array(accepted), np.ones(n, dtype=np.int64), np.full(n, model),
                     np.array(scores, dtype=np.float64), np.full(len(scores), LOOKUP, dtype=np.int8),
                     np.array(on_path))


def test_on_accepted_path_marks_the_matching_chain_only():
    tok, parent = np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 1])  # 5 -> 7, 6 -> 8
    assert on_accepted_path(tok, parent, np.array([5, 7, 9])).tolist() == [True, False, True, False]
    assert on_accepted_path(tok, parent, np.array([6, 7])).tolist() == [False, True, False, False]
    assert on_accepted_path(tok, parent, np.array([], dtype=np.int64)).tolist() == [False] * 4


def test_size_table_lists_the_ranked_candidates_and_their_path():
    tok, score, parent = np.array([5, 6, 7]), np.array([-0.1, -0.5, -0.2]), np.array([-1, -1, 0])
    table = size_table(0, tok, score, parent, None, np.array([5, 7]), 4)
    assert table.scores.tolist() == [-0.1, -0.2, -0.5] and table.on_path.tolist() == [True, True, False]
    assert (table.sources == MODEL).all()


def test_confidence_rule_drafts_where_the_map_says_it_pays_and_emits_what_is_accepted():
    # every position offers one candidate; sure ones (score -0.05) are always accepted, unsure ones (-3) never
    sure, unsure = _table([0, 1], [-0.05], [True]), _table([0, 0], [-3.0], [False])
    tables = [sure, unsure, sure, unsure, unsure]
    fitted = hindsight_acceptance(tables)
    assert fitted.prob(np.array([-0.05]), np.array([LOOKUP]))[0] == pytest.approx(1.0)
    assert fitted.prob(np.array([-3.0]), np.array([LOOKUP]))[0] == pytest.approx(0.0, abs=1e-6)
    verify = np.array([1.0, 1.5])
    s = confidence_schedule(tables, fitted, verify, np.zeros((5, 2)))
    # a sure round emits 2 tokens and skips the unsure state after it: positions 0 and 2 are rounds, 4 a plain step
    assert s.sizes == (2, 2, 1) and s.cost == pytest.approx(4.0) and s.tokens == 5
    # reading a draft that never pays at a plain step's price is refused: plain steps only, at plain cost
    s = confidence_schedule([unsure] * 3, fitted, verify, np.zeros((3, 2)), peek_cost=0.3)
    assert s.sizes == (1, 1, 1) and s.cost == pytest.approx(3.0)


def test_confidence_rule_never_beats_the_oracle():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n_tok, n = int(rng.integers(1, 10)), 4
        tables = []
        for _ in range(n_tok):
            on = np.sort(rng.random(n - 1) < 0.5)[::-1]  # a chain: accepted nodes come first in rank
            scores = np.sort(rng.uniform(-4, 0, n - 1))[::-1]
            tables.append(_table([0, *np.cumsum(on).tolist()], scores, on))
        fitted = hindsight_acceptance(tables)
        acc = np.array([t.accepted for t in tables])
        verify, draft = np.array([1.0, 1.4, 1.8, 2.3]), rng.uniform(0, 0.3, size=(n_tok, n))
        best = best_schedule(acc, verify, draft)
        assert confidence_schedule(tables, fitted, verify, draft).cost >= best.cost - 1e-9


def test_recent_hits_counts_the_first_guesses_back_to_a_position_without_candidates():
    hit, miss = _table([0, 1], [-1.0], [True]), _table([0, 0], [-1.0], [False])
    tables = [hit, None, hit, miss, hit]
    assert recent_hits(tables, 0, 2) == -1  # nothing before the first position
    assert recent_hits(tables, 2, 2) == -1  # the position right before has no candidates
    assert recent_hits(tables, 3, 2) == 1  # one hit, then the position without candidates ends the count
    assert recent_hits(tables, 5, 2) == 1 and recent_hits(tables, 5, 3) == 2


def test_a_rule_reading_the_drafts_record_drafts_in_runs_of_hits_and_stays_within_the_oracle():
    # the draft's first guess is right in runs (six hits, six misses) at one and the same score: its confidence says
    # nothing, its record says which run it is in
    hit, miss = _table([0, 1], [-1.0], [True]), _table([0, 0], [-1.0], [False])
    tables = ([hit] * 6 + [miss] * 6) * 4
    verify, draft = np.array([1.0, 1.6]), np.zeros((len(tables), 2))
    pooled = confidence_schedule(tables, hindsight_acceptance(tables), verify, draft)
    assert pooled.sizes == (1,) * len(tables)  # p = 0.5 everywhere: 1.5 tokens for 1.6 steps never pays
    by_record = hindsight_history_acceptance([tables], 1)
    assert set(by_record.by_hits) == {-1, 0, 1}
    reading = confidence_schedule(tables, by_record, verify, draft)
    assert reading.cost < pooled.cost and 2 in reading.sizes
    assert reading.cost >= best_schedule(np.array([t.accepted for t in tables]), verify, draft).cost - 1e-9


def test_the_replays_frozen_clock_takes_every_call_the_budget_makes_to_it(monkeypatch):
    """``benchmarks/budget_replay.py`` freezes time through the budget's own interfaces (``freeze_time``: frozen
    costs, ``TreeBudget.calibrated_time``); when it replaced the budget's plain-step hook instead, the hook gained an
    argument (a plain step's decision time) and every replay failed at its first plain step, with no test running
    one. Here a frozen budget hears decided plain steps and a tree, each charged its calibrated cost, not the
    clock's."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import budget_replay
    from eagle2_local.tree_policy import PLAIN_STEP, CostModel, RoundResult, RoundTimes, TreeBudget

    sizes = [1, 2, 4, 8, 16, 32, 64]
    costs = CostModel(sizes, [0.010 * (1 + 0.002 * n) for n in sizes], 0.0005, 0.0005)
    budget = TreeBudget(costs, max_nodes=60, max_depth=6)
    budget_replay.freeze_time(budget)
    for _ in range(3):
        budget.observe(RoundResult(PLAIN_STEP, RoundTimes(0.0, drafted=0.0, verified=0.5, done=0.5, asked=-1e-4)))
    plan = budget.plan(1)
    assert plan.drafts, plan
    times = RoundTimes(0.0, levels=[0.001], drafted=0.001, verified=3.0, done=3.0)
    budget.observe(RoundResult(plan, times, 2, np.log([0.9, 0.8]), accepted=np.array([True, False])))
    assert costs.summary()["plain_steps_in_window"] == 0 and costs.summary()["shape_corrections"] == {}
    assert budget.guard.plain_rate() == pytest.approx(1.0 / costs.verify_s(1))  # not the clock's 0.5 s a step
    assert budget_replay.round_cost(costs, 3, 1) == pytest.approx((costs.verify_s(3) + costs.draft_s(1))
                                                                  / costs.verify_s(1))


def test_a_chats_schedules_join_into_one(monkeypatch):
    """``budget_replay.py --turns all`` prices a chat as its answers' schedules added up: tokens and costs summed,
    rounds kept in order, so a record's speed is its every turn's tokens over their cost (as bench adds turns)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import budget_replay

    scripts = budget_replay.Schedule  # the script imports benchmarks/oracle.py as `oracle`, beside it
    first, second = scripts(3, 2.5, (1, 4)), scripts(2, 2.0, (1, 1))
    both = budget_replay.joined([first, second])
    assert (both.tokens, both.cost, both.sizes) == (5, 4.5, (1, 4, 1, 1))
    assert both.drafted_rounds == 1
    assert abs(both.speedup - 5 / 4.5) < 1e-12
    assert budget_replay.joined([first]) == first
