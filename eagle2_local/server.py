"""``eagle2-local serve``: an OpenAI-compatible HTTP API over one model, for the clients people already use.

Editor plugins, chat UIs and scripts speak the OpenAI protocol (as they do to ``llama-server`` or
``python -m llama_cpp.server``); this module gives them ``/v1/chat/completions``, ``/v1/completions`` (both with
server-sent-event streaming), ``/v1/models`` and ``/health`` on FastAPI + uvicorn + sse-starlette.

One model holds one KV cache, so requests are answered one at a time, in arrival order, on a single worker
thread: generation is blocking llama.cpp work and must never run on the event loop, and running it always on the
same thread keeps the cache's owner obvious. Consecutive requests reuse the cached prefix they share (the
generator keeps it, as in ``chat``), as far as that leaves the answer what the request alone would get; a request
with llama-server's ``cache_prompt: true`` (or ``serve --cache-prompt``) reuses all of it, faster but no longer
independent of earlier requests at near-ties. A request whose client goes away is stopped between two rounds and its
stream closed, which trims the cache to the prompt plus what was emitted, exactly as after a stopped chat answer.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .chat import prompt_tokens
from .errors import ContextFullError, Eagle2Error, EmptyPromptError
from .generator import add_counts
from .sampling import SamplingParams

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024  # far above any prompt that fits a context; stops a client from filling memory
TERMINAL = ("done", "error", "cancelled")
MAX_STOPS = 16  # each stop string is checked at every token


# ---------------------------------------------------------------- errors
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


def _internal_error(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("request failed", exc_info=exc)
    return server_fault().response()


# ---------------------------------------------------------------- requests
class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields both endpoints accept, as llama-cpp-python's server does; unknown fields are ignored. Python's JSON
    parser reads ``NaN`` and ``Infinity``: refused here, they would poison the sampling arithmetic."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    cache_prompt: bool | None = None  # llama-server's field; None: the server's default (serve --cache-prompt)
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self) -> None:
        """Fields a client may set that this server cannot honour: refused rather than silently ignored."""
        extra = self.model_extra or {}
        unsupported = {
            "n": self.n not in (None, 1), "presence_penalty": self.presence_penalty not in (None, 0.0),
            "frequency_penalty": self.frequency_penalty not in (None, 0.0),
            "logprobs": bool(extra.get("logprobs")), "top_logprobs": bool(extra.get("top_logprobs")),
            "echo": bool(extra.get("echo")), "best_of": extra.get("best_of") not in (None, 1),
            "suffix": bool(extra.get("suffix")), "logit_bias": bool(extra.get("logit_bias")),
            "tools": bool(extra.get("tools")), "functions": bool(extra.get("functions")),
            "grammar": bool(extra.get("grammar")),
            "response_format": isinstance(extra.get("response_format"), dict)
            and extra["response_format"].get("type", "text") != "text",
        }
        for name, bad in unsupported.items():
            if bad:
                raise APIError(400, f"{name}: not supported by this server (only n=1, plain text, no logprobs)",
                               code="unsupported_parameter", param=name)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    def as_dict(self) -> dict:
        """``{"role", "content": str}``; text parts are joined, other parts (images, audio) refused."""
        if isinstance(self.content, list):
            if any(p.type != "text" or p.text is None for p in self.content):
                raise APIError(400, "messages: only text content parts are supported", param="messages")
            return {"role": self.role, "content": "".join(p.text for p in self.content)}
        return {"role": self.role, "content": self.content or ""}


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


@dataclass(frozen=True)
class Defaults:
    """What a request gets for a field it leaves out (the serve command's sampling options)."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None


def _pick(value, default):
    return default if value is None else value


# ---------------------------------------------------------------- the worker
@dataclass
class Job:
    """One admitted request: what to generate, where its events go, and a flag its client raises on leaving."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    seed: int | None
    cache_prompt: bool | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, kind: str, payload: Any = None) -> None:
        """Hand an event to the request's coroutine (called from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening any more
            self.cancelled.set()

    async def events_until_done(self) -> AsyncIterator[tuple[str, Any]]:
        while True:
            kind, payload = await self.events.get()
            yield kind, payload
            if kind in TERMINAL:
                return


class GenerationTotals:
    """What the generations since the server started produced, summed: tokens, target passes (so τ), and the
    draft tokens verified and accepted per drafter (model, lookup, both)."""

    def __init__(self) -> None:
        self.generations = self.n_tokens = self.target_passes = self.pass_tokens = self.plain_steps = 0
        self.nodes_by_source: dict[str, int] = {}
        self.accepted_by_source: dict[str, int] = {}
        self.last: dict | None = None

    def add(self, stats: dict) -> None:
        self.generations += 1
        self.last = stats
        for key in ("n_tokens", "target_passes", "pass_tokens", "plain_steps"):
            setattr(self, key, getattr(self, key) + int(stats.get(key, 0)))
        for key in ("nodes_by_source", "accepted_by_source"):
            add_counts(getattr(self, key), stats.get(key) or {})

    def as_dict(self) -> dict:
        tau = self.pass_tokens / self.target_passes if self.target_passes else 1.0
        return {"generations": self.generations, "n_tokens": self.n_tokens, "target_passes": self.target_passes,
                "pass_tokens": self.pass_tokens, "tau": round(tau, 4), "plain_steps": self.plain_steps,
                "nodes_by_source": dict(self.nodes_by_source),
                "accepted_by_source": dict(self.accepted_by_source), "last": self.last}


class ModelWorker:
    """Runs generations on one dedicated thread, one at a time, in the order they were admitted."""

    def __init__(self, llm, max_waiting: int) -> None:
        self.llm = llm
        self.max_waiting = max_waiting
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eagle2-serve")
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.waiting = self.running = 0
        self.completed = self.stopped_early = self.failed = 0
        self._mean_s = 1.0  # running mean of a request's duration, for Retry-After
        self.totals = GenerationTotals()

    def status(self) -> dict:
        with self._lock:
            return {"running": self.running, "waiting": self.waiting, "max_waiting": self.max_waiting,
                    "completed": self.completed, "stopped_early": self.stopped_early, "failed": self.failed}

    def totals_dict(self) -> dict:
        with self._lock:
            return self.totals.as_dict()

    def admit(self, job: Job) -> None:
        """Queue ``job``, or refuse with 503 + Retry-After when ``max_waiting`` requests already wait."""
        with self._lock:  # held while submitting: close() cannot shut the pool down between check and submit
            if self._closing.is_set():
                raise APIError(503, "the server is shutting down", "server_error", "shutting_down")
            if self.waiting >= self.max_waiting:
                retry = max(1, math.ceil(self._mean_s * (self.waiting + self.running)))
                raise APIError(503, f"the queue is full ({self.waiting} requests waiting); retry in {retry} s",
                               "server_error", "queue_full", headers={"Retry-After": str(retry)})
            self._pool.submit(self._run, job)
            self.waiting += 1

    def close(self) -> None:
        """Stop the running generation at its next round and wait for the thread. Queued jobs are not
        cancelled in the pool: each still passes through :meth:`_run`, which sees the server closing and sends
        its client a terminal event (and keeps the counters right) without generating."""
        with self._lock:
            self._closing.set()
        self._pool.shutdown(wait=True)

    def _run(self, job: Job) -> None:
        with self._lock:
            self.waiting -= 1
            self.running = 1
        t0 = time.perf_counter()
        outcome = "failed"
        try:
            if job.cancelled.is_set() or self._closing.is_set():
                outcome = "stopped_early"  # the client left while waiting: nothing to undo
                job.send("cancelled")
                return
            kind, payload = self._generate(job)
            outcome = "completed" if kind == "done" else "stopped_early"
            job.send(kind, payload)
        except (ContextFullError, EmptyPromptError) as exc:  # what the request asked for does not fit
            job.send("error", APIError(400, str(exc)))
        except Exception:  # noqa: BLE001 - DecodeError, TreeError, bugs: a fault here, not in the request
            log.exception("generation failed")
            job.send("error", server_fault())
        finally:
            with self._lock:
                self.running = 0
                setattr(self, outcome, getattr(self, outcome) + 1)
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - t0)

    def _generate(self, job: Job) -> tuple[str, Any]:
        """Stream ``job``'s chunks; stop between rounds once its client has gone (or the server stops)."""
        stream = self.llm.stream(job.prompt, job.max_tokens, job.sampling, stop=job.stop, seed=job.seed,
                                 cache_prompt=job.cache_prompt)
        tokens: list[int] = []
        reason = None
        try:
            for chunk in stream:
                tokens.extend(chunk.tokens)
                reason = chunk.finish_reason or reason
                job.send("chunk", chunk)
                if job.cancelled.is_set() or self._closing.is_set():
                    return "cancelled", None
        finally:
            stream.close()  # the generator's own cleanup trims the KV cache to prompt + emitted tokens
            stats = self.llm.stats()
            with self._lock:
                self.totals.add(stats)
        return "done", {"tokens": tokens, "finish_reason": reason or "stop", "stats": stats}


