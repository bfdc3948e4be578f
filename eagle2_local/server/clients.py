"""Who is asking, and how much of the server their unfinished requests may hold.

A server that a team shares must keep its clients apart: a client is one API key (``serve --api-key K1,K2``,
llama-server's comma-separated list), or, on a server without keys, one remote address. The prompt cache is
reused only within one client (unless ``serve --share-prompt-cache``), and ``/stats`` and ``/health`` show each
client its own figures; the ``--admin-key`` sees the totals.

:class:`Readers` bounds the request bodies being read at once, per client and in all, by count and by the bytes
they hold, so that slow senders hold a bounded share (never the queue: a request takes its place there only once
its body is complete) and many senders cannot grow the server's memory past a fixed budget.
"""

from __future__ import annotations

import hmac
import threading
from dataclasses import dataclass
from typing import Sequence

from .errors import APIError, labelled

READERS = 256  # bodies being read at once, in all: each costs a socket and a little state
READERS_PER_CLIENT = 128  # so that one client's slow senders leave the other half to everyone else
READ_BUDGET_BYTES = 64 * 1024 * 1024  # bytes all unfinished bodies may hold together
SHARED_CACHE = "shared"  # the cache group of every client under --share-prompt-cache


@dataclass(frozen=True)
class Caller:
    """A request's client: ``name`` partitions the statistics and the readers ("key 2", "address 10.0.0.5",
    "admin"); ``admin`` sees every client's figures; ``known`` is False for a request without a valid key on a
    keyed server (only the public routes answer it)."""

    name: str
    admin: bool = False
    known: bool = True


def parse_keys(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``--api-key``'s keys: one string with comma-separated keys (as llama-server's option), or a list."""
    parts = value.split(",") if isinstance(value, str) else list(value or ())
    return tuple(k.strip() for k in parts if k.strip())


def _same(given: str, key: str) -> bool:
    return hmac.compare_digest(given.encode(), key.encode())


class Keys:
    """The server's API keys and admin key; tells each request's :class:`Caller` from its headers."""

    def __init__(self, api_keys: str | Sequence[str] | None = None, admin_key: str | None = None) -> None:
        self.api_keys = parse_keys(api_keys)
        self.admin_key = admin_key or None

    @property
    def required(self) -> bool:
        """A keyed server: the API routes want a key; with only an admin key the API stays open."""
        return bool(self.api_keys)

    def caller(self, authorization: str, client: tuple | None) -> Caller:
        """The caller a request's ``Authorization`` header (and, without keys, its address) names. Every key is
        compared in constant time, so the time taken does not tell which one (if any) came close."""
        token = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        if self.admin_key is not None and _same(token, self.admin_key):
            return Caller("admin", admin=True)
        matches = [i for i, key in enumerate(self.api_keys) if _same(token, key)]
        if matches:
            return Caller(f"key {matches[0] + 1}")
        if self.required:
            return Caller("nobody", known=False)
        return Caller(f"address {client[0] if client else 'unknown'}")

    def refusal(self, authorization: str) -> APIError:
        """The 401 of a keyed route asked without a valid key."""
        why = "missing API key" if not authorization else "invalid API key"
        return labelled(401, f"{why}: send `Authorization: Bearer KEY`", {"WWW-Authenticate": "Bearer"})


def busy_reading(what: str, own: bool) -> APIError:
    """The refusal of a body there is no room to read now: 429 when the client's own share is full (it is the
    one sending too much), 503 when the server's is. The connection is closed, as its body is never read."""
    headers = {"Retry-After": "1", "Connection": "close"}
    message = f"too many request bodies are being read at once ({what}); retry in 1 s"
    if own:
        return labelled(429, message, headers)
    return APIError(503, message, "server_error", "server_busy", headers=headers)


class Readers:
    """The bodies being read: at most ``total`` at once (``per_client`` of them one client's), holding at most
    ``budget`` bytes together (half of it one client's); a client past its share gets 429, everyone past the
    server's 503. Thread-safe; the event loop is its only user."""

    def __init__(self, total: int = READERS, per_client: int = READERS_PER_CLIENT,
                 budget: int = READ_BUDGET_BYTES) -> None:
        self.total, self.per_client, self.budget = total, per_client, budget
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    def start(self, client: str) -> None:
        """Count a body ``client`` starts sending, or refuse it (503) when no room is left."""
        with self._lock:
            if self._count.get(client, 0) >= self.per_client:
                raise busy_reading(f"{self.per_client} from one client", own=True)
            if sum(self._count.values()) >= self.total:
                raise busy_reading(f"{self.total} in all", own=False)
            self._count[client] = self._count.get(client, 0) + 1

    def hold(self, client: str, n_bytes: int) -> None:
        """``client``'s body grew by ``n_bytes``: refused (503) past the budget, in all or the client's half."""
        with self._lock:
            mine = self._bytes.get(client, 0) + n_bytes
            if mine > self.budget // 2:
                raise busy_reading(f"{self.budget >> 21} MiB of bodies from one client", own=True)
            if sum(self._bytes.values()) + n_bytes > self.budget:
                raise busy_reading(f"{self.budget >> 20} MiB of bodies in all", own=False)
            self._bytes[client] = mine

    def finish(self, client: str, n_bytes: int) -> None:
        """A body of ``client`` that held ``n_bytes`` is read (or given up): its count and bytes come back."""
        with self._lock:
            self._count[client] -= 1
            self._bytes[client] = self._bytes.get(client, 0) - n_bytes
            if not self._count[client]:
                del self._count[client]
                self._bytes.pop(client, None)

    def status(self) -> dict:
        with self._lock:
            return {"reading": sum(self._count.values()), "bytes": sum(self._bytes.values())}
