"""A calibration of the tree budget's costs that knows when it was disturbed, and the quick check of a cached one.

Other processes on the cores do not slow every timing alike: a pass can stall for seconds while its neighbour
runs at full speed (llama.cpp's threads spin-wait for each other at every graph barrier). One sweep over tree
sizes, one timing each, can then record any curve at all, and a curve that is cached stays wrong for good.
So the sizes are timed interleaved, in a fresh random order in each of several rounds, next to the plain
decoding step timed the way the plain loop runs it (``decode_one``, not a one-node tree); each size keeps the
median of its timings, and the result is checked:

* spread: the interquartile range of every size's timings, relative to its median, stays under a limit;
* monotone: a larger tree never costs clearly less than a smaller one (within a tolerance for noise);
* one node: verifying a one-node tree costs about a plain step.

A calibration that fails is measured once more; if that fails too, its problems are reported and the caller
does not cache it.

The curve is timed at a short context (64 tokens) and, where the machine can afford it, again at a long one
(:func:`long_context`, at most 2,048 tokens): every node attends over the whole KV cache, so on a small model a
tree's cost in plain steps moves with the prompt's length, up or down by machine
(NOTES.md#the-cost-model-at-two-contexts-and-the-long-context-sets-benched), and the budget reads the curve at each
round's context (costs.py). Reaching the long context costs a prefill, so its length is bounded by what that prefill
is predicted to cost, and it times fewer sizes (:data:`LONG_SIZES`; the short curve's shape fills those between).

Everything here is pure: the timing functions are passed in, so tests simulate any load
deterministically; microbench.py's ``measure_costs`` and ``check_costs`` supply them from a real target and
draft engine (the runtime's auto budget, api.py, calls those).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..tree.draft_tree import TreeParams
from ..tree_policy.costs import CALIBRATION_CONTEXT, ContextCurve, CostModel

log = logging.getLogger(__name__)

# every size up to 16 (where CPU trees are chosen and kernels batch in groups, so the curve has teeth), then sparse
CALIBRATION_SIZES = (*range(1, 17), 24, 32, 48, 60)

# the long context's sizes: where CPU trees are chosen (teeth included) and the largest (flat GPU-like curves);
# about a third of the short curve's plain steps per round
LONG_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
# the long context, at most: as long as the prompts whose trees the short curve misprices (past it the shape is
# extrapolated, and how c(n) moves past 1k tokens differs by machine:
# NOTES.md#the-long-anchor-at-2k-tokens-a-trees-cost-past-1k-tokens-moves-by-machine)
LONG_CONTEXT = 2048
MIN_LONG_CONTEXT = 256  # a shorter "long" context moves the shape by little more than the timing noise: skipped
LONG_PREFILL_S = 8.0  # the prefill that reaches the long context may be predicted to take this long, at most
LONG_ROUNDS = 3  # interleaved rounds at the long context (the short curve takes 5)

TimePlain = Callable[[], float]  # seconds of one plain decoding step
TimeVerify = Callable[[int], float]  # seconds of verifying one tree of n nodes


@dataclass(frozen=True)
class Limits:
    """When a calibration counts as disturbed."""

    max_spread: float = 0.5  # interquartile range / median of one size's timings
    monotone_tolerance: float = 0.5  # a larger tree may cost this fraction less than a smaller one (kernels that
    # batch tokens in groups of four make 4 nodes ~30% cheaper than 3 on this project's machine)
    one_node_ratio: float = 1.6  # verify(1) / plain step must lie within [1/this, this]
    check_tolerance: float = 1.6  # a cached shape agrees with a quick check within this factor
    max_remeasure_s: float = 15.0  # an attempt whose timings took longer stops after 3 rounds and is not
    # re-measured: a machine that busy (a token can cost 100 times its idle time) spoils the next one too


@dataclass
class Calibration:
    """The medians of one calibration (seconds per size; size 1 is the plain step) and what went wrong."""

    verify: dict[int, float]
    one_node_tree: float
    spread: dict[int, float]
    problems: list[str] = field(default_factory=list)
    attempts: int = 1

    def quality(self) -> dict:
        return {"problems": list(self.problems), "attempts": self.attempts,
                "max_spread": round(max(self.spread.values()), 3),
                "one_node_over_plain": round(self.one_node_tree / self.verify[1], 3)}


def time_interleaved(time_plain: TimePlain, time_verify: TimeVerify, sizes: list[int], rounds: int,
                     rng: np.random.Generator, max_s: float = float("inf"),
                     min_rounds: int = 3) -> tuple[dict[int, list[float]], list[float]]:
    """Timings per size (size 1: plain steps) and of one-node trees, every size once per round in a random
    order, so a burst of load spreads over the sizes instead of spoiling some of them entirely. Stops after
    ``min_rounds`` once the timings add up to ``max_s`` (a machine that busy is not kept waiting)."""
    jobs = [("plain", 1), ("tree", 1)] + [("tree", n) for n in sizes if n > 1]
    out: dict[int, list[float]] = {n: [] for n in sizes}
    one_node: list[float] = []
    for r in range(rounds):
        if r >= min_rounds and sum(map(sum, out.values())) + sum(one_node) > max_s:
            break
        for i in rng.permutation(len(jobs)):
            kind, n = jobs[i]
            if kind == "plain":
                out[1].append(time_plain())
            elif n == 1:
                one_node.append(time_verify(1))
            else:
                out[n].append(time_verify(n))
    return out, one_node


def relative_spread(times: list[float]) -> float:
    """Interquartile range over median: 0 for steady timings, ~1 when a quarter of them stalled."""
    q25, q50, q75 = np.percentile(times, [25, 50, 75])
    return float((q75 - q25) / max(q50, 1e-12))


def summarise(times: dict[int, list[float]], one_node: list[float], limits: Limits) -> Calibration:
    """Medians, spreads and the consistency problems of one set of timings."""
    sizes = sorted(times)
    med = {n: float(np.median(times[n])) for n in sizes}
    spread = {n: relative_spread(times[n]) for n in sizes}
    one = float(np.median(one_node))
    problems = [f"{n} nodes spread {s:.0%}" for n, s in spread.items() if s > limits.max_spread]
    for a, b in zip(sizes, sizes[1:]):
        if med[b] < (1.0 - limits.monotone_tolerance) * med[a]:
            problems.append(f"{b} nodes ({med[b] * 1e3:.1f} ms) cheaper than {a} ({med[a] * 1e3:.1f} ms)")
    ratio = one / max(med[1], 1e-12)
    if not 1.0 / limits.one_node_ratio <= ratio <= limits.one_node_ratio:
        problems.append(f"a one-node tree costs {ratio:.2f} plain steps")
    return Calibration(med, one, spread, problems)


def calibrate(time_plain: TimePlain, time_verify: TimeVerify, sizes: list[int], rounds: int = 5,
              attempts: int = 2, seed: int = 0, limits: Limits = Limits()) -> Calibration:
    """Verify times per size (median of ``rounds`` interleaved timings), re-measured up to ``attempts`` times
    while the checks fail (unless an attempt took longer than ``limits.max_remeasure_s``); the attempt with the
    fewest problems (then the smallest spread) is returned."""
    rng = np.random.default_rng(seed)
    sizes = sorted(set(sizes) | {1})
    best: Calibration | None = None
    for attempt in range(1, attempts + 1):
        times, one_node = time_interleaved(time_plain, time_verify, sizes, rounds, rng, limits.max_remeasure_s)
        cal = summarise(times, one_node, limits)
        if best is None or (len(cal.problems), max(cal.spread.values())) < \
                (len(best.problems), max(best.spread.values())):
            best = cal
        if not cal.problems or sum(map(sum, times.values())) + sum(one_node) > limits.max_remeasure_s:
            break
    best.attempts = attempt
    return best


def cost_model(cal: Calibration, draft_root_s: float, draft_level_s: float,
               draft_token_s: float | None = None, context: int = CALIBRATION_CONTEXT,
               longer: dict[int, Calibration] | None = None) -> CostModel:
    """The cost model of a calibration at ``context`` tokens and of those at ``longer`` contexts (by context);
    a longer one's problems count as the calibration's (prefixed with its context), so a disturbed long curve
    is not cached either."""
    longer = longer or {}
    sizes = sorted(cal.verify)
    quality = cal.quality()
    for ctx, long in sorted(longer.items()):
        quality["problems"] += [f"at {ctx} tokens: {p}" for p in long.problems]
        quality["max_spread"] = max(quality["max_spread"], long.quality()["max_spread"])
    if longer:
        quality["contexts"] = [context, *sorted(longer)]
    curves = [ContextCurve(ctx, tuple(sorted(c.verify)), tuple(c.verify[n] for n in sorted(c.verify)))
              for ctx, c in sorted(longer.items())]
    return CostModel(sizes, [cal.verify[n] for n in sizes], draft_root_s, draft_level_s, draft_token_s,
                     quality=quality, context=context, longer=curves)


def adopt_cached(costs: CostModel, time_plain: TimePlain, time_verify: TimeVerify, mid_size: int,
                 n_plain: int = 5, n_tree: int = 3, limits: Limits = Limits()) -> tuple[bool, dict]:
    """Adopt a cached calibration if it still describes this machine: a few plain steps and a mid-size tree,
    timed at the short calibration's context; their ratio (load cancels out) is compared with the cached shape
    there. If they agree, the plain steps seed ``costs``' plain rate, so the budget starts from the machine's
    speed now, not the calibration's."""
    plain = [time_plain() for _ in range(n_plain)]
    tree = [time_verify(mid_size) for _ in range(n_tree)]
    p, t = float(np.median(plain)), float(np.median(tree))
    measured, cached = t / max(p, 1e-12), costs.calibrated_shape(mid_size, costs.context)
    agrees = 1.0 / limits.check_tolerance <= measured / cached <= limits.check_tolerance
    if agrees:
        for s in plain:
            costs.observe_plain(s)
    info = {"plain_ms": round(p * 1e3, 3), "nodes": mid_size, "tree_ms": round(t * 1e3, 3),
            "tree_over_plain": round(measured, 2), "cached_tree_over_plain": round(cached, 2)}
    if not agrees:
        info["reason"] = f"{mid_size} nodes cost {measured:.1f} plain steps, the cache says {cached:.1f}"
    return agrees, info


