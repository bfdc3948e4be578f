"""`eagle2-local serve` as its clients see it: the real server in a subprocess on a free loopback port, serving
the default SmolLM2 model with its shipped head, driven by the official `openai` client and by raw HTTP.

The server runs with one thread so that greedy answers are bit-identical to `generate --plain` (NOTES.md#lossless:
batch invariance holds with one thread); prompts stay short (< 64 tokens) for the same reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from eagle2_local.decoding.grammar import Grammar
from eagle2_local.decoding.stats import GenerationStats
from eagle2_local.errors import ContextFullError, DecodeError, TreeError
from eagle2_local.llamacpp.llama import LlamaModel
from tests.support.helpers import assert_follows_grammar

pytestmark = pytest.mark.smollm2

KEY = "sekret-test-key"
NAME = "SmolLM2-135M-Instruct.Q4_1"
N_CTX = 1024
MAX_TOKENS = 24
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPTS = ["What is the capital of France?", "Name three primary colours.", "What do bees make?",
           "Which planet is closest to the sun?"]
LONG = "Summarize this story: " + " ".join(  # over 512 tokens: more than one batch
    f"On day {i} the farmer counted {i * 7} sheep and sold {i % 5} of them." for i in range(28))
# What users get (responses carry only the statistics their request alone decides) ...
PRIVATE_ARGS = ("--threads", "1", "--n-ctx", str(N_CTX), "--api-key", KEY, "--max-queue", "16")
# ... and what most tests run: every statistic in every response, to check τ, reuse and tree sizes
SERVER_ARGS = PRIVATE_ARGS + ("--expose-stats",)
IDLE_S = 3  # the module server's --idle-timeout
RECORD_ENV = "EAGLE2_LOCAL_SERVER_RECORD"  # write the load test's throughput record to this JSON path
NOTE_ENV = "EAGLE2_LOCAL_RECORD_NOTE"  # a remark stored in that record (e.g. what else loaded the machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    log: Path

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=KEY, max_retries=0, timeout=120)

    def http(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120, **kw)

    def health(self) -> dict:
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()[-3000:]}"
        r = httpx.get(self.base + "/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert r.status_code == 200
        return r.json()

    def idle_queue(self, within_s: float) -> dict:
        """The queue's counters once nothing runs or waits (or after ``within_s``, for the caller to assert)."""
        deadline = time.monotonic() + within_s
        while (q := self.health()["queue"])["running"] + q["waiting"] and time.monotonic() < deadline:
            time.sleep(0.1)
        return q


def start_server(log: Path, *args: str) -> Server:
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port), *args],
                                stdout=out, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(server.base + "/health", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    stop_server(server)
    pytest.fail(f"server did not answer within 180 s:\n{log.read_text()[-3000:]}")


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    """No --model: the built-in default model with its head and the default (auto) tree budget, as users get
    it; the API key guards everything but /health. Responses carry all their statistics (--expose-stats), and
    silent connections close after IDLE_S seconds."""
    s = start_server(tmp_path_factory.mktemp("serve") / "server.log", *SERVER_ARGS, "--idle-timeout", str(IDLE_S))
    yield s
    alive = s.proc.poll() is None
    stop_server(s)
    assert alive, "the server died during the tests"


def reference(prompt: str, max_tokens: int = MAX_TOKENS) -> dict:
    """What `eagle2-local generate --plain` answers to ``prompt`` as a chat message, greedy, one thread."""
    out = subprocess.run([sys.executable, "-m", "cli", "generate", "--plain", "--threads", "1", "--n-ctx", str(N_CTX),
                          "--chat", "--json", "--temperature", "0", "-n", str(max_tokens), "-p", prompt],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def chat(client: openai.OpenAI, prompt: str, max_tokens: int = MAX_TOKENS, **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}],
                                          max_tokens=max_tokens, temperature=0, **kw)


# ------------------------------------------------------------------ the official client
def test_models_names_the_model_not_its_path(server):
    assert [m.id for m in server.openai().models.list().data] == [NAME]


def test_chat_completion_and_its_stream_agree(server):
    client = server.openai()
    whole = chat(client, PROMPTS[0])
    text = whole.choices[0].message.content
    assert text and whole.model == NAME and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0
    eagle = whole.model_extra["eagle"]
    assert eagle["engine"] != "plain" and eagle["tokens_per_s"] > 0 and eagle["target_passes"] >= 1
    assert eagle["pass_tokens"] == eagle["target_passes"] + sum(eagle["accepted_per_depth"])
    assert eagle["tau"] == round(eagle["pass_tokens"] / eagle["target_passes"], 4)
    assert "mean_tree_size" in eagle and len(eagle["tokens"]) == whole.usage.completion_tokens

    deltas, usage, reasons, finals = [], None, [], []
    for chunk in chat(client, PROMPTS[0], stream=True, stream_options={"include_usage": True}):
        assert chunk.model == NAME
        usage = chunk.usage or usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
                finals.append(chunk.model_extra["eagle"])
    assert "".join(deltas) == text
    assert reasons == [whole.choices[0].finish_reason]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert finals[0]["tokens"] == eagle["tokens"]
    assert finals[0]["prompt_tokens_reused"] > 0  # the same prompt again: its KV prefix was kept, not re-prefilled


def test_completion_streamed_and_whole(server):
    client = server.openai()
    whole = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert whole.choices[0].text and whole.model == NAME
    assert whole.usage.completion_tokens == len(whole.model_extra["eagle"]["tokens"]) > 0
    parts = [c.choices[0].text for c in client.completions.create(
        model=NAME, prompt="The capital of France is", max_tokens=12, temperature=0, stream=True)]
    assert "".join(parts) == whole.choices[0].text


