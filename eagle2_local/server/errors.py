"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and the handlers that give every
failure that shape: a refused field, malformed JSON, an unknown route, a fault on the server's side."""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 becomes OpenAI's 400, naming the first offending field."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('msg', 'cannot parse')}",
                        code="invalid_json").response()
    if not loc:
        return APIError(400, "the body must be a JSON object (Content-Type: application/json): "
                        f"{first.get('msg', 'invalid value')}", code="invalid_value").response()
    where = ".".join(loc)
    return APIError(400, f"{where}: {first.get('msg', 'invalid value')}", code="invalid_value",
                    param=where).response()


# The ``code`` of a status where OpenAI's label is not HTTP's own phrase (``not_found``, ``request_timeout``,
# ...); 413 is named here too, since Python 3.13 renamed its phrase.
OWN_CODES = {401: "invalid_api_key", 413: "body_too_large", 422: "invalid_value", 429: "rate_limit_exceeded"}


def status_label(status: int) -> tuple[str, str]:
    """OpenAI's ``(type, code)`` for ``status``: ``invalid_request_error`` for a 4xx, ``server_error`` for a
    5xx, and :data:`OWN_CODES`' code or else the status's own phrase (``http_NNN`` for a status without one)."""
    try:
        phrase = HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        phrase = f"http_{status}"
    return ("server_error" if status >= 500 else "invalid_request_error"), OWN_CODES.get(status, phrase)


def labelled(status: int, message: str, headers: dict[str, str] | None = None) -> APIError:
    """An error labelled by its status alone (:func:`status_label`), as the framework's own are."""
    return APIError(status, message, *status_label(status), headers=headers)


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own errors (404 unknown route, 405 wrong method, 400 unparsable body, ...) in the same
    shape, each labelled by its status."""
    what = "unknown route" if exc.status_code == 404 else str(exc.detail).lower()
    return labelled(exc.status_code, f"{what}: {request.method} {request.url.path}",
                    getattr(exc, "headers", None)).response()


def server_fault() -> APIError:
    """What a client is told of a fault on the server's side: that it is one, not its details (a path, a
    llama.cpp code), which go to the log, where whoever runs the server can read them."""
    return APIError(500, "internal error: the server failed to answer (the details are in its log)", "server_error",
                    "internal_error")


def shutting_down() -> APIError:
    """What a request is told when the server stops before answering it."""
    return APIError(503, "the server is shutting down", "server_error", "shutting_down")


def _internal_error(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("request failed", exc_info=exc)
    return server_fault().response()


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error ``app`` raises in OpenAI's shape."""
    app.add_exception_handler(APIError, lambda _r, exc: exc.response())
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
