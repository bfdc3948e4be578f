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

The shape depends on the context: every node of a tree attends over the whole KV cache, and attention's cost grows
linearly with the KV length while the weights' stays put. Where attention is computed node by node, a tree costs
more plain steps on a long prompt than on a short one; where reading the KV dominates a plain step, a tree reads it
once for all its nodes and the shape flattens instead (both were measured on different machines:
NOTES.md#the-cost-model-at-two-contexts-and-the-long-context-sets-benched). So the verify curve is not assumed but
timed at several contexts (:class:`ContextCurve`); the calibrated shape at the context now is interpolated between
them, linearly in context, and the online corrections multiply that context's shape (they learn what the calibration
got wrong about the machine, not about the context).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

CORRECTION_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
CALIBRATION_CONTEXT = 64  # tokens of context the (short) verify curve is timed at (microbench.Timers' default)
EXTRAPOLATE_UP_TO = 2.0  # past the longest calibrated context, the shape is extrapolated up to this many times it
# (attention's share of a pass saturates, so a straight line overshoots further out), then held
CONFIRM = 3  # a cost observed dearer than calibrated counts the calibration as votes until this many observations
# of its own, unless confirmed otherwise (_believed)
LONG_CATCH_UP = 256  # catch-ups over this many backlog tokens in all confirm a dear per-token cost: a stall is
# spread over their tokens
DEAR = 1.25  # a tree round whose time over its calibrated shape exceeds this is a dear one
SEALING = 2.0  # a tree size believed this many times its calibrated cost, or plain steps after a tree believed
# SEALING - 1 plain steps dearer, is rechecked (CostModel._recheck): such a belief stops trees
LOG_SEALING = math.log(SEALING)
AFTER_TREE = 2  # plain steps after a run of tree rounds whose extra time is charged to the run (switch_steps)
RECHECK_STEPS = 128  # plain steps after which costs believed dear enough to stop trees are rechecked (SEALING)
CONTEXT_STEP = 32  # the calibrated shape follows the context in steps of this many tokens (each move re-derives
# the shape and whatever the budget computed from it; a round's context moves every round)


def _believed(observed, calibrated: float, confirmed: bool = False) -> float:
    """What a short window of observed costs says a cost is, given what the calibration said (``calibrated``).

    Asymmetric on purpose: a cost lower than calibrated is believed at once, because the budget then spends
    it and the next rounds correct it if it was wrong. A higher one seals itself: the budget stops paying for what
    it now thinks dear (a tree size, and through the interpolation the sizes around it; a draft whose root or
    level looks dear), so no later round would correct it, and one pass stalled by another process would turn
    trees off for the rest of the process. So a higher cost is believed only when confirmed (``confirmed``, or
    :data:`CONFIRM` observations of its own); until then the calibration fills the missing votes, so a second
    dear observation outvotes it and a lone stall never does."""
    middle = median(observed)
    if middle <= calibrated or confirmed or len(observed) >= CONFIRM:
        return middle
    return median(list(observed) + [calibrated] * (CONFIRM - len(observed)))


def median(values) -> float:
    """Median of a short sequence (plain Python: this runs at every plain step, numpy would cost more)."""
    s = sorted(values)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


@dataclass(frozen=True)
class ContextCurve:
    """Verify seconds timed at a longer ``context`` (KV length), at ``sizes`` (size 1: the plain step there); may
    be sparser than the short curve, whose shape fills the sizes between (:func:`_long_shape`)."""

    context: int
    sizes: tuple[int, ...]
    verify: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.verify) or 1 not in self.sizes:
            raise ValueError("a context's verify curve needs one time per size, the plain step (n=1) included")

    def to_dict(self) -> dict:
        return {"context": self.context, "sizes": list(self.sizes), "verify_s": [round(v, 7) for v in self.verify]}

    @classmethod
    def from_dict(cls, d: dict) -> "ContextCurve":
        return cls(int(d["context"]), tuple(int(n) for n in d["sizes"]), tuple(float(v) for v in d["verify_s"]))