# ------------------------------------------------------------------ bad input over raw HTTP
GOOD = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
BAD = [  # (what, method, path, httpx kwargs, status, error code or None)
    ("malformed JSON", "POST", CHAT, {"content": b'{"messages": [', "headers": {"content-type": "application/json"}},
     400, "invalid_json"),
    ("body not an object", "POST", CHAT, {"json": [1, 2]}, 400, "invalid_value"),
    ("no body", "POST", CHAT, {}, 400, "invalid_value"),
    ("max_tokens not an integer", "POST", CHAT, {"json": {**GOOD, "max_tokens": "many"}}, 400, "invalid_value"),
    ("temperature not a number", "POST", CHAT, {"json": {**GOOD, "temperature": "hot"}}, 400, "invalid_value"),
    ("stream not a boolean", "POST", CHAT, {"json": {**GOOD, "stream": "sometimes"}}, 400, "invalid_value"),
    ("stop not a string", "POST", CHAT, {"json": {**GOOD, "stop": 5}}, 400, "invalid_value"),
    ("messages not a list", "POST", CHAT, {"json": {"messages": "hello"}}, 400, "invalid_value"),
    ("message without a role", "POST", CHAT, {"json": {"messages": [{"content": "x"}]}}, 400, "invalid_value"),
    ("no messages", "POST", CHAT, {"json": {"messages": []}}, 400, "invalid_value"),
    ("image content", "POST", CHAT, {"json": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}}, 400, None),
    ("negative temperature", "POST", CHAT, {"json": {**GOOD, "temperature": -1}}, 400, None),
    ("top_p above 1", "POST", CHAT, {"json": {**GOOD, "top_p": 1.5}}, 400, None),
    ("temperature NaN", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "x"}], '
                                       b'"temperature": NaN}', "headers": {"content-type": "application/json"}},
     400, "invalid_value"),
    ("body not UTF-8", "POST", COMPLETIONS, {"content": b'{"prompt": "\xff\xfe"}',
                                            "headers": {"content-type": "application/json"}}, 400, "bad_request"),
    ("lone surrogate", "POST", COMPLETIONS, {"content": b'{"prompt": "a\\ud800b"}',
                                             "headers": {"content-type": "application/json"}}, 400, None),
    ("n = 2", "POST", CHAT, {"json": {**GOOD, "n": 2}}, 400, "unsupported_parameter"),
    ("invalid grammar", "POST", CHAT, {"json": {**GOOD, "grammar": "root ::= ("}}, 400, None),
    ("schema that is not an object", "POST", CHAT, {"json": {**GOOD, "json_schema": [1]}}, 400, "invalid_value"),
    ("response_format json_schema without a schema", "POST", CHAT,
     {"json": {**GOOD, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}}, 400, None),
    ("unknown response_format", "POST", CHAT, {"json": {**GOOD, "response_format": {"type": "xml"}}}, 400, None),
    ("tools on a template that does not render them", "POST", CHAT,
     {"json": {**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}}, 400, None),
    ("functions (the old form of tools)", "POST", CHAT, {"json": {**GOOD, "functions": [{"name": "f"}]}}, 400,
     "unsupported_parameter"),
    ("token id outside the vocabulary", "POST", COMPLETIONS, {"json": {"prompt": [1, 10 ** 9]}}, 400, None),
    ("negative token id", "POST", COMPLETIONS, {"json": {"prompt": [-5]}}, 400, None),
    ("prompt longer than the context", "POST", COMPLETIONS, {"json": {"prompt": "hello " * 3000}}, 400,
     "context_length_exceeded"),
    ("two prompts", "POST", COMPLETIONS, {"json": {"prompt": ["a", "b"]}}, 400, None),
    ("no API key", "POST", CHAT, {"json": GOOD, "headers": {"Authorization": ""}}, 401, "invalid_api_key"),
    ("wrong API key", "GET", "/v1/models", {"headers": {"Authorization": "Bearer nope"}}, 401, "invalid_api_key"),
    ("unknown route", "POST", "/v1/embeddings", {"json": {"input": "x"}}, 404, "not_found"),
    ("wrong method", "GET", CHAT, {}, 405, "method_not_allowed"),
]


@pytest.mark.parametrize("what,method,path,kw,status,code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_an_openai_error_and_the_server_goes_on(server, what, method, path, kw, status, code):
    with server.http() as http:
        r = http.request(method, path, **kw)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"] and err["type"] and "code" in err
        if code is not None:
            assert err["code"] == code
        if code == "context_length_exceeded":  # the token counts are in the message
            assert str(N_CTX) in err["message"] and any(ch.isdigit() for ch in err["message"].split(" has ")[1])
        ok = http.post(CHAT, json=GOOD)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] > 0
    assert server.health()["status"] == "ok"


