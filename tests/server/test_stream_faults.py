"""A stream that fails after it started still ends as a stream ends: an OpenAI error event, then ``[DONE]`` (a
client reading with the official library or a raw SSE loop must not hang or see a cut stream), with the details
only in the server's log."""

from __future__ import annotations

import json

import pytest

from tests.server.test_server import CHAT, COMPLETIONS, StandIn


@pytest.mark.parametrize("path, body, response_class", [
    (COMPLETIONS, {"prompt": [1, 2], "max_tokens": 3, "stream": True}, "CompletionResponse"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}, "ChatResponse")])
def test_a_fault_inside_a_started_stream_ends_with_an_error_event_and_done(path, body, response_class, monkeypatch,
                                                                           caplog):
    from fastapi.testclient import TestClient

    from eagle2_local.chat import responses
    from eagle2_local.server import create_app

    def broken(self, text, *args):
        raise RuntimeError("secret detail of a parser bug")

    monkeypatch.setattr(getattr(responses, response_class), "deltas", broken)
    llm = StandIn()
    llm.gate.set()
    with TestClient(create_app(llm, model_name="m")) as http:
        r = http.post(path, json=body)
        assert r.status_code == 200  # the stream had started: its status was sent
        events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events
        error = json.loads(events[-2])["error"]
        assert error["code"] == "internal_error" and "secret" not in error["message"]
        assert http.get("/health").json()["status"] == "ok"
    assert any(rec.exc_info and "secret detail" in str(rec.exc_info[1]) for rec in caplog.records)
