"""Calibration (measure/calibration.py) on simulated machines: poisoned or loaded timings fail their checks and are
not cached, the measurement is interleaved and robust to a burst of load, a cached calibration is checked cheaply at
start, the catch-up cost is calibrated and cached; and Eagle2 calibrates once, then checks the cache."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.measure.calibration import Limits, adopt_cached, calibrate, cost_model, summarise
from eagle2_local.measure.cost_cache import CostKey, cached_or_measured, load_costs, save_costs
from eagle2_local.tree_policy import CostModel
from tests.support.budget_helpers import SIZES, STEEP, run_budget, steep
from tests.support.budget_sim import CPU_SIZES, POISONED_SIZES, POISONED_VERIFY, World


def test_poisoned_calibration_fails_its_checks_and_is_not_cached(tmp_path):
    """Verify times measured under load (3.04 s for 1 node, 2.90 for 2, 0.12 for 3, 3.16 for 32, 2.69 for 60):
    not monotone within tolerance, so a calibration like it is reported and never cached."""
    times = {n: [t] for n, t in zip(POISONED_SIZES, POISONED_VERIFY)}
    cal = summarise(times, [3.0], Limits())
    assert cal.problems == ["3 nodes (120.0 ms) cheaper than 2 (2900.0 ms)"]
    key = CostKey(model="m", draft="d", build="b", threads=2, n_gpu_layers=0, tree_top_k=10)
    costs, info = cached_or_measured(key, lambda: cost_model(cal, 0.0018, 0.0063), directory=tmp_path)
    assert info["source"] == "fresh, not cached (disturbed)" and info["problems"] == cal.problems
    assert not list(tmp_path.glob("*.json"))  # nothing cached (the calibration lock's file may stay)


def sim_timers(world: World, load_of_call):
    """Timing functions on a simulated machine whose load factor depends on the call's index."""
    calls = [0]

    def timed(seconds: float) -> float:
        calls[0] += 1
        return seconds * load_of_call(calls[0])

    return (lambda: timed(world.plain_s)), (lambda n: timed(world.verify_time(n))), calls


def test_calibration_is_interleaved_and_robust_to_a_burst_of_load():
    """A burst of load stalling every call for a stretch (llama.cpp's spin-waiting threads) spoils one round of
    each size, not some sizes entirely: the medians stay within a few percent and the checks pass."""
    world = World()
    per_round = len(CPU_SIZES) + 1  # every size, the plain step and a one-node tree
    time_plain, time_verify, calls = sim_timers(world, lambda i: 10.0 if 11 <= i < 17 else 1.0)  # in round 2
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert calls[0] == 5 * per_round and cal.attempts == 1 and not cal.problems
    for n in CPU_SIZES:
        assert cal.verify[n] == pytest.approx(world.verify_time(n), rel=1e-9), n
    # a longer burst, over two rounds, may stall one size twice: too much spread, so it is measured again
    time_plain, time_verify, calls = sim_timers(world, lambda i: 4.0 if 15 <= i < 24 else 1.0)
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert calls[0] == 10 * per_round and cal.attempts == 2 and not cal.problems
    assert all(cal.verify[n] == pytest.approx(world.verify_time(n), rel=1e-9) for n in CPU_SIZES)
    one_sweep = [world.verify_time(n) * (80.0 if 3 <= i < 6 else 1.0) for i, n in enumerate(CPU_SIZES)]
    assert summarise({n: [t] for n, t in zip(CPU_SIZES, one_sweep)}, [world.plain_s], Limits()).problems


def test_calibration_under_persistent_load_is_remeasured_then_not_cached(tmp_path):
    rng = np.random.default_rng(5)
    stalls = rng.choice([1.0, 1.0, 5.0], size=10_000)  # a third of the passes stall
    world = World()
    time_plain, time_verify, calls = sim_timers(world, lambda i: stalls[i])
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert cal.attempts == 2 and cal.problems and calls[0] == 2 * 5 * (len(CPU_SIZES) + 1)
    # a machine so busy that the timings add up to over 15 s is not made to wait for more than 3 rounds
    time_plain, time_verify, calls = sim_timers(world, lambda i: 100 * stalls[i])
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert cal.attempts == 1 and cal.problems and calls[0] == 3 * (len(CPU_SIZES) + 1)
    key = CostKey(model="m", draft="d", build="b", threads=2, n_gpu_layers=0, tree_top_k=10)
    _, info = cached_or_measured(key, lambda: cost_model(cal, 0.0018, 0.0063), directory=tmp_path)
    assert info["source"] == "fresh, not cached (disturbed)" and load_costs(key, tmp_path) is None
    # the load goes away for the second attempt: re-measured, checked, cached
    time_plain, time_verify, calls = sim_timers(world, lambda i: stalls[i] if i <= 50 else 1.0)
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    assert cal.attempts == 2 and not cal.problems
    _, info = cached_or_measured(key, lambda: cost_model(cal, 0.0018, 0.0063), directory=tmp_path)
    assert info["source"] == "fresh" and load_costs(key, tmp_path) is not None


