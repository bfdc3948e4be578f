"""The one thread that generates: requests are admitted into a bounded queue and answered one at a time, clients
taking turns (:class:`~eagle2_local.server.turns.Turns`; each client's requests in arrival order), on a dedicated
worker thread (generation is blocking llama.cpp work that must never run on the
event loop, and one thread keeps the KV cache's owner obvious). Each request is a :class:`Job` whose events
(chunks, then one terminal event) the request's coroutine reads.

The KV cache holds one client's prompt at a time: a job of another cache group (another client, unless the
server shares its cache) starts from an empty cache, so no client can tell from its prefill time, or from the
prefix its own statistics say was reused, what another client asked."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..decoding.grammar import Grammar, GrammarError
from ..errors import ContextFullError, EmptyPromptError, PrefillCancelled
from ..tree.sampling import SamplingParams
from .errors import APIError, server_fault, shutting_down
from .ledger import Ledger
from .turns import Turns

log = logging.getLogger(__name__)

TERMINAL = ("done", "error", "cancelled")


@dataclass
class Job:
    """One admitted request: what to generate, where its events go, a flag its client raises on leaving, whose
    it is (``client``, for the accounts) and whose cached prompt it may reuse (``cache_group``)."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    seed: int | None
    cache_prompt: bool | None
    grammar: Grammar | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    client: str = ""
    cache_group: str = ""

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


