"""The API key and the body-size limit, checked by plain ASGI middleware before any routing (streams pass
through untouched).

As in llama-cpp-python's server, the key guards the API, not its description: ``/health`` and the OpenAPI docs
(``/docs``, ``/openapi.json``) answer without it; they tell a client what the routes are, never what they hold."""

from __future__ import annotations

import hmac
from typing import Callable

from .errors import APIError

MAX_BODY_BYTES = 16 * 1024 * 1024  # far above any prompt that fits a context; stops a client from filling memory
PUBLIC_PATHS = frozenset({"/health", "/docs", "/openapi.json"})


class Guard:
    """API key and body size, before any routing."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            problem = self._problem(scope)
            if problem is None and not any(k.lower() == b"content-length" for k, _ in scope.get("headers", [])):
                problem, receive = await _capped_body(receive)
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
                return APIError(401, f"{why}: send `Authorization: Bearer KEY`", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        length = headers.get("content-length", "0")
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES:
            return _too_large()
        return None


def _too_large() -> APIError:
    return APIError(413, f"request body larger than {MAX_BODY_BYTES} bytes", code="body_too_large")


async def _capped_body(receive) -> tuple[APIError | None, Callable]:
    """A body sent without Content-Length (chunked) is read here, up to ``MAX_BODY_BYTES``, and replayed to the
    app; past the limit the rest is read and dropped (so the client gets to read the 413) but never kept."""
    parts, size, message = [], 0, {"more_body": True}
    while message.get("more_body", False):
        message = await receive()
        if message["type"] != "http.request":  # the client left: the app sees that as it would have
            return None, _replay([message], receive)
        size += len(message.get("body", b""))
        if size <= MAX_BODY_BYTES:
            parts.append(message.get("body", b""))
    if size > MAX_BODY_BYTES:
        return _too_large(), receive
    return None, _replay([{"type": "http.request", "body": b"".join(parts), "more_body": False}], receive)


def _replay(messages: list[dict], receive) -> Callable:
    """``receive`` that first hands out ``messages``, then the connection's own (for disconnect detection)."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()
    return replayed
