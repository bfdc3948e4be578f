"""How busy the machine was while a benchmark ran: the load average, and the CPU time a VM's host took away.

A speed-up is a ratio of two timings taken on a machine that other work may share. Two kinds of sharing change
the timings without changing the code: processes inside the machine (the 1-minute load average counts them,
the benchmark's own threads included) and, on a virtual machine, other guests of its host (the kernel's
"steal" time: ticks a virtual CPU was ready to run but the host ran something else). Recording both per record
lets a report tell an outlier caused by a neighbour from one caused by the code. Linux only; elsewhere the
readings are None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuTicks:
    """The machine-wide CPU tick counters of ``/proc/stat``'s ``cpu`` line: all of them, and the stolen ones."""

    total: int
    steal: int

    @classmethod
    def now(cls) -> "CpuTicks | None":
        """The counters now, or None where ``/proc/stat`` does not exist (not Linux) or has no steal column."""
        try:
            with open("/proc/stat") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if len(fields) < 9 or fields[0] != "cpu":
            return None
        # user nice system idle iowait irq softirq steal [guest guest_nice, already counted in user and nice]
        ticks = [int(x) for x in fields[1:9]]
        return cls(total=sum(ticks), steal=ticks[7])


def pooled_steal(spans: list[tuple[CpuTicks | None, CpuTicks | None]]) -> float | None:
    """The share of the CPU ticks inside ``spans`` (pairs of readings before and after) that the host stole: 0 on
    bare metal; None where there were no readings."""
    pairs = [(a, b) for a, b in spans if a is not None and b is not None and b.total > a.total]
    total = sum(b.total - a.total for a, b in pairs)
    return round(sum(b.steal - a.steal for a, b in pairs) / total, 4) if total else None


def load_1min() -> float | None:
    """The 1-minute load average (runnable processes, this benchmark's threads included), or None."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def loaded(load: float | None, threads: int) -> bool:
    """Whether a run at ``threads`` llama.cpp threads shared the machine with other busy work: a load average at
    least one runnable process above its own threads."""
    return load is not None and load >= threads + 1


def describe(load: float | None, steal: float | None, threads: int | None) -> str:
    """'load average 4.05 over the records at 1 llama.cpp thread(s): other work shared the machine; host steal 3.1%
    of CPU time', the parts there are readings for ('' for none): bench's output and BENCHMARKS' sections say it
    this one way."""
    parts = []
    if load is not None and threads:
        busy = "other work shared the machine" if loaded(load, threads) else "no other busy work"
        parts.append(f"load average {load:.2f} over the records at {threads} llama.cpp thread(s): {busy}")
    if steal is not None:
        parts.append(f"host steal {steal:.1%} of CPU time")
    return "; ".join(parts)
