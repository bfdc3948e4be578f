"""No grammar can take the server down (issue 45): the hanging grammar, the 60,000-parenthesis one and the other
known forms are each answered 400 within a second while another client's generation goes on and completes;
/health keeps answering; the server's memory stays within a stated bound; a grammar the model cannot follow is
a 400 before anything is sent, or a clean finish that says why after, never a 500."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from eagle2_local.decoding.grammar import GrammarError
from tests.decoding.test_grammar_screen import DEAD, HANGS, NESTED, WRAPS
from tests.server.test_server import CHAT, COMPLETIONS, SERVER_ARGS, StandIn, start_server, stop_server

pytestmark = pytest.mark.smollm2

PEAK_RSS_GROWTH_MB = 64
"""How much the server's peak resident memory (VmHWM) may grow while it refuses the bad grammars: the validator
parses at most 256 KB, and llama.cpp only ever compiles them in a child. Unguarded, the hanging grammar alone
grows the process by gigabytes a minute."""
BAD = [("hangs", HANGS, "left-recursive"), ("nested", NESTED, "deep"), ("dead end", DEAD, "matches no text"),
       ("wraps", WRAPS, "maximum is below")]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("serve-grammar") / "server.log", *SERVER_ARGS, "--plain")
    yield s
    alive = s.proc.poll() is None
    stop_server(s)
    assert alive, "the server died during the tests"


def _memory_kb(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}


def test_bad_grammars_get_400_within_a_second_while_another_request_completes(server):
    with server.http() as http:  # one generation first: the memory measured below is the steady state's
        assert http.post(CHAT, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).is_success
    before = _memory_kb(server.proc.pid)
    other: dict = {"text": ""}
    started = threading.Event()

    def long_generation() -> None:
        with server.http() as http, http.stream("POST", COMPLETIONS, json={
                "prompt": "Once upon a time", "max_tokens": 160, "temperature": 0, "stream": True}) as r:
            other["status"] = r.status_code
            for line in r.iter_lines():
                started.set()
                other["text"] += line
        other["done_at"] = time.monotonic()

    thread = threading.Thread(target=long_generation)
    thread.start()
    assert started.wait(60), "the other request never started streaming"
    answered_at = 0.0
    with server.http() as http:
        for name, text, needle in BAD:
            for path, body in ((COMPLETIONS, {"prompt": "Hi", "max_tokens": 4, "grammar": text}),
                               (CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                       "grammar": text, "stream": True})):
                t0 = time.perf_counter()
                r = http.post(path, json=body, timeout=10)
                elapsed = time.perf_counter() - t0
                assert r.status_code == 400, (name, r.text)
                assert elapsed < 1.0, f"{name}: answered after {elapsed:.2f} s"
                err = r.json()["error"]
                assert err["param"] == "grammar" and needle in err["message"] and "\n" not in err["message"]
            assert httpx.get(server.base + "/health", timeout=1).status_code == 200, name
        answered_at = time.monotonic()
    thread.join(120)
    assert other["status"] == 200 and '"finish_reason":"length"' in other["text"].replace(" ", "")
    assert other["done_at"] > answered_at, "the other request had finished before the bad ones were answered"
    after = _memory_kb(server.proc.pid)
    assert after["VmHWM"] - before["VmHWM"] < PEAK_RSS_GROWTH_MB * 1024, (before, after)
    assert server.health()["status"] == "ok"


def test_json_schema_count_past_the_bound_is_a_400(server):
    """The JSON-schema converter nests one group per optional character: maxLength 5000 would nest 5000 deep. The
    count is judged before anything is expanded (decoding/grammar_bounds.py), and the refusal names the field."""
    with server.http() as http:
        r = http.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 4,
                                         "json_schema": {"type": "string", "maxLength": 5000}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "json_schema"
    assert "maxLength is 5000" in r.json()["error"]["message"], r.text


def test_a_grammar_the_vocabulary_cannot_follow(server):
    """Nothing allowed at the start (a token id beyond the vocabulary): a 400 before the request is queued. A
    dead end after some text: the text so far, finish_reason "stop" and the reason in eagle.finish_detail."""
    with server.http() as http:
        r = http.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 4, "grammar": "root ::= <[99999999]>"})
        assert r.status_code == 400 and "no token" in r.json()["error"]["message"], r.text
        r = http.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 8, "temperature": 0,
                                         "grammar": 'root ::= "a" <[99999999]>'})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["choices"][0]["text"] == "a" and answer["choices"][0]["finish_reason"] == "stop"
        assert "allows no further token" in answer["eagle"]["finish_detail"]
    assert server.health()["status"] == "ok"


def test_grammar_error_before_any_text_is_a_400_not_a_500():
    """The worker's side, without a model: a GrammarError raised as generation starts is the client's (400)."""
    from fastapi.testclient import TestClient

    from eagle2_local.server import create_app

    with TestClient(create_app(StandIn(GrammarError("the grammar allows no token here")), model_name="m")) as http:
        r = http.post(COMPLETIONS, json={"prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert "cannot follow the grammar" in r.json()["error"]["message"]
        assert http.get("/health").status_code == 200
