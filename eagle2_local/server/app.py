"""The endpoints and their wiring: :class:`Service` validates and tokenizes a request on the event loop's thread
pool and hands it to the worker; :func:`create_app` builds the FastAPI app (routes, error handlers, the guard,
OpenAPI docs at ``/docs``); :func:`serve` binds, loads the model and runs uvicorn."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Sequence

from fastapi import FastAPI, Request, Security
from fastapi.security import HTTPBearer
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from ..chat.responses import ChatResponse, CompletionResponse, usage
from ..chat.templates import prompt_tokens
from ..chat.tool_calls import ToolPlan
from ..decoding.grammar import Grammar, GrammarError, response_grammar
from ..decoding.grammar_screen import PROBE_WAIT_S, GrammarCheckBusy
from ..errors import Eagle2Error, ParameterError
from ..tree.sampling import DEFAULTS, SamplingDefaults, SamplingParams
from .admission import Admission, body_limit, caller_of
from .clients import SHARED_CACHE, Caller, Keys
from .errors import APIError, add_error_handlers, server_fault, shutting_down
from .types import MAX_STOPS, ChatRequest, CompletionRequest, SamplingFields, eagle_stats
from .worker import Job, ModelWorker

log = logging.getLogger(__name__)

def _pick(value, default):
    return default if value is None else value


# ---------------------------------------------------------------- the service
class Service:
    """The endpoints: validate and tokenize on the event loop's thread pool, generate on the worker."""

    def __init__(self, llm, model_name: str, max_waiting: int, defaults: SamplingDefaults,
                 expose_stats: bool = False, share_prompt_cache: bool = False) -> None:
        self.llm = llm
        self.model_name = model_name
        self.defaults = defaults
        self.expose_stats = expose_stats  # per-request figures that depend on other clients' requests
        self.share_prompt_cache = share_prompt_cache  # one cache group for all clients (a single team's choice)
        self.worker = ModelWorker(llm, max_waiting)
        self.created = int(time.time())

    # ---------------------------------------------------------- simple routes
    async def health(self, request: Request) -> dict:
        """A liveness probe for anyone; the queue's load and how the caller's requests ended for a client (every
        client's for the admin, or with ``expose_stats``). A keyed server shows a caller without a valid key
        nothing of its queue: when and how much others ask is theirs."""
        caller = caller_of(request.scope)
        out = {"status": "ok", "model": self.model_name, "engine": self.llm.engine_name, "n_ctx": self.llm.n_ctx()}
        if caller.known:
            out["queue"] = self.worker.status(self._whose(caller))
        return out

    async def stats(self, request: Request) -> dict:
        """The caller's totals since the server started (τ, draft tokens accepted per drafter), or every
        client's for the admin or with ``expose_stats`` (a diff of totals around one's own request would give
        another client's exact figures); the last generation's statistics only with ``expose_stats``, since
        they are whichever client's request came last."""
        caller = caller_of(request.scope)
        totals = self.worker.totals_dict(self._whose(caller))
        if not self.expose_stats:
            totals.pop("last", None)
        return {"model": self.model_name, "engine": self.llm.engine_name,
                "clients": "all" if self._whose(caller) is None else "yours", **totals}

    def _whose(self, caller: Caller) -> str | None:
        """Whose figures ``caller`` may see: its own, or everyone's (None)."""
        return None if caller.admin or self.expose_stats else caller.name

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "eagle2-local"}]}

    # ---------------------------------------------------------- generation routes
    async def chat_completions(self, body: ChatRequest, request: Request):
        body.refuse_unsupported()
        messages = [m.as_dict() for m in body.messages]
        plan = await run_in_threadpool(self._guarded, self.llm.tool_plan, body.tools, body.tool_choice,
                                       body.parallel_tool_calls)
        prompt = await run_in_threadpool(self._guarded, self.llm.chat_tokens, messages,
                                         plan.tools if plan is not None else None)
        if body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        return await self._answer(body, prompt, ChatResponse(self.model_name, plan), request, plan)

    async def completions(self, body: CompletionRequest, request: Request):
        body.refuse_unsupported()
        prompt = await run_in_threadpool(self._guarded, self._completion_tokens, body.prompt)
        return await self._answer(body, prompt, CompletionResponse(self.model_name), request)

    @staticmethod
    def _guarded(fn: Callable, *args):
        """Template, tool and tokenizer errors are the client's input: 400, not 500."""
        try:
            return fn(*args)
        except ParameterError as exc:  # a tool, a tool choice, a sampling value out of its range
            raise APIError(400, str(exc), code="invalid_value", param=exc.param) from None
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

    async def _answer(self, body: SamplingFields, prompt: list[int], response: ChatResponse | CompletionResponse,
                      request: Request, tools: ToolPlan | None = None):
        job = await self._job(body, prompt, caller_of(request.scope), tools)
        self.worker.admit(job)
        if body.stream:
            return _JobStream(job, self._stream(job, response, body.include_usage()), sep="\n")
        return await self._collect(job, response, request)

    async def _job(self, body: SamplingFields, prompt: list[int], caller: Caller,
                   tools: ToolPlan | None = None) -> Job:
        """Check the prompt fits and the sampling values are valid, before the request takes a queue slot; the
        job reuses only its own client's cached prompt (every client's with ``share_prompt_cache``)."""
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
        grammar = await run_in_threadpool(self._grammar, body, tools)  # off the event loop: /health answers
        return Job(prompt, max_tokens, sampling, stop, seed, body.cache_prompt, grammar, asyncio.get_running_loop(),
                   client=caller.name, cache_group=SHARED_CACHE if self.share_prompt_cache else caller.name)

    def _grammar(self, body: SamplingFields, tools: ToolPlan | None) -> Grammar | None:
        """The request's constraint (``grammar``, ``json_schema``, ``response_format``, or the calls its
        ``tool_choice`` requires), checked and compiled once against the model here (on a worker thread) so that
        a bad one is a 400 before the request takes a queue slot: the screens of
        :mod:`eagle2_local.decoding.grammar_screen` refuse what would hang, bloat or crash llama.cpp, in this process or a
        time- and memory-limited child, and a grammar that allows no token at its start is refused too."""
        try:
            grammar = response_grammar(body.grammar, body.json_schema, body.response_format)
            if tools is not None:
                grammar = self._guarded(tools.constrain, grammar)
            if grammar is not None:
                grammar.check(self.llm.model)
        except GrammarCheckBusy as exc:  # nothing wrong with this grammar: too many new ones at once
            raise APIError(503, str(exc), "server_error", "grammar_check_busy",
                           headers={"Retry-After": str(round(PROBE_WAIT_S))}) from None
        except GrammarError as exc:
            raise APIError(400, str(exc), param="response_format" if body.response_format else
                           "json_schema" if body.json_schema is not None else
                           "tools" if tools is not None and tools.grammar is not None else "grammar") from None
        return grammar

    async def _collect(self, job: Job, response: ChatResponse | CompletionResponse, request: Request) -> dict:
        """A whole answer; a client that disconnects while waiting stops its generation all the same."""
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        text: list[str] = []
        try:
            async for kind, payload in job.events_until_done():
                if kind == "chunk":
                    text.append(payload.text)
                elif kind == "done":
                    return response.whole("".join(text), payload["finish_reason"], usage=usage(payload["stats"]),
                                          eagle=eagle_stats(payload, self.expose_stats))
                elif kind == "error":
                    raise payload
            raise shutting_down()
        finally:
            watcher.cancel()
            job.cancelled.set()

    async def _stream(self, job: Job, response: ChatResponse | CompletionResponse,
                      include_usage: bool) -> AsyncIterator[dict]:
        """Server-sent events; sse-starlette cancels this coroutine when the client goes away, and the
        ``finally`` tells the worker to stop at its next round."""
        def event(choices: list[dict], **extra) -> dict:
            obj = response.chunk(choices, **extra)
            if include_usage and "usage" not in obj:
                obj["usage"] = None
            return {"data": json.dumps(obj)}

        try:
            first = response.first()
            if first is not None:
                yield event([first])
            async for kind, payload in job.events_until_done():
                if kind == "chunk" and payload.text:
                    for choice in response.deltas(payload.text):
                        yield event([choice])
                elif kind == "done":
                    *owed, last = response.finish(payload["finish_reason"])
                    for choice in owed:
                        yield event([choice])
                    yield event([last], eagle=eagle_stats(payload, self.expose_stats))
                    if include_usage:
                        yield event([], usage=usage(payload["stats"]))
                elif kind == "error":
                    yield {"data": json.dumps(payload.body())}
                elif kind == "cancelled":
                    yield {"data": json.dumps(shutting_down().body())}
        except Exception:  # whatever went wrong, a client's stream ends as a stream ends: an error event, [DONE]
            log.exception("a stream failed after it started")
            yield {"data": json.dumps(server_fault().body())}
        finally:
            job.cancelled.set()
        yield {"data": "[DONE]"}


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



