"""``eagle2-local serve``: an OpenAI-compatible HTTP API over one model, for the clients people already use.

Editor plugins, chat UIs and scripts speak the OpenAI protocol (as they do to ``llama-server`` or
``python -m llama_cpp.server``); this package gives them ``/v1/chat/completions``, ``/v1/completions`` (both with
server-sent-event streaming), ``/v1/models``, ``/health`` and ``/stats`` on FastAPI + uvicorn + sse-starlette,
with OpenAPI docs at ``/docs``.

One model holds one KV cache, so requests are answered one at a time, clients taking turns (each client's in
arrival order), on a single worker thread: generation is blocking llama.cpp work and must never run on the event
loop, and running it always on the same thread keeps the cache's owner obvious. Consecutive requests of one
client reuse the cached prefix they share (the generator keeps it, as in ``chat``), as far as that leaves the
answer what the request alone would get; a request with llama-server's ``cache_prompt: true`` (or ``serve
--cache-prompt``) reuses all of it, faster but no longer independent of earlier requests at near-ties. A request
whose client goes away is stopped between two rounds and its stream closed, which trims the cache to the prompt
plus what was emitted, exactly as after a stopped chat answer; one that goes away while its prompt is evaluated
stops between two prompt batches, the cache back to what it held.

Laid out as llama-cpp-python's server is: ``types.py`` (request shapes, and which statistics an answer shows),
``errors.py`` (OpenAI's error shape and its handlers), ``worker.py`` (the generation thread and its queue),
``turns.py`` (whose request runs next),
``ledger.py`` (the ``/stats`` totals and outcome counts, per client and in all, and the service times behind
``Retry-After``), ``clients.py`` (who is asking: an API key or an address; the room for bodies being read),
``admission.py`` (the API key, the body's size, deadline and reading room, then a place in the queue),
``timeouts.py`` (closing connections that send no request), ``app.py`` (the routes, ``create_app``, ``serve``).
The response objects are :mod:`eagle2_local.chat.responses`, shared with the Python API.

Clients do not learn about each other: a client is an API key (or, without keys, a remote address); its requests
reuse only its own cached prompt (unless ``--share-prompt-cache``), a response carries only the statistics its
request alone decides (token counts and ids) unless the operator asks for all (``--expose-stats``), and
``/stats`` and ``/health`` show each client its own figures (the ``--admin-key`` sees the totals).
"""

from .admission import MAX_BODY_BYTES, body_limit
from .app import create_app, listen, serve
from .errors import APIError
from .ledger import GenerationTotals
from .worker import TERMINAL, Job, ModelWorker

__all__ = ["APIError", "GenerationTotals", "Job", "MAX_BODY_BYTES", "ModelWorker", "TERMINAL",
           "body_limit", "create_app", "listen", "serve"]
