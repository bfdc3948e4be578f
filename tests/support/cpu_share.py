"""This machine's cores shared between pytest-xdist workers.

llama.cpp's CPU threads spin at every barrier of a graph, so two workers each running a model on all cores
would wait a scheduler slice per barrier (a decode has hundreds). Instead each worker is pinned to its own share
of the cores (the library's default thread count follows the CPUs a process may use, and subprocesses inherit
the mask), and a test marked ``all_cores`` (one that needs 2+ threads) runs alone with every core while the other
workers wait between their tests: a readers-writer lock on two files, fair to the writer (a turnstile).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ALL_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def workers() -> tuple[int, int] | None:
    """(this worker's index, how many workers) under pytest-xdist; None in a plain pytest run."""
    name, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not name or not count or not name.startswith("gw"):
        return None
    return int(name[2:]), int(count)


def auto_workers() -> int:
    """Workers for ``-n auto``: one per usable CPU, at most 8 (each loads its own models and calibrations)."""
    return max(1, min(len(ALL_CPUS) or os.cpu_count() or 1, 8))


def own_cpus(index: int, count: int) -> set[int]:
    """The worker's share of the CPUs: an equal slice (workers beyond the CPUs share them round-robin)."""
    per = max(1, len(ALL_CPUS) // count)
    start = (index * per) % len(ALL_CPUS)
    return set(ALL_CPUS[start:start + per])


def pin_worker() -> None:
    """Pin this xdist worker to its share of the cores (nothing outside xdist or without affinity masks)."""
    w = workers()
    if w is not None and ALL_CPUS:
        os.sched_setaffinity(0, own_cpus(*w))


@contextmanager
def cpu_share(exclusive: bool) -> Iterator[None]:
    """Hold the machine shared (a test on the worker's own cores) or whole (an ``all_cores`` test, run with every
    core while no other test runs). Outside xdist it does nothing."""
    w = workers()
    if w is None or not ALL_CPUS:
        yield
        return
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"eagle2-local-tests-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'run')}"
    with open(f"{base}.turnstile", "a+") as turnstile, open(f"{base}.lock", "a+") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # a waiting writer holds it, so no new reader slips past
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            if exclusive:
                os.sched_setaffinity(0, set(ALL_CPUS))
            yield
        finally:
            if exclusive:
                os.sched_setaffinity(0, own_cpus(*w))
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_UN)
