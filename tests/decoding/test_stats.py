"""Generation statistics add up: several generations as one (a chat's turns, a benchmark set, a server's totals)
give the same figures as one generation that did all their rounds."""

from __future__ import annotations

import pytest

from eagle2_local.decoding.stats import GenerationStats


def _turn(engine: str, budget: dict | None, depth: list[int], sizes: dict[int, int]) -> GenerationStats:
    return GenerationStats(engine=engine, prompt_tokens=5, n_tokens=10, target_passes=4, pass_tokens=10,
                           accepted_per_depth=depth, tree_sizes=sizes, nodes_by_source={"model": 12},
                           accepted_by_source={"model": 6}, plain_steps=1, budget=budget, prefill_s=0.5,
                           draft_s=0.25, verify_s=0.5, total_s=1.5, rounds=4, rounds_s=0.9, llama_s=0.6,
                           host_draft_s=0.02, host_verify_s=0.01)


def test_two_generations_add_up_to_one_that_did_both():
    first = _turn("head", None, [3, 1], {5: 3})
    second = _turn("head+lookup", {"state": "after"}, [2, 1, 1], {5: 1, 7: 2})
    second.nodes_by_source = {"model": 3, "lookup": 2}
    both = first + second
    assert (both.engine, both.budget) == ("head+lookup", {"state": "after"})  # the later one's: the state after
    assert both.n_tokens == 20 and both.target_passes == 8 and both.tau == 20 / 8
    assert both.accepted_per_depth == [5, 2, 1] and both.tree_sizes == {5: 4, 7: 2}
    assert both.nodes_by_source == {"model": 15, "lookup": 2} and both.accepted_by_source == {"model": 12}
    assert both.drafted_nodes == 4 * 4 + 2 * 6 and both.mean_tree_size == pytest.approx((4 * 5 + 2 * 7) / 6)
    assert both.decode_s == pytest.approx(2.0) and both.tokens_per_s == pytest.approx(10.0)
    host = both.host_totals()
    assert host["rounds"] == 8 and host["llama_s"] == 1.2 and host["host_ms_per_round"] == pytest.approx(7.5)
    assert host["host_us_per_node"] == pytest.approx(0.06 * 1e6 / 28, abs=1e-3)
    assert first.n_tokens == 10 and first.tree_sizes == {5: 3}  # the parts are left as they were


def test_the_empty_stats_add_nothing():
    turn = _turn("head", {"state": 1}, [3, 1], {5: 3})
    assert sum([turn], GenerationStats()).as_dict() == turn.as_dict()
    assert (GenerationStats() + turn).as_dict() == turn.as_dict()
    assert GenerationStats().tau == 1.0 and GenerationStats().as_dict()["host_us_per_node"] is None


def test_totals_dict_holds_only_figures_that_add_up():
    """The server's /stats totals: no per-generation figures (prompt reuse, timings of one request)."""
    totals = (_turn("head", None, [3], {4: 3}) + _turn("head", None, [2], {4: 3})).totals_dict()
    assert totals["tau"] == 2.5 and totals["rounds"] == 8
    assert "prompt_tokens_reused" not in totals and "prefill_s" not in totals and "budget" not in totals
