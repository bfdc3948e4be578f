"""Speculative sampling keeps the target's distribution: a chi-square test over thousands of seeded runs cannot
tell it from plain sampling, while the same test does catch a biased acceptance rule."""

from __future__ import annotations

import numpy as np
import pytest

import eagle2_local.generation.generator as generator_mod
from eagle2_local.decoding.acceptance import _walk
from eagle2_local.decoding.grammar import Grammar
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.tree.draft_tree import TreeParams
from eagle2_local.tree.sampling import SamplingParams
from tests.support.budget_helpers import set_tree_rate
from tests.support.helpers import N_RUNS, ONE_THREAD, chi2_pvalue, forced_budget, make, mask_ignoring, over_accepting

PROMPT = [1, 40, 41, 42, 43]


POSITIONS = (1, 2)  # tokens that come out of tree acceptance (position 0 comes from the prefill)
# Lower-case text: after PROMPT the synthetic model's favourite (';', p ~ 0.32) and others are forbidden, so the
# constrained distribution differs much from the raw one, and several drafted tokens stay allowed.
LOWER = Grammar('root ::= [a-z ]+')


def token_counts(gen, sampling: SamplingParams, positions=POSITIONS, grammar: Grammar | None = None,
                 runs: int = N_RUNS) -> dict[int, dict[int, int]]:
    """Per position, how often each token came out over ``runs`` seeded runs (one run serves every position)."""
    counts: dict[int, dict[int, int]] = {p: {} for p in positions}
    for seed in range(runs):
        toks = []
        # one token past the last position read: a tree is no deeper than the answer takes, so the round that
        # drafts the last position must still have a token to gain
        for ch in gen.generate(PROMPT, max(positions) + 2, sampling, seed=seed, grammar=grammar,
                               speculative=gen.engine is not None):
            toks += ch.tokens
        for p in positions:
            counts[p][outcome(toks, p)] = counts[p].get(outcome(toks, p), 0) + 1
    return counts


def outcome(toks: list[int], position: int) -> int:
    """The token at ``position``, or -1 where the answer ended before it (an end-of-generation token sampled
    earlier is an outcome too: dropping such runs would bias the counts)."""
    return toks[position] if position < len(toks) else -1


@pytest.fixture(scope="module")
def model(synth_q8):
    return LlamaModel(synth_q8)


@pytest.fixture(scope="module")
def plain_counts(model):
    """Plain decoding's token counts per sampling setting, computed once for every test of this module."""
    cache: dict[tuple, dict[int, dict[int, int]]] = {}

    def counts(sampling: SamplingParams, grammar: Grammar | None = None) -> dict[int, dict[int, int]]:
        if (sampling, grammar) not in cache:
            cache[sampling, grammar] = token_counts(make(model, None), sampling, grammar=grammar)
        return cache[sampling, grammar]
    return counts


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0),
                                      SamplingParams(temperature=0.7, top_p=0.9)], ids=["T1", "T0.7-top_p0.9"])
def test_speculative_sampling_matches_plain(model, plain_counts, sampling):
    spec = make(model, model, TreeParams(12, 4, 3))
    got = token_counts(spec, sampling)
    for position in POSITIONS:
        p = chi2_pvalue(plain_counts(sampling)[position], got[position])
        assert p > 0.01, f"position {position}: speculative differs from plain (p={p:.2e})"
    assert spec.last_stats.target_passes >= 1


def test_chi_square_catches_biased_acceptance(model, plain_counts):
    sampling = SamplingParams(temperature=1.0)
    spec = make(model, model, TreeParams(12, 4, 3))
    original = generator_mod.accept
    generator_mod.accept = over_accepting
    try:
        biased = token_counts(spec, sampling, positions=(1,))
    finally:
        generator_mod.accept = original
    p = chi2_pvalue(plain_counts(sampling)[1], biased[1])
    assert p < 1e-4, f"the biased rule went unnoticed (p={p:.2e})"


