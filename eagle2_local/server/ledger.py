"""What the server has done, in all and for each client: the generations' statistics added up
(:class:`GenerationTotals`), how requests ended, and how long recent ones took (for ``Retry-After``).

Each client sees its own account (``/stats``, ``/health``); the totals are the operator's (``--admin-key``, or
``--expose-stats`` on a single user's server), since a diff of totals between two of one's own requests gives
another client's exact figures."""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict, deque

from ..decoding.stats import GenerationStats

OUTCOMES = ("completed", "stopped_early", "failed")
MAX_ACCOUNTS = 1024  # clients remembered (least recently served forgotten first): addresses are unbounded
RECENT = 32  # requests whose service time Retry-After is computed from
UNMEASURED_S = 1.0  # a request's service time before any was measured


class GenerationTotals:
    """What the generations since the server started produced: their statistics added up (one
    :class:`GenerationStats`, which computes τ and the host figures), how many there were and the last one's."""

    def __init__(self) -> None:
        self.generations = 0
        self.sum = GenerationStats()
        self.last: GenerationStats | None = None

    def add(self, stats: GenerationStats) -> None:
        self.generations += 1
        self.sum = self.sum + stats
        self.last = stats

    def as_dict(self) -> dict:
        last = self.last.as_dict() if self.last is not None else None
        return {"generations": self.generations, **self.sum.totals_dict(), "last": last}


class Account:
    """One client's (or everyone's) figures: how its requests ended and its generations' totals."""

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.totals = GenerationTotals()


class Ledger:
    """The accounts of every client and of all together, and the recent service times. Not thread-safe: the
    worker calls it with its lock held."""

    def __init__(self) -> None:
        self.all = Account()
        self._clients: OrderedDict[str, Account] = OrderedDict()
        self._service_s: deque[float] = deque(maxlen=RECENT)

    def account(self, client: str | None) -> Account:
        """``client``'s account (a new one when unknown; None: everyone's)."""
        if client is None:
            return self.all
        found = self._clients.pop(client, None) or Account()
        self._clients[client] = found
        while len(self._clients) > MAX_ACCOUNTS:
            self._clients.popitem(last=False)
        return found

    def view(self, client: str | None) -> Account:
        """``client``'s account to read (an empty one when unknown, not remembered; None: everyone's)."""
        return self.all if client is None else self._clients.get(client) or Account()

    def ended(self, client: str, outcome: str, service_s: float | None) -> None:
        """A request of ``client`` ended (``outcome``: one of :data:`OUTCOMES`) after ``service_s`` seconds on
        the worker (None: it never ran, so its time says nothing about the next request's)."""
        for account in (self.all, self.account(client)):
            account.outcomes[outcome] += 1
        if service_s is not None:
            self._service_s.append(service_s)

    def generated(self, client: str, stats: GenerationStats) -> None:
        for account in (self.all, self.account(client)):
            account.totals.add(stats)

    def retry_after(self, ahead: int) -> int:
        """Seconds until a place is likely free: the median recent service time times the ``ahead`` requests
        before it (the median: one long generation must not make every client wait minutes), at least 1."""
        typical = statistics.median(self._service_s) if self._service_s else UNMEASURED_S
        return max(1, math.ceil(typical * max(ahead, 1)))