# ---------------------------------------------------------------- response shapes
class ChatShape:
    """``chat.completion`` objects and their stream chunks."""

    prefix, final_object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    @staticmethod
    def first() -> dict | None:
        return {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    @staticmethod
    def delta(text: str) -> dict:
        return {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}

    @staticmethod
    def finish(reason: str) -> dict:
        return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}

    @staticmethod
    def whole(text: str, reason: str) -> dict:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": reason}


class CompletionShape:
    """``text_completion`` objects; a stream's chunks have the same object name."""

    prefix, final_object, chunk_object = "cmpl", "text_completion", "text_completion"

    @staticmethod
    def first() -> dict | None:
        return None

    @staticmethod
    def delta(text: str) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

    @staticmethod
    def finish(reason: str) -> dict:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}

    @staticmethod
    def whole(text: str, reason: str) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}


def _usage(stats: dict) -> dict:
    return {"prompt_tokens": stats["prompt_tokens"], "completion_tokens": stats["n_tokens"],
            "total_tokens": stats["prompt_tokens"] + stats["n_tokens"]}


def _eagle(result: dict) -> dict:
    """The speculative statistics (τ, tokens/s, tree sizes) plus the generated token ids."""
    return {**result["stats"], "tokens": result["tokens"]}


# ---------------------------------------------------------------- the service
class Service:
    """The endpoints: validate and tokenize on the event loop's thread pool, generate on the worker."""

    def __init__(self, llm, model_name: str, max_waiting: int, defaults: Defaults) -> None:
        self.llm = llm
        self.model_name = model_name
        self.defaults = defaults
        self.worker = ModelWorker(llm, max_waiting)
        self.created = int(time.time())

    # ---------------------------------------------------------- simple routes
    async def health(self) -> dict:
        return {"status": "ok", "model": self.model_name, "engine": self.llm.engine_name,
                "n_ctx": self.llm.n_ctx(), "queue": self.worker.status()}

    async def stats(self) -> dict:
        """Totals since the server started (τ, draft tokens accepted per drafter) and the last generation's
        statistics."""
        return {"model": self.model_name, "engine": self.llm.engine_name, **self.worker.totals_dict()}

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "eagle2-local"}]}

    # ---------------------------------------------------------- generation routes
    async def chat_completions(self, body: ChatRequest, request: Request):
        body.refuse_unsupported()
        messages = [m.as_dict() for m in body.messages]
        prompt = await run_in_threadpool(self._guarded, self.llm.chat_tokens, messages)
        if body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        return await self._answer(body, prompt, ChatShape, request)

    async def completions(self, body: CompletionRequest, request: Request):
        body.refuse_unsupported()
        prompt = await run_in_threadpool(self._guarded, self._completion_tokens, body.prompt)
        return await self._answer(body, prompt, CompletionShape, request)

    @staticmethod
    def _guarded(fn: Callable, *args):
        """Template and tokenizer errors are the client's input: 400, not 500."""
        try:
            return fn(*args)
        except Eagle2Error as exc:
            raise APIError(400, str(exc)) from None
        except UnicodeError as exc:  # JSON can carry lone surrogates ("\ud800"), which have no UTF-8 form
            raise APIError(400, f"the text is not valid Unicode: {exc}") from None

    def _completion_tokens(self, prompt) -> list[int]:
        """A string, one string in a list, token ids, or one list of token ids (as the OpenAI API allows)."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, "prompt: one prompt per request (batches are not supported)", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt_tokens(self.llm.model, prompt)
        n_vocab = self.llm.model.n_vocab
        bad = [t for t in prompt if not 0 <= t < n_vocab]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                           param="prompt")
        return list(prompt)

    async def _answer(self, body: SamplingFields, prompt: list[int], shape, request: Request):
        job = self._job(body, prompt)
        self.worker.admit(job)
        head = {"id": f"{shape.prefix}-{uuid.uuid4()}", "created": int(time.time()), "model": self.model_name}
        if body.stream:
            return _JobStream(job, self._stream(job, shape, head, body.include_usage()), sep="\n")
        return await self._collect(job, shape, head, request)

    def _job(self, body: SamplingFields, prompt: list[int]) -> Job:
        """Check the prompt fits and the sampling values are valid, before the request takes a queue slot."""
        n_ctx = self.llm.n_ctx()
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        if len(prompt) >= n_ctx:
            raise APIError(400, f"the prompt has {len(prompt)} tokens but the context holds {n_ctx} (and at least "
                           "one must be left to answer); shorten it", code="context_length_exceeded")
        d = self.defaults
        sampling = self._guarded(lambda: SamplingParams(
            temperature=_pick(body.temperature, d.temperature), top_k=_pick(body.top_k, d.top_k),
            top_p=_pick(body.top_p, d.top_p), min_p=_pick(body.min_p, d.min_p),
            repeat_penalty=_pick(body.repeat_penalty, d.repeat_penalty)))
        max_tokens = _pick(body.max_tokens, d.max_tokens)
        if max_tokens <= 0:  # as llama-cpp-python: no limit but the context
            max_tokens = n_ctx - len(prompt)
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        if len(stop) > MAX_STOPS:
            raise APIError(400, f"stop: at most {MAX_STOPS} stop strings", param="stop")
        seed = _pick(body.seed, d.seed)
        if seed is not None and seed < 0:  # llama.cpp's convention: a negative seed asks for a random one
            seed = None
        return Job(prompt, max_tokens, sampling, stop, seed, body.cache_prompt, asyncio.get_running_loop())

    async def _collect(self, job: Job, shape, head: dict, request: Request) -> dict:
        """A whole answer; a client that disconnects while waiting stops its generation all the same."""
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        text: list[str] = []
        try:
            async for kind, payload in job.events_until_done():
                if kind == "chunk":
                    text.append(payload.text)
                elif kind == "done":
                    return {**head, "object": shape.final_object,
                            "choices": [shape.whole("".join(text), payload["finish_reason"])],
                            "usage": _usage(payload["stats"]), "eagle": _eagle(payload)}
                elif kind == "error":
                    raise payload
            raise APIError(503, "the server is shutting down", "server_error", "shutting_down")
        finally:
            watcher.cancel()
            job.cancelled.set()

    async def _stream(self, job: Job, shape, head: dict, include_usage: bool) -> AsyncIterator[dict]:
        """Server-sent events; sse-starlette cancels this coroutine when the client goes away, and the
        ``finally`` tells the worker to stop at its next round."""
        def event(choices: list[dict], **extra) -> dict:
            obj = {**head, "object": shape.chunk_object, "choices": choices, **extra}
            if include_usage and "usage" not in obj:
                obj["usage"] = None
            return {"data": json.dumps(obj)}

        try:
            if shape.first() is not None:
                yield event([shape.first()])
            async for kind, payload in job.events_until_done():
                if kind == "chunk" and payload.text:
                    yield event([shape.delta(payload.text)])
                elif kind == "done":
                    yield event([shape.finish(payload["finish_reason"])], eagle=_eagle(payload))
                    if include_usage:
                        yield event([], usage=_usage(payload["stats"]))
                elif kind == "error":
                    yield {"data": json.dumps(payload.body())}
                elif kind == "cancelled":
                    yield {"data": json.dumps(APIError(503, "the server is shutting down", "server_error",
                                                       "shutting_down").body())}
            yield {"data": "[DONE]"}
        finally:
            job.cancelled.set()


class _JobStream(EventSourceResponse):
    """The job stops once its response is over, however it ended: a client that leaves before the event
    generator has started (so its ``finally`` never runs) or a failed send must not leave it generating."""

    def __init__(self, job: Job, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancelled.set()


async def _cancel_on_disconnect(request: Request, job: Job, every_s: float = 0.2) -> None:
    while not job.cancelled.is_set():
        if await request.is_disconnected():
            job.cancelled.set()
            return
        await asyncio.sleep(every_s)


# ---------------------------------------------------------------- ASGI guards
class Guard:
    """Plain ASGI middleware (streams pass through untouched): API key and body size, before any routing."""

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
        if self.api_key is not None and scope.get("path") != "/health":
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


# ---------------------------------------------------------------- wiring
def create_app(llm, *, model_name: str, api_key: str | None = None, max_waiting: int = 16,
               defaults: Defaults | None = None) -> FastAPI:
    """The ASGI app for ``llm`` (an :class:`eagle2_local.api.Eagle2`); it owns the worker thread."""
    service = Service(llm, model_name, max_waiting, defaults or Defaults())

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await run_in_threadpool(service.worker.close)

    app = FastAPI(title="eagle2-local", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    app.add_api_route("/health", service.health, methods=["GET"])
    app.add_api_route("/stats", service.stats, methods=["GET"])
    app.add_api_route("/v1/models", service.models, methods=["GET"])
    app.add_api_route("/v1/completions", service.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", service.chat_completions, methods=["POST"])
    app.add_exception_handler(APIError, lambda _r, exc: exc.response())
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(Guard, api_key=api_key)
    return app


def listen(host: str, port: int) -> socket.socket:
    """Bind before serving, so a port in use is a one-line error (and ``--port 0`` reports the port it got)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise Eagle2Error(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


def serve(open_model: Callable[[], Any], *, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
          max_waiting: int = 16, model_name: str | None = None, defaults: Defaults | None = None,
          say: Callable[[str], None] = log.warning, log_level: str = "warning") -> None:
    """Bind, then load the model (``open_model()`` returns an :class:`eagle2_local.api.Eagle2`), then serve
    until interrupted (Ctrl-C / SIGTERM). Binding first makes a busy port an instant error, not one after a load.
    ``model_name`` defaults to the GGUF file name without ``.gguf``."""
    import uvicorn

    sock = listen(host, port)
    try:
        llm = open_model()
    except BaseException:
        sock.close()
        raise
    try:
        name = model_name or llm.model_path.name.removesuffix(".gguf")
        app = create_app(llm, model_name=name, api_key=api_key, max_waiting=max_waiting, defaults=defaults)
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5, access_log=False)
        say(f"serving {name} (draft: {llm.engine_name}) on http://{host}:{sock.getsockname()[1]}/v1")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        llm.close()
