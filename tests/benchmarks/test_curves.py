"""The recorded verify curves (benchmarks/curves.json) load as the runtime's cost models and read as recorded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from eagle2_local.tree_policy.costs import CostModel

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "curves.py"
_spec = importlib.util.spec_from_file_location("bench_curves", _PATH)
curves = sys.modules["bench_curves"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(curves)


def test_every_curve_reads_its_recorded_points():
    loaded = curves.load_curves()
    assert loaded
    for curve in loaded.values():
        assert curve.c(1) == pytest.approx(1.0)
        for n, c in curve.points.items():
            assert curve.c(n) == pytest.approx(min(c, n)), (curve.name, n)


def test_the_three_machines_of_issue_44_have_the_default_models_curve():
    machines = {c.name.split("/")[0] for c in curves.curves_for("/anywhere/SmolLM2-135M-Instruct.Q4_1.gguf")}
    assert {"zen4-avx512", "intel-amx", "epyc-avx2"} <= machines


def test_linear_between_points_and_the_last_slope_past_them():
    curve = curves.load_curves()["epyc-avx2/smollm2"]  # c(8) 4.58, c(16) 9.66, c(60) 35.4
    assert curve.c(12) == pytest.approx((4.58 + 9.66) / 2)
    slope = (35.4 - 9.66) / (60 - 16)
    assert curve.c(64) == pytest.approx(35.4 + 4 * slope)
    assert np.all(np.diff(curve.c(np.arange(1, 61))) > 0)  # this one is monotone as measured


def test_drafting_costs_from_the_record_else_from_the_calibration_at_hand():
    loaded = curves.load_curves()
    zen4 = loaded["zen4-avx512/smollm2"].cost_model()
    assert zen4.draft_s(3) / zen4.verify_s(1) == pytest.approx(0.234 + 2 * 0.852)
    here = CostModel([1, 2], [0.010, 0.018], draft_root_s=0.002, draft_level_s=0.005)
    qwen = loaded["epyc-avx2/qwen1.5b-q4_0"]  # no drafting costs recorded
    assert qwen.draft is None and qwen.cost_model(here).verify_s(1) == pytest.approx(0.055)
    assert qwen.cost_model(here).draft_s(2) / qwen.cost_model(here).verify_s(1) == pytest.approx(0.2 + 0.5)
    assert qwen.cost_model().draft_s(4) == 0.0  # nothing to go by: drafting free


def test_a_curve_below_one_plain_step_is_refused(tmp_path):
    bad = tmp_path / "curves.json"
    bad.write_text('{"curves": [{"name": "x", "machine": "m", "model_file": "f.gguf", "threads": 1, "context": 1,'
                   ' "plain_ms": 1.0, "c": {"2": 0.5}, "source": "s"}]}')
    with pytest.raises(ValueError):
        curves.load_curves(bad)
