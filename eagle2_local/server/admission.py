"""Admission: what a request must pass before any routing, in one plain ASGI middleware (streams pass through
untouched): the API key (and which client is asking), the body's size, deadline and reading room, and a place for
a generation request.

As in llama-cpp-python's server, the key guards the API, not its description: ``/health`` and the OpenAPI docs
(``/docs``, ``/openapi.json``) answer without it; they tell a client what the routes are, never what they hold.

Only the two generation routes read a body. Every other route answers without reading one, and a connection that
sent one is closed after the answer (its body is dropped by the server as it arrives, never kept).

A generation request's body is read first, within a deadline, a size that follows from the context
(:func:`body_limit`) and the room :class:`~eagle2_local.server.clients.Readers` gives its client; only a complete
body takes a place in the queue (:meth:`ModelWorker.reserve`), which then bounds the bodies being parsed,
tokenized, queued and answered. So a client that trickles bodies holds reading room, never places: everyone else
is still answered. A server whose places are all taken answers 503 at once, without reading anything."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol

from .clients import Caller, Keys, Readers
from .errors import APIError, labelled

MAX_BODY_BYTES = 16 * 1024 * 1024  # the most any context allows; stops a client from filling memory
MIN_BODY_BYTES = 1024 * 1024  # the least: room for tools, schemas and JSON escapes around a short context
BODY_BYTES_PER_TOKEN = 256  # far above what a token of prompt takes in a JSON body, escapes included
PUBLIC_PATHS = frozenset({"/health", "/docs", "/openapi.json"})
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
EMPTY_BODY = {"type": "http.request", "body": b"", "more_body": False}


def body_limit(n_ctx: int) -> int:
    """The largest body worth reading for a context of ``n_ctx`` tokens: a prompt that fits it takes far less
    (a larger body can only be refused, after costing ~35x its size to parse and tokenize)."""
    return max(MIN_BODY_BYTES, min(MAX_BODY_BYTES, BODY_BYTES_PER_TOKEN * n_ctx))


class Places(Protocol):
    """Where a generation request takes its place once its body is read (:class:`ModelWorker`)."""

    def check_room(self) -> None: ...

    def reserve(self) -> None: ...

    def release(self) -> None: ...


def caller_of(scope) -> Caller:
    """The :class:`Caller` that :class:`Admission` found for a request (a route reads it from ``request.state``)."""
    return scope["state"]["caller"]


class Admission:
    """The API key, the body's size, deadline and reading room, a place for a generation request: checked before
    any routing."""

    def __init__(self, app, keys: Keys, places: Places, max_body: int = MAX_BODY_BYTES,
                 body_timeout_s: float | None = None, readers: Readers | None = None) -> None:
        self.app = app
        self.keys = keys
        self.places = places
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.readers = readers or Readers()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        authorization = headers.get("authorization", "")
        caller = self.keys.caller(authorization, scope.get("client"))
        scope.setdefault("state", {})["caller"] = caller
        declared = "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")
        unread = _closing(send) if declared else send  # answers given before a body is read close the connection
        if not caller.known and scope.get("path") not in PUBLIC_PATHS:
            await self.keys.refusal(authorization).response()(scope, receive, unread)
        elif scope.get("method") != "POST" or scope.get("path") not in GENERATION_PATHS:
            await self.app(scope, _replay([EMPTY_BODY], receive), unread)
        else:
            await self._generation(scope, receive, (unread, send), headers, caller.name)

    async def _generation(self, scope, receive, sends: tuple[Callable, Callable], headers: dict[str, str],
                          client: str) -> None:
        """Read the body (bounded), then run the route in a place. ``sends``: the connection's ``send`` for
        answers before the body is read (they close the connection) and after."""
        unread, send = sends
        try:
            self._start_reading(headers.get("content-length", "0"), client)
        except APIError as problem:
            await problem.response()(scope, receive, unread)
            return
        problem, receive = await self._read(receive, client)
        if problem is not None:
            await problem.response()(scope, receive, unread)
            return
        await self._run_in_place(scope, receive, send)

    def _start_reading(self, length: str, client: str) -> None:
        """Refuse a declared body over the limit (413), a full server (503, as nothing need be read to answer
        it) or a body there is no room to read (429 / 503); otherwise count ``client``'s new reader."""
        if not (length.isascii() and length.isdigit()) or int(length) > self.max_body:
            raise _too_large(self.max_body)
        self.places.check_room()
        self.readers.start(client)

    async def _read(self, receive, client: str) -> tuple[APIError | None, Callable]:
        """Read the body, every part counted against ``client``'s reading room until it is complete."""
        held = 0

        def hold(n_bytes: int) -> None:
            nonlocal held
            self.readers.hold(client, n_bytes)
            held += n_bytes

        try:
            return await _read_body(receive, self.max_body, self.body_timeout_s, hold)
        finally:
            self.readers.finish(client, held)

    async def _run_in_place(self, scope, receive, send) -> None:
        """Take a place (or answer 503), run the route, give the place back when its response has ended."""
        try:
            self.places.reserve()
        except APIError as refused:
            await refused.response()(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.places.release()


def _closing(send) -> Callable:
    """``send`` whose response closes the connection: a body the route did not read is then never read."""
    async def closing(message: dict) -> None:
        headers = message.get("headers", [])
        if message["type"] == "http.response.start" and not any(k.lower() == b"connection" for k, _ in headers):
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)
    return closing


def _too_large(limit: int) -> APIError:
    return labelled(413, f"request body larger than {limit} bytes", {"Connection": "close"})


def _too_slow(timeout_s: float) -> APIError:
    return labelled(408, f"the request body did not arrive within {timeout_s:g} s", {"Connection": "close"})


async def _read_body(receive, limit: int, timeout_s: float | None,
                     hold: Callable[[int], None]) -> tuple[APIError | None, Callable]:
    """Read the body, up to ``limit`` bytes and within ``timeout_s``, and replay it to the app; ``hold`` is told
    of every part kept (and may refuse it). Past the limit the rest of a chunked body is read and dropped (so
    the client gets to read the 413) but never kept. A declared length over the limit never gets here."""
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
        body = message.get("body", b"")
        size += len(body)
        if size <= limit and body:
            try:
                hold(len(body))
            except APIError as busy:
                return busy, receive
            parts.append(body)
    if size > limit:
        return _too_large(limit), receive
    return None, _replay([{"type": "http.request", "body": b"".join(parts), "more_body": False}], receive)


def _replay(messages: list[dict], receive) -> Callable:
    """``receive`` that first hands out ``messages``, then the connection's own (for disconnect detection)."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()
    return replayed
