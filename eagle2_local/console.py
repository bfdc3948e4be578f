"""Terminal presentation for the command line: the self-updating progress line of long jobs (training).

The click layer (the repository's cli.py) declares the commands; what they show on the terminal lives here, in
the package, so it can be tested and reused without click's command machinery.
"""

from __future__ import annotations

import time

import click


class ProgressLine:
    """One self-updating terminal line per phase: done/total, rate and ETA."""

    def __init__(self) -> None:
        self._clock = time.perf_counter
        self._phase, self._t0, self._n0 = None, 0.0, 0

    def say(self, message: str) -> None:
        self.done()
        click.echo(message, err=True)

    def count(self, phase: str, n: int, total: int) -> None:
        if phase != self._phase:
            self.done()
            self._phase, self._t0, self._n0 = phase, self._clock(), n
        rate = (n - self._n0) / max(self._clock() - self._t0, 1e-9)
        eta = (total - n) / rate if rate > 0 else float("inf")
        self._line(f"{phase}: {_bar(n / max(total, 1))} {n:,}/{total:,} tokens  {rate:,.0f} tok/s  ETA {_hms(eta)}")

    def train(self, p) -> None:
        if self._phase != "train":
            self.done()
            self._phase = "train"
        acc = "/".join(f"{a:.2f}" for a in p.acc)
        self._line(f"train: {_bar(p.step / max(p.total, 1))} step {p.step}/{p.total}  loss {p.loss:.3f}  "
                   f"top-1 {acc}  {p.tokens_per_s:,.0f} tok/s  ETA {_hms(p.eta_s)}")

    def _line(self, text: str) -> None:
        click.echo("\r" + text + "\033[K", nl=False, err=True)

    def done(self) -> None:
        if self._phase is not None:
            click.echo(err=True)
        self._phase = None


def _bar(frac: float, width: int = 24) -> str:
    filled = int(round(max(0.0, min(1.0, frac)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _hms(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "--:--"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