def test_tree_rejection_sampling_exact_distribution():
    """Without llama.cpp: over many draws the accepted-or-bonus first token follows p exactly."""
    from eagle2_local.tree.draft_tree import DraftTree
    rng = np.random.default_rng(0)
    V = 6
    logits = np.log(np.array([[0.05, 0.4, 0.3, 0.1, 0.1, 0.05]] * 4))
    tree = DraftTree(tokens=[0, 1, 3, 5], parents=[-1, 0, 0, 0], scores=[0, -0.1, -0.2, -0.3], cand_ids=[-1, 0, 1, 2])
    params = SamplingParams(temperature=1.0)
    counts = np.zeros(V)
    n = 40000
    for _ in range(n):
        acc = _walk(tree, logits, params, None, rng)
        first = tree.tokens[acc.path[1]] if len(acc.path) > 1 else acc.bonus
        counts[first] += 1
    np.testing.assert_allclose(counts / n, np.exp(logits[0]), atol=0.01)


def test_speculative_sampling_with_budget_matches_plain(model, plain_counts):
    """With the tree budget on, tokens come from trees of varying size and from plain steps; still exact."""
    from eagle2_local.decoding.target import Target
    from eagle2_local.drafts import DraftModelEngine
    from eagle2_local.generation.generator import Generator

    sampling = SamplingParams(temperature=1.0)
    spec = Generator(Target(model, ONE_THREAD), DraftModelEngine(model, ONE_THREAD, 3, 4), TreeParams(12, 4, 3),
                     policy=forced_budget(12, 4))
    sizes, plain_steps = set(), 0
    counts: list[dict[int, int]] = [{}, {}]
    for seed in range(N_RUNS):
        spec.policy = forced_budget(12, 4)
        if seed % 2:  # trees "lose": plain steps, and probe trees as the exploration account allows
            set_tree_rate(spec.policy, 0.0)
            spec.policy.plan()  # the probe falls before the run: it starts with a plain step
        toks = []
        for ch in spec.generate(PROMPT, 4, sampling, seed=seed):  # 4: a later round may still draft
            toks += ch.tokens
        for i in (0, 1):
            counts[i][outcome(toks, i + 1)] = counts[i].get(outcome(toks, i + 1), 0) + 1
        sizes |= set(spec.last_stats.tree_sizes)
        plain_steps += spec.last_stats.plain_steps
    for i, position in enumerate(POSITIONS):
        p = chi2_pvalue(plain_counts(sampling)[position], counts[i])
        assert p > 0.01, f"position {position}: speculative with budget differs from plain (p={p:.2e})"
    assert plain_steps >= N_RUNS // 2 and len(sizes) >= 3, (plain_steps, sizes)


def test_constrained_speculative_sampling_matches_plain(model, plain_counts):
    """Under a grammar: rejection sampling against the masked target at every visited node keeps plain
    constrained sampling's distribution; the same test catches acceptance against the unmasked target."""
    sampling = SamplingParams(temperature=1.0)
    spec = make(model, model, TreeParams(12, 4, 3))
    got = token_counts(spec, sampling, grammar=LOWER)
    plain = plain_counts(sampling, LOWER)
    for position in POSITIONS:
        p = chi2_pvalue(plain[position], got[position])
        assert p > 0.01, f"position {position}: constrained speculative differs from plain (p={p:.2e})"
    assert sum(spec.last_stats.accepted_by_source.values()) >= 1
    original = generator_mod.accept
    generator_mod.accept = mask_ignoring
    try:
        biased = token_counts(spec, sampling, positions=(1,), grammar=LOWER, runs=N_RUNS // 3)  # p ~ 1e-100 at N_RUNS
    finally:
        generator_mod.accept = original
    p = chi2_pvalue(plain[1], biased[1])
    assert p < 1e-4, f"acceptance ignoring the mask went unnoticed (p={p:.2e})"
