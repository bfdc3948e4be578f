"""One record's result in the side-by-side benchmark, and what a measured host time would leave of a speed-up on
a faster device."""

from __future__ import annotations

from dataclasses import dataclass

from ..decoding.stats import GenerationStats


@dataclass
class PromptResult:
    set: str
    index: int
    plain: GenerationStats  # the record's every turn, added up (the median run of ``repeat``)
    eagle: GenerationStats
    identical: bool
    divergence_at: int | None = None  # token index in the answer of turn ``divergence_turn``
    divergence_gap: float | None = None
    llama_cpp: dict | None = None
    turns: int = 1
    divergence_turn: int | None = None
    split: str = "tune"
    constrained: bool = False  # a schema or grammar constrained the answers
    machine_load: dict | None = None  # load average after the record, host steal share per mode (machine_load.py)

    @property
    def speedup(self) -> float:
        return self.eagle.tokens_per_s / self.plain.tokens_per_s if self.plain.tokens_per_s else 0.0


PROJECTION_STEPS_MS = (5.0, 10.0, 20.0, 40.0)  # target step times of GPU / Apple-silicon class devices


def projected_speedup(tau: float, host_ms: float, step_ms: float, plain_host_ms: float = 0.0) -> float:
    """What the measured host time would leave of a speed-up on a device where verifying a round's tree costs
    one target step of ``step_ms`` and drafting costs nothing (a GPU running a 7-8B target: both nearly so).
    An upper bound, and a projection, not a measurement: a round yields ``tau`` tokens in ``step_ms + host_ms``,
    a plain step one token in ``step_ms + plain_host_ms``."""
    return tau * (step_ms + plain_host_ms) / (step_ms + host_ms)