def test_oversized_bodies_get_413_with_or_without_content_length(server):
    """A declared length over the limit is refused before its body is read; a chunked body (no length) is
    counted as it arrives and refused past the limit; a small chunked body still works."""
    from eagle2_local.server import MAX_BODY_BYTES

    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {10 ** 12}\r\n\r\n".encode())
        answer = b""
        while chunk := raw.recv(65536):  # the server closes the connection: the body was never read
            answer += chunk
    head, _, payload = answer.decode("latin-1").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413"), head
    assert json.loads(payload)["error"]["code"] == "body_too_large"

    mib = b"x" * (1 << 20)
    with server.http() as http:
        r = http.post(CHAT, content=iter([mib] * (MAX_BODY_BYTES // len(mib) + 1)),
                      headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers and r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "body_too_large"
        body = json.dumps(GOOD).encode()
        ok = http.post(CHAT, content=iter([body[:10], body[10:]]), headers={"content-type": "application/json"})
        assert "content-length" not in ok.request.headers
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] > 0
    assert server.health()["status"] == "ok"


def test_busy_port_is_a_one_line_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        proc = subprocess.run([sys.executable, "-m", "cli", "serve", "--port", str(busy.getsockname()[1])],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "cannot listen on 127.0.0.1" in proc.stderr


# ------------------------------------------------------------------ queue, disconnects, load
def test_disconnect_stops_the_generation_and_the_next_answer_is_unaffected(server):
    client = server.openai()
    before = chat(client, PROMPTS[1]).model_extra["eagle"]["tokens"]
    stopped = server.health()["queue"]["stopped_early"]
    with server.http() as http, http.stream("POST", COMPLETIONS, json={
            "prompt": "Once upon a time", "max_tokens": 800, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    # 800 tokens take many seconds on one thread; a stopped generation frees the model within a round or two
    q = server.idle_queue(10)
    assert q["running"] == 0 and q["stopped_early"] == stopped + 1
    assert chat(client, PROMPTS[1]).model_extra["eagle"]["tokens"] == before


def rss_mib(pid: int) -> float:
    """A process's resident memory now, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def test_full_queue_answers_503_with_retry_after(smollm2_path, tmp_path):
    """--max-queue 2: one answered and two waiting fill the server. Then even large bodies are refused at once
    and unread (a full server answers before reading a body), so the server's memory stays where it was; once
    the queue has drained, the same body is read and answered."""
    from eagle2_local.server import body_limit

    s = start_server(tmp_path / "server.log", "--plain", "--threads", "1", "--max-queue", "2")
    long = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "stream": True}
    big = json.dumps({"prompt": "sheep " * (body_limit(4096) // 6 - 10), "max_tokens": 1}).encode()
    assert len(big) > body_limit(4096) * 0.9
    try:
        with httpx.Client(base_url=s.base, timeout=60) as http, ExitStack() as streams:
            for _ in range(3):  # one running, two waiting
                assert streams.enter_context(http.stream("POST", COMPLETIONS, json=long)).status_code == 200
            assert s.health()["queue"]["waiting"] == 2
            r = http.post(COMPLETIONS, json=long)
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["code"] == "queue_full"
            before, t0 = rss_mib(s.proc.pid), time.monotonic()
            with ThreadPoolExecutor(12) as pool:
                statuses = list(pool.map(lambda _: httpx.post(s.base + COMPLETIONS, content=big, timeout=60,
                                                              headers={"content-type": "application/json"})
                                         .status_code, range(24)))
            assert statuses == [503] * 24 and time.monotonic() - t0 < 20
            assert rss_mib(s.proc.pid) - before < 64, (before, rss_mib(s.proc.pid))
        q = s.idle_queue(10)  # the streams are closed: the queue drains without generating
        assert q["running"] == q["waiting"] == q["places_taken"] == 0 and q["stopped_early"] == 3
        with httpx.Client(base_url=s.base, timeout=60) as http:
            assert http.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 3}).status_code == 200
            r = http.post(COMPLETIONS, content=big, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    finally:
        stop_server(s)


@pytest.fixture(scope="module")
def references() -> dict[str, dict]:
    """`generate --plain` for each of PROMPTS, the answers the load tests must reproduce token for token."""
    return references_of(PROMPTS + [LONG])


def references_of(prompts: list[str]) -> dict[str, dict]:
    """`reference` of each prompt, two at a time."""
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(prompts, pool.map(reference, prompts)))


def _client_session(server: Server, client_id: int, n_requests: int, leave_after: int = 2) -> list[dict]:
    """One streaming client: ``n_requests`` chat requests in turn, a third of them abandoned after
    ``leave_after`` chunks (the first chunk carries only the role, the second the first token)."""
    client, results = server.openai(), []
    for j in range(n_requests):
        prompt = PROMPTS[(client_id + j) % len(PROMPTS)]
        leaves = (client_id + j) % 3 == 0
        stream = chat(client, prompt, stream=True, stream_options={"include_usage": True},
                      max_tokens=64 if leaves else MAX_TOKENS)
        got = {"client": client_id, "prompt": prompt, "left": leaves, "text": "", "eagle": None, "usage": None}
        for i, chunk in enumerate(stream):
            if leaves and i == leave_after:
                stream.close()
                break
            got["usage"] = chunk.usage or got["usage"]
            for choice in chunk.choices:
                got["text"] += choice.delta.content or ""
                if choice.finish_reason:
                    got["eagle"] = chunk.model_extra["eagle"]
        results.append(got)
    return results


def _run_clients(server: Server, n_clients: int, n_requests: int, **kw) -> list[dict]:
    with ThreadPoolExecutor(n_clients) as pool:
        return [r for rs in pool.map(lambda i: _client_session(server, i, n_requests, **kw), range(n_clients))
                for r in rs]


def _assert_finished_match(results: list[dict], refs: dict[str, dict], n_clients: int, n_requests: int) -> list:
    """Nothing lost, every finished answer exactly `generate --plain`'s (tokens, text, usage)."""
    assert len(results) == n_clients * n_requests
    finished = [r for r in results if not r["left"]]
    assert len(finished) == sum(1 for i in range(n_clients) for j in range(n_requests) if (i + j) % 3)
    for r in finished:
        ref = refs[r["prompt"]]
        assert r["eagle"] is not None and r["usage"] is not None, r
        assert r["eagle"]["tokens"] == ref["tokens"], (r["prompt"], r["text"], ref["text"])
        assert r["text"] == ref["text"]
        assert r["usage"].prompt_tokens == ref["stats"]["prompt_tokens"]
        assert r["usage"].completion_tokens == ref["n_tokens"]
        assert r["eagle"]["engine"] != "plain"
    return finished


def test_load_8_streaming_clients_match_plain_generate(server, references):
    """8 concurrent streaming clients x 4 requests, a third of them abandoned early: every finished answer is
    token for token what `generate --plain` gives, nothing is lost or mixed, and the server stays up."""
    n_clients, n_requests = 8, 4
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    results = _run_clients(server, n_clients, n_requests)
    wall = time.perf_counter() - t0
    finished = _assert_finished_match(results, references, n_clients, n_requests)
    server.idle_queue(30)  # a client that left last may still have its job running until its next round
    health = server.health()
    assert health["queue"]["running"] == health["queue"]["waiting"] == 0
    if os.environ.get(RECORD_ENV):
        _write_record(Path(os.environ[RECORD_ENV]), finished, results, wall, (n_clients, n_requests), health,
                      load_before)


def assert_fixed_tree_rounds(stats: list[dict], size: int) -> None:
    """A fixed tree's rule, not one machine's schedule: no budget, no tree over ``size`` nodes, full-size trees
    drafted, and at most one plain step an answer (where one token was left to emit: which round lands there
    depends on the acceptances, which differ between CPUs at near-ties)."""
    assert all(st["budget"] is None and st["plain_steps"] <= 1 for st in stats), stats
    sizes = {int(n) for st in stats for n in st["tree_size_hist"]}
    assert max(sizes) == size, stats


def test_tree_rounds_under_concurrent_streams_match_plain_generate(smollm2_path, tmp_path, references):
    """The auto budget mostly picks plain steps on a slow CPU, so this runs a small fixed tree (rounds draft and
    verify up to 6 nodes; fewer only near the answer's end): 4 concurrent streaming clients x 2 requests, three abandoned in the middle of
    their tree rounds, then a prompt longer than a batch. Each finished answer still equals `generate --plain`,
    and drafts were really accepted. Lookup branches join the head's trees (--lookup); /stats sums it all up."""
    n_clients, n_requests = 4, 2
    s = start_server(tmp_path / "server.log", *SERVER_ARGS, "--total-tokens", "6", "--depth", "3", "--lookup")
    try:
        results = _run_clients(s, n_clients, n_requests, leave_after=4)
        finished = _assert_finished_match(results, references, n_clients, n_requests)
        stats = [r["eagle"] for r in finished]
        assert_fixed_tree_rounds(stats, 6)
        accepted = sum(sum(st["accepted_per_depth"]) for st in stats)
        assert accepted > 0 and sum(st["tau"] for st in stats) / len(stats) > 1.0, stats
        q = s.idle_queue(30)  # the last client may have just left: its job stops at its next round
        assert q["running"] == q["waiting"] == 0, q
        assert q["stopped_early"] == len(results) - len(finished) and q["completed"] == len(finished), q

        # A prompt over n_batch (512) tokens that keeps the template's opening from the request before: the
        # head encodes the new text in several batches after a kept prefix (this once failed with "inconsistent
        # sequence positions"); the answer is still plain greedy's, and so is the next one.
        long = chat(s.openai(), LONG).model_extra["eagle"]
        assert long["prompt_tokens"] > 512 and long["prompt_tokens_reused"] > 0
        assert_fixed_tree_rounds([long], 6)
        assert long["tokens"] == references[LONG]["tokens"]
        last = chat(s.openai(), PROMPTS[2]).model_extra["eagle"]
        assert last["tokens"] == references[PROMPTS[2]]["tokens"]

        with s.http() as http:
            totals = http.get("/stats").json()
        assert totals["engine"].endswith("+lookup") and totals["generations"] == len(results) + 2, totals
        assert totals["last"]["accepted_by_source"] == last["accepted_by_source"]
        assert sum(totals["accepted_by_source"].values()) >= accepted + sum(long["accepted_by_source"].values())
        assert totals["tau"] == round(totals["pass_tokens"] / totals["target_passes"], 4) > 1.0
    finally:
        stop_server(s)


def _write_record(path: Path, finished: list[dict], results: list[dict], wall: float, shape: tuple[int, int],
                  health: dict, load_before: tuple[float, ...]) -> None:
    """The load test's throughput, for benchmarks/make_record.py (with a note from $EAGLE2_LOCAL_RECORD_NOTE)."""
    import platform

    n_clients, n_requests = shape
    tokens = sum(r["usage"].completion_tokens for r in finished)
    taus = [r["eagle"]["tau"] for r in finished]
    record = {
        "kind": "server-load", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"{RECORD_ENV}={path} " + (f"{NOTE_ENV}='...' " if os.environ.get(NOTE_ENV) else "")
                   + "python -m pytest tests/server/test_server.py -k load",
        "server": "eagle2-local serve " + " ".join(a if a != KEY else "KEY" for a in SERVER_ARGS)
                  + " (default model and its head)",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_at_start": [round(x, 2) for x in load_before],
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "clients": n_clients, "requests_per_client": n_requests, "requests": len(results),
        "abandoned_early": len(results) - len(finished), "finished": len(finished),
        "max_tokens": MAX_TOKENS, "wall_s": round(wall, 2), "completion_tokens_finished": tokens,
        "tokens_per_s": round(tokens / wall, 2), "finished_requests_per_s": round(len(finished) / wall, 3),
        "mean_tau": round(sum(taus) / len(taus), 3), "queue_after": health["queue"],
        "mean_decode_tokens_per_s": round(sum(r["eagle"]["tokens_per_s"] for r in finished) / len(finished), 2),
        "identical_to_plain_generate": len(finished),
    }
    if os.environ.get(NOTE_ENV):
        record["note"] = os.environ[NOTE_ENV]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


# ------------------------------------------------------------------ faults, shutdown and the queue's accounting
class StandIn:
    """Stands in for :class:`eagle2_local.api.Eagle2` where the worker and the endpoints are tested without a
    model: ``stream`` yields one-token chunks, each after ``gate`` opens, or raises ``fault`` at its start."""

    engine_name = "stand-in"

    def __init__(self, fault: Exception | None = None) -> None:
        from types import SimpleNamespace

        self.fault = fault
        self.gate = threading.Event()
        self.started = threading.Event()
        self.model = SimpleNamespace(n_vocab=100)
        self.generated = 0

    def n_ctx(self) -> int:
        return 64

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return [1, 2]

    def tool_plan(self, tools, tool_choice=None, parallel_tool_calls=None) -> None:
        return None

    def stream(self, prompt, max_tokens, sampling, stop=(), seed=None, cache_prompt=None, grammar=None,
               cancelled=None):
        from eagle2_local.generation.generator import Chunk

        self.started.set()
        if self.fault is not None:
            raise self.fault
        self.generated = 0
        for i in range(max_tokens):
            self.gate.wait(30)
            self.generated += 1
            yield Chunk("x", [7], "length" if i == max_tokens - 1 else None)

    @property
    def last_stats(self) -> GenerationStats:
        return GenerationStats(prompt_tokens=1, n_tokens=self.generated, target_passes=self.generated,
                               pass_tokens=self.generated)


def _job(loop, max_tokens: int = 2):
    from eagle2_local.server import Job
    from eagle2_local.tree.sampling import SamplingParams

    return Job([1], max_tokens, SamplingParams(temperature=0.0), (), None, None, None, loop)


def _events(loop, job, timeout_s: float = 30) -> list[str]:
    async def kinds() -> list[str]:
        return [kind async for kind, _ in job.events_until_done()]
    return loop.run_until_complete(asyncio.wait_for(kinds(), timeout_s))


@pytest.mark.parametrize("fault", [DecodeError("llama_decode failed with code -3: secret detail"),
                                   TreeError("extended batch full (61 entries)"), RuntimeError("a bug")])
def test_generation_fault_is_a_500_with_a_generic_message_and_the_detail_in_the_log(fault, caplog):
    """A DecodeError or TreeError mid-generation is the server's fault, not the request's: 500, OpenAI's error
    shape, a message that does not leak the exception's text; the traceback goes to the server's log."""
    from fastapi.testclient import TestClient

    from eagle2_local.server import create_app

    with TestClient(create_app(StandIn(fault), model_name="m")) as http:
        for path, body in ((COMPLETIONS, {"prompt": [1, 2], "max_tokens": 2}),
                           (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})):
            r = http.post(path, json=body)
            assert r.status_code == 500, r.text
            assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"message", "type", "param", "code"}
            err = r.json()["error"]
            assert err["type"] == "server_error" and err["code"] == "internal_error"
            assert "details are in its log" in err["message"] and str(fault) not in err["message"]
        assert http.get("/health").json()["queue"]["failed"] == 2
    assert any(rec.exc_info and str(fault) in str(rec.exc_info[1]) for rec in caplog.records)


def test_openapi_docs_answer_without_the_api_key():
    """/docs and /openapi.json describe the routes, as in llama-cpp-python's server: open without the key (like
    /health), while every API route still wants it."""
    from fastapi.testclient import TestClient

    from eagle2_local.server import create_app

    with TestClient(create_app(StandIn(), model_name="m", api_key="k")) as http:
        docs = http.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        schema = http.get("/openapi.json")
        assert schema.status_code == 200
        paths = schema.json()["paths"]
        assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(paths)
        # the bearer scheme is declared, so "Authorize" in /docs sends the key on every keyed route
        (scheme_name, scheme), = schema.json()["components"]["securitySchemes"].items()
        assert scheme == {**scheme, "type": "http", "scheme": "bearer"}
        for path, method in (("/v1/chat/completions", "post"), ("/v1/completions", "post"), ("/v1/models", "get"),
                             ("/stats", "get")):
            assert paths[path][method]["security"] == [{scheme_name: []}], path
        assert "security" not in paths["/health"]["get"]
        assert http.get("/v1/models").status_code == 401
        assert http.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200


def test_a_prompt_that_no_longer_fits_stays_the_clients_error():
    from eagle2_local.server import ModelWorker

    loop = asyncio.new_event_loop()
    worker = ModelWorker(StandIn(ContextFullError("no room in the KV cache for 9 tokens")), max_waiting=4)
    try:
        job = _job(loop)
        worker.admit(job)
        kind, err = loop.run_until_complete(asyncio.wait_for(job.events.get(), 30))
        assert kind == "error" and err.status == 400 and "no room" in err.message
    finally:
        worker.close()
        loop.close()


def test_close_gives_every_queued_job_a_terminal_event_and_balances_the_counters():
    """Jobs still waiting when the server shuts down are answered (cancelled), never left without an end."""
    from eagle2_local.server import TERMINAL, APIError, ModelWorker

    llm = StandIn()
    loop = asyncio.new_event_loop()
    worker = ModelWorker(llm, max_waiting=8)
    try:
        jobs = [_job(loop, max_tokens=50) for _ in range(4)]
        for job in jobs:
            worker.admit(job)
        assert llm.started.wait(30)  # the first runs (held at the gate), three wait
        assert worker.status()["waiting"] == 3
        closer = threading.Thread(target=worker.close)
        closer.start()
        llm.gate.set()  # the running one reaches its next round, sees the server closing and stops
        closer.join(30)
        assert not closer.is_alive()
        for job in jobs:
            assert _events(loop, job)[-1] in TERMINAL
        status = worker.status()
        assert status["waiting"] == status["running"] == 0 and status["stopped_early"] == 4, status
        with pytest.raises(APIError) as refused:
            worker.admit(_job(loop))
        assert refused.value.status == 503 and refused.value.code == "shutting_down"
    finally:
        llm.gate.set()
        worker.close()
        loop.close()


def test_admit_racing_close_is_a_503_or_an_answered_job_never_a_lost_count():
    """``admit`` counted a waiting request, then submitting to a pool that ``close`` had just shut down raised
    (a 500) and the count was never taken back. Admissions racing a close now either are refused with 503 or
    get a terminal event, and nothing stays counted as waiting."""
    from eagle2_local.server import TERMINAL, APIError, ModelWorker

    for attempt in range(20):
        llm = StandIn()
        llm.gate.set()
        loop = asyncio.new_event_loop()
        worker = ModelWorker(llm, max_waiting=1000)
        admitted, refused, other = [], [], []
        start = threading.Barrier(5)

        def admit_many() -> None:
            start.wait()
            for _ in range(50):
                job = _job(loop, max_tokens=1)
                try:
                    worker.admit(job)
                    admitted.append(job)
                except APIError as exc:
                    refused.append(exc.status)
                except Exception as exc:  # noqa: BLE001 - the bug this test guards against
                    other.append(exc)

        threads = [threading.Thread(target=admit_many) for _ in range(4)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(0.0005 * attempt)
        worker.close()
        for t in threads:
            t.join(30)
        try:
            assert other == [] and set(refused) <= {503}, (other, refused)
            assert all(_events(loop, job)[-1] in TERMINAL for job in admitted)
            status = worker.status()
            assert status["waiting"] == status["running"] == 0, status
            assert status["completed"] + status["stopped_early"] == len(admitted), status
        finally:
            loop.close()


# ------------------------------------------------------------------ same request, same answer
# Two prompts past 64 tokens (the batch size at which this build's attention kernels switch), each 100-odd: the
# ones where reusing a cached prefix could change an answer.
SAME = ["Summarize this story: " + " ".join(f"On day {i} the farmer counted {i * 7} sheep and sold {i % 5} of them."
                                           for i in range(6)),
        "Read this and answer: " + " ".join(f"Box {i} holds {i * 3} red and {i % 4} blue marbles."
                                            for i in range(7)) + " Which box holds the most marbles?"]


def _concurrent_vs_alone(s: Server, alone: dict[str, list[int]]) -> None:
    """Four concurrent streams, two of each prompt, after other requests: each answer is the one sent alone."""
    def one(prompt: str) -> list[int]:
        final = None
        for chunk in chat(s.openai(), prompt, stream=True):
            final = chunk.model_extra.get("eagle") or final
        return final["tokens"]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(one, SAME * 2))
    for prompt, tokens in zip(SAME * 2, got):
        assert tokens == alone[prompt], prompt[:40]


def test_same_request_same_answer_alone_repeated_and_concurrent(server):
    """The default server (shipped head, auto budget, 1 thread): a long prompt's answer is `generate --plain`'s
    when sent first, again, after another prompt, and in four concurrent streams; `cache_prompt: true` (the
    request field llama-server has) reuses the whole cached prompt instead."""
    refs = {prompt: ref["tokens"] for prompt, ref in references_of(SAME).items()}
    client = server.openai()
    for prompt in (SAME[0], SAME[0], SAME[1], SAME[0]):
        assert chat(client, prompt).model_extra["eagle"]["tokens"] == refs[prompt]
    _concurrent_vs_alone(server, refs)
    chat(client, SAME[1])
    full = chat(client, SAME[1], extra_body={"cache_prompt": True}).model_extra["eagle"]
    assert full["prompt_tokens_reused"] == full["prompt_tokens"] - 1


@pytest.mark.all_cores
def test_same_request_same_answer_two_threads_plain(tmp_path):
    """A plain server on 2 threads (single-token decodes there split long KV ranges, so reuse is limited to
    aligned prompt cells): a request's answer alone on a fresh server is its answer after others and under
    concurrency."""
    s = start_server(tmp_path / "server.log", "--threads", "2", "--n-ctx", str(N_CTX), "--api-key", KEY, "--plain",
                     "--expose-stats")
    try:
        alone = {}
        for prompt in SAME:
            alone[prompt] = chat(s.openai(), prompt).model_extra["eagle"]["tokens"]
            again = chat(s.openai(), prompt).model_extra["eagle"]
            assert again["tokens"] == alone[prompt] and again["prompt_tokens_reused"] > 0
            chat(s.openai(), PROMPTS[0])
        assert chat(s.openai(), SAME[0]).model_extra["eagle"]["tokens"] == alone[SAME[0]]
        _concurrent_vs_alone(s, alone)
    finally:
        stop_server(s)


def test_stats_totals_sum_the_host_time():
    """/stats sums the generations' host time (rounds' wall time minus llama.cpp) and reports it per round and
    per drafted node over all of them; the last generation's figures stay under "last"."""
    from eagle2_local.server.ledger import GenerationTotals
    totals = GenerationTotals()
    first = GenerationStats(n_tokens=10, target_passes=4, pass_tokens=10, rounds=4, tree_sizes={11: 4},
                            llama_s=0.5, host_draft_s=0.02, host_verify_s=0.01)
    plain = GenerationStats(n_tokens=5, target_passes=5, pass_tokens=5, rounds=5, llama_s=0.3,
                            host_verify_s=0.005)
    totals.add(first)
    totals.add(plain)
    d = totals.as_dict()
    assert d["generations"] == 2 and d["n_tokens"] == 15 and d["tau"] == round(15 / 9, 4)
    assert d["rounds"] == 9 and d["llama_s"] == 0.8 and d["host_s"] == pytest.approx(0.035)
    assert d["host_ms_per_round"] == pytest.approx(35 / 9, abs=1e-4)
    assert d["host_draft_ms_per_round"] == pytest.approx(20 / 9, abs=1e-4)
    assert d["host_us_per_node"] == pytest.approx(875.0) and d["last"] == plain.as_dict()


# ------------------------------------------------------------------ structured output
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "likes_tea": {"type": "boolean"}},
          "required": ["name", "age", "likes_tea"], "additionalProperties": False}


def test_response_format_json_schema_with_the_official_client(server, smollm2_path):
    """OpenAI's response_format (whole and streamed) and llama-server's json_schema and grammar fields: the
    answers parse and validate against what the schema's grammar enforces (a prefix of it where cut at
    max_tokens), or match the grammar."""
    import jsonschema

    client = server.openai()
    ask = [{"role": "user", "content": "Describe Ann, 31, who likes tea, as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    grammar = Grammar.from_json_schema(PERSON)
    enforced = {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer"}}}  # no min/max in GBNF
    vocab = LlamaModel(smollm2_path)
    try:
        whole = client.chat.completions.create(model=NAME, messages=ask, temperature=0, max_tokens=160,
                                               response_format=fmt)
        assert_follows_grammar(vocab, whole.choices[0].model_dump(), grammar,
                               lambda v: jsonschema.validate(v, enforced))
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=NAME, messages=ask, temperature=0, max_tokens=160, response_format=fmt, stream=True)
            if c.choices)
        assert streamed == whole.choices[0].message.content
        sampled = client.chat.completions.create(model=NAME, messages=ask, temperature=1.0, seed=3, max_tokens=160,
                                                 extra_body={"json_schema": PERSON})
        assert_follows_grammar(vocab, sampled.choices[0].model_dump(), grammar,
                               lambda v: jsonschema.validate(v, enforced))
    finally:
        vocab.close()
    yes_no = client.completions.create(model=NAME, prompt="Is the sky blue? Answer:", max_tokens=4, temperature=0,
                                       extra_body={"grammar": 'root ::= " yes" | " no"'})
    assert yes_no.choices[0].text in (" yes", " no")


# ------------------------------------------------------------------ tool calls
TOOLS_TEMPLATE = Path(__file__).resolve().parents[2] / "eagle2_local" / "data" / "templates" / "chatml-tools.jinja"
WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "unit": {"type": "string", "enum": ["C", "F"]}},
                "required": ["city", "unit"], "additionalProperties": False}
