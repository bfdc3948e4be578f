"""Stop strings matched in time linear in the answer (issue 74: 16 stop strings of 60K characters took seconds a
token), cutting exactly where a search of the whole text would, pieces held back exactly while they may begin a
stop; and the server's bounds on stop lists and sampling values: a clear 400 naming the field, a temperature
below the floor decoded greedily."""

from __future__ import annotations

import random

import pytest

from eagle2_local.decoding.stopping import StopMatcher, TokenEmitter
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.server.types import MAX_STOP_CHARS, MAX_STOPS, ChatRequest
from eagle2_local.tree.sampling import MIN_TEMPERATURE
from tests.server.test_server import test_a_value_out_of_range_names_its_parameter as names_its_parameter

TEXT = ("The quick brown fox jumps over the lazy dog. STOP here? Not yet: abab abcab, then END.\n\nUser: "
        "more text follows with a tab\tand caf\u00e9 and numbers 12345 6789.") * 3


def reference(text: str, stops: list[str]) -> str:
    """The answer a whole-text search would give: the text up to the earliest occurrence of any stop."""
    cuts = [text.find(s) for s in stops if s and s in text]
    return text[:min(cuts)] if cuts else text


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = LlamaModel(smollm2_path)
    yield m
    m.close()


def emit(model, tokens: list[int], stops: tuple[str, ...]) -> tuple[str, str, str | None]:
    e = TokenEmitter(model, max_tokens=10 ** 6, stop=stops)
    shown = "".join(e.push(t) for t in tokens) + e.finish("length")
    return shown, e.text, e.finish_reason


@pytest.mark.smollm2
def test_cuts_where_a_whole_text_search_does(model):
    tokens = model.tokenize(TEXT, add_special=False)
    whole = emit(model, tokens, ())[1]
    rng = random.Random(7)
    cases = [("STOP",), ("ab", "abc"), ("\n\nUser:",), ("zzz",), ("caf\u00e9 and", "lazy"), ("6789.The",)]
    for _ in range(40):  # stops cut from the text itself, at random places and lengths
        start = rng.randrange(len(whole) - 20)
        cases.append(tuple(whole[start:start + rng.randint(1, 15)] for _ in range(rng.randint(1, 3))))
    for stops in cases:
        shown, text, reason = emit(model, tokens, stops)
        assert text == reference(whole, list(stops)) and shown == text, stops
        assert reason == ("stop" if text != whole else "length")


def test_the_hold_is_the_longest_end_that_begins_a_stop():
    for stop, text, held in [("abcab", "xxabca", 4), ("aab", "aaa", 2), ("END", "the EN", 2), ("x", "abc", 0)]:
        m = StopMatcher(stop)
        assert m.feed(text) == -1 and m.matched == held


@pytest.mark.smollm2
def test_long_stop_lists_cost_time_linear_in_the_answer(model, monkeypatch):
    """16 stop strings of the largest length, none found, over a 3,000-token answer: whole-text searches and a
    hold-back that tried every prefix took minutes. Now each stop's matcher reads every character of the answer
    once: the work counted, not timed."""
    tokens = model.tokenize(TEXT, add_special=False) * 30
    stops = tuple(("ab" * MAX_STOP_CHARS)[i:i + MAX_STOP_CHARS - 1] + "!" for i in range(MAX_STOPS))
    fed: list[int] = []
    feed = StopMatcher.feed
    monkeypatch.setattr(StopMatcher, "feed", lambda self, text: fed.append(len(text)) or feed(self, text))
    shown, text, reason = emit(model, tokens, stops)
    assert reason == "length" and shown == text
    assert sum(fed) == MAX_STOPS * len(text)  # linear: no character read twice by any matcher


BAD = [("stop", ["s"] * (MAX_STOPS + 1)), ("stop", ["x" * (MAX_STOP_CHARS + 1)]), ("repeat_penalty", 1e-320),
       ("repeat_penalty", 1e9)]


@pytest.mark.parametrize("field, value", BAD, ids=["17 stops", "long stop", "penalty 1e-320", "penalty 1e9"])
def test_out_of_bounds_values_are_a_400_naming_the_field(field, value):
    names_its_parameter(field, value)  # both endpoints: 400, param and message naming the field


@pytest.mark.parametrize("temperature", [1e-308, 5e-324, MIN_TEMPERATURE / 2])
def test_a_temperature_below_the_floor_is_greedy(temperature):
    body = ChatRequest(messages=[{"role": "user", "content": "x"}], temperature=temperature)
    assert body.temperature == 0.0
    assert ChatRequest(messages=[{"role": "user", "content": "x"}], temperature=MIN_TEMPERATURE).temperature > 0