class ModelWorker:
    """Runs generations on one dedicated thread, one at a time: clients take turns, each client's requests in
    the order they were admitted."""

    def __init__(self, llm, max_waiting: int) -> None:
        self.llm = llm
        self.max_waiting = max_waiting
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eagle2-serve")
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.waiting = self.running = 0
        self.places_taken = 0  # generation requests between reserve() and release(): parsed, queued or run
        self.ledger = Ledger()
        self._cache_group: str | None = None  # whose prompt the KV cache holds (None: nobody's yet)
        self._turns: Turns[Job] = Turns()  # the admitted jobs not yet taken by the thread

    def status(self, client: str | None = None) -> dict:
        """The queue's load, and how ``client``'s requests ended (None: everyone's)."""
        with self._lock:
            return {"running": self.running, "waiting": self.waiting, "max_waiting": self.max_waiting,
                    "places_taken": self.places_taken, **self.ledger.view(client).outcomes}

    def totals_dict(self, client: str | None = None) -> dict:
        """``client``'s generation totals (None: everyone's)."""
        with self._lock:
            return self.ledger.view(client).totals.as_dict()

    def check_room(self) -> None:
        """Refuse with 503 + Retry-After, taking nothing, when no place is free now: a full server need not read
        a body to answer it."""
        with self._lock:
            self._room()

    def reserve(self) -> None:
        """Take one of the ``max_waiting + 1`` places (one answered, ``max_waiting`` waiting) that a generation
        request holds from when its body is complete until its response ends, or refuse with 503 +
        Retry-After. Parsing and tokenizing a body cost memory too: bounding only the queue would let any
        number of requests do that at once."""
        with self._lock:
            self._room()
            self.places_taken += 1

    def _room(self) -> None:
        if self._closing.is_set():
            raise shutting_down()
        busy = max(self.places_taken, self.waiting + self.running)  # a left client's job may still run
        if busy > self.max_waiting:
            raise self._full()

    def release(self) -> None:
        """Give back a place taken by :meth:`reserve`."""
        with self._lock:
            self.places_taken -= 1

    def admit(self, job: Job) -> None:
        """Queue ``job``, or refuse with 503 + Retry-After when ``max_waiting`` requests already wait behind
        the one answered (``max_waiting`` 0: none waits; a request is refused while another is answered)."""
        with self._lock:  # held while submitting: close() cannot shut the pool down between check and submit
            if self._closing.is_set():
                raise shutting_down()
            if self.waiting + self.running > self.max_waiting:
                raise self._full()
            self._turns.put(job.client, job)
            self._pool.submit(self._run_next)  # one task a job: each takes whichever job's turn it is then
            self.waiting += 1

    def _full(self) -> APIError:
        """The 503 of a full server: what holds its places, and a Retry-After of the median recent service time
        times the requests ahead (called with the lock held)."""
        checking = max(self.places_taken - self.waiting - self.running, 0)  # parsed and checked, not yet queued
        ahead = self.running + self.waiting + checking
        retry = self.ledger.retry_after(ahead)
        if self.max_waiting:
            what = (f"the queue is full: {self.running} request being answered, {self.waiting} waiting (at most "
                    f"{self.max_waiting} may wait) and {checking} being checked")
        else:
            what = "busy with another request, and no request may wait (max_waiting 0)"
        return APIError(503, f"{what}; retry in {retry} s", "server_error", "queue_full",
                        headers={"Retry-After": str(retry)})

    def close(self) -> None:
        """Stop the running generation at its next round and wait for the thread. Queued jobs are not
        cancelled in the pool: each still passes through :meth:`_run`, which sees the server closing and sends
        its client a terminal event (and keeps the counters right) without generating."""
        with self._lock:
            self._closing.set()
        self._pool.shutdown(wait=True)

    def _run_next(self) -> None:
        with self._lock:
            job = self._turns.take()
            self.waiting -= 1
            self.running = 1
        self._run(job)

    def _run(self, job: Job) -> None:
        t0 = time.perf_counter()
        outcome, ran = "failed", True
        try:
            if job.cancelled.is_set() or self._closing.is_set():
                outcome, ran = "stopped_early", False  # the client left while waiting: nothing to undo
                job.send("cancelled")
                return
            kind, payload = self._generate(job)
            outcome = "completed" if kind == "done" else "stopped_early"
            job.send(kind, payload)
        except (ContextFullError, EmptyPromptError) as exc:  # what the request asked for does not fit
            job.send("error", APIError(400, str(exc)))
        except GrammarError as exc:  # its grammar leaves the model no token before any was sent: the client's
            job.send("error", APIError(400, f"the model cannot follow the grammar: {exc}", param="grammar"))
        except Exception:  # noqa: BLE001 - DecodeError, TreeError, bugs: a fault here, not in the request
            log.exception("generation failed")
            job.send("error", server_fault())
        finally:
            with self._lock:
                self.running = 0
                self.ledger.ended(job.client, outcome, time.perf_counter() - t0 if ran else None)

    def _generate(self, job: Job) -> tuple[str, Any]:
        """Stream ``job``'s chunks; stop between the prompt's batches or between rounds once its client has
        gone (or the server stops)."""
        def gone() -> bool:
            return job.cancelled.is_set() or self._closing.is_set()

        if job.cache_group != self._cache_group:
            if self._cache_group is not None:
                self.llm.reset()  # another client's prompt: none of it may be reused, or even timed
            self._cache_group = job.cache_group
        stream = self.llm.stream(job.prompt, job.max_tokens, job.sampling, stop=job.stop, seed=job.seed,
                                 cache_prompt=job.cache_prompt, grammar=job.grammar, cancelled=gone)
        tokens: list[int] = []
        reason = detail = None
        sent = False
        try:
            for chunk in stream:
                tokens.extend(chunk.tokens)
                reason = chunk.finish_reason or reason
                job.send("chunk", chunk)
                sent = True
                if gone():
                    return "cancelled", None
        except PrefillCancelled:
            return "cancelled", None
        except GrammarError as exc:  # a dead end under the grammar after some text: end there, saying why
            if not sent:
                raise
            reason, detail = "stop", f"the grammar allows no further token: {exc}"
            log.info("generation ended at a dead end of its grammar: %s", exc)
        finally:
            stream.close()  # the generator's own cleanup trims the KV cache to prompt + emitted tokens
            stats = self.llm.last_stats
            with self._lock:
                self.ledger.generated(job.client, stats)
        done = {"tokens": tokens, "finish_reason": reason or "stop", "stats": stats.as_dict()}
        return "done", ({**done, "finish_detail": detail} if detail else done)
