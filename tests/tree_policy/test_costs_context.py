"""The cost model at the context of each round: verify curves timed at two contexts, interpolated linearly in
context, the online correction carried across contexts, the long context the calibration picks, the cache; and one
real calibration of SmolLM2 at two contexts."""

from __future__ import annotations

import time

import numpy as np
import pytest

from eagle2_local.measure import calibration
from eagle2_local.measure.calibration import Calibration, cost_model, long_context, long_sizes
from eagle2_local.measure.cost_cache import CACHE_VERSION, CostKey, load_costs, save_costs
from eagle2_local.tree_policy import PLAIN_STEP, CostModel, TreeBudget
from eagle2_local.tree_policy.costs import CONTEXT_STEP, EXTRAPOLATE_UP_TO, ContextCurve
from eagle2_local.tree_policy.learning import MODEL_ROUND

PLAIN = 0.010
SIZES = [1, 2, 3, 4, 6, 8, 16, 60]
SHORT = [1.0, 1.8, 2.6, 2.1, 3.0, 4.0, 7.0, 25.0]  # c(n) at 64 tokens: 4 nodes cheaper than 3 (a kernel's tooth)
LONG_AT = 1024
LONG_SIZES = (1, 2, 4, 16, 60)
LONG = [1.0, 2.0, 2.9, 9.0, 35.0]  # c(n) at 1024 tokens: steeper


def short_only() -> CostModel:
    return CostModel(SIZES, [PLAIN * c for c in SHORT], 0.002, 0.001)


def two_contexts(long: list[float] = LONG, draft_root: float = 0.002) -> CostModel:
    plain_long = 1.3 * PLAIN  # the plain step is dearer there too: the shape is in that context's plain steps
    return CostModel(SIZES, [PLAIN * c for c in SHORT], draft_root, 0.001,
                     longer=[ContextCurve(LONG_AT, LONG_SIZES, tuple(plain_long * c for c in long))])


def shapes(costs: CostModel, ns=(2, 3, 4, 6, 8, 16, 32, 60)) -> list[float]:
    return [float(costs.shape(n)) for n in ns]


def test_one_context_is_the_model_of_old():
    """Without a longer curve the context changes nothing: same shape, no re-derivation, same record."""
    costs = short_only()
    before, version = shapes(costs), costs.shape_version
    for ctx in (10, 64, 700, 4000):
        assert costs.at_context(ctx) is False
    assert shapes(costs) == before and costs.shape_version == version
    assert costs.to_dict() == {"sizes": SIZES, "verify_s": [round(PLAIN * c, 7) for c in SHORT],
                               "draft_root_s": 0.002, "draft_level_s": 0.001, "context": 64}
    assert "calibrated_contexts" not in costs.summary()
    old_record = {k: v for k, v in costs.to_dict().items() if k != "context"}  # a version-4 cache's costs
    assert CostModel.from_dict(old_record).context == 64


def test_the_shape_follows_the_context_linearly():
    costs = two_contexts()
    short = shapes(costs)
    assert short == shapes(short_only())  # the model starts at the short calibration's context
    costs.at_context(LONG_AT)
    long = shapes(costs)
    # measured sizes are the long curve's own; between them the short shape times the interpolated ratio
    assert [long[0], long[2], long[5]] == pytest.approx([2.0, 2.9, 9.0])
    assert long[-1] == pytest.approx(35.0)
    assert long[1] == pytest.approx(min(3.0, 2.6 * np.interp(np.log(3), np.log([2, 4]), [2.0 / 1.8, 2.9 / 2.1])))
    assert long[4] == pytest.approx(4.0 * np.interp(np.log(8), np.log([4, 16]), [2.9 / 2.1, 9.0 / 7.0]))
    assert all(b >= a for a, b in zip(short, long))
    mid = (64 + LONG_AT) // 2
    costs.at_context(mid)
    assert shapes(costs) == pytest.approx([(a + b) / 2 for a, b in zip(short, long)])
    costs.at_context(0)  # shorter than the short calibration: its shape (not extrapolated down)
    assert shapes(costs) == pytest.approx(short)