# ---------------------------------------------------------------- wiring
def create_app(llm, *, model_name: str, api_key: str | Sequence[str] | None = None, max_waiting: int = 16,
               defaults: SamplingDefaults | None = None, expose_stats: bool = False,
               body_timeout_s: float | None = None, admin_key: str | None = None,
               share_prompt_cache: bool = False) -> FastAPI:
    """The ASGI app for ``llm`` (an :class:`eagle2_local.api.Eagle2`); it owns the worker thread.
    ``api_key``: one key, comma-separated keys or a list (one client each); ``admin_key``: a key that sees every
    client's figures. ``expose_stats``: responses carry every statistic of their generation, also those that
    depend on other clients' requests, and every caller sees the totals (a single user's setting);
    ``share_prompt_cache``: all clients reuse one prompt cache (faster, but a client can then time another's
    prompt); ``body_timeout_s``: how long a request's body may take (None: no deadline; :func:`serve` passes its
    ``idle_timeout_s``)."""
    keys = Keys(api_key, admin_key)
    service = Service(llm, model_name, max_waiting, defaults or DEFAULTS, expose_stats, share_prompt_cache)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await run_in_threadpool(service.worker.close)

    app = FastAPI(title="eagle2-local", lifespan=lifespan, docs_url="/docs", openapi_url="/openapi.json",
                  redoc_url=None)
    app.state.service = service
    # The key is checked by Admission; declared here too, so the OpenAPI spec names the scheme and /docs can
    # send it ("Authorize"). auto_error=False: the dependency itself never refuses anything.
    keyed = [Security(HTTPBearer(auto_error=False, description="the server's --api-key"))] if keys.required else None
    app.add_api_route("/health", service.health, methods=["GET"])
    app.add_api_route("/stats", service.stats, methods=["GET"], dependencies=keyed)
    app.add_api_route("/v1/models", service.models, methods=["GET"], dependencies=keyed)
    app.add_api_route("/v1/completions", service.completions, methods=["POST"], dependencies=keyed)
    app.add_api_route("/v1/chat/completions", service.chat_completions, methods=["POST"], dependencies=keyed)
    add_error_handlers(app)
    app.add_middleware(Admission, keys=keys, places=service.worker, max_body=body_limit(llm.n_ctx()),
                       body_timeout_s=body_timeout_s)
    return app


