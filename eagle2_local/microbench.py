"""How much one tree verification costs on this machine, relative to decoding one token.

On a GPU, verifying 60 tree nodes costs about as much as one token; on a small CPU it can cost 25x. This
measurement is what the tree size has to be weighed against (and the figure the benchmark record keeps).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .costs import CostModel
from .target import Target
from .tree import DraftTree, TreeParams, grow_candidates

log = logging.getLogger(__name__)

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 48, 60, 64)
CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 16, 32, 60)


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


def draft_cost(engine, n_vocab: int, params: TreeParams, context_tokens: int = 64, repeats: int = 3,
               seed: int = 0) -> tuple[float, float]:
    """Fastest seconds of a draft round's root (``catch_up`` of one new token) and of one deeper level.

    Runs real rounds of the tree builder on random text; the engine is reset afterwards. The minimum, not the
    median: other processes on the cores only ever add time, and the budget learns the current load online.
    """
    rng = np.random.default_rng(seed)
    text = rng.integers(0, n_vocab, context_tokens)
    engine.reset()
    engine.catch_up(text)
    roots, levels = [], []
    for i in range(repeats + 1):  # the first round warms up; dropped
        text = np.concatenate([text, rng.integers(0, n_vocab, 1)])
        marks: list[float] = []
        t0 = time.perf_counter()
        root_logits = engine.catch_up(text)
        grow_candidates(root_logits, engine.expand, params, lambda *_: marks.append(time.perf_counter()) or True)
        engine.commit(np.zeros(0, dtype=np.int64))
        if i:
            roots.append(marks[0] - t0)
            levels.extend(np.diff(marks).tolist())
    engine.reset()
    level_s = float(np.min(levels)) if levels else 0.0
    log.info("draft root %.2f ms, level %.2f ms", np.min(roots) * 1e3, level_s * 1e3)
    return float(np.min(roots)), level_s


def measure_costs(target: Target, engine, params: TreeParams, progress=None) -> CostModel:
    """The tree budget's calibration: verify times over tree sizes up to ``params.total_tokens`` and the
    draft's root/level times; a few seconds on SmolLM2. Leaves target and engine empty."""
    say = progress or log.info
    sizes = sorted({n for n in CALIBRATION_SIZES if n < params.total_tokens} | {params.total_tokens})
    say(f"timing verification of {len(sizes)} tree sizes up to {params.total_tokens} nodes")
    verify = verify_cost(target, sizes, context_tokens=64, repeats=2, reduce=np.min)  # min: see draft_cost
    target.reset()
    say("timing the draft")
    # every level costs the same (k frontier nodes), so three levels time it as well as six
    short = TreeParams(params.total_tokens, min(params.depth, 3), params.top_k)
    root_s, level_s = draft_cost(engine, target.model.n_vocab, short, repeats=2)
    return CostModel(sizes, [verify[n] for n in sizes], root_s, level_s)
