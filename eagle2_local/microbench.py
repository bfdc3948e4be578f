"""What speculation costs on this machine, relative to decoding one token: verifying an n-node tree, and
drafting one tree level.

On a GPU, verifying 60 tree nodes costs about as much as one token; on a small CPU it can cost 25x. These
measurements are what the tree size has to be weighed against (and the figures the benchmark record keeps).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .target import Target
from .tree import DraftTree

log = logging.getLogger(__name__)

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 48, 60, 64)


def bushy_tree(n: int, rng: np.random.Generator, n_vocab: int, max_depth: int = 6) -> DraftTree:
    """A random tree shaped like EAGLE-2's (wide near the root, at most ``max_depth`` deep)."""
    parents = [-1]
    depth = [0]
    for i in range(1, n):
        candidates = [j for j in range(i) if depth[j] < max_depth]
        p = int(candidates[int(rng.integers(0, min(len(candidates), 4 + i // 2)))])
        parents.append(p)
        depth.append(depth[p] + 1)
    return DraftTree.from_parents(rng.integers(0, n_vocab, n), parents)


def verify_cost(target: Target, sizes=DEFAULT_SIZES, context_tokens: int = 128, repeats: int = 5,
                seed: int = 0) -> dict[int, float]:
    """Median seconds of one ``verify`` of an n-node tree after ``context_tokens`` of context, per size."""
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
        out[n] = float(np.median(times[1:]))
        log.info("verify %d nodes: %.2f ms", n, out[n] * 1e3)
    return out


class _TimedEngine:
    """Wraps a draft engine and records how long each call takes (delegates everything else)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.catch_up_s: list[float] = []
        self.level_s: dict[int, list[float]] = {}

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def catch_up(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._engine.catch_up(*args, **kwargs)
        self.catch_up_s.append(time.perf_counter() - t0)
        return out

    def expand(self, cand_ids, tokens, parent_ids, level):
        t0 = time.perf_counter()
        out = self._engine.expand(cand_ids, tokens, parent_ids, level)
        self.level_s.setdefault(int(level), []).append(time.perf_counter() - t0)
        return out


def draft_cost(llm, prompts: list[str], max_tokens: int = 64) -> dict:
    """Per-call cost of the attached draft engine during real greedy generations, against the target's cost
    of one plain decoding step measured on the same prompts in the same process.

    ``llm`` is an :class:`eagle2_local.api.Eagle2` with a draft. Times are medians in milliseconds; a "level" is
    one ``expand`` call (``tree_top_k`` nodes in one batch).
    """
    gen = llm.generator
    timed = _TimedEngine(gen.engine)
    plain_token_s = []
    gen.engine = timed
    try:
        for prompt in prompts:
            llm.reset()
            messages = [{"role": "user", "content": prompt}]
            llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0)
            llm.reset()
            llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0, speculative=False)
            st = gen.last_stats
            plain_token_s.append(st.verify_s / max(st.target_passes, 1))
    finally:
        gen.engine = timed._engine
    target_ms = float(np.median(plain_token_s)) * 1e3
    levels = {lvl: float(np.median(v)) * 1e3 for lvl, v in sorted(timed.level_s.items())}
    all_levels = [t for v in timed.level_s.values() for t in v]
    level_ms = float(np.median(all_levels)) * 1e3 if all_levels else 0.0
    return {
        "engine": gen.engine.name, "width": llm.tree_params.top_k, "target_token_ms": round(target_ms, 3),
        "catch_up_ms": round(float(np.median(timed.catch_up_s)) * 1e3, 3) if timed.catch_up_s else 0.0,
        "level_ms": round(level_ms, 3), "level_ms_by_level": {k: round(v, 3) for k, v in levels.items()},
        "level_over_target_token": round(level_ms / target_ms, 4) if target_ms else None,
        "rounds": len(timed.catch_up_s),
    }