def test_past_the_longest_context_the_shape_is_extrapolated_then_held():
    costs = two_contexts()
    costs.at_context(LONG_AT)
    long = np.array(shapes(costs))
    slope = (long - np.array(shapes(short_only()))) / (LONG_AT - 64)
    costs.at_context(1600)
    ns = np.array([2, 3, 4, 6, 8, 16, 32, 60])
    assert shapes(costs) == pytest.approx(np.minimum(long + slope * (1600 - LONG_AT), ns))
    costs.at_context(int(EXTRAPOLATE_UP_TO * LONG_AT))
    far = shapes(costs)
    costs.at_context(100_000)
    assert shapes(costs) == pytest.approx(far) and all(c <= n for c, n in zip(far, ns))
    # a long curve cheaper than the short one (noise) is never extrapolated downwards
    cheap = two_contexts(long=[1.0, 1.7, 2.0, 6.5, 24.0])
    cheap.at_context(LONG_AT)
    at_long = shapes(cheap)
    cheap.at_context(2 * LONG_AT)
    assert shapes(cheap) == pytest.approx(at_long)


def test_the_shape_moves_in_steps_of_context():
    costs = two_contexts()
    version = costs.shape_version
    assert costs.at_context(64 + CONTEXT_STEP - 1) is False and costs.shape_version == version
    assert costs.at_context(64 + CONTEXT_STEP) is True and costs.shape_version == version + 1
    assert costs.summary()["context"] == 64 + CONTEXT_STEP
    assert costs.summary()["calibrated_contexts"] == [64, LONG_AT]


def test_a_correction_learned_at_one_context_applies_at_another():
    """Trees 20% dearer than calibrated at 64 tokens: the correction is relative to the calibrated shape at the
    round's context, so at 1024 tokens the prediction is the long shape 20% dearer, not the short one's."""
    costs = two_contexts()
    for _ in range(3):
        costs.observe_plain(PLAIN)
        costs.observe_verify(4, 1.2 * 2.1 * PLAIN)
    assert costs.shape(4) == pytest.approx(1.2 * 2.1)
    costs.at_context(LONG_AT)
    assert costs.shape(4) == pytest.approx(1.2 * 2.9)
    # trees at the long context that cost just what its curve says pull the correction back towards 1
    for _ in range(6):
        costs.observe_plain(1.3 * PLAIN)
    for _ in range(6):
        costs.observe_verify(4, 2.9 * 1.3 * PLAIN)
    assert costs.shape(4) == pytest.approx(2.9)
    costs.at_context(64)
    assert costs.shape(4) == pytest.approx(2.1)
    assert costs.calibrated_shape(4, 64) == pytest.approx(2.1)
    assert costs.calibrated_shape(4, LONG_AT) == pytest.approx(2.9)


def test_two_contexts_round_trip_and_cache(tmp_path):
    costs = two_contexts()
    again = CostModel.from_dict(costs.to_dict())
    assert again.to_dict() == costs.to_dict() and [c.context for c in again.longer] == [LONG_AT]
    key = CostKey(model="m", draft=None, build="b", threads=1, n_gpu_layers=0, tree_top_k=10)
    assert key.as_dict()["version"] == CACHE_VERSION >= 5  # version-4 caches (one context) are re-measured
    save_costs(key, costs, tmp_path)
    assert load_costs(key, tmp_path).to_dict() == costs.to_dict()
    with pytest.raises(ValueError):
        CostModel(SIZES, [PLAIN * c for c in SHORT], 0.0, 0.0, longer=[ContextCurve(64, (1, 2), (0.01, 0.02))])


