"""A server that clients share (issue 74): a client is an API key; slow senders hold no place in the queue; bodies
are read only by the routes that use them, within a bounded room; a full server says what fills it and when to
come back; one client's prompt cache, statistics and counters are not another's; accepted sockets send at once
(TCP_NODELAY). The real server in a subprocess (tests/server/test_server.py's helpers), the official ``openai`` client,
httpx and raw sockets; assertions on what the server reports, never on how long anything took."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, closing, contextmanager
from typing import Iterator

import httpx
import openai
import pytest

from tests.server.test_server import CHAT, COMPLETIONS, N_CTX, NAME, Server, start_server, stop_server

pytestmark = pytest.mark.smollm2

ALICE, BOB, ADMIN = "alice-key", "bob-key", "admin-key"
IDLE_S = 3
SHARED_ARGS = ("--plain", "--threads", "1", "--n-ctx", str(N_CTX), "--api-key", f"{ALICE},spare-key", "--admin-key",
               ADMIN, "--idle-timeout", str(IDLE_S))  # and BOB's key in an --api-key-file
PROMPT = "Tell me a short story about a lighthouse keeper and his cat."


@contextmanager
def running(tmp_path_factory, name: str, *args: str) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp(name)
    (folder / "keys.txt").write_text(f"\n{BOB}\n")
    s = start_server(folder / "server.log", *SHARED_ARGS, "--api-key-file", str(folder / "keys.txt"), *args)
    try:
        yield s
    finally:
        alive = s.proc.poll() is None
        stop_server(s)
    assert alive, "the server died during the tests"


@pytest.fixture(scope="module")
def private(smollm2_path, tmp_path_factory):
    """Two keys and an admin key, nothing exposed: what a team gets by default."""
    with running(tmp_path_factory, "serve-private", "--max-queue", "2") as s:
        yield s


@pytest.fixture(scope="module")
def exposed(smollm2_path, tmp_path_factory):
    """Two keys, every statistic in every response (so the reused prefix can be read), each key its own cache."""
    with running(tmp_path_factory, "serve-exposed", "--expose-stats") as s:
        yield s


def client(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key=key, max_retries=0, timeout=120)


def reused(server: Server, key: str, prompt: str = PROMPT, **kw) -> tuple[int, list[int]]:
    """The prompt tokens a greedy request of ``key`` found in the cache, and its answer's tokens."""
    out = client(server, key).chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}],
                                                      max_tokens=4, temperature=0, **kw)
    eagle = out.model_extra["eagle"]
    return eagle["prompt_tokens_reused"], eagle["tokens"]


def get(server: Server, path: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(server.base + path, headers=headers, timeout=30)


def test_an_empty_key_file_is_an_error_not_an_open_server(tmp_path):
    (tmp_path / "keys.txt").write_text("\n  \n")
    out = subprocess.run([sys.executable, "-m", "cli", "serve", "--api-key-file", str(tmp_path / "keys.txt")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].endswith("holds no key"), out.stderr


# ------------------------------------------------------------------ isolation
def test_a_key_reuses_only_its_own_cached_prompt(exposed):
    """Alice's prompt cached, Bob's identical prompt is evaluated whole (he cannot learn that she sent it, from
    his own statistics or from the time it takes); Alice's next request starts from an empty cache too, and a
    key's own repeat reuses its prefix. Every answer is the same."""
    _, first = reused(exposed, ALICE)
    n, again = reused(exposed, ALICE)
    assert n > 0 and again == first
    n, bobs = reused(exposed, BOB)
    assert n == 0 and bobs == first
    n, after = reused(exposed, ALICE)
    assert n == 0 and after == first


def test_share_prompt_cache_lets_keys_reuse_each_other(smollm2_path, tmp_path_factory):
    with running(tmp_path_factory, "serve-shared", "--expose-stats", "--share-prompt-cache") as s:
        _, alices = reused(s, ALICE)
        n, bobs = reused(s, BOB)
        assert n > 0 and bobs == alices


def test_stats_and_health_show_each_key_its_own_figures(private):
    """/stats and /health: each key its own generations and outcomes, the admin key every client's; /health
    answers anyone (a liveness probe) but shows its queue only to a key."""
    base = {who: get(private, "/stats", who).json()["generations"] for who in (ALICE, BOB, ADMIN)}
    for key in (ALICE, ALICE, BOB):
        out = client(private, key).completions.create(model=NAME, prompt="Hello", max_tokens=2)
        assert out.usage.completion_tokens > 0
    mine = {who: get(private, "/stats", who).json() for who in (ALICE, BOB, ADMIN)}
    assert mine[ALICE]["generations"] - base[ALICE] == 2 and mine[ALICE]["clients"] == "yours"
    assert mine[BOB]["generations"] - base[BOB] == 1
    assert mine[ADMIN]["generations"] - base[ADMIN] == 3 and mine[ADMIN]["clients"] == "all"
    assert "last" not in mine[ADMIN]
    assert get(private, "/stats").status_code == 401 and get(private, "/stats", "wrong").status_code == 401
    for who in (None, "wrong"):
        anonymous = get(private, "/health", who)
        assert anonymous.status_code == 200 and anonymous.json()["status"] == "ok"
        assert "queue" not in anonymous.json()
    queues = {who: get(private, "/health", who).json()["queue"] for who in (ALICE, BOB, ADMIN)}
    assert queues[ADMIN]["completed"] >= queues[ALICE]["completed"] + queues[BOB]["completed"]
    assert queues[ALICE]["completed"] >= 2 and queues[BOB]["completed"] >= 1


# ------------------------------------------------------------------ slow senders and bodies
def _slow_body(server: Server, key: str, path: str = CHAT) -> socket.socket:
    """A connection that sends a request head announcing 100 bytes of body, then one byte of it."""
    host, port = server.base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode())
    return sock


def test_slow_senders_take_no_place_in_the_queue(private):
    """Twenty connections (more than the 3 places of --max-queue 2) each send a head and one byte of their body:
    they hold no place, so another client's stream and Alice's own request are answered meanwhile; the slow
    ones are then answered 408 at their body deadline."""
    with ExitStack() as stack:
        slow = [stack.enter_context(closing(_slow_body(private, ALICE))) for _ in range(20)]
        assert get(private, "/health", ADMIN).json()["queue"]["places_taken"] == 0
        parts = [c.choices[0].delta.content or "" for c in client(private, BOB).chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True) if c.choices]
        assert "".join(parts)
        assert client(private, ALICE).completions.create(model=NAME, prompt="Hi", max_tokens=2).choices[0].text
        for sock in slow:
            sock.settimeout(IDLE_S + 10)
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
    assert get(private, "/health", ADMIN).json()["queue"]["places_taken"] == 0


