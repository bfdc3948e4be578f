"""What verification and drafting cost on the machine at hand, and where that measurement is cached.

The tree budget (budget.py) weighs expected accepted tokens against time, so it needs two curves:

* ``verify_s(n)``: seconds of one target pass over an n-node tree. Flat on a GPU, steep on a small CPU
  (SmolLM2 on 2 cores: 60 nodes cost ~25 single-token decodes, DESIGN §5).
* drafting: seconds to get the root's draft logits (``catch_up``) and seconds per deeper level (``expand``).

Both start from a short calibration (microbench.measure_costs) and are corrected online from the timings of
real rounds, because the calibration ran at one context length and the machine's load changes (other
processes share the cores). Everything here is pure: numbers in, numbers out; the disk cache is plain JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

CACHE_VERSION = 1


@dataclass
class CostModel:
    """Piecewise-linear verify-time curve over measured tree sizes, plus drafting times; learns online.

    Online, the calibrated *shape* is kept and one load factor scales every prediction: other processes on
    the cores, thermal limits or a longer context slow verification and drafting alike, and a single factor
    learned from every round (plain steps included) keeps the comparison between tree sizes, and between a
    tree and a plain step, as calibrated, whichever sizes the rounds happen to use. Draft times are learned
    in calibration units (observed time divided by the load). ``alpha`` is the weight of one observation in
    the moving averages: small enough that one slow round does not swing the budget.
    """

    sizes: list[int]
    verify: list[float]
    draft_root_s: float
    draft_level_s: float
    alpha: float = 0.1
    load: float = 1.0
    n_observed: int = 0

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.verify) or not self.sizes:
            raise ValueError("a cost model needs one verify time per measured size")
        order = np.argsort(self.sizes)
        self.sizes = [int(self.sizes[i]) for i in order]
        self.verify = [float(self.verify[i]) for i in order]
        if self.sizes[0] != 1:
            raise ValueError("the verify curve must include n=1 (the plain decoding step)")
        self._xs = np.asarray(self.sizes, dtype=np.float64)
        # Monotone in n, and never above n plain steps (the n nodes could be decoded one by one): a timing
        # spoiled by other processes (2 threads on 2 busy cores can stall a pass for seconds) stays bounded.
        ys = np.maximum.accumulate(np.asarray(self.verify, dtype=np.float64))
        self._ys = np.minimum(ys, self._xs * ys[0])
        tail = (self._ys[-1] - self._ys[-2]) / (self._xs[-1] - self._xs[-2]) if len(self._xs) > 1 else 0.0
        self._slope = max(tail, 0.0)

    # ------------------------------------------------------------ predictions
    def _base_verify(self, n) -> np.ndarray:
        n_arr = np.asarray(n, dtype=np.float64)
        out = np.interp(n_arr, self._xs, self._ys)
        return np.where(n_arr > self._xs[-1], self._ys[-1] + self._slope * (n_arr - self._xs[-1]), out)

    def verify_s(self, n: int | np.ndarray) -> np.ndarray | float:
        """Predicted seconds to verify n nodes (monotone; extrapolated linearly past the largest size)."""
        out = self.load * self._base_verify(n)
        return float(out) if np.ndim(out) == 0 else out

    def draft_s(self, levels: int) -> float:
        """Predicted seconds to draft a tree with ``levels`` levels below the root (level 1 needs no expand)."""
        return self.load * (self.draft_root_s + max(levels - 1, 0) * self.draft_level_s)

    @property
    def draft_level_now(self) -> float:
        return self.load * self.draft_level_s

    @property
    def draft_root_now(self) -> float:
        return self.load * self.draft_root_s

    @property
    def plain_rate(self) -> float:
        """Tokens per second of plain decoding (one token per single-node pass)."""
        return 1.0 / max(self.load * self._ys[0], 1e-12)  # runs every plain step: no numpy call

    # ------------------------------------------------------------ online correction
    def observe_verify(self, n: int, seconds: float) -> None:
        """Learn the load factor from one measured verification of n nodes."""
        base = self._ys[0] if n == 1 else float(self._base_verify(n))  # n == 1: every plain step, kept cheap
        ratio = seconds / max(base, 1e-12)
        self.load = (1.0 - self.alpha) * self.load + self.alpha * ratio
        self.n_observed += 1

    def observe_draft(self, root_s: float, level_s: list[float]) -> None:
        """Update drafting times (calibration units) from one round's root time and expanded levels' times."""
        a, load = self.alpha, max(self.load, 1e-12)
        self.draft_root_s = (1 - a) * self.draft_root_s + a * root_s / load
        for s in level_s:
            self.draft_level_s = (1 - a) * self.draft_level_s + a * s / load

    # ------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "verify_s": [round(v, 7) for v in self.verify],
                "draft_root_s": round(self.draft_root_s, 7), "draft_level_s": round(self.draft_level_s, 7)}

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        return cls(list(d["sizes"]), list(d["verify_s"]), float(d["draft_root_s"]), float(d["draft_level_s"]))

    def summary(self) -> dict:
        """Milliseconds at a few sizes: what the stats and the CLI show."""
        shown = [n for n in (1, 8, 16, 32, self.sizes[-1]) if n <= self.sizes[-1]]
        return {"verify_ms": {n: round(float(self.verify_s(n)) * 1e3, 3) for n in dict.fromkeys(shown)},
                "draft_root_ms": round(self.draft_root_now * 1e3, 3),
                "draft_level_ms": round(self.draft_level_now * 1e3, 3), "load": round(self.load, 3)}


# ---------------------------------------------------------------- disk cache
def cache_dir() -> Path:
    """``$EAGLE2_LOCAL_CACHE`` or ``~/.cache/eagle2-local``."""
    env = os.environ.get("EAGLE2_LOCAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "eagle2-local"


def file_identity(path: str | os.PathLike | None) -> str | None:
    """A cheap stand-in for a file's content: resolved path, size and mtime (hashing 1 GB would cost seconds)."""
    if path is None:
        return None
    p = Path(path).resolve()
    st = p.stat()
    return f"{p}:{st.st_size}:{st.st_mtime_ns}"