def listen(host: str, port: int) -> socket.socket:
    """Bind before serving, so a port in use is a one-line error (and ``--port 0`` reports the port it got).
    The socket names its protocol (TCP): asyncio then turns Nagle's algorithm off (``TCP_NODELAY``) on every
    connection it accepts, so a kept-alive request's small answer is not held ~40 ms for the client's ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise Eagle2Error(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


def serve(open_model: Callable[[], Any], *, host: str = "127.0.0.1", port: int = 8080,
          api_key: str | Sequence[str] | None = None, max_waiting: int = 16, model_name: str | None = None,
          defaults: SamplingDefaults | None = None, expose_stats: bool = False, idle_timeout_s: float,
          say: Callable[[str], None] = log.warning, log_level: str = "warning", admin_key: str | None = None,
          share_prompt_cache: bool = False) -> None:
    """Bind, then load the model (``open_model()`` returns an :class:`eagle2_local.api.Eagle2`), then serve
    until interrupted (Ctrl-C / SIGTERM). Binding first makes a busy port an instant error, not one after a load.
    ``model_name`` defaults to the GGUF file name without ``.gguf``. ``idle_timeout_s``: a connection's request
    head, and then its body, must each arrive within it (a silent or trickling client is closed, 408 for a body),
    and a kept-alive connection is closed after that long without a request (no default here: ``serve
    --idle-timeout`` holds the one)."""
    import uvicorn

    from .timeouts import head_timeout_protocol

    sock = listen(host, port)
    try:
        llm = open_model()
    except BaseException:
        sock.close()
        raise
    try:
        name = model_name or llm.model_path.name.removesuffix(".gguf")
        app = create_app(llm, model_name=name, api_key=api_key, max_waiting=max_waiting, defaults=defaults,
                         expose_stats=expose_stats, body_timeout_s=idle_timeout_s, admin_key=admin_key,
                         share_prompt_cache=share_prompt_cache)
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5, access_log=False,
                                http=head_timeout_protocol(idle_timeout_s), timeout_keep_alive=idle_timeout_s)
        say(f"serving {name} (draft: {llm.engine_name}) on http://{host}:{sock.getsockname()[1]}/v1")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        llm.close()