def test_the_budget_reads_the_costs_at_the_targets_context():
    """Free drafting, trees that pay at 64 tokens and cannot at 1024: the budget drafts on the short prompt and
    decodes plainly on the long one, from the first round, without a tree run to learn it."""
    free_at_short = [1.0, 1.2, 1.4, 1.5, 2.0, 2.5, 4.0, 12.0]
    steep_at_long = [1.0, 2.0, 4.0, 16.0, 60.0]  # attention-bound: a node costs a plain step
    ctx = [64]
    costs = CostModel(SIZES, [PLAIN * c for c in free_at_short], 0.1 * PLAIN, 0.1 * PLAIN,
                      longer=[ContextCurve(LONG_AT, LONG_SIZES, tuple(PLAIN * c for c in steep_at_long))])
    budget = TreeBudget(costs, max_nodes=16, max_depth=4, context_of=lambda: ctx[0])
    budget.plan()
    assert budget._kind_can_pay(MODEL_ROUND)
    ctx[0] = LONG_AT
    assert budget.plan() is PLAIN_STEP and not budget._kind_can_pay(MODEL_ROUND)
    assert costs.context_now == LONG_AT


def test_the_long_context_fits_the_context_and_the_prefill_budget():
    cal = Calibration({1: PLAIN, 60: 60 * 0.004}, PLAIN, {1: 0.0, 60: 0.0})  # 4 ms a prompt token
    assert long_context(cal, 4096, 60) == 2048
    assert long_context(cal, 2048, 60) == 1984  # the largest tree still fits
    assert long_context(cal, 1024, 60) == 960  # the largest tree still fits
    assert long_context(cal, 1024, 60, limit_s=2.0) == 512  # 64 + 2 s / 4 ms = 564 tokens, in steps of 64
    assert long_context(cal, 300, 60) is None and long_context(cal, 4096, 60, limit_s=0.5) is None
    assert long_sizes(type("P", (), {"total_tokens": 10})()) == [1, 2, 3, 4, 6, 8, 10]


def test_a_disturbed_long_curve_is_a_disturbed_calibration():
    short = Calibration({1: PLAIN, 2: 2 * PLAIN}, PLAIN, {1: 0.1, 2: 0.1})
    long = Calibration({1: PLAIN, 2: 3 * PLAIN}, PLAIN, {1: 0.1, 2: 0.9}, problems=["2 nodes spread 90%"])
    costs = cost_model(short, 0.001, 0.001, longer={LONG_AT: long})
    assert costs.quality["problems"] == [f"at {LONG_AT} tokens: 2 nodes spread 90%"]
    assert costs.quality["contexts"] == [64, LONG_AT] and costs.quality["max_spread"] == 0.9
    assert costs.longer == [ContextCurve(LONG_AT, (1, 2), (PLAIN, 3 * PLAIN))]


@pytest.mark.smollm2
def test_smollm2_costs_more_plain_steps_at_a_long_context(smollm2_path, smollm2_head, monkeypatch):
    """The real calibration times SmolLM2 at 64 tokens and at a long context: two anchors, the long one where
    the context allows, and its mid-size trees no cheaper in plain steps (attention grows with the KV; a loose
    bound: at 448 tokens the rise is ~10%, less than the noise next to other test workers). CPU clock at one
    thread, which other processes inflate less than the wall clock."""
    from eagle2_local.api import Eagle2
    from eagle2_local.measure.microbench import check_costs, measure_costs

    monkeypatch.setattr(calibration, "LONG_PREFILL_S", 120.0)  # whatever the load, reach the long context
    with Eagle2(smollm2_path, smollm2_head, n_ctx=512, n_threads=1, budget="fixed", total_tokens=6, depth=3) as llm:
        costs = measure_costs(llm.target, llm.generator.engine, llm.tree_params, clock=time.process_time)
        long_at = (llm.target.n_ctx - 7) // 64 * 64  # the largest tree fits (llama.cpp rounds n_ctx up)
        assert [c.context for c in costs.longer] == [long_at] and costs.quality["contexts"] == [64, long_at]
        assert costs.longer[0].sizes == (1, 2, 3, 4, 6)
        mid = [3, 4, 6]
        short = np.mean([costs.calibrated_shape(n, 64) for n in mid])
        long = np.mean([costs.calibrated_shape(n, long_at) for n in mid])
        assert long >= 0.7 * short
        assert llm.target.n_past == 0
        agrees, info = check_costs(llm.target, costs, llm.tree_params, clock=time.process_time)
        assert info["nodes"] == 6 and "cached_tree_over_plain" in info  # the start check still runs