TIME_ARGS = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
             "required": ["timezone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER_ARGS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                           "parameters": TIME_ARGS}}]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_server(smollm2_path, tmp_path_factory):
    """The default model and head with the vendored ChatML tools template (SmolLM2's own renders no tools); a
    fixed tree, so that no calibration runs. Without --expose-stats, as users get it."""
    s = start_server(tmp_path_factory.mktemp("serve-tools") / "server.log", *PRIVATE_ARGS, "--budget", "fixed",
                     "--total-tokens", "12", "--depth", "4", "--chat-template-file", str(TOOLS_TEMPLATE))
    yield s
    alive = s.proc.poll() is None
    stop_server(s)
    assert alive, "the server died during the tests"


def streamed_calls(chunks) -> tuple[list[tuple[str, str]], str | None, str]:
    """(name, arguments) per call index, the finish reason and the content, from a chat stream's deltas."""
    calls: dict[int, list[str]] = {}
    reason, content = None, ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                if tc.id is not None:
                    assert tc.index not in calls and tc.type == "function" and tc.function.name
                    calls[tc.index] = [tc.function.name, ""]
                calls[tc.index][1] += tc.function.arguments or ""
            reason = choice.finish_reason or reason
    return [tuple(c) for c in calls.values()], reason, content


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_required_and_named_with_the_official_client(tools_server, choice):
    """A constrained answer is one call whose arguments validate against the function's schema; streamed, it
    reassembles to the same call (id and name first, then the arguments)."""
    import jsonschema

    client = tools_server.openai()
    whole = client.chat.completions.create(model=NAME, messages=WEATHER_Q, tools=TOOLS, tool_choice=choice,
                                           temperature=0, max_tokens=60)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and message.content is None
    (call,) = message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER_ARGS if call.function.name == "get_weather" else TIME_ARGS)
    calls, reason, content = streamed_calls(client.chat.completions.create(
        model=NAME, messages=WEATHER_Q, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=60, stream=True))
    assert calls == [(call.function.name, call.function.arguments)] and reason == "tool_calls" and content == ""


