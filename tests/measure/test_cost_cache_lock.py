"""The cost cache's cross-process lock: processes that start together with the same settings calibrate once (the
others wait, then read the cache the first wrote), and a holder that dies frees the lock. Real processes and a
real flock; only the calibration is a stand-in (a sleep that records who ran it)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from eagle2_local.measure.cost_cache import CostKey, cached_or_measured, fcntl
from eagle2_local.tree_policy import CostModel

pytestmark = pytest.mark.skipif(fcntl is None, reason="no flock on this platform: no lock, by design")

KEY = CostKey(model="m.gguf:1:2", draft="d.gguf:3:4", build="0.3.36 CPU", threads=2, n_gpu_layers=0, tree_top_k=10)
CALIBRATION_S = 2.0  # long enough for the second process to reach the lock while the first holds it, on a busy CI


def costs() -> CostModel:
    return CostModel([1, 2, 4, 8], [0.010, 0.018, 0.030, 0.050], 0.002, 0.001)


class Waits(logging.Handler):
    """Records whether this process logged that it waits for another's calibration."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.waited = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.waited += "waiting for another process" in record.getMessage()


def contender(folder: str, start: multiprocessing.synchronize.Barrier) -> None:
    """One process starting with the settings ``KEY``: its calibration sleeps and appends its pid to calls.txt;
    what it got (the source and whether it waited) goes to results.jsonl."""
    directory = Path(folder)

    def calibrate() -> CostModel:
        time.sleep(CALIBRATION_S)
        with open(directory / "calls.txt", "a") as f:
            f.write(f"{os.getpid()}\n")
        return costs()

    waits = Waits()
    logger = logging.getLogger("eagle2_local.measure.cost_cache")
    logger.addHandler(waits)
    logger.setLevel(logging.INFO)
    start.wait(timeout=30)
    _, info = cached_or_measured(KEY, calibrate, directory=directory)
    with open(directory / "results.jsonl", "a") as f:
        f.write(json.dumps({"source": info["source"], "waited": waits.waited}) + "\n")


def test_two_processes_starting_together_calibrate_once(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=contender, args=(str(cache), start)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len((cache / "calls.txt").read_text().split()) == 1  # one calibration between them
    results = sorted((json.loads(line) for line in (cache / "results.jsonl").read_text().splitlines()),
                     key=lambda r: r["source"])
    # the one that calibrated did not wait; the other waited (logged once) and then read the cache
    assert results == [{"source": "cached", "waited": 1}, {"source": "fresh", "waited": 0}]


def holder(folder: str, holding: multiprocessing.synchronize.Event) -> None:
    """A process that dies (killed) in the middle of its calibration, with the lock held."""
    def calibrate() -> CostModel:
        holding.set()
        time.sleep(60)
        return costs()

    cached_or_measured(KEY, calibrate, directory=Path(folder))


def test_a_calibration_that_dies_frees_the_lock(tmp_path):
    ctx = multiprocessing.get_context("fork")
    holding = ctx.Event()
    p = ctx.Process(target=holder, args=(str(tmp_path), holding))
    p.start()
    assert holding.wait(timeout=30)
    p.kill()
    p.join(timeout=30)
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(cached_or_measured(KEY, costs, directory=tmp_path)[1]["source"]),
                         daemon=True)
    t.start()
    t.join(timeout=10)
    assert got == ["fresh"]  # not stuck on the dead process's lock, and it cached nothing
