"""The best schedule in hindsight (tree_policy/oracle.py): hand-computed cases and a brute-force check."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.decoding.tree import LOOKUP, MODEL, DraftTree
from eagle2_local.tree_policy.oracle import accepted_length, best_schedule, size_table


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