def test_tool_choice_auto_reads_the_models_own_call_and_results_render(tools_server):
    """Two earlier turns answered by calls: SmolLM2 answers the third by a <tool_call> of its own, read as a call
    (whole and streamed alike); then a conversation with the call's result gets a content answer."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = []
    for city in ("Rome", "Oslo"):
        earlier = {"id": f"call_{city}", "type": "function",
                   "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        msgs += [{"role": "user", "content": f"Weather in {city}?"},
                 {"role": "assistant", "content": None, "tool_calls": [earlier]},
                 {"role": "tool", "tool_call_id": f"call_{city}", "content": "{\"temp\": 20}"},
                 {"role": "assistant", "content": "20 degrees."}]
    msgs.append({"role": "user", "content": "Weather in Paris?"})
    client = tools_server.openai()
    whole = client.chat.completions.create(model=NAME, messages=msgs, tools=tools, temperature=0, max_tokens=40)
    assert whole.choices[0].finish_reason == "tool_calls", whole.choices[0].message.content
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    calls, reason, _ = streamed_calls(client.chat.completions.create(model=NAME, messages=msgs, tools=tools,
                                                                     temperature=0, max_tokens=40, stream=True))
    assert calls == [(call.function.name, call.function.arguments)] and reason == "tool_calls"
    answered = msgs + [whole.choices[0].message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": call.id, "content": "{\"temp\": 18}"}]
    after = client.chat.completions.create(model=NAME, messages=answered, tools=tools, tool_choice="none",
                                           temperature=0, max_tokens=12)
    assert after.choices[0].message.content and not after.choices[0].message.tool_calls


BAD_TOOLS = [  # (what, body fields, param); each a 400 in OpenAI's shape, nothing generated
    ("parameters not an object schema", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array", "items": {"type": "string"}}}}]}, "tools"),
    ("unsupported schema feature", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}]}, "tools"),
    ("named choice not among the tools", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {
        "name": "get_stock"}}}, "tool_choice"),
    ("malformed tools entry", {"tools": [{"type": "function", "name": "get_weather"}]}, "tools"),
    ("tools and response_format", {"tools": TOOLS, "tool_choice": "required",
                                   "response_format": {"type": "json_object"}}, "tool_choice"),
    ("tool call arguments not JSON", {"messages": WEATHER_Q + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}]}]}, None),
]


@pytest.mark.parametrize("what,fields,param", BAD_TOOLS, ids=[b[0] for b in BAD_TOOLS])
def test_bad_tools_get_a_400_and_nothing_is_generated(tools_server, what, fields, param):
    with tools_server.http() as http:
        before = http.get("/stats").json()["generations"]
        r = http.post(CHAT, json={"messages": WEATHER_Q, "max_tokens": 8, **fields})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param and "\n" not in err["message"]
        assert http.get("/stats").json()["generations"] == before


# ------------------------------------------------------------------ faults and what clients learn of each other
RANGES = [("temperature", -1), ("top_p", 2), ("top_p", 0), ("top_k", -1), ("min_p", 1), ("repeat_penalty", 0)]


@pytest.mark.parametrize("field,value", RANGES, ids=[f"{f}={v}" for f, v in RANGES])
def test_a_value_out_of_range_names_its_parameter(field, value):
    """As OpenAI does: a 400 whose ``param`` is the field to change, on both endpoints."""
    from fastapi.testclient import TestClient

    from eagle2_local.server import create_app

    with TestClient(create_app(StandIn(), model_name="m")) as http:
        for path, body in ((COMPLETIONS, {"prompt": [1, 2]}), (CHAT, {"messages": [{"role": "user", "content": "x"}]})):
            r = http.post(path, json={**body, "max_tokens": 1, field: value})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == field and err["type"] == "invalid_request_error" and field in err["message"]


def test_framework_errors_are_labelled_by_their_status():
    """Not every error the framework raises is a 405: each status has its own OpenAI-style label."""
    from eagle2_local.server.errors import status_label

    codes = {400: "bad_request", 401: "invalid_api_key", 403: "forbidden", 404: "not_found",
             405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type", 422: "invalid_value",
             429: "rate_limit_exceeded", 503: "service_unavailable", 451: "unavailable_for_legal_reasons",
             507: "insufficient_storage"}
    for status, code in codes.items():
        assert status_label(status) == ("server_error" if status >= 500 else "invalid_request_error", code)


def test_the_tool_calls_message_shows_the_shape_once():
    from eagle2_local.chat.templates import validate_messages
    from eagle2_local.errors import Eagle2Error

    with pytest.raises(Eagle2Error) as err:
        validate_messages([{"role": "assistant", "content": None, "tool_calls": "x"}])
    assert str(err.value).endswith("{'function': {'name': str, 'arguments': JSON text}}"), str(err.value)


def test_max_queue_0_answers_one_at_a_time_and_refuses_only_while_busy():
    """``--max-queue 0``: nothing waits. An idle server answers; a busy one refuses with 503 + Retry-After, also
    before a body is read (a place); once the answer is done the next request is answered again."""
    from eagle2_local.server import APIError, ModelWorker

    llm = StandIn()
    loop = asyncio.new_event_loop()
    worker = ModelWorker(llm, max_waiting=0)
    try:
        first = _job(loop, max_tokens=1)
        worker.reserve()
        worker.admit(first)
        assert llm.started.wait(30)
        for take in (lambda: worker.admit(_job(loop)), worker.reserve):
            with pytest.raises(APIError) as busy:
                take()
            assert busy.value.status == 503 and int(busy.value.headers["Retry-After"]) >= 1
            assert "no request may wait" in busy.value.message
        llm.gate.set()
        assert _events(loop, first)[-1] == "done"
        worker.release()
        deadline = time.monotonic() + 30
        while worker.status()["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        worker.reserve()  # idle again: a place and a queue slot for the next request
        second = _job(loop, max_tokens=1)
        worker.admit(second)
        assert _events(loop, second)[-1] == "done"
        worker.release()
        assert worker.status()["places_taken"] == 0
    finally:
        llm.gate.set()
        worker.close()
        loop.close()
    help_text = subprocess.run([sys.executable, "-m", "cli", "serve", "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    assert "0: none waits" in " ".join(help_text.split())


def test_default_responses_carry_only_what_the_request_alone_decides(tools_server):
    """Without --expose-stats a response's ``eagle`` holds the token counts and ids, nothing another client's
    request changes (prefix reuse, prefill time, τ, the budget); /stats shows totals, not the last generation."""
    client = tools_server.openai()
    for _ in range(2):  # the second reuses the first's prefix: the figure that would tell
        whole = chat(client, PROMPTS[0], max_tokens=8)
    assert set(whole.model_extra["eagle"]) == {"engine", "prompt_tokens", "n_tokens", "tokens"}
    finals = [c.model_extra["eagle"] for c in chat(client, PROMPTS[0], max_tokens=8, stream=True)
              if c.model_extra.get("eagle")]
    assert finals == [whole.model_extra["eagle"]]
    with tools_server.http() as http:
        totals = http.get("/stats").json()
    assert "last" not in totals and totals["generations"] >= 3 and "prompt_tokens_reused" not in json.dumps(totals)


def test_exposed_statistics_name_the_calibration_cache_not_its_path(server):
    """--expose-stats shows everything, the budget's calibration included, by its file name: a path would show
    the directory (and the user the server runs as)."""
    eagle = chat(server.openai(), PROMPTS[2], max_tokens=4).model_extra["eagle"]
    assert "prefill_s" in eagle and "prompt_tokens_reused" in eagle
    calibration = eagle["budget"]["calibration"]
    file = calibration["file"]  # None when a loaded machine disturbed the calibration: then nothing was cached
    assert (file.startswith("costs-") and file.endswith(".json") and "/" not in file if file is not None
            else "not cached" in calibration["source"])
    with server.http() as http:
        stats = http.get("/stats").json()
    assert stats["last"]["budget"]["calibration"]["file"] == file
    assert os.environ["EAGLE2_LOCAL_CACHE"] not in json.dumps(eagle) + json.dumps(stats)


def _until_closed():
    """benchmarks/server_faults.py's ``until_closed``: read a raw connection until the server closes it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("server_faults", Path(__file__).resolve().parents[2]
                                                  / "benchmarks" / "server_faults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.until_closed


