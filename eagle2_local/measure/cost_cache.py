"""Where the auto budget's cost calibration is kept between runs: a JSON file per :class:`CostKey` (the files,
llama.cpp build, threads and tree shape it depends on), checked against a quick timing at start. Processes that
start together with the same key take turns (a lock file beside it), so only the first calibrates."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..formats.atomic_write import atomic_path
from ..formats.cache_root import cache_root
from ..tree_policy.costs import CostModel

try:
    import fcntl
except ImportError:  # Windows: no flock, so two simultaneous starts each calibrate, as they did before the lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

CACHE_VERSION = 6  # 2: calibrations checked for disturbance (version-1 caches may hold a poisoned curve);
# 3: the draft's catch-up cost per backlog token is measured (version-2 caches lack it); 4: every size up to 16
# is measured (version-3 curves skip 5, 7, 9-15 and could not show the cheap multiples of four); 5: the curve is
# also timed at a long context (version-4 curves know 64 tokens only, and misprice trees on long prompts); 6: the
# long context reaches 2,048 tokens (version-5 curves stop at 1,024 and price small trees too cheap past 2k)


# ---------------------------------------------------------------- disk cache
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
    path = (directory or cache_root()) / key.file_name()
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
    d = directory or cache_root()
    path = d / key.file_name()
    try:
        d.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"key": key.as_dict(), "costs": costs.to_dict()}, indent=1))
        return path
    except OSError as exc:
        log.warning("could not write the cost cache %s: %s", path, exc)
        return None


@contextmanager
def calibration_lock(key: CostKey, directory: Path) -> Iterator[None]:
    """Held by one process at a time per ``key`` (an flock on ``costs-<digest>.lock`` beside the cache file), so
    processes that start together with the same settings (two servers, two test workers) calibrate once: the
    others wait, then find the cache the first one wrote. A calibration is tens of seconds of CPU, and two at once
    also slow and disturb each other. The kernel drops the lock when its holder dies, so a crash never leaves the
    others waiting; where flock or the folder is missing (Windows, a read-only cache) there is no lock."""
    if fcntl is None:
        yield
        return
    path = directory / key.file_name().replace(".json", ".lock")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        log.debug("no calibration lock at %s: %s", path, exc)
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process's tree-cost calibration (lock %s)", path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor of the open file releases its lock


def cached_or_measured(key: CostKey, measure: Callable[[], CostModel], refresh: bool = False,
                       directory: Path | None = None,
                       check: Callable[[CostModel], tuple[bool, dict]] | None = None) -> tuple[CostModel, dict]:
    """The cached calibration for ``key`` if ``check`` (a quick timing at start) agrees with it; otherwise
    ``measure()`` it, and cache it only if the measurement was not disturbed (``quality["problems"]`` empty).

    Returns the costs and a description for the stats, whose ``source`` says which happened: "cached" (no
    check given), "cached-verified", "fresh", "re-measured" (the cache disagreed), "fresh, not cached
    (disturbed)" or "cached, kept (re-measure disturbed)": a disagreeing cache is kept over a disturbed
    re-measure, since only calibrations that passed the consistency checks are ever cached. ``file`` is the
    cache file's name in ``directory`` (default :func:`cache_root`). Processes that ask for the same ``key`` at
    once take turns (:func:`calibration_lock`): the first measures, the others then read its cache."""
    directory = directory or cache_root()
    with calibration_lock(key, directory):
        return _cached_or_measured(key, measure, refresh, directory, check)


def _cached_or_measured(key: CostKey, measure: Callable[[], CostModel], refresh: bool, directory: Path,
                        check: Callable[[CostModel], tuple[bool, dict]] | None) -> tuple[CostModel, dict]:
    """:func:`cached_or_measured` under its lock."""
    file = key.file_name()  # its name, not its path: statistics travel (API responses, records), a home does not
    cached = None if refresh else load_costs(key, directory)
    info: dict = {}
    if cached is not None:
        if check is None:
            return cached, {"source": "cached", "file": file}
        agrees, info = check(cached)
        if agrees:
            return cached, {"source": "cached-verified", "check": info, "file": file}
        log.info("the cached tree-cost calibration disagrees with a check just now (%s); re-measuring",
                 info.get("reason", "shape differs"))
    t0 = time.perf_counter()
    costs = measure()
    seconds = round(time.perf_counter() - t0, 2)
    extra = {"check": info} if info else {}
    problems = costs.quality.get("problems", [])
    if problems:
        log.warning("tree-cost calibration disturbed (%s): not cached, measured again at the next start",
                    "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else ""))
        if cached is not None:
            return cached, {"source": "cached, kept (re-measure disturbed)", "problems": problems,
                            "seconds": seconds, **extra, "file": file}
        return costs, {"source": "fresh, not cached (disturbed)", "problems": problems, "seconds": seconds,
                       "file": None}
    path = save_costs(key, costs, directory)
    log.info("calibrated tree costs in %.1f s (cached at %s)", seconds, path)
    return costs, {"source": "re-measured" if cached is not None else "fresh", "seconds": seconds, **extra,
                   "file": path.name if path else None}