@dataclass
class CostModel:
    """Verify-time curve over measured tree sizes plus drafting times, in plain steps; learns online.

    ``verify[0]`` (size 1) is the plain decoding step; the other sizes are tree verifications. Predictions are
    ``plain step now x shape``: the plain step is the median of the last ``window`` plain steps observed (the
    calibration's until one is), the shape is the calibrated cost in plain steps times a per-size correction,
    the median ratio of observed to calibrated shape at the nearest measured size (sizes between two
    observed ones interpolate in log size; size 1 is the anchor). Medians of short windows, not moving
    averages: one pass stalled by another process moves nothing, a wrong calibration is replaced after a
    few rounds; a cost observed dearer than calibrated waits for a confirmation (:func:`_believed`).
    ``frozen`` turns online learning off (tests that need fixed costs). ``draft_token_s``: seconds per backlog
    token a catch-up ingests beyond the root (None: not measured; then a token is taken to cost
    as much as a one-token catch-up, an upper bound, until a real backlog catch-up has been timed).

    ``sizes``/``verify`` were timed at ``context`` tokens of KV; ``longer`` holds curves timed at longer contexts.
    :meth:`at_context` tells the model the context of the round about to be planned: the calibrated shape is then
    that context's (linear in context between the anchors; past the last, extrapolated linearly and never
    decreasing up to twice its context, then held, within [1, n]; below the first, the first's), and an observed tree's correction is its time over
    the shape at the context it ran at. With no longer curve the context changes nothing (the model of old).
    """

    sizes: list[int]
    verify: list[float]
    draft_root_s: float
    draft_level_s: float
    draft_token_s: float | None = None
    frozen: bool = False
    window: int = 9
    quality: dict = field(default_factory=dict)  # how the calibration went (calibration.py); not cached
    context: int = CALIBRATION_CONTEXT
    longer: list[ContextCurve] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.verify) or not self.sizes:
            raise ValueError("a cost model needs one verify time per measured size")
        order = np.argsort(self.sizes)
        self.sizes = [int(self.sizes[i]) for i in order]
        self.verify = [float(self.verify[i]) for i in order]
        if self.sizes[0] != 1:
            raise ValueError("the verify curve must include n=1 (the plain decoding step)")
        self.longer = sorted(self.longer, key=lambda c: c.context)
        if any(c.context <= self.context for c in self.longer) or \
                len({c.context for c in self.longer}) != len(self.longer):
            raise ValueError("each longer curve needs its own context, longer than the short curve's")
        xs = np.asarray(self.sizes, dtype=np.float64)
        self.plain_cal = max(self.verify[0], 1e-9)
        shape_cal = _sane_shape(xs, np.asarray(self.verify, dtype=np.float64) / self.plain_cal)
        # corrections live on a fixed grid, finer than a sparse (or spoiled) calibration may be
        grid = sorted({n for n in CORRECTION_GRID if n < self.sizes[-1]} | set(self.sizes))
        self._xs = np.asarray(grid, dtype=np.float64)
        self._log_xs = np.log(self._xs)
        # the calibrated shape on the grid at each anchor context, shortest first
        self._anchor_ctx = np.asarray([self.context] + [c.context for c in self.longer], dtype=np.float64)
        short = np.interp(self._xs, xs, shape_cal)
        self._anchor_shapes = np.stack([short] + [_long_shape(self._xs, short, c) for c in self.longer])
        self.context_now = self.context
        self._shape_cal = self._anchor_shapes[0]
        self._plain: deque[float] = deque(maxlen=self.window)
        self._knot: list[deque[float]] = [deque(maxlen=self.window) for _ in grid]
        self._dear: deque[bool] = deque(maxlen=self.window)  # the last tree rounds: was each dear?
        self._root: deque[float] = deque(maxlen=self.window)
        self._level: deque[float] = deque(maxlen=self.window)
        self._token: deque[float] = deque(maxlen=self.window)
        self._token_n: deque[int] = deque(maxlen=self.window)  # the backlog tokens each of those averaged over
        # per position after a run of trees (first, second plain step): each one's time over the plain step's
        self._after: list[deque[float]] = [deque(maxlen=self.window) for _ in range(AFTER_TREE)]
        self.switch_steps = 0.0
        self.n_observed = 0
        self._plain_steps = 0  # plain steps observed in all (the recheck's clock)
        self._recheck_every = RECHECK_STEPS
        self._recheck_at = math.inf  # the plain step at which dear costs are rechecked (inf: none is dear)
        self._stalls = 0  # plain steps since the recheck was scheduled that took over DEAR times the plain step
        self._rechecked: set[int] = set()  # the sizes the last recheck forgot, not yet timed again
        self.rechecks = 0  # rechecks that forgot dear costs
        self.shape_version = 0
        self._refresh_shape()

    # ------------------------------------------------------------ state
    def _refresh_shape(self) -> None:
        """Recompute the corrected shape and drafting costs from the observation windows."""
        seen = [i for i, d in enumerate(self._knot) if i > 0 and d]
        log_c = np.zeros(len(self._xs))
        if seen:
            known_x = np.concatenate([[self._log_xs[0]], self._log_xs[seen]])
            known_c = np.concatenate([[0.0], [np.log(self._correction(self._knot[i])) for i in seen]])
            log_c = np.interp(self._log_xs, known_x, known_c)  # past the last observed size: its correction
        if float(log_c.max()) > LOG_SEALING:
            self._schedule_recheck()
        self._shape = _sane_shape(self._xs, self._shape_cal * np.exp(log_c))
        tail = (self._shape[-1] - self._shape[-2]) / (self._xs[-1] - self._xs[-2]) if len(self._xs) > 1 else 0.0
        self._slope = max(float(tail), 0.0)
        root_cal, level_cal = self.draft_root_s / self.plain_cal, self.draft_level_s / self.plain_cal
        self._root_rel = _believed(self._root, root_cal) if self._root else root_cal
        self._level_rel = _believed(self._level, level_cal) if self._level else level_cal
        token_cal = self._root_rel if self.draft_token_s is None else self.draft_token_s / self.plain_cal
        self._token_rel = (_believed(self._token, token_cal, confirmed=sum(self._token_n) >= LONG_CATCH_UP)
                           if self._token else token_cal)
        self._shape_of: dict[int, float] = {}
        self.shape_version += 1  # values computed from the shape alone stay valid while it is unchanged
        self._refresh_plain()

    def _correction(self, observed: deque[float]) -> float:
        """A tree size's shape correction from its observations (ratios of observed to calibrated shape):
        :func:`_believed`, where the recent tree rounds, of any size, also confirm when most of them (two at
        least) were dear: stalls hit some passes, a dear curve makes every round dear."""
        dear = sum(self._dear)
        return _believed(observed, 1.0, confirmed=dear >= 2 and 2 * dear > len(self._dear))

    def _refresh_plain(self) -> None:
        self._plain_s = median(self._plain) if self._plain else self.plain_cal

    @property
    def n_plain(self) -> int:
        """Plain steps observed in the current window (0: the plain rate is still the calibration's)."""
        return len(self._plain)

    @property
    def load(self) -> float:
        """The plain step now over the calibrated one: how much busier (or idler) the machine is."""
        return self._plain_s / self.plain_cal

    # ------------------------------------------------------------ context
    def at_context(self, n_past: int) -> bool:
        """The round about to be planned runs after ``n_past`` tokens of KV: predictions and the corrections
        observed next are that context's. Moves the shape only in steps of :data:`CONTEXT_STEP` tokens (and never
        without a longer curve), so the values derived from it stay cached between steps. Returns whether the
        shape moved."""
        if not self.longer or abs(n_past - self.context_now) < CONTEXT_STEP:
            return False
        self.context_now = int(n_past)
        self._shape_cal = self._cal_shape_grid(n_past)
        self._refresh_shape()
        return True

    def _cal_shape_grid(self, context: int) -> np.ndarray:
        """The calibrated shape on the grid at ``context``: linear in context between the anchors (attention's
        cost grows linearly with the KV length); past the last anchor the last segment's slope up to
        :data:`EXTRAPOLATE_UP_TO` times its context, held beyond, within [1, n], and floored at 0: a tree is never
        predicted cheaper than at the longest context measured (a falling slope may be noise, and trees drafted on
        an extrapolated saving would lose); before the first anchor, the first's."""
        ctx, shapes = self._anchor_ctx, self._anchor_shapes
        if len(ctx) == 1 or context <= ctx[0]:
            return shapes[0]
        if context >= ctx[-1]:
            slope = np.maximum((shapes[-1] - shapes[-2]) / (ctx[-1] - ctx[-2]), 0.0)
            beyond = min(context, EXTRAPOLATE_UP_TO * ctx[-1]) - ctx[-1]
            return _sane_shape(self._xs, shapes[-1] + slope * beyond)
        i = int(np.searchsorted(ctx, context, side="right")) - 1
        w = (context - ctx[i]) / (ctx[i + 1] - ctx[i])
        return (1.0 - w) * shapes[i] + w * shapes[i + 1]

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

    def calibrated_shape(self, n: int, context: int | None = None) -> float:
        """Verifying n nodes in plain steps as the calibration measured it (sanitised, no online correction), at
        ``context`` tokens of KV (None: the context now, :meth:`at_context`)."""
        shape = self._shape_cal if context is None else self._cal_shape_grid(context)
        return float(np.interp(n, self._xs, shape))

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
    def observe_plain(self, seconds: float, after_tree: int = 0) -> None:
        """One plain decoding step actually taken: the unit every other cost is expressed in. ``after_tree``: it
        is the first (1) or second (2) plain step after a run of tree rounds (0: neither), whose extra time over a
        plain step the run is charged (:attr:`switch_steps`)."""
        self.n_observed += 1
        if self.frozen or not seconds > 0:
            return
        if 0 < after_tree <= AFTER_TREE:
            self._after[after_tree - 1].append(float(seconds) / self._plain_s - 1.0)
            self._refresh_switch()
        self._plain.append(float(seconds))
        self._plain_steps += 1
        if seconds > DEAR * self._plain_s:
            self._stalls += 1
        if self._plain_steps >= self._recheck_at:
            self._recheck()
        self._refresh_plain()

    def _recheck(self) -> None:
        """Forget the costs believed dear enough to stop trees (a tree size over SEALING times its calibrated shape,
        the plain steps after a tree over SEALING - 1 plain steps dearer than plain ones) if plain steps stalled (over
        DEAR times the plain step) since they were: stalls then explain them as well as a dear curve does. Such a cost
        is never paid again, so nothing else would correct it, and on a machine that stalls one pass in five a size's
        short window turns dear by chance sooner or later (and through the interpolation its neighbours). With no
        stalled plain step the belief stands (a wrong calibration stays corrected). Each recheck waits twice as long
        as the last, until a size it forgot is timed cheap again, so a truly dearer cost is paid again a few times per
        doubling."""
        if self._stalls:
            self.rechecks += 1
            self._rechecked = {i for i, knot in enumerate(self._knot)
                               if i > 0 and knot and self._correction(knot) > SEALING}
            for i in self._rechecked:
                self._knot[i].clear()
            self._dear.clear()  # the same rounds: they must not confirm the next dear one at once
            for after in self._after:
                if after and _believed(after, 0.0) > SEALING - 1.0:
                    after.clear()
            self._refresh_switch()
        self._recheck_every *= 2
        self._recheck_at = math.inf
        self._refresh_shape()  # re-schedules a recheck while a cost is still believed dear

    def _refresh_switch(self) -> None:
        """:attr:`switch_steps`: plain steps that ending a run of tree rounds costs the plain steps after it,
        beyond their own time. On a CPU the first plain step after a tree is measured slower than one after a plain
        step (~8% of a step on the Intel AMX VM, the second ~3.5%: NOTES.md#a-tree-slows-the-plain-steps-after-it), a
        cost of the tree that a curve timed size by size does not show. Believed like any dearer cost
        (:func:`_believed` against 0: a lone stall moves nothing); a plain step measured faster counts 0."""
        self.switch_steps = sum(max(_believed(w, 0.0), 0.0) for w in self._after if w)
        if self.switch_steps > SEALING - 1.0:
            self._schedule_recheck()

    def _schedule_recheck(self) -> None:
        """A cost is believed dear enough to stop trees: :meth:`_recheck` looks at it again ``_recheck_every`` plain
        steps from now."""
        if self._recheck_at == math.inf:
            self._recheck_at = self._plain_steps + self._recheck_every
            self._stalls = 0

    def observe_verify(self, n: int, seconds: float) -> None:
        """One tree of n nodes verified: a shape correction for the nearest measured size (n = 1, the root
        alone on the tree path, says nothing about trees and is only counted). The correction is relative to the
        calibrated shape at the round's context (:meth:`at_context`), so it carries over when the context moves."""
        self.n_observed += 1
        if self.frozen or n < 2 or not seconds > 0:
            return
        k = int(np.argmin(np.abs(self._log_xs - np.log(n))))
        k = max(k, 1)
        ratio = seconds / self._plain_s / float(np.interp(n, self._xs, self._shape_cal))
        self._knot[k].append(ratio)
        self._dear.append(ratio > DEAR)
        if k in self._rechecked:  # the first time a forgotten size is timed again: was forgetting it right?
            self._rechecked.discard(k)
            if ratio <= DEAR:
                self._recheck_every = RECHECK_STEPS
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
        self._token_n.append(n_tokens - 1)
        self._refresh_shape()

    # ------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        token = {} if self.draft_token_s is None else {"draft_token_s": round(self.draft_token_s, 9)}
        longer = {"longer": [c.to_dict() for c in self.longer]} if self.longer else {}
        return {"sizes": list(self.sizes), "verify_s": [round(v, 7) for v in self.verify],
                "draft_root_s": round(self.draft_root_s, 7), "draft_level_s": round(self.draft_level_s, 7), **token,
                "context": self.context, **longer}

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        token = d.get("draft_token_s")
        return cls(list(d["sizes"]), list(d["verify_s"]), float(d["draft_root_s"]), float(d["draft_level_s"]),
                   None if token is None else float(token), context=int(d.get("context", CALIBRATION_CONTEXT)),
                   longer=[ContextCurve.from_dict(c) for c in d.get("longer", [])])

    def summary(self) -> dict:
        """Milliseconds at a few sizes and what online learning changed: what the stats and the CLI show."""
        shown = [n for n in (1, 8, 16, 32, self.sizes[-1]) if n <= self.sizes[-1]]
        corrections = {int(self._xs[i]): round(self._correction(d), 3) for i, d in enumerate(self._knot)
                       if i > 0 and d}
        contexts = {"context": self.context_now,
                    "calibrated_contexts": [self.context] + [c.context for c in self.longer]} if self.longer else {}
        return {"verify_ms": {n: round(float(self.verify_s(n)) * 1e3, 3) for n in dict.fromkeys(shown)},
                "draft_root_ms": round(self.draft_root_now * 1e3, 3),
                "draft_level_ms": round(self.draft_level_now * 1e3, 3),
                "draft_token_ms": round(self.draft_token_now * 1e3, 4), "load": round(self.load, 3),
                "plain_steps_in_window": self.n_plain, "shape_corrections": corrections,
                "switch_steps": round(self.switch_steps, 3), "dear_rechecks": self.rechecks, **contexts}


