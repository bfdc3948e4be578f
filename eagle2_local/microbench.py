"""What speculation costs on this machine, relative to decoding one token: verifying an n-node tree, and
drafting one tree level.

On a GPU, verifying 60 tree nodes costs about as much as one token; on a small CPU it can cost 25x. These
measurements are what the tree size has to be weighed against (and the figures the benchmark record keeps).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .calibration import bushy_tree
from .target import Target

log = logging.getLogger(__name__)

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 48, 60, 64)


def verify_cost(target: Target, sizes=DEFAULT_SIZES, context_tokens: int = 128, repeats: int = 5,
                seed: int = 0, reduce=np.median) -> dict[int, float]:
    """Seconds of one ``verify`` of an n-node tree after ``context_tokens`` of context, per size (the median
    of ``repeats`` runs, or ``reduce`` of them)."""
    rng = np.random.default_rng(seed)
    target.reset()
    target.prefill(rng.integers(0, target.model.n_vocab, context_tokens))
    out: dict[int, float] = {}
    for n in sizes:
        times = []
        for _ in range(repeats + 1):  # the first run warms caches and allocates buffers; dropped
            tree = bushy_tree(n, rng, target.model.n_vocab)
            t0 = time.perf_counter()
            target.verify(tree)
            times.append(time.perf_counter() - t0)
            target.abort_tree()
        out[n] = float(reduce(times[1:]))
        log.info("verify %d nodes: %.2f ms", n, out[n] * 1e3)
    return out


@dataclass
class DraftTimes:
    """A :class:`~eagle2_local.generator.DraftTimer` that keeps every draft call's time: give it to
    ``Eagle2(draft_timer=...)``, generate, then read it (:func:`drafting_profile`)."""

    catch_up_s: list[float] = field(default_factory=list)
    level_s: dict[int, list[float]] = field(default_factory=dict)

    def catch_up(self, seconds: float) -> None:
        self.catch_up_s.append(seconds)

    def level(self, level: int, seconds: float) -> None:
        self.level_s.setdefault(level, []).append(seconds)


def drafting_profile(llm, times: DraftTimes, prompts: list[str], max_tokens: int = 64) -> dict:
    """Per-call cost of the attached draft engine during real greedy generations, against the target's cost
    of one plain decoding step measured on the same prompts in the same process.

    ``llm`` is an :class:`eagle2_local.api.Eagle2` with a draft, made with ``draft_timer=times``. Times are
    medians in milliseconds; a "level" is one ``expand`` call (``tree_top_k`` nodes in one batch).
    """
    plain_token_s = []
    for prompt in prompts:
        llm.reset()
        messages = [{"role": "user", "content": prompt}]
        llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0)
        llm.reset()
        llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0, speculative=False)
        st = llm.stats()
        plain_token_s.append(st["verify_s"] / max(st["target_passes"], 1))
    target_ms = float(np.median(plain_token_s)) * 1e3
    levels = {lvl: float(np.median(v)) * 1e3 for lvl, v in sorted(times.level_s.items())}
    all_levels = [t for v in times.level_s.values() for t in v]
    level_ms = float(np.median(all_levels)) * 1e3 if all_levels else 0.0
    return {
        "engine": llm.engine_name, "width": llm.tree_params.top_k, "target_token_ms": round(target_ms, 3),
        "catch_up_ms": round(float(np.median(times.catch_up_s)) * 1e3, 3) if times.catch_up_s else 0.0,
        "level_ms": round(level_ms, 3), "level_ms_by_level": {k: round(v, 3) for k, v in levels.items()},
        "level_over_target_token": round(level_ms / target_ms, 4) if target_ms else None,
        "rounds": len(times.catch_up_s),
    }