def test_spiky_calibration_then_budget_chooses_plain():
    """Load spikes during calibration, then the budget on the calibrated costs: plain decoding."""
    world = World()
    time_plain, time_verify, _ = sim_timers(world, lambda i: 50.0 if i % 7 == 0 else 1.0)
    cal = calibrate(time_plain, time_verify, CPU_SIZES, rounds=5)
    budget, tally = run_budget(cost_model(cal, 0.0018, 0.0063), world, rounds=300)
    assert tally.tree_share(10) == 0.0 and tally.rate(10) == pytest.approx(1 / world.plain_s)


def test_cached_calibration_is_checked_cheaply_at_start():
    world = World()
    time_plain, time_verify, calls = sim_timers(world, lambda i: 2.0)  # twice as busy as at calibration
    good = CostModel(CPU_SIZES, [world.plain_s * s for s in world.shape], 0.0018, 0.0063)
    agrees, info = adopt_cached(good, time_plain, time_verify, 16)
    assert agrees and calls[0] == 8 and info["tree_over_plain"] == pytest.approx(9.46)
    assert good.load == pytest.approx(2.0) and good.n_plain == 5  # the budget starts from today's speed
    poisoned = CostModel(POISONED_SIZES, POISONED_VERIFY, 0.0018, 0.0063)
    agrees, info = adopt_cached(poisoned, time_plain, time_verify, 16)
    assert not agrees and "16 nodes cost 9.5 plain steps, the cache says 1.0" == info["reason"]


def fake_clock(steps):
    """A clock that advances by the next of ``steps`` (cycled) at every reading: real llama.cpp calls, timed
    deterministically."""
    state = {"t": 0.0, "i": 0}

    def clock() -> float:
        state["t"] += steps[state["i"] % len(steps)]
        state["i"] += 1
        return state["t"]

    return clock


def test_eagle2_calibrates_once_then_checks_the_cache(synth_q8, tmp_path, monkeypatch):
    """budget="auto" (the default) measures costs on first use and caches them if they pass the consistency
    checks, checks a cached calibration at start, never caches a disturbed one, and stays lossless."""
    from functools import partial

    from eagle2_local import api
    from eagle2_local.api import Eagle2
    from eagle2_local.measure import microbench

    def timing(steps) -> None:  # every timed call of calibration and start check takes the next step
        monkeypatch.setattr(api, "measure_costs", partial(microbench.measure_costs, clock=fake_clock(steps)))
        monkeypatch.setattr(api, "check_costs", partial(microbench.check_costs, clock=fake_clock(steps)))

    monkeypatch.setenv("EAGLE2_LOCAL_CACHE", str(tmp_path))
    lines: list[str] = []
    kw = dict(draft_model_path=synth_q8, n_ctx=512, n_threads=1, depth=4, tree_top_k=3)
    timing([0.01])  # a steady machine: every size costs the same, which passes the checks
    with Eagle2(synth_q8, progress=lines.append, **kw) as llm:
        assert llm.budget_mode == "auto" and lines  # progress was reported
        out = llm.create_completion("the cat", max_tokens=24, temperature=0)
        stats = out["eagle"]
        assert stats["budget"]["calibration"]["source"] == "fresh"
        assert set(stats["budget"]["calibration"]["verify_ms"]) >= {1, 8, 16, 32, 60}
        assert stats["n_tokens"] == 24
        plain = llm.create_completion("the cat", max_tokens=24, temperature=0, speculative=False)
        assert plain["choices"][0]["text"] == out["choices"][0]["text"]
    assert len(list(tmp_path.glob("costs-*.json"))) == 1
    with Eagle2(synth_q8, **kw) as llm:
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert llm.stats()["budget"]["calibration"]["source"] == "cached-verified"
    timing([0.01, 0.01, 0.01, 0.01, 0.01, 0.5])  # every third timing stalls
    with Eagle2(synth_q8, recalibrate=True, **kw) as llm:
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        cal = llm.stats()["budget"]["calibration"]
        assert cal["source"] == "fresh, not cached (disturbed)" and cal["problems"]
    assert load_costs_any(tmp_path)["verify_s"][-1] == pytest.approx(0.01)  # the steady one stays cached
    with Eagle2(synth_q8, total_tokens=8, **kw) as llm:  # an explicit size means EAGLE-2's fixed tree
        llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert llm.budget_mode == "fixed" and llm.stats()["budget"] is None
    with pytest.raises(Exception, match="budget"):
        Eagle2(synth_q8, budget="sometimes", **kw)


def load_costs_any(directory) -> dict:
    import json

    (path,) = directory.glob("costs-*.json")
    return json.loads(path.read_text())["costs"]


def test_catch_up_cost_is_calibrated_and_cached(tmp_path):
    """The per-token catch-up cost travels through the cache; a cost model without it takes a backlog token
    to cost as much as the root (an upper bound) until a real catch-up is timed."""
    key = CostKey(model="m", draft="d", build="b", threads=1, n_gpu_layers=0, tree_top_k=10)
    costs = CostModel(SIZES, STEEP, 0.001, 0.002, 0.00025)
    save_costs(key, costs, tmp_path)
    again = load_costs(key, tmp_path)
    assert again.draft_token_s == 0.00025 and again.catch_up_steps(101) == pytest.approx(100 * 0.00025)
    assert "draft_token_s" not in steep().to_dict()
    assert steep().catch_up_steps(11) == pytest.approx(10 * 0.001 / 0.009)  # unmeasured: a token = a root