def _sane_shape(xs: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """1 at n = 1, never below one plain step nor above n of them (the n nodes could be decoded one by one).
    Not made monotone: CPU kernels for repacked quantizations batch tokens in groups (four at a time here), so
    verifying 4 nodes can cost less than 3, and the sizes chosen should follow that (NOTES.md#the-tree-budget)."""
    out = np.clip(shape, 1.0, np.maximum(xs, 1.0))
    out[0] = 1.0
    return out


def _long_shape(xs: np.ndarray, short: np.ndarray, curve: ContextCurve) -> np.ndarray:
    """A longer context's shape on the grid ``xs``: its own timings where it has them; between and past them,
    the short shape times the long-over-short ratio, interpolated in log size between its sizes (1 at n = 1) and
    held past the largest. A sparse long curve so keeps the short curve's teeth (sizes whose kernels batch well)
    and only scales them."""
    sizes = np.asarray(curve.sizes, dtype=np.float64)
    order = np.argsort(sizes)
    sizes = sizes[order]
    verify = np.asarray(curve.verify, dtype=np.float64)[order]
    own = _sane_shape(sizes, verify / max(verify[0], 1e-9))
    ratio = own / np.interp(sizes, xs, short)
    out = short * np.interp(np.log(xs), np.log(sizes), ratio)
    return _sane_shape(xs, out)