@dataclass(frozen=True)
class CostKey:
    """Everything a calibration depends on: the files, the llama.cpp build/backend, threads and tree shape."""

    model: str
    draft: str | None
    build: str
    threads: int
    n_gpu_layers: int
    tree_top_k: int
    extra: dict = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict:
        return {"version": CACHE_VERSION, "model": self.model, "draft": self.draft, "build": self.build,
                "threads": self.threads, "n_gpu_layers": self.n_gpu_layers, "tree_top_k": self.tree_top_k,
                **self.extra}

    def file_name(self) -> str:
        digest = hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:20]
        return f"costs-{digest}.json"


def load_costs(key: CostKey, directory: Path | None = None) -> CostModel | None:
    """The cached calibration for ``key``, or None (missing, unreadable or from another key)."""
    path = (directory or cache_dir()) / key.file_name()
    try:
        rec = json.loads(path.read_text())
        if rec.get("key") != key.as_dict():
            return None
        return CostModel.from_dict(rec["costs"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("ignoring unreadable cost cache %s: %s", path, exc)
        return None


def save_costs(key: CostKey, costs: CostModel, directory: Path | None = None) -> Path | None:
    """Write the calibration next to its key; a read-only cache only costs a recalibration next time."""
    d = directory or cache_dir()
    path = d / key.file_name()
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key.as_dict(), "costs": costs.to_dict()}, indent=1))
        tmp.replace(path)
        return path
    except OSError as exc:
        log.warning("could not write the cost cache %s: %s", path, exc)
        return None


def cached_or_measured(key: CostKey, measure: Callable[[], CostModel], refresh: bool = False,
                       directory: Path | None = None) -> tuple[CostModel, dict]:
    """The cached calibration for ``key`` unless ``refresh``; otherwise ``measure()`` it and cache it.

    Returns the costs and a description of where they came from (for the stats)."""
    costs = None if refresh else load_costs(key, directory)
    if costs is not None:
        return costs, {"source": "cache", "file": str((directory or cache_dir()) / key.file_name())}
    t0 = time.perf_counter()
    costs = measure()
    seconds = time.perf_counter() - t0
    path = save_costs(key, costs, directory)
    log.info("calibrated tree costs in %.1f s (cached at %s)", seconds, path)
    return costs, {"source": "measured", "seconds": round(seconds, 2), "file": str(path) if path else None}
