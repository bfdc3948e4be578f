"""Whose request runs next: clients take turns, so one client's burst of long requests does not make every other
client wait behind all of it. Each client's own requests still run in the order they arrived."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")
REMEMBERED = 1024  # clients whose last turn is kept (the longest ago forgotten first)


class Turns(Generic[T]):
    """Waiting items by client, handed out by turns: the client served longest ago (or never) first; among
    clients never served, the one that has waited longest. Not thread-safe: the worker's lock guards it."""

    def __init__(self) -> None:
        self._waiting: dict[str, deque[T]] = {}
        self._last_turn: dict[str, int] = {}  # client -> the turn it was last served in
        self._turn = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def put(self, client: str, item: T) -> None:
        self._waiting.setdefault(client, deque()).append(item)

    def take(self) -> T:
        """The next item: the first waiting one of the client whose last turn is the oldest. A client that
        sends its next request as soon as its last one is answered keeps its last turn, so it cannot jump
        ahead of clients already waiting."""
        client = min(self._waiting, key=lambda c: self._last_turn.get(c, -1))  # ties: the first to wait
        line = self._waiting[client]
        item = line.popleft()
        if not line:
            del self._waiting[client]
        self._turn += 1
        self._last_turn.pop(client, None)
        self._last_turn[client] = self._turn
        if len(self._last_turn) > REMEMBERED:  # insertion order is turn order: the first is the oldest
            del self._last_turn[next(iter(self._last_turn))]
        return item
