"""What verification and drafting cost on the machine at hand, as a model that learns online (pure).

The auto budget weighs expected accepted tokens against time, so it needs two curves:

* ``verify_s(n)``: seconds of one target pass over an n-node tree. Flat on a GPU, steep on a small CPU
  (SmolLM2 on 2 cores: 60 nodes cost ~25 single-token decodes, docs/design.md §4).
* drafting: seconds to get the root's draft logits (``catch_up``), seconds per deeper level (``expand``), and
  seconds per extra token when the catch-up ingests a backlog (a new prompt, tokens decoded plainly).

Both start from a short calibration (calibration.py, timed by microbench.measure_costs; cached by
eagle2_local/measure/cost_cache.py) and are corrected online from the timings of real rounds. Everything is held in
units of one plain decoding step: the plain step's duration now is measured from the plain steps actually taken
(other processes, thermal limits and context length change it), and the *shape* (what a tree of n nodes or a draft
level costs in plain steps) is learned per size from the rounds actually run, so a calibration spoiled by other load
cannot fix a wrong shape for good. Numbers in, numbers out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

CORRECTION_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def _median(values) -> float:
    """Median of a short sequence (plain Python: this runs at every plain step, numpy would cost more)."""
    s = sorted(values)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


@dataclass
class CostModel:
    """Verify-time curve over measured tree sizes plus drafting times, in plain steps; learns online.

    ``verify[0]`` (size 1) is the plain decoding step; the other sizes are tree verifications. Predictions are
    ``plain step now x shape``: the plain step is the median of the last ``window`` plain steps observed (the
    calibration's until one is), the shape is the calibrated cost in plain steps times a per-size correction,
    the median ratio of observed to calibrated shape at the nearest measured size (sizes between two
    observed ones interpolate in log size; size 1 is the anchor). Medians of short windows, not moving
    averages: one pass stalled by another process moves nothing, a wrong calibration is replaced after a
    few rounds. ``frozen`` turns online learning off (tests that need fixed costs). ``draft_token_s``: seconds
    per backlog token a catch-up ingests beyond the root (None: not measured; then a token is taken to cost
    as much as a one-token catch-up, an upper bound, until a real backlog catch-up has been timed).
    """

    sizes: list[int]
    verify: list[float]
    draft_root_s: float
    draft_level_s: float
    draft_token_s: float | None = None
    frozen: bool = False
    window: int = 9
    quality: dict = field(default_factory=dict)  # how the calibration went (calibration.py); not cached

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.verify) or not self.sizes:
            raise ValueError("a cost model needs one verify time per measured size")
        order = np.argsort(self.sizes)
        self.sizes = [int(self.sizes[i]) for i in order]
        self.verify = [float(self.verify[i]) for i in order]
        if self.sizes[0] != 1:
            raise ValueError("the verify curve must include n=1 (the plain decoding step)")
        xs = np.asarray(self.sizes, dtype=np.float64)
        self.plain_cal = max(self.verify[0], 1e-9)
        shape_cal = _sane_shape(xs, np.asarray(self.verify, dtype=np.float64) / self.plain_cal)
        # corrections live on a fixed grid, finer than a sparse (or spoiled) calibration may be
        grid = sorted({n for n in CORRECTION_GRID if n < self.sizes[-1]} | set(self.sizes))
        self._xs = np.asarray(grid, dtype=np.float64)
        self._log_xs = np.log(self._xs)
        self._shape_cal = np.interp(self._xs, xs, shape_cal)
        self._plain: deque[float] = deque(maxlen=self.window)
        self._knot: list[deque[float]] = [deque(maxlen=self.window) for _ in grid]
        self._root: deque[float] = deque(maxlen=self.window)
        self._level: deque[float] = deque(maxlen=self.window)
        self._token: deque[float] = deque(maxlen=self.window)
        self.n_observed = 0
        self.shape_version = 0
        self._refresh_shape()

    # ------------------------------------------------------------ state
    def _refresh_shape(self) -> None:
        """Recompute the corrected shape and drafting costs from the observation windows."""
        seen = [i for i, d in enumerate(self._knot) if i > 0 and d]
        log_c = np.zeros(len(self._xs))
        if seen:
            known_x = np.concatenate([[self._log_xs[0]], self._log_xs[seen]])
            known_c = np.concatenate([[0.0], [np.log(_median(self._knot[i])) for i in seen]])
            log_c = np.interp(self._log_xs, known_x, known_c)  # past the last observed size: its correction
        self._shape = _sane_shape(self._xs, self._shape_cal * np.exp(log_c))
        tail = (self._shape[-1] - self._shape[-2]) / (self._xs[-1] - self._xs[-2]) if len(self._xs) > 1 else 0.0
        self._slope = max(float(tail), 0.0)
        self._root_rel = _median(self._root) if self._root else self.draft_root_s / self.plain_cal
        self._level_rel = _median(self._level) if self._level else self.draft_level_s / self.plain_cal
        self._token_rel = (_median(self._token) if self._token else self._root_rel if self.draft_token_s is None
                           else self.draft_token_s / self.plain_cal)
        self._shape_of: dict[int, float] = {}
        self.shape_version += 1  # values computed from the shape alone stay valid while it is unchanged
        self._refresh_plain()

    def _refresh_plain(self) -> None:
        self._plain_s = _median(self._plain) if self._plain else self.plain_cal

    @property
    def n_plain(self) -> int:
        """Plain steps observed in the current window (0: the plain rate is still the calibration's)."""
        return len(self._plain)

    @property
    def load(self) -> float:
        """The plain step now over the calibrated one: how much busier (or idler) the machine is."""
        return self._plain_s / self.plain_cal

    # ------------------------------------------------------------ predictions
    def shape(self, n: int | np.ndarray) -> np.ndarray | float:
        """Verifying n nodes, in plain steps (the learned shape; linear past the largest measured size)."""
        n_arr = np.asarray(n, dtype=np.float64)
        out = np.interp(n_arr, self._xs, self._shape)
        out = np.where(n_arr > self._xs[-1], self._shape[-1] + self._slope * (n_arr - self._xs[-1]), out)
        return float(out) if np.ndim(out) == 0 else out

    def shape_at(self, n: int) -> float:
        """:meth:`shape` of one size, kept until the shape moves (asked at every plain step; the shape moves
        only when a tree round is observed)."""
        out = self._shape_of.get(n)
        if out is None:
            out = self._shape_of[n] = float(self.shape(n))
        return out

    def calibrated_shape(self, n: int) -> float:
        """Verifying n nodes in plain steps as the calibration measured it (sanitised, no online correction)."""
        return float(np.interp(n, self._xs, self._shape_cal))

    def verify_s(self, n: int | np.ndarray) -> np.ndarray | float:
        """Predicted seconds to verify n nodes (extrapolated linearly past the largest size)."""
        return self._plain_s * self.shape(n)

    def draft_s(self, levels: int) -> float:
        """Predicted seconds to draft a tree with ``levels`` levels below the root (level 1 needs no expand)."""
        return self._plain_s * (self._root_rel + max(levels - 1, 0) * self._level_rel)

    def catch_up_steps(self, n_tokens: int) -> float:
        """Plain steps a catch-up over ``n_tokens`` costs beyond a one-token catch-up (the root's)."""
        return self._token_rel * max(n_tokens - 1, 0)

    @property
    def draft_token_now(self) -> float:
        """Seconds per backlog token of a catch-up, at today's plain speed."""
        return self._plain_s * self._token_rel

    @property
    def draft_level_now(self) -> float:
        return self._plain_s * self._level_rel

    @property
    def draft_root_now(self) -> float:
        return self._plain_s * self._root_rel

    @property
    def plain_rate(self) -> float:
        """Tokens per second of plain decoding (one token per plain step)."""
        return 1.0 / self._plain_s

    # ------------------------------------------------------------ online correction
    def observe_plain(self, seconds: float) -> None:
        """One plain decoding step actually taken: the unit every other cost is expressed in."""
        self.n_observed += 1
        if self.frozen or not seconds > 0:
            return
        self._plain.append(float(seconds))
        self._refresh_plain()

    def observe_verify(self, n: int, seconds: float) -> None:
        """One tree of n nodes verified: a shape correction for the nearest measured size (n = 1, the root
        alone on the tree path, says nothing about trees and is only counted)."""
        self.n_observed += 1
        if self.frozen or n < 2 or not seconds > 0:
            return
        k = int(np.argmin(np.abs(self._log_xs - np.log(n))))
        k = max(k, 1)
        self._knot[k].append(seconds / self._plain_s / float(np.interp(n, self._xs, self._shape_cal)))
        self._refresh_shape()

    def observe_draft(self, root_s: float, level_s: list[float]) -> None:
        """Drafting times of one steady round (root catch-up and each expanded level), in plain steps now."""
        if self.frozen:
            return
        if root_s > 0:
            self._root.append(root_s / self._plain_s)
        self._level.extend(s / self._plain_s for s in level_s if s > 0)
        self._refresh_shape()

    def observe_catch_up(self, n_tokens: int, root_s: float) -> None:
        """A round whose draft first ingested a backlog of ``n_tokens`` (root included) in ``root_s`` seconds:
        what it took beyond a steady root, per backlog token, in plain steps now."""
        if self.frozen or n_tokens < 2 or not root_s > 0:
            return
        self._token.append(max(root_s / self._plain_s - self._root_rel, 0.0) / (n_tokens - 1))
        self._refresh_shape()

    # ------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        token = {} if self.draft_token_s is None else {"draft_token_s": round(self.draft_token_s, 9)}
        return {"sizes": list(self.sizes), "verify_s": [round(v, 7) for v in self.verify],
                "draft_root_s": round(self.draft_root_s, 7), "draft_level_s": round(self.draft_level_s, 7), **token}

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        token = d.get("draft_token_s")
        return cls(list(d["sizes"]), list(d["verify_s"]), float(d["draft_root_s"]), float(d["draft_level_s"]),
                   None if token is None else float(token))

    def summary(self) -> dict:
        """Milliseconds at a few sizes and what online learning changed: what the stats and the CLI show."""
        shown = [n for n in (1, 8, 16, 32, self.sizes[-1]) if n <= self.sizes[-1]]
        corrections = {int(self._xs[i]): round(_median(d), 3) for i, d in enumerate(self._knot) if i > 0 and d}
        return {"verify_ms": {n: round(float(self.verify_s(n)) * 1e3, 3) for n in dict.fromkeys(shown)},
                "draft_root_ms": round(self.draft_root_now * 1e3, 3),
                "draft_level_ms": round(self.draft_level_now * 1e3, 3),
                "draft_token_ms": round(self.draft_token_now * 1e3, 4), "load": round(self.load, 3),
                "plain_steps_in_window": self.n_plain, "shape_corrections": corrections}


def _sane_shape(xs: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """1 at n = 1, never below one plain step nor above n of them (the n nodes could be decoded one by one).
    Not made monotone: CPU kernels for repacked quantizations batch tokens in groups (four at a time here), so
    verifying 4 nodes can cost less than 3, and the sizes chosen should follow that (NOTES.md#the-tree-budget)."""
    out = np.clip(shape, 1.0, np.maximum(xs, 1.0))
    out[0] = 1.0
    return out