def test_connections_that_send_nothing_are_closed(server):
    """--idle-timeout: a connection that stays silent, one that trickles half a request head, one that stops in
    the middle of its body (408) and a kept-alive one after its answer are all closed after IDLE_S seconds."""
    host, port = server.base.removeprefix("http://").split(":")
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n").encode()
    cases = {"silent": (b"", b""), "half a head, a byte at a time": (b"GET /health HTTP/1.1\r\n", b"X-Slow: " * 40),
             "half a body": (head + b'{"messages"', b""),
             "kept alive after an answer": (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"")}

    until_closed = _until_closed()

    def one(sent: tuple[bytes, bytes]) -> tuple[float | None, bytes]:
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            raw.sendall(sent[0])
            return until_closed(raw, IDLE_S + 10, sent[1])

    with ThreadPoolExecutor(len(cases)) as pool:
        results = dict(zip(cases, pool.map(one, cases.values())))
    for what, (took, got) in results.items():
        assert took is not None and IDLE_S - 0.5 < took < IDLE_S + 3, (what, took, got[:200])
    assert results["half a body"][1].startswith(b"HTTP/1.1 408"), results["half a body"][1][:200]
    assert b'"request_timeout"' in results["half a body"][1]
    assert results["kept alive after an answer"][1].startswith(b"HTTP/1.1 200")
    assert server.health()["queue"]["places_taken"] == 0


