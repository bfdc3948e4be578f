"""The tree budget on synthetic cost curves (no llama.cpp): flat (GPU-like) curves buy large trees, steep
(CPU-like) ones small trees or plain steps; the acceptance map converges on simulated acceptance; the cost
model learns from observed timings and is cached on disk under its key."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.budget import AcceptanceMap, TreeBudget, best_size, deeper_can_pay
from eagle2_local.costs import CostKey, CostModel, cached_or_measured, load_costs, save_costs

SIZES = [1, 2, 4, 8, 16, 32, 64]
STEEP = [1.0, 1.77, 2.72, 4.45, 7.94, 15.0, 28.1]  # SmolLM2 on this 2-core CPU (DESIGN §5), x one token


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


def test_budget_keep_expanding_and_choose_size_with_a_fake_clock():
    now = [0.0]
    budget = TreeBudget(flat(), max_nodes=60, max_depth=6, clock=lambda: now[0])
    budget.start_round()
    scores = np.array([-0.05, -0.5, -1.0, -2.0])
    now[0] = 0.001
    assert budget.keep_expanding(scores, scores[:2], levels_done=1)
    assert not budget.keep_expanding(scores, scores[:2], levels_done=6)  # depth limit
    assert budget.choose_size(eagle_like_scores(np.random.default_rng(1))) == 60
    slow = TreeBudget(steep(draft_level=0.040), max_nodes=60, max_depth=6, clock=lambda: now[0])
    slow.start_round()
    assert not slow.keep_expanding(scores, scores[:2], levels_done=1)
    assert slow.choose_size(scores) <= 3


def test_a_draft_that_cannot_pay_is_never_run():
    """Even accepting every drafted token cannot beat plain decoding when one level costs 5 target tokens."""
    budget = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6)
    assert budget.ceiling_rate() < budget.costs.plain_rate
    assert not any(budget.wants_tree() for _ in range(500))
    assert TreeBudget(flat(), max_nodes=60, max_depth=6).ceiling_rate() > 5 * flat().plain_rate


def test_losing_trees_turn_into_plain_steps_with_backoff_probes():
    budget = TreeBudget(steep(), max_nodes=60, max_depth=6, probe_every=4, max_probe_every=16, clock=lambda: 0.0)
    scores = np.array([-1.5, -2.0, -2.5])

    def tree_round(accepted: bool) -> None:
        budget.start_round()
        budget.keep_expanding(scores, scores, levels_done=1)
        budget.observe_tree(scores, np.array([accepted, False, False]), 0.02, 1 + int(accepted))

    assert budget.wants_tree()  # nothing known yet: try a tree
    tree_round(False)  # one token for a tree's cost: slower than plain
    pattern = []
    for _ in range(40):
        want = budget.wants_tree()
        pattern.append(want)
        if want:
            tree_round(False)
        else:
            budget.observe_plain(0.009)
    probes = [i for i, w in enumerate(pattern) if w]
    gaps = np.diff(probes).tolist()
    assert gaps[:3] == [5, 9, 17] and all(g == 17 for g in gaps[3:])  # 4, 8, 16 plain steps between probes
    assert budget.plain_steps == 40 - len(probes)
    budget.tree_rate = 10 * budget.costs.plain_rate  # a probe that wins brings trees back at once
    assert all(budget.wants_tree() for _ in range(10))


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


def test_cost_model_interpolates_and_learns_online():
    cm = steep()
    assert cm.verify_s(3) == pytest.approx((cm.verify[1] + cm.verify[2]) / 2)
    assert cm.verify_s(128) > cm.verify_s(64)  # linear extrapolation past the last measured size
    shape = cm.verify_s(np.array(SIZES)) / cm.verify_s(1)
    for _ in range(200):
        cm.observe_verify(8, 3 * 0.009 * 4.45)  # the machine got 3x busier
    assert cm.load == pytest.approx(3.0, rel=0.01)
    assert cm.verify_s(1) == pytest.approx(3 * 0.009, rel=0.01)  # every size slows alike...
    assert np.allclose(cm.verify_s(np.array(SIZES)) / cm.verify_s(1), shape)  # ...and the curve keeps its shape
    for _ in range(200):
        cm.observe_draft(3 * 0.004, [3 * 0.010, 3 * 0.012])
    assert cm.draft_root_s == pytest.approx(0.004, rel=0.02) and 0.010 < cm.draft_level_s < 0.012
    assert cm.draft_s(3) == pytest.approx(3 * (cm.draft_root_s + 2 * cm.draft_level_s))
    with pytest.raises(ValueError):
        CostModel([2, 4], [0.1, 0.2], 0.0, 0.0)  # no n=1 anchor: no plain rate
    spoiled = CostModel([1, 2, 8, 16], [0.010, 0.011, 3.0, 0.1], 0.0, 0.0)  # one pass stalled by other load
    assert spoiled.verify_s(8) == pytest.approx(0.080) and spoiled.verify_s(16) == pytest.approx(0.160)


def test_budget_decisions_do_not_flip_when_the_machine_gets_busier():
    """Load scales plain steps and trees alike: a draft that cannot pay stays unused at any load."""
    budget = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6)
    for _ in range(100):
        assert not budget.wants_tree()
        budget.observe_plain(0.080)  # 9x slower plain steps than calibrated
    assert budget.costs.load > 5 and budget.ceiling_rate() < budget.costs.plain_rate


def test_cost_cache_is_keyed_and_refreshable(tmp_path):
    key = CostKey(model="m.gguf:1:2", draft="d.gguf:3:4", build="0.3.36 CPU", threads=2, n_gpu_layers=0,
                  tree_top_k=10)
    calls = []

    def measure() -> CostModel:
        calls.append(1)
        return steep()

    costs, info = cached_or_measured(key, measure, directory=tmp_path)
    assert info["source"] == "measured" and len(calls) == 1
    again, info = cached_or_measured(key, measure, directory=tmp_path)
    assert info["source"] == "cache" and len(calls) == 1 and again.to_dict() == costs.to_dict()
    _, info = cached_or_measured(key, measure, refresh=True, directory=tmp_path)
    assert info["source"] == "measured" and len(calls) == 2
    other = CostKey(model="m.gguf:1:2", draft="d.gguf:3:4", build="0.3.36 CPU", threads=1, n_gpu_layers=0,
                    tree_top_k=10)
    assert other.file_name() != key.file_name() and load_costs(other, tmp_path) is None
    (tmp_path / key.file_name()).write_text("{not json")
    assert load_costs(key, tmp_path) is None  # a corrupt cache means recalibrating, not crashing
    assert save_costs(key, steep(), tmp_path / "f" / "g") is not None


def test_eagle2_calibrates_once_then_reads_the_cache(synth_q8, tmp_path, monkeypatch):
    """budget="auto" (the default) measures costs on first use, caches them, and stays lossless."""
    from eagle2_local.api import Eagle2

    monkeypatch.setenv("EAGLE2_LOCAL_CACHE", str(tmp_path))
    lines: list[str] = []
    kw = dict(draft_model_path=synth_q8, n_ctx=512, n_threads=1, depth=4, tree_top_k=3)
    with Eagle2(synth_q8, progress=lines.append, **kw) as llm:
        assert llm.budget_mode == "auto" and lines  # progress was reported
        out = llm.create_completion("the cat", max_tokens=24, temperature=0)
        stats = out["eagle"]
        assert stats["budget"]["calibration"]["source"] == "measured"
        assert set(stats["budget"]["calibration"]["verify_ms"]) >= {1, 8, 16, 32, 60}
        assert stats["n_tokens"] == 24
        plain = llm.create_completion("the cat", max_tokens=24, temperature=0, speculative=False)
        assert plain["choices"][0]["text"] == out["choices"][0]["text"]
    assert len(list(tmp_path.glob("costs-*.json"))) == 1
    with Eagle2(synth_q8, **kw) as llm:
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert llm.stats()["budget"]["calibration"]["source"] == "cache"
    with Eagle2(synth_q8, recalibrate=True, **kw) as llm:
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert llm.stats()["budget"]["calibration"]["source"] == "measured"
    with Eagle2(synth_q8, total_tokens=8, **kw) as llm:  # an explicit size means EAGLE-2's fixed tree
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert llm.budget_mode == "fixed" and llm.stats()["budget"] is None
    with pytest.raises(Exception, match="budget"):
        Eagle2(synth_q8, budget="sometimes", **kw)


def test_probes_wait_while_the_draft_has_a_long_backlog():
    """Catching a head up on a long backlog (a new prompt, many plain steps) costs more than a probe can win:
    once trees have lost, a probe is postponed until the backlog is short; winning trees ignore the backlog."""
    budget = TreeBudget(steep(), max_nodes=60, max_depth=6, probe_every=2, max_probe_every=2, clock=lambda: 0.0)
    scores = np.array([-1.5, -2.0, -2.5])
    assert budget.wants_tree(fresh_tokens=500)  # nothing known yet: the first tree is always tried
    budget.start_round(500)
    budget.keep_expanding(scores, scores, levels_done=1)
    budget.observe_tree(scores, np.array([False, False, False]), 0.02, 1)
    assert not any(budget.wants_tree(fresh_tokens=100 + i) for i in range(20))
    assert any(budget.wants_tree(fresh_tokens=3) for _ in range(4))
    budget.tree_rate = 10 * budget.costs.plain_rate
    assert budget.wants_tree(fresh_tokens=500)
