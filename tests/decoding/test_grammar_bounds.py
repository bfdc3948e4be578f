"""Schemas judged before anything is expanded (issue 74): every count, quantifier, enum, depth and the estimated
grammar size is bounded, refused in one line naming the place and the field, within milliseconds and without the
process growing; the conversion runs in the memory-limited child and its verdict is cached; a flat enum of
10,000 values is written as a prefix tree that llama.cpp follows in milliseconds, not seconds per token."""

from __future__ import annotations

import resource

import pytest

from eagle2_local.decoding import grammar_screen
from eagle2_local.decoding.grammar import Grammar, GrammarError
from eagle2_local.decoding.grammar_bounds import MAX_COUNT, MAX_DEPTH, MAX_ENUM_VALUES, check_schema
from eagle2_local.llamacpp.llama import LlamaModel

INTS = {"type": "integer"}
HOSTILE = [  # (schema, the field the message must name)
    ({"type": "array", "items": INTS, "minItems": 10_000_000}, "schema.minItems"),
    ({"type": "array", "items": INTS, "maxItems": 10 ** 9}, "schema.maxItems"),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 10 ** 8}}},
     "schema.properties.s.maxLength"),
    ({"type": "object", "minProperties": 50_000}, "schema.minProperties"),
    ({"type": "string", "pattern": "^(ab){1,99999999}$"}, "schema.pattern"),
    ({"type": "string", "pattern": "^a{" + "9" * 5000 + "}$"}, "schema.pattern"),
    ({"type": "array", "items": {"type": "array", "items": {"type": "string", "pattern": "^x{3000,}$"}}},
     "schema.items.items.pattern"),
    ({"enum": list(range(MAX_ENUM_VALUES + 1))}, "schema.enum"),
    ({"type": "array", "items": INTS, "minItems": -1}, "schema.minItems"),
    ({"type": "array", "items": INTS, "minItems": 2.5}, "schema.minItems"),
]


@pytest.mark.parametrize("schema, field", HOSTILE, ids=[f for _, f in HOSTILE])
def test_hostile_counts_are_refused_before_anything_is_expanded(schema, field):
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(GrammarError) as refused:
        Grammar.from_json_schema(schema)
    message = str(refused.value)
    assert field in message and "\n" not in message, message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kb < 64 * 1024


def test_many_counts_within_bounds_add_up_to_a_refusal():
    """Each count within its bound, but together a grammar of megabytes: the estimate refuses it unexpanded."""
    props = {f"p{i}": {"type": "array", "items": INTS, "minItems": MAX_COUNT} for i in range(40)}
    with pytest.raises(GrammarError, match="would be over"):
        check_schema({"type": "object", "properties": props})


def test_depth_and_size_are_bounded_without_recursion():
    deep: dict = {"type": "integer"}
    for _ in range(50_000):  # far past Python's recursion limit: the walk is iterative
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError, match=f"more than {MAX_DEPTH} levels"):
        check_schema(deep)
    with pytest.raises(GrammarError, match="more than 100000 values"):
        check_schema({"type": "integer", "examples": [[1]] * 200_000})


def test_ordinary_schemas_pass():
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 1, "maxItems": 8},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"}, "kind": {"enum": ["a", "b", 3, None]}},
        "required": ["tags", "code"]}
    check_schema(schema)
    assert "root ::=" in Grammar.from_json_schema(schema).gbnf


def test_the_verdict_is_cached_and_the_conversion_runs_in_a_child(monkeypatch):
    """The first conversion of a schema runs the child once; the same schema again, and its refusal again, run
    nothing (a refusal of the converter is cached as well)."""
    runs = []
    real = grammar_screen.subprocess.run
    monkeypatch.setattr(grammar_screen.subprocess, "run", lambda *a, **k: runs.append(a[0]) or real(*a, **k))
    schema = {"type": "object", "properties": {"cached_only_here": {"type": "string", "maxLength": 7}}}
    first = Grammar.from_json_schema(schema)
    assert len(runs) == 1 and "--schema" in runs[0]
    assert Grammar.from_json_schema(schema) == first and len(runs) == 1
    unsupported = {"type": "string", "pattern": "no anchors, cached"}
    for _ in range(2):
        with pytest.raises(GrammarError, match="must start with"):
            Grammar.from_json_schema(unsupported)
    assert len(runs) == 2


@pytest.mark.smollm2
def test_a_flat_enum_of_10000_values_costs_milliseconds(smollm2_path, monkeypatch):
    """Issue 74: a flat 10,000-value enum was refused after 3.9 s on every request (llama.cpp keeps one parse
    stack per alternative). As a prefix tree: converted once, then a cached lookup, and a mask over the
    vocabulary far below the one-second step limit; a value of the enum is followed to the end."""
    values = [f"item-{i:05d}" for i in range(10_000)]
    schema = {"type": "object", "properties": {"pick": {"enum": values}}, "required": ["pick"]}
    grammar = Grammar.from_json_schema(schema)
    conversions = []
    monkeypatch.setattr(grammar_screen, "_convert", lambda text: conversions.append(text))  # a second one fails
    again = Grammar.from_json_schema(schema)
    assert again == grammar and conversions == []  # the cached verdict: neither judged nor converted again
    model = LlamaModel(smollm2_path)
    try:
        grammar.check(model)
        state = grammar.state(model)  # a mask past the grammar's one-second step limit would raise
        for token in model.tokenize('{"pick": "item-04217"}', add_special=False):
            assert state.allows(token)
            state.mask()
            state.accept(token)
        assert state.allows(model.eos)
        state.close()
    finally:
        model.close()
