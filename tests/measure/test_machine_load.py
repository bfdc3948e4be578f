"""The machine-load readings a bench report carries, and how the current-figures table tells a loaded run apart."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eagle2_local.commands.console import machine_load_lines
from eagle2_local.measure.machine_load import CpuTicks, load_1min, loaded, pooled_steal

ROOT = Path(__file__).resolve().parents[2]


def test_readings_on_linux_are_counters_and_a_load_average():
    a = CpuTicks.now()
    sum(i * i for i in range(200_000))  # some ticks pass
    b = CpuTicks.now()
    assert a is not None and b is not None and b.total >= a.total and b.steal >= a.steal
    assert load_1min() is not None and load_1min() >= 0


def test_pooled_steal_weighs_spans_by_their_ticks_and_skips_missing_readings():
    spans = [(CpuTicks(100, 0), CpuTicks(200, 10)),   # 10 of 100 stolen
             (CpuTicks(0, 0), CpuTicks(300, 0)),      # none of 300
             (None, CpuTicks(50, 5)),                 # no reading before: left out
             (CpuTicks(7, 1), CpuTicks(7, 1))]        # no ticks passed: left out
    assert pooled_steal(spans) == 0.025
    assert pooled_steal([]) is None and pooled_steal([(None, None)]) is None


def test_a_run_is_loaded_when_other_work_adds_a_runnable_process_beyond_its_threads():
    assert not loaded(1.2, threads=1) and not loaded(2.9, threads=2) and not loaded(None, threads=1)
    assert loaded(2.0, threads=1) and loaded(4.1, threads=2)


def test_bench_prints_the_load_against_its_threads():
    report = {"machine": {"load_1min_median": 4.05, "steal_median": 0.031}, "settings": {"threads": 1}}
    assert machine_load_lines(report) == [
        "machine: load average 4.05 over the records at 1 llama.cpp thread(s): other work shared the machine; "
        "host steal 3.1% of CPU time"]
    assert machine_load_lines({"machine": {}, "settings": {"threads": 1}}) == []  # reports before the readings


def test_the_table_keys_a_loaded_run_apart_by_its_load_or_else_its_name():
    spec = importlib.util.spec_from_file_location("benchmarks_table", ROOT / "benchmarks" / "benchmarks_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    idle = {"machine": {"load_1min_median": 1.1}, "settings": {"threads": 1}}
    busy = {"machine": {"load_1min_median": 4.0}, "settings": {"threads": 1}}
    old = {"machine": {}, "settings": {"threads": 1}}
    assert table.condition_label("bench-x-under-busy-loops", idle) == ""  # the reading wins over the name
    assert table.condition_label("bench-x", busy) == ", loaded"
    assert table.condition_label("bench-x-under-busy-loops", old) == ", loaded"
    assert table.condition_label("bench-x", old) == ""
