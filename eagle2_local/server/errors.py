"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and the handlers that give every
failure that shape: a refused field, malformed JSON, an unknown route, a fault on the server's side."""

from __future__ import annotations

import logging

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


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404 for unknown routes, 405 for a wrong method, in the same error shape."""
    what = "unknown route" if exc.status_code == 404 else str(exc.detail).lower()
    return APIError(exc.status_code, f"{what}: {request.method} {request.url.path}",
                    code="not_found" if exc.status_code == 404 else "method_not_allowed",
                    headers=getattr(exc, "headers", None)).response()


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
