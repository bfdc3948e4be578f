"""How much one tree verification costs on this machine, relative to decoding one token.

On a GPU, verifying 60 tree nodes costs about as much as one token; on a small CPU it can cost 25x. This
measurement is what the tree size has to be weighed against (and the figure the benchmark record keeps).
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
