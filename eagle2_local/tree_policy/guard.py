"""The auto budget's rate guard: it guards the decoding speed against drafted rounds that lose, by the tokens per
second they realised against plain steps' (one guard per kind of round, see TreeBudget)."""

from __future__ import annotations

import logging
from collections import deque

log = logging.getLogger(__name__)


class RateGuard:
    """The last line of defence: realised tokens per second of tree rounds against plain steps.

    Whatever the cost model believes, if the last ``window`` tree rounds emitted fewer tokens per second
    than the last ``window`` plain steps (at least ``min_rounds`` and ``min_plain`` of each), the guard
    trips: trees stop until probes, timed the same way, show otherwise. Sums, not means of rates: tokens over
    seconds is what the user waits for. Times are the measured round times (draft + verify, the draft's
    catch-up of a backlog counted at its steady cost; see TreeBudget.observe) and plain decode times.
    """

    def __init__(self, window: int = 32, min_rounds: int = 4, min_plain: int = 2) -> None:
        self.tree: deque[tuple[int, float]] = deque(maxlen=window)
        self.plain: deque[float] = deque(maxlen=window)
        self.min_rounds, self.min_plain = min_rounds, min_plain
        self.tripped = False
        self.trips = 0

    @staticmethod
    def _rate(tokens: float, seconds: float) -> float:
        return tokens / seconds if seconds > 0 else float("inf")

    def tree_rate(self) -> float | None:
        if not self.tree:
            return None
        return self._rate(sum(t for t, _ in self.tree), sum(s for _, s in self.tree))

    def plain_rate(self) -> float | None:
        return self._rate(len(self.plain), sum(self.plain)) if self.plain else None

    def add_plain(self, seconds: float) -> None:
        self.plain.append(seconds)

    def add_tree(self, tokens: int, seconds: float) -> None:
        """One tree round; trips or releases the guard."""
        self.tree.append((tokens, seconds))
        if len(self.plain) < self.min_plain:
            return
        losing = self.tree_rate() < self.plain_rate()
        if not self.tripped and losing and len(self.tree) >= self.min_rounds:
            self.tripped, self.trips = True, self.trips + 1
            log.info("tree rounds realised %.1f tok/s against %.1f for plain steps: trees stop until a probe wins",
                     self.tree_rate(), self.plain_rate())
            self.tree.clear()  # from now on the window holds the probes only
        elif self.tripped and not losing:
            self.tripped = False

    def summary(self) -> dict:
        rt, rp = self.tree_rate(), self.plain_rate()
        return {"tripped": self.tripped, "trips": self.trips,
                "tree_tokens_per_s": round(rt, 2) if rt is not None and rt != float("inf") else None,
                "plain_tokens_per_s": round(rp, 2) if rp is not None and rp != float("inf") else None}
