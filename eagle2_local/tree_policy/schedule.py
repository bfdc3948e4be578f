"""When the auto budget drafts at all: probes with exponential backoff while trees lose, periodic plain steps
while they win, and postponement while the draft's first catch-up would cost more than it can win back.

Pure state over round counts; the costs it weighs come in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costs import CostModel


@dataclass
class ProbeSchedule:
    """Draft-or-plain, round by round, given whether trees lose now (the :class:`TreeBudget` knows that).

    While trees win, one round in ``plain_probe_every`` is a plain step anyway (every other round until three
    are measured), so the plain rate and the guard rest on plain steps actually taken. While trees lose, a tree
    is probed after ``probe_every`` plain rounds, then after twice as many, up to ``max_probe_every``, and a
    probe that lost is followed by enough plain steps that probing costs at most ``probe_share`` of plain speed.
    """

    probe_every: int = 8
    max_probe_every: int = 128
    probe_backlog: int = 32  # probe only when the draft has at most this many tokens to catch up on
    probe_share: float = 0.02  # a losing probe is followed by enough plain steps to cost at most this share
    max_probe_wait: int = 2048
    plain_probe_every: int = 16
    catch_up_share: float = 0.02  # unproven trees wait until a long backlog's catch-up costs at most this share
    # of the plain decoding done since the backlog began

    def __post_init__(self) -> None:
        self._backoff = self.probe_every
        self._plain_left = 0
        self._gap = 0  # plain rounds planned after the last probe
        self.probing = False  # the current tree round is a probe while trees lose
        self._since_plain = 0
        self._last_fresh: int | None = None  # the previous round's backlog, when it was a plain step
        self._backlog_start = 1  # the backlog when its plain steps began (a new prompt: the prompt)
        self.plain_steps = 0
        self.plain_probes = 0
        self.catch_up_postponed = 0  # rounds that would have drafted but stayed plain for the catch-up

    def note_backlog(self, fresh_tokens: int) -> None:
        """Every round, first: how much text the draft would catch up on (one more after each plain step)."""
        if self._last_fresh is None or fresh_tokens != self._last_fresh + 1:  # not one plain step later
            self._backlog_start = fresh_tokens
        self._last_fresh = fresh_tokens

    def draft_now(self, fresh_tokens: int, costs: CostModel, losing: bool, proven: bool, free: bool,
                  steady_backlog: int) -> bool:
        """Draft this round? ``losing``: trees lose to plain decoding now; ``proven``: a tree round has been
        modelled; ``free``: only free lookup branches would run (their catch-up costs nothing);
        ``steady_backlog``: the longest catch-up of a normal round (``max_depth + 1``)."""
        if not losing:
            self._backoff = self.probe_every
            self._plain_left = self._gap = 0
            if self._since_plain >= self._plain_probe_gap(costs):
                self.plain_probes += 1
                return False
            if not proven and self._postpone(fresh_tokens, costs, free, steady_backlog):
                return False
            self._since_plain += 1
            return True
        if self._plain_left > 0:
            self._plain_left -= 1
            return False
        if self._backlog_too_long(fresh_tokens, costs, free):
            return False
        if self._postpone(fresh_tokens, costs, free, steady_backlog):
            return False
        # a probe is due: go plain for `backoff` rounds after it if it loses again
        self._plain_left = self._gap = self._backoff
        self._backoff = min(2 * self._backoff, self.max_probe_every)
        self.probing = True
        return True

    def round_started(self) -> None:
        self._last_fresh = None  # the next round's backlog starts anew

    def plain_taken(self) -> None:
        self.plain_steps += 1
        self._since_plain = 0

    def _backlog_too_long(self, fresh_tokens: int, costs: CostModel, free: bool) -> bool:
        """A probe waits while the draft would first ingest more than ``probe_backlog`` tokens (plain steps since
        the last probe do not count) that cost it more than a plain step: a lookup's catch-up costs nothing."""
        if free or fresh_tokens <= self.probe_backlog + self._gap:
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
        """Tree rounds between plain probes: none before the first plain step is measured (the calibration's
        plain step may be the spoiled number), one until three are, then ``plain_probe_every``."""
        measured = max(self.plain_steps, costs.n_plain)
        return 0 if measured == 0 else 1 if measured < 3 else self.plain_probe_every

    def after_probe(self, lost_steps: float) -> None:
        """A probe while trees lose cost about ``lost_steps`` plain steps; wait long enough after it that probing
        costs at most ``probe_share`` of plain speed (a 60-node probe on this CPU costs ~25 steps for ~3 tokens)."""
        self.probing = False
        if lost_steps > 0:
            wait = min(int(np.ceil(lost_steps / self.probe_share)), self.max_probe_wait)
            self._plain_left = max(self._plain_left, wait)
            self._gap = max(self._gap, self._plain_left)
