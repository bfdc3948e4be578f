"""Admission: what a request must pass before any routing, in one plain ASGI middleware (streams pass through
untouched): the API key, a place for a generation request, and the body's size and deadline.

As in llama-cpp-python's server, the key guards the API, not its description: ``/health`` and the OpenAPI docs
(``/docs``, ``/openapi.json``) answer without it; they tell a client what the routes are, never what they hold.

A generation request takes its place in the queue (:meth:`ModelWorker.reserve`) before its body is read, so
the bodies being read, parsed and tokenized at once are bounded by ``--max-queue`` as the queued requests are,
and a full server answers 503 without reading anything. The body must then arrive within a deadline (a client
that trickles it must not hold a place) and within a size that follows from the context (:func:`body_limit`)."""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Callable, Protocol

from .errors import APIError, labelled

MAX_BODY_BYTES = 16 * 1024 * 1024  # the most any context allows; stops a client from filling memory
MIN_BODY_BYTES = 1024 * 1024  # the least: room for tools, schemas and JSON escapes around a short context
BODY_BYTES_PER_TOKEN = 256  # far above what a token of prompt takes in a JSON body, escapes included
PUBLIC_PATHS = frozenset({"/health", "/docs", "/openapi.json"})
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def body_limit(n_ctx: int) -> int:
    """The largest body worth reading for a context of ``n_ctx`` tokens: a prompt that fits it takes far less
    (a larger body can only be refused, after costing ~35x its size to parse and tokenize)."""
    return max(MIN_BODY_BYTES, min(MAX_BODY_BYTES, BODY_BYTES_PER_TOKEN * n_ctx))


class Places(Protocol):
    """Where a generation request takes its place before its body is read (:class:`ModelWorker`)."""

    def reserve(self) -> None: ...

    def release(self) -> None: ...


class Admission:
    """The API key, a place for a generation request, the body's size and deadline: checked before any routing."""

    def __init__(self, app, api_key: str | None, places: Places | None = None, max_body: int = MAX_BODY_BYTES,
                 body_timeout_s: float | None = None) -> None:
        self.app = app
        self.api_key = api_key
        self.places = places
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            problem = self._problem(scope)
            place = problem is None and self._take_place(scope)
        except APIError as exc:  # no place left: 503 before a byte of the body is read
            problem, place = exc, False
        if problem is not None:
            await problem.response()(scope, receive, send)
            return
        try:
            await self._read_and_run(scope, receive, send)
        finally:
            if place:
                self.places.release()

    def _take_place(self, scope) -> bool:
        """A generation request takes its place in the queue now (raising 503 when there is none)."""
        if self.places is None or scope.get("method") != "POST" or scope.get("path") not in GENERATION_PATHS:
            return False
        self.places.reserve()
        return True

    async def _read_and_run(self, scope, receive, send) -> None:
        problem, receive = await _read_body(receive, self.max_body, self.body_timeout_s)
        if problem is not None:
            await problem.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _problem(self, scope) -> APIError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope.get("path") not in PUBLIC_PATHS:
            given = headers.get("authorization", "")
            token = given[7:].strip() if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                why = "missing API key" if not given else "invalid API key"
                return labelled(401, f"{why}: send `Authorization: Bearer KEY`", {"WWW-Authenticate": "Bearer"})
        length = headers.get("content-length", "0")
        if not (length.isascii() and length.isdigit()) or int(length) > self.max_body:
            return _too_large(self.max_body)
        return None


def _too_large(limit: int) -> APIError:
    return labelled(413, f"request body larger than {limit} bytes", {"Connection": "close"})


def _too_slow(timeout_s: float) -> APIError:
    return labelled(408, f"the request body did not arrive within {timeout_s:g} s", {"Connection": "close"})


async def _read_body(receive, limit: int, timeout_s: float | None) -> tuple[APIError | None, Callable]:
    """Read the body, up to ``limit`` bytes and within ``timeout_s``, and replay it to the app; past the limit
    the rest of a chunked body is read and dropped (so the client gets to read the 413) but never kept. A
    declared length over the limit never gets here."""
    parts, size, message = [], 0, {"more_body": True}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while message.get("more_body", False):
        try:
            message = await (receive() if deadline is None
                             else asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0)))
        except asyncio.TimeoutError:
            return _too_slow(timeout_s), receive
        if message["type"] != "http.request":  # the client left: the app sees that as it would have
            return None, _replay([message], receive)
        size += len(message.get("body", b""))
        if size <= limit:
            parts.append(message.get("body", b""))
    if size > limit:
        return _too_large(limit), receive
    return None, _replay([{"type": "http.request", "body": b"".join(parts), "more_body": False}], receive)


def _replay(messages: list[dict], receive) -> Callable:
    """``receive`` that first hands out ``messages``, then the connection's own (for disconnect detection)."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()
    return replayed
