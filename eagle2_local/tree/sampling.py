"""Logit warpers and token sampling, shared by plain and speculative decoding.

Lossless speculative sampling means: the speculative loop emits tokens with exactly the distribution the plain
loop samples from. Both loops therefore call :func:`SamplingParams.probs` on the same logits with the same
history, so any warper (temperature, top-k, top-p, min-p, repetition penalty) is automatically identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError


@dataclass(frozen=True)
class SamplingDefaults:
    """What a caller gets for a sampling setting it leaves out (llama.cpp's and llama-cpp-python's defaults): the
    CLI's options, the server's request fields (``serve`` overrides them from its options) and the Python API
    read them here. Two API methods differ on purpose, as llama-cpp-python's do: see ``CHAT_TEMPERATURE`` and
    ``COMPLETION_MAX_TOKENS``."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None


DEFAULTS = SamplingDefaults()
CHAT_TEMPERATURE = 0.2  # create_chat_completion's default temperature, as llama-cpp-python's
COMPLETION_MAX_TOKENS = 16  # create_completion's default max_tokens, as llama-cpp-python's
MIN_TEMPERATURE = 1e-4
"""A temperature above 0 but below this is greedy decoding: dividing logits by 1e-308 overflows to inf and the
distribution to NaN (the last token of the vocabulary every step), and below 1e-4 a sampled answer differs from the
greedy one only at exact ties."""
REPEAT_PENALTY_RANGE = (1e-3, 1e3)
"""``repeat_penalty`` divides or multiplies logits: beyond these bounds they overflow to inf or vanish."""


@dataclass(frozen=True)
class SamplingParams:
    """How to turn target logits into a next-token distribution.

    ``temperature == 0`` (or below :data:`MIN_TEMPERATURE`) means greedy decoding (argmax); all other fields are
    then ignored.
    The order of the warpers is: repetition penalty, temperature, top-k, top-p, min-p.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ParameterError(f"temperature must be >= 0, got {self.temperature}", "temperature")
        if self.top_k < 0:
            raise ParameterError(f"top_k must be >= 0 (0 = off), got {self.top_k}", "top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise ParameterError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if not 0.0 <= self.min_p < 1.0:
            raise ParameterError(f"min_p must be in [0, 1), got {self.min_p}", "min_p")
        low, high = REPEAT_PENALTY_RANGE
        if not low <= self.repeat_penalty <= high:
            raise ParameterError(f"repeat_penalty must be between {low:g} and {high:g} (1 = off), got "
                                 f"{self.repeat_penalty:g}", "repeat_penalty")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    def recent(self, tokens: list[int] | np.ndarray, last: int | None = None) -> np.ndarray | None:
        """What :meth:`penalized` reads of the text ``tokens`` (+ ``last``): its last ``repeat_last_n`` tokens as an
        array, None without a repetition penalty. A decoding step passes this, not the whole text: converting a
        3,000-token context cost ~50 us a step, for a penalty that reads 64 tokens or none."""
        if self.repeat_penalty == 1.0 or self.repeat_last_n <= 0:
            return None
        tail = tokens[-self.repeat_last_n:] if last is None else [*tokens[-self.repeat_last_n:], last]
        return np.asarray(tail[-self.repeat_last_n:])

    def penalized(self, logits: np.ndarray, history: np.ndarray | None) -> np.ndarray:
        """Apply the repetition penalty (llama.cpp / CTRL style) to the tokens seen recently."""
        if self.repeat_penalty == 1.0 or self.repeat_last_n <= 0 or history is None or len(history) == 0:
            return logits  # repeat_last_n <= 0 means off, as in llama.cpp
        recent = np.unique(np.asarray(history[-self.repeat_last_n:], dtype=np.int64))
        out = logits.astype(np.float64, copy=True)
        vals = out[recent]
        out[recent] = np.where(vals > 0, vals / self.repeat_penalty, vals * self.repeat_penalty)
        return out

    def probs(self, logits: np.ndarray, history: np.ndarray | None = None) -> np.ndarray:
        """The warped next-token distribution (float64, sums to 1). Greedy gives a one-hot vector."""
        z = self.penalized(np.asarray(logits), history).astype(np.float64, copy=False)
        if self.greedy:
            p = np.zeros(z.shape[-1], dtype=np.float64)
            p[int(np.argmax(z))] = 1.0
            return p
        z = z / self.temperature
        if 0 < self.top_k < z.shape[-1]:
            kth = np.partition(z, -self.top_k)[-self.top_k]
            z = np.where(z >= kth, z, -np.inf)
        z = z - np.max(z)
        p = np.exp(z)
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            n_keep = int(np.searchsorted(cum, self.top_p, side="left")) + 1
            mask = np.zeros_like(p, dtype=bool)
            mask[order[:n_keep]] = True
            p = np.where(mask, p, 0.0)
            p /= p.sum()
        if self.min_p > 0.0:
            p = np.where(p >= self.min_p * p.max(), p, 0.0)
            p /= p.sum()
        return p

    def choose(self, logits: np.ndarray, history: np.ndarray | None, rng: np.random.Generator) -> int:
        """Pick the next token: argmax when greedy, else one draw from :meth:`probs`."""
        if self.greedy:
            z = self.penalized(np.asarray(logits), history)
            return int(np.argmax(z))
        return sample_from(self.probs(logits, history), rng)


def sample_from(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector, by inverse CDF (one uniform per draw, so seeds replay exactly)."""
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    idx = int(np.searchsorted(cdf, u, side="right"))
    idx = min(idx, len(p) - 1)
    while p[idx] == 0.0 and idx > 0:  # guard against landing on a zero-mass token through float rounding
        idx -= 1
    return idx
