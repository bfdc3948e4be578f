"""The one thread that generates: requests are admitted into a bounded queue and answered one at a time, in
arrival order, on a dedicated worker thread (generation is blocking llama.cpp work that must never run on the
event loop, and one thread keeps the KV cache's owner obvious). Each request is a :class:`Job` whose events
(chunks, then one terminal event) the request's coroutine reads."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..decoding.grammar import Grammar, GrammarError
from ..decoding.stats import GenerationStats
from ..errors import ContextFullError, EmptyPromptError, PrefillCancelled
from ..tree.sampling import SamplingParams
from .errors import APIError, server_fault, shutting_down

log = logging.getLogger(__name__)

TERMINAL = ("done", "error", "cancelled")


@dataclass
class Job:
    """One admitted request: what to generate, where its events go, and a flag its client raises on leaving."""

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
    """What the generations since the server started produced: their statistics added up (one
    :class:`GenerationStats`, which computes τ and the host figures), how many there were and the last one's."""

    def __init__(self) -> None:
        self.generations = 0
        self.sum = GenerationStats()
        self.last: GenerationStats | None = None

    def add(self, stats: GenerationStats) -> None:
        self.generations += 1
        self.sum = self.sum + stats
        self.last = stats

    def as_dict(self) -> dict:
        last = self.last.as_dict() if self.last is not None else None
        return {"generations": self.generations, **self.sum.totals_dict(), "last": last}


class ModelWorker:
    """Runs generations on one dedicated thread, one at a time, in the order they were admitted."""

    def __init__(self, llm, max_waiting: int) -> None:
        self.llm = llm
        self.max_waiting = max_waiting
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eagle2-serve")
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.waiting = self.running = 0
        self.places_taken = 0  # generation requests between reserve() and release(): read, parsed, queued or run
        self.completed = self.stopped_early = self.failed = 0
        self._mean_s = 1.0  # running mean of a request's duration, for Retry-After
        self.totals = GenerationTotals()

    def status(self) -> dict:
        with self._lock:
            return {"running": self.running, "waiting": self.waiting, "max_waiting": self.max_waiting,
                    "places_taken": self.places_taken, "completed": self.completed,
                    "stopped_early": self.stopped_early, "failed": self.failed}

    def totals_dict(self) -> dict:
        with self._lock:
            return self.totals.as_dict()

    def reserve(self) -> None:
        """Take one of the ``max_waiting + 1`` places (one answered, ``max_waiting`` waiting) that a generation
        request holds from before its body is read until its response ends, or refuse with 503 + Retry-After.
        Reading, parsing and tokenizing a body cost memory too: bounding only the queue would let any number
        of requests do that at once."""
        with self._lock:
            if self._closing.is_set():
                raise shutting_down()
            busy = max(self.places_taken, self.waiting + self.running)  # a left client's job may still run
            if busy > self.max_waiting:
                raise self._full(busy)
            self.places_taken += 1

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
                raise self._full(self.waiting + self.running)
            self._pool.submit(self._run, job)
            self.waiting += 1

    def _full(self, busy: int) -> APIError:
        """The 503 of a full server, with a Retry-After of the mean request's duration times the ``busy``
        requests ahead (called with the lock held)."""
        retry = max(1, math.ceil(self._mean_s * busy))
        what = (f"the queue is full ({self.waiting} requests waiting)" if self.max_waiting
                else "busy with another request, and no request may wait (max_waiting 0)")
        return APIError(503, f"{what}; retry in {retry} s", "server_error", "queue_full",
                        headers={"Retry-After": str(retry)})

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
        except GrammarError as exc:  # its grammar leaves the model no token before any was sent: the client's
            job.send("error", APIError(400, f"the model cannot follow the grammar: {exc}", param="grammar"))
        except Exception:  # noqa: BLE001 - DecodeError, TreeError, bugs: a fault here, not in the request
            log.exception("generation failed")
            job.send("error", server_fault())
        finally:
            with self._lock:
                self.running = 0
                setattr(self, outcome, getattr(self, outcome) + 1)
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - t0)

    def _generate(self, job: Job) -> tuple[str, Any]:
        """Stream ``job``'s chunks; stop between the prompt's batches or between rounds once its client has
        gone (or the server stops)."""
        def gone() -> bool:
            return job.cancelled.is_set() or self._closing.is_set()

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
                self.totals.add(stats)
        done = {"tokens": tokens, "finish_reason": reason or "stop", "stats": stats.as_dict()}
        return "done", ({**done, "finish_detail": detail} if detail else done)
