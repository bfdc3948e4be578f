"""What speculation costs on this machine, timed live on a real target and draft: verifying an n-node tree
(``verify_cost``), a plain step, the draft's root, levels and catch-up, the auto budget's calibration and its
start check (``measure_costs``, ``check_costs``, whose checks are calibration.py's), and the draft's per-call
profile during real generations.

On a GPU, verifying 60 tree nodes costs about as much as one token; on a small CPU it can cost 25x. These
measurements are what the tree size has to be weighed against (and the figures the benchmark record keeps).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..decoding.target import Target
from ..tree.draft_tree import DraftTree, TreeParams, grow_candidates
from ..tree_policy.costs import CostModel
from .calibration import LONG_ROUNDS, adopt_cached, calibrate, calibration_sizes, cost_model, long_context, long_sizes

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


def draft_cost(engine, target: Target, params: TreeParams, context_tokens: int = 64, repeats: int = 3,
               seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float, float]:
    """Median seconds of a draft round's root (``catch_up`` of one new token), of one deeper level, and per
    token of a catch-up over a backlog (the whole text at once, beyond the root's cost).

    Runs real rounds of the tree builder on random text, fed with the target's real features when the engine
    needs them (the target decodes each new token between rounds, untimed); engine and target are reset
    afterwards. Medians, like the verify times they are weighed against (a stalled pass moves neither), and
    the budget replaces them with the times of real rounds as soon as it drafts. The backlog catch-up (what
    a new prompt costs the draft before its first tree) is timed on the same text, a few times, warm.
    """
    rng = np.random.default_rng(seed)
    n_vocab = target.model.n_vocab
    text = [int(t) for t in rng.integers(0, n_vocab, context_tokens)]
    target.reset()
    engine.reset()
    feats = target.prefill(text).features if engine.needs_features else None
    roots, levels = [], []
    for i in range(repeats + 1):  # the first round ingests the context and warms up; dropped
        new = int(rng.integers(0, n_vocab))
        marks: list[float] = []
        t0 = clock()
        root_logits = engine.catch_up(np.asarray(text + [new]), feats, 0)
        grow_candidates(root_logits, engine.expand, params, level_done=lambda _: marks.append(clock()))
        engine.commit(np.zeros(0, dtype=np.int64))
        if i:
            roots.append(marks[0] - t0)
            levels.extend(np.diff(marks).tolist())
        if feats is not None:
            feats = np.concatenate([feats, target.decode_one(new).features])
        text.append(new)
    root_s = float(np.median(roots))
    token_s = _backlog_catch_up(engine, np.asarray(text), None if feats is None else feats[:len(text) - 1],
                                repeats, clock) - root_s
    token_s = max(token_s, 0.0) / (len(text) - 1)
    engine.reset()
    target.reset()
    level_s = float(np.median(levels)) if levels else 0.0
    log.info("draft root %.2f ms, level %.2f ms, %.3f ms per backlog token", root_s * 1e3, level_s * 1e3,
             token_s * 1e3)
    return root_s, level_s, token_s


def _backlog_catch_up(engine, tokens: np.ndarray, feats: np.ndarray | None, repeats: int,
                      clock: Callable[[], float]) -> float:
    """Median seconds of a fresh engine ingesting all of ``tokens`` (the last one the root) in one catch-up."""
    times = []
    for _ in range(repeats):
        engine.reset()
        t0 = clock()
        engine.catch_up(tokens, feats, 0)
        times.append(clock() - t0)
    return float(np.median(times))


class Timers:
    """Times plain steps and tree verifications on a target holding ``context_tokens`` of random text, each
    call leaving the cache as it found it (on a recurrent / hybrid model, one token longer: a state is taken back
    only within its last decode); a plain step and a ``warm_size``-node tree warm buffers up first, untimed
    (``warm_size`` None: the caller drops its own first timings)."""

    def __init__(self, target: Target, clock: Callable[[], float], warm_size: int | None, context_tokens: int = 64,
                 seed: int = 0) -> None:
        self.target, self.clock = target, clock
        self.rng = np.random.default_rng(seed)
        self.n_vocab = target.model.n_vocab
        self.warm_size = warm_size
        target.reset()
        target.prefill(self.rng.integers(0, self.n_vocab, context_tokens))
        self._warm()

    @property
    def context(self) -> int:
        """Tokens of context the timings run after."""
        return self.target.n_past

    def extend(self, context_tokens: int) -> None:
        """Grow the context to ``context_tokens`` with more random text (no features: only its length matters),
        then warm up again (a longer KV cache is a new graph)."""
        self.target.prefill(self.rng.integers(0, self.n_vocab, context_tokens - self.target.n_past), False)
        self._warm()

    def _warm(self) -> None:
        if self.warm_size is not None:
            self.plain()
            self.verify(self.warm_size)

    def plain(self) -> float:
        """One plain decoding step, as the plain loop takes it (``decode_one``), then rolled back."""
        token = int(self.rng.integers(0, self.n_vocab))
        t0 = self.clock()
        self.target.decode_one(token)
        seconds = self.clock() - t0
        if not self.target.chain_only:  # a recurrent state cannot take back a one-token decode: the context grows
            self.target.rollback(self.target.n_past - 1)
        return seconds

    def verify(self, n: int) -> float:
        """One verification of an n-node tree; on a recurrent / hybrid model a chain and its rejection timed
        together (a checkpoint's restore and replay, or a snapshot's take-back, which the next decode applies and
        so the next timing pays), which leaves its root committed: the context grows a token a call there."""
        chain = self.target.chain_only
        tree = (DraftTree.from_parents(self.rng.integers(0, self.n_vocab, n), np.arange(-1, n - 1)) if chain
                else bushy_tree(n, self.rng, self.n_vocab))  # what the target verifies
        t0 = self.clock()
        self.target.verify(tree)
        if chain:
            self.target.abort_tree()
        seconds = self.clock() - t0
        if not chain:
            self.target.abort_tree()
        return seconds


def verify_cost(target: Target, sizes=DEFAULT_SIZES, context_tokens: int = 128, repeats: int = 5,
                seed: int = 0, reduce=np.median) -> dict[int, float]:
    """Seconds of one ``verify`` of an n-node tree after ``context_tokens`` of context, per size (the median
    of ``repeats`` runs, or ``reduce`` of them); leaves the target empty."""
    timers = Timers(target, time.perf_counter, warm_size=None, context_tokens=context_tokens, seed=seed)
    out: dict[int, float] = {}
    for n in sizes:
        times = [timers.verify(n) for _ in range(repeats + 1)]  # the first run warms caches for the size: dropped
        out[n] = float(reduce(times[1:]))
        log.info("verify %d nodes: %.2f ms", n, out[n] * 1e3)
    target.reset()
    return out


def measure_costs(target: Target, engine, params: TreeParams, progress=None,
                  clock: Callable[[], float] = time.perf_counter) -> CostModel:
    """The tree budget's calibration: verify times over tree sizes up to ``params.total_tokens``, timed
    interleaved and checked for disturbance (calibration.py), and the draft's root, level and backlog-token
    times; a few seconds on SmolLM2. The verify curve is timed at a short context and again, with fewer sizes,
    at a long one where a prefill to it is affordable (calibration.long_context). ``quality["problems"]`` lists
    what made it look disturbed. Leaves target and engine empty."""
    say = progress or log.info
    sizes = calibration_sizes(params)
    say("timing what a draft tree costs on this machine, so that the budget drafts only where it pays (once for "
        "these settings: the result is cached)")
    say(f"timing verification of {len(sizes)} tree sizes up to {params.total_tokens} nodes, interleaved")
    timers = Timers(target, clock, warm_size=min(8, params.total_tokens))
    short_context = timers.context
    cal = calibrate(timers.plain, timers.verify, sizes)
    longer = {}
    ctx = long_context(cal, target.n_ctx, params.total_tokens, short_context)
    if ctx is not None:
        lsizes = long_sizes(params)
        say(f"timing verification of {len(lsizes)} tree sizes at {ctx} tokens of context")
        timers.extend(ctx)
        longer[ctx] = calibrate(timers.plain, timers.verify, lsizes, rounds=LONG_ROUNDS, attempts=1)
    target.reset()
    say("timing the draft")
    # every level costs the same (k frontier nodes), so three levels time it as well as six
    short = TreeParams(params.total_tokens, min(params.depth, 3), params.top_k)
    return cost_model(cal, *draft_cost(engine, target, short, repeats=3, clock=clock), context=short_context,
                      longer=longer)


def check_costs(target: Target, costs: CostModel, params: TreeParams,
                clock: Callable[[], float] = time.perf_counter) -> tuple[bool, dict]:
    """Quick check of a cached calibration at start (5 plain steps and 3 timings of a mid-size tree, well
    under a second on SmolLM2); leaves the target empty."""
    mid = max(2, min(params.total_tokens, 16))
    timers = Timers(target, clock, warm_size=mid, context_tokens=costs.context)
    try:
        return adopt_cached(costs, timers.plain, timers.verify, mid)
    finally:
        target.reset()


@dataclass
class DraftTimes:
    """A :class:`~eagle2_local.generation.generator.DraftTimer` that keeps every draft call's time: give it to
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