# ~600 tokens: a prompt whose evaluation takes long enough to leave during it
STORY = "Retell this story: " + " ".join(
    f"On day {i} the miller weighed {i * 11} sacks and gave {i % 4} away." for i in range(30))


def test_a_client_that_leaves_during_its_prompt_stops_the_prompt(server, references):
    """Leaving while a long prompt is evaluated stops it between two prompt batches: the model is free at
    once, not after the whole prompt, and the next answers are the ones a fresh server gives."""
    client = server.openai()
    alone = chat(client, "Now " + STORY, max_tokens=1).model_extra["eagle"]
    assert alone["prompt_tokens"] > 500 and alone["prefill_s"] > 0.3, alone
    stopped = server.health()["queue"]["stopped_early"]
    with server.http() as http, http.stream("POST", CHAT, json={
            "messages": [{"role": "user", "content": STORY}], "max_tokens": 8, "stream": True}) as r:
        assert next(r.iter_lines()).startswith("data: ")  # the role chunk: admitted, its prompt being evaluated
        time.sleep(0.1)
    left = time.monotonic()
    q = server.idle_queue(alone["prefill_s"] + 10)
    freed = time.monotonic() - left
    assert q["stopped_early"] == stopped + 1 and freed < alone["prefill_s"] / 2, (freed, alone["prefill_s"])
    # the cache after a cancelled prompt: tests/integration/test_determinism.py checks longer answers more closely
    assert chat(client, PROMPTS[3]).model_extra["eagle"]["tokens"] == references[PROMPTS[3]]["tokens"]