def test_one_clients_slow_senders_are_bounded_and_others_still_answered(private):
    """A client's share of the bodies being read (128) is full: its next body is refused at once with 429,
    while another key is still read and answered."""
    from eagle2_local.server.clients import READERS_PER_CLIENT

    import selectors

    with ExitStack() as stack, selectors.DefaultSelector() as ready:
        for _ in range(READERS_PER_CLIENT + 1):  # one more than the share: the first answer is its 429
            ready.register(stack.enter_context(closing(_slow_body(private, ALICE))), selectors.EVENT_READ)
        (first, _), *_ = ready.select(timeout=30)
        assert _until_closed(first.fileobj).startswith(b"HTTP/1.1 429")
        assert client(private, BOB).completions.create(model=NAME, prompt="Hi", max_tokens=2).choices[0].text


def test_bodies_to_other_routes_are_never_read(private):
    """A body sent to /health, /docs, /openapi.json, /stats or an unknown route is not read: the answer comes
    before the body does, and the connection is closed after it. Two hundred such connections sending 1 MiB
    each (fifty at once) leave the server's memory where it was (read, they would hold 50 MiB)."""
    host, port = private.base.removeprefix("http://").split(":")
    for path in ("/health", "/docs", "/openapi.json", "/stats", "/v1/nowhere"):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
                          f"Content-Length: {1 << 20}\r\n\r\n").encode())
            got = _until_closed(sock)
            assert got.split(b" ", 2)[1] in (b"200", b"404") and b"connection: close" in got.lower(), (path, got)
    before, peak, stop = _rss_mib(private), [0.0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            peak[0] = max(peak[0], _rss_mib(private))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    body = b"x" * (1 << 20)

    def flood(_: int) -> None:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            try:
                sock.sendall(f"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                             + body)
            except OSError:  # the server answered and closed without reading: what it should do
                pass
            _until_closed(sock)

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(50) as pool:
        list(pool.map(flood, range(200)))
    stop.set()
    sampler.join()
    assert peak[0] - before < 32, (before, peak[0])
    assert get(private, "/health").json()["status"] == "ok"


def _until_closed(sock: socket.socket) -> bytes:
    got = b""
    while chunk := _recv(sock):
        got += chunk
    return got


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _rss_mib(server: Server) -> float:
    with open(f"/proc/{server.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


# ------------------------------------------------------------------ a full server
def test_a_full_server_says_what_fills_it(private):
    """--max-queue 2: one answered and two waiting; the next request's 503 names those numbers and asks to come
    back in at least a second (the median recent service time per request ahead)."""
    long = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "stream": True}
    auth = {"Authorization": f"Bearer {ALICE}"}
    with httpx.Client(base_url=private.base, headers=auth, timeout=60) as http, ExitStack() as streams:
        for _ in range(3):
            assert streams.enter_context(http.stream("POST", COMPLETIONS, json=long)).status_code == 200
        r = http.post(COMPLETIONS, json=long)
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        message = r.json()["error"]["message"]
        assert "1 request being answered, 2 waiting (at most 2 may wait)" in message, message
        assert int(r.headers["Retry-After"]) >= 1 and f"retry in {r.headers['Retry-After']} s" in message
    assert idle(private)["places_taken"] == 0


def idle(server: Server, within_s: float = 30) -> dict:
    """The queue as the admin sees it once nothing runs or waits (or after ``within_s``)."""
    deadline = time.monotonic() + within_s
    while (q := get(server, "/health", ADMIN).json()["queue"])["running"] + q["waiting"] + q["places_taken"] \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    return q


def test_clients_take_turns_each_in_arrival_order():
    """Alice queues three requests while one of hers runs, then Bob one: Bob's runs next, not after all of
    Alice's; a client served last waits behind one that has waited."""
    from eagle2_local.server import ModelWorker
    from tests.server.test_server import StandIn, _events, _job

    class Recording(StandIn):
        def __init__(self) -> None:
            super().__init__()
            self.order: list[str] = []

        def stream(self, prompt, *args, **kwargs):
            self.order.append(prompt[0])
            return super().stream(prompt, *args, **kwargs)

        def reset(self) -> None:
            pass

    llm = Recording()
    loop = asyncio.new_event_loop()
    worker = ModelWorker(llm, max_waiting=8)
    try:
        jobs = []
        for name, client_ in (("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("b1", "bob"), ("c1", "carol")):
            job = _job(loop, max_tokens=1)
            job.prompt, job.client = [name], client_
            worker.admit(job)
            jobs.append(job)
            if name == "a1":
                assert llm.started.wait(30)  # a1 runs (held at the gate) while the others queue
        llm.gate.set()
        for job in jobs:
            assert _events(loop, job)[-1] == "done"
        assert llm.order == ["a1", "b1", "c1", "a2", "a3"], llm.order
    finally:
        llm.gate.set()
        worker.close()
        loop.close()


def test_turns_go_to_the_client_served_longest_ago():
    from eagle2_local.server.turns import Turns

    turns: Turns[str] = Turns()
    for client_, item in (("a", "a1"), ("a", "a2"), ("b", "b1")):
        turns.put(client_, item)
    assert turns.take() == "a1"  # the first to wait
    assert turns.take() == "b1"  # never served, before a's second
    turns.put("b", "b2")
    turns.put("c", "c1")
    assert [turns.take() for _ in range(3)] == ["c1", "a2", "b2"] and len(turns) == 0


def test_retry_after_is_the_median_service_time_per_request_ahead():
    from eagle2_local.server.ledger import Ledger

    ledger = Ledger()
    assert ledger.retry_after(3) == 3  # nothing measured yet: a second a request
    for seconds in (0.5, 4.0, 4.0, 100.0):
        ledger.ended("key 1", "completed", seconds)
    ledger.ended("key 1", "stopped_early", None)  # never ran: says nothing of the next one's time
    assert ledger.retry_after(3) == 12 and ledger.retry_after(0) == 4
    assert ledger.view("key 1").outcomes == {"completed": 4, "stopped_early": 1, "failed": 0}
    assert ledger.view("key 2").outcomes["completed"] == 0 and ledger.view(None).outcomes["completed"] == 4


def test_readers_bound_each_client_and_the_bytes_they_hold():
    from eagle2_local.server import APIError
    from eagle2_local.server.clients import Readers

    readers = Readers(total=4, per_client=2, budget=1000)
    readers.start("a")
    readers.start("a")
    with pytest.raises(APIError) as busy:
        readers.start("a")  # the client's own share is full: it is the one sending too much
    assert busy.value.status == 429 and busy.value.headers["Retry-After"] == "1"
    readers.start("b")
    readers.hold("b", 500)
    with pytest.raises(APIError) as busy:
        readers.hold("b", 1)  # half the budget is one client's most
    assert busy.value.status == 429
    readers.hold("a", 400)
    readers.start("c")
    with pytest.raises(APIError) as busy:
        readers.hold("c", 101)  # the whole budget: 500 + 400 + 101 > 1000
    assert busy.value.status == 503 and busy.value.code == "server_busy"
    with pytest.raises(APIError) as busy:
        readers.start("d")  # four bodies being read: the server's room is full
    assert busy.value.status == 503
    readers.finish("b", 500)
    readers.finish("a", 400)
    readers.finish("c", 0)
    assert readers.status() == {"reading": 1, "bytes": 0}


# ------------------------------------------------------------------ sockets
def test_accepted_connections_have_tcp_nodelay():
    """The listening socket :func:`listen` makes gives every accepted connection TCP_NODELAY (asyncio sets it
    on TCP sockets), read back with getsockopt on the server's side of a real connection through uvicorn."""
    import uvicorn

    from eagle2_local.server import listen
    from eagle2_local.server.timeouts import head_timeout_protocol

    seen: list[int] = []
    base = head_timeout_protocol(5)

    class Recording(base):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            super().connection_made(transport)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, http=Recording, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        with httpx.Client(timeout=30) as http:
            for _ in range(2):  # one kept-alive connection, two requests
                assert http.get(f"http://127.0.0.1:{sock.getsockname()[1]}/").text == "ok"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    assert seen and all(seen), seen