def calibration_sizes(params: TreeParams) -> list[int]:
    return sorted({n for n in CALIBRATION_SIZES if n < params.total_tokens} | {params.total_tokens})


def long_sizes(params: TreeParams) -> list[int]:
    """Sizes timed at the long context: :data:`LONG_SIZES` within the tree, and the largest tree."""
    return sorted({n for n in LONG_SIZES if n < params.total_tokens} | {1, params.total_tokens})


def long_context(short: Calibration, n_ctx: int, max_nodes: int, short_context: int = CALIBRATION_CONTEXT,
                 limit_s: float | None = None) -> int | None:
    """The long context to time (a multiple of 64 tokens), or None when none worth timing is affordable: at most
    :data:`LONG_CONTEXT`, leaving the largest tree room in ``n_ctx``, and no longer than a prefill predicted to
    take ``limit_s`` reaches. The prediction takes a prompt token to cost what a node of the largest calibrated
    tree does (a batch's cost per token; a prefill's larger batches cost no more per token). ``limit_s`` None:
    :data:`LONG_PREFILL_S`."""
    limit_s = LONG_PREFILL_S if limit_s is None else limit_s
    largest = max(short.verify)
    per_token = short.verify[largest] / largest
    affordable = short_context + limit_s / max(per_token, 1e-9)
    ctx = int(min(LONG_CONTEXT, n_ctx - max_nodes - 1, affordable)) // 64 * 64
    if ctx < MIN_LONG_CONTEXT:
        log.info("no long-context calibration: %d tokens fit the context and the prefill's time (%.1f ms a token)",
                 ctx, per_token * 1e3)
        return None
    return ctx
