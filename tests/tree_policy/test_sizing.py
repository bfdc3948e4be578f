"""The sizing maths (tree_policy/sizing.py): flat (GPU-like) curves buy large trees, steep (CPU-like) ones small trees
or plain steps, deeper levels only where they can pay; the acceptance maps start at path confidence and converge on
simulated acceptance, the lookup's by fine bins, its rates carried into the next answer as a prior."""

from __future__ import annotations

import numpy as np

from eagle2_local.tree.proposals import LOOKUP
from eagle2_local.tree_policy import AcceptanceMap, SourceAcceptance, TreeBudget, best_size, deeper_can_pay
from tests.support.budget_helpers import QWEN_CPU, eagle_like_scores, flat, steep, true_costs
from tests.support.budget_sim import World


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
