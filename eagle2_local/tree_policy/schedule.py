"""When the auto budget drafts at all: periodic plain steps while trees win, exploration paid from an account while
they lose, postponement while the draft's first catch-up would cost more than it can win back, and plain runs that
spare the loop its decision where nothing has drafted for a while.

Pure state over round counts and plain steps; the costs it weighs come in as arguments.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .costs import CostModel, median


@dataclass
class Exploration:
    """What drafted rounds of one kind may still lose, in plain steps, while that kind loses to plain decoding.

    Every answer brings ``allowance`` steps (the account holds at most that much), every step of decoding earns
    ``share`` of a step, and every drafted round of the kind pays what it lost against plain decoding (its time in
    plain steps, the draft's catch-up over the text decoded plainly since it last ran included, minus its tokens)
    or is refunded what it won, while that kind was losing. A losing kind drafts again only while the account is
    positive, so exploring costs at most ``allowance`` plus ``share`` of the decoding per answer (and one round's
    loss): bounded by its cost, in the machine's own unit, however short the answer. Where a catch-up costs more
    per token than ``share`` of a step, the allowances pay for the probes: about one every few answers."""

    share: float = 0.01
    allowance: float = 0.25
    left: float = 0.0
    spent: float = 0.0  # steps lost exploring, in all (what the summary shows)

    def __post_init__(self) -> None:
        self.left = self.allowance

    def begin_answer(self) -> None:
        self.left = min(self.left + self.allowance, self.allowance)

    def earn(self, steps: float) -> None:
        """``steps`` plain steps' worth of decoding went by (any kind of round)."""
        self.left = min(self.left + self.share * steps, self.allowance)

    def pay(self, lost_steps: float) -> None:
        """A round of this kind, run while the kind was losing, lost ``lost_steps`` against plain decoding
        (negative: won that many)."""
        self.left = min(self.left - lost_steps, self.allowance)
        self.spent += max(lost_steps, 0.0)

    @property
    def open(self) -> bool:
        return self.left > 0.0


@dataclass
class ProbeSchedule:
    """Draft-or-plain, round by round, given whether a kind of round loses now (the :class:`TreeBudget` knows
    that).

    While trees win, one round in ``plain_probe_every`` is a plain step anyway (every other round until three
    are measured), so the plain rate and the guard rest on plain steps actually taken. While a kind loses, it
    drafts only as its :class:`Exploration` account allows (``probe_share``, ``explore_allowance``)."""

    probe_backlog: int = 32  # probe only when the draft has at most this many tokens to catch up on
    probe_share: float = 0.01  # losing rounds may cost this share of the decoding done
    explore_allowance: float = 0.25  # and this many plain steps per answer
    plain_probe_every: int = 16
    catch_up_share: float = 0.02  # unproven trees wait until a long backlog's catch-up costs at most this share
    # of the plain decoding done since the backlog began
    deciding_share: float = 0.0025  # a plain run's decision may cost at most this share of its plain steps
    max_plain_run: int = 16  # the most plain steps taken on one decision
    run_growth: int = 4  # a plain run is at most this fraction of the plain steps since the answer's last tree

    def __post_init__(self) -> None:
        self._since_plain = 0
        self._since_probe = 0  # plain steps since the last drafted round (a losing probe's backlog is not the prompt's)
        self._answer_at = 0  # plain_steps when the answer began
        self._noted_at = 0  # plain_steps at the last note_backlog
        self._decided: deque[float] = deque(maxlen=16)  # seconds the loop took to decide its recent plain steps
        self._last_fresh: int | None = None  # the previous round's backlog, when it was a plain step
        self._backlog_start = 1  # the backlog when its plain steps began (a new prompt: the prompt)
        self.plain_steps = 0
        self.plain_probes = 0
        self.catch_up_postponed = 0  # rounds that would have drafted but stayed plain for the catch-up

    def account(self) -> Exploration:
        """A fresh exploration account on this schedule's terms (one per kind of round)."""
        return Exploration(self.probe_share, self.explore_allowance)

    def note_backlog(self, fresh_tokens: int) -> None:
        """Every planned round, first: how much text the draft would catch up on (one more after each plain
        step)."""
        plain_since = self.plain_steps - self._noted_at
        if self._last_fresh is None or fresh_tokens != self._last_fresh + plain_since:  # not plain steps later
            self._backlog_start = fresh_tokens
        self._last_fresh = fresh_tokens
        self._noted_at = self.plain_steps

    def plain_probe_due(self, costs: CostModel) -> bool:
        """Is this round a plain step to keep the plain rate measured (counted as a plain probe)?"""
        if self._since_plain >= self._plain_probe_gap(costs):
            self.plain_probes += 1
            return True
        return False

    def draft_now(self, fresh_tokens: int, costs: CostModel, losing: bool, proven: bool, free: bool,
                  steady_backlog: int, account: Exploration) -> bool:
        """Draft a round of a kind this round? ``losing``: that kind loses to plain decoding now; ``proven``: a
        round of it has been modelled; ``free``: only free lookup branches would run (their catch-up costs
        nothing); ``steady_backlog``: the longest catch-up of a normal round (``max_depth + 1``); ``account``:
        what that kind may still lose exploring."""
        if not losing:
            return proven or not self._postpone(fresh_tokens, costs, free, steady_backlog)
        if not account.open or self._backlog_too_long(fresh_tokens, costs, free):
            return False
        return not self._postpone(fresh_tokens, costs, free, steady_backlog)

    def round_started(self) -> None:
        self._last_fresh = None  # the next round's backlog starts anew
        self._since_plain += 1
        self._since_probe = 0

    def plain_taken(self, decide_s: float | None = None) -> None:
        """A plain step was taken; ``decide_s``: what deciding it cost the loop (None: decided with a plain run)."""
        self.plain_steps += 1
        self._since_plain = 0
        self._since_probe += 1
        if decide_s is not None:
            self._decided.append(decide_s)

    def begin_answer(self) -> None:
        """A new answer: its first steps are decided one by one (it may copy from its start)."""
        self._answer_at = self.plain_steps

    def plain_run(self, plain_s: float) -> int:
        """Plain steps to take on the decision of a plain step (1: ask again at the next one), where nothing has
        drafted for a while. Deciding a round (the lookup's evidence, the plan) costs the loop about a tenth of a
        millisecond, which a plain step of a small model or a GPU pays as a percent or more; a run of k steps pays
        it once, so k is the fewest steps that bring the decision under ``deciding_share`` of them at ``plain_s``
        seconds a step. The price is evidence read late: a copy that begins inside the run is drafted at most
        k - 1 steps after it could have been. So k is at most a ``run_growth``-th of the plain steps since the
        answer's last drafted round (a copy that resumes after a few edited tokens is still found at once) and
        ``max_plain_run``."""
        if not self._decided or plain_s <= 0.0:
            return 1
        wanted = math.ceil(median(self._decided) / (self.deciding_share * plain_s))
        since_tree = min(self._since_probe, self.plain_steps - self._answer_at)  # or since the answer began
        return max(1, min(wanted, since_tree // self.run_growth, self.max_plain_run))

    def _backlog_too_long(self, fresh_tokens: int, costs: CostModel, free: bool) -> bool:
        """A probe waits while the draft would first ingest more than ``probe_backlog`` tokens beyond the plain
        steps since the last drafted round, if they cost it more than a plain step: a lookup's catch-up costs
        nothing."""
        if free or fresh_tokens <= self.probe_backlog + self._since_probe:
            return False
        return costs.catch_up_steps(fresh_tokens) > 1.0

    def catch_up_too_dear(self, fresh_tokens: int, costs: CostModel, steady_backlog: int) -> bool:
        """Would drafting now pay a catch-up out of proportion to what plain decoding has spent since?

        A backlog that began long (more than a normal round's ``steady_backlog`` tokens: a new prompt) costs the
        draft ``costs.catch_up_steps`` plain steps to ingest, and only trees that win pay that back. So before
        any tree has shown it wins, that cost must be at most ``catch_up_share`` of the plain steps taken in this
        backlog: on a loaded CPU, where ingesting a 700-token prompt costs dozens of plain steps, a short answer
        stays plain; where it costs a fraction of one (a GPU), trees start after a few tokens. What is charged is
        the backlog at its start, not the plain steps' own tokens: each adds a token to the catch-up and a step
        to the plain time, and charging them too would postpone for ever a draft whose catch-up costs more than
        ``catch_up_share`` of a plain step per token."""
        start = self._backlog_start
        if start <= steady_backlog:
            return False
        return costs.catch_up_steps(start) > self.catch_up_share * (fresh_tokens - start)

    def _postpone(self, fresh_tokens: int, costs: CostModel, free: bool, steady_backlog: int) -> bool:
        """Count and say yes when drafting waits for the catch-up (a lookup-only round's costs nothing)."""
        if free or not self.catch_up_too_dear(fresh_tokens, costs, steady_backlog):
            return False
        self.catch_up_postponed += 1
        return True

    def _plain_probe_gap(self, costs: CostModel) -> int:
        """Drafted rounds between plain probes: none before the first plain step is measured (the calibration's
        plain step may be the spoiled number), one until three are, then ``plain_probe_every``."""
        measured = max(self.plain_steps, costs.n_plain)
        return 0 if measured == 0 else 1 if measured < 3 else self.plain_probe_every
