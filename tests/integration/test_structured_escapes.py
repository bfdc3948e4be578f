"""Structured output that always parses (issue 74): constants and property names holding backslashes, tabs,
newlines, quotes, control characters and non-ASCII text are written by the grammar as JSON writes them, patterns
too; sampled answers under ``response_format`` parse with ``json.loads`` and validate with ``jsonschema``;
pydantic-shaped tools (``$defs`` / ``$ref``) work under every ``tool_choice``; tool names are matched whole; and
no model output, however malformed or deep, makes reading tool calls raise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from eagle2_local import Eagle2
from eagle2_local.chat.tool_calls import HERMES, LLAMA3, AnswerStream, ToolError, plan_tools
from eagle2_local.decoding.grammar import Grammar

pytestmark = pytest.mark.smollm2

ROOT = Path(__file__).resolve().parents[2]
TOOLS_TEMPLATE = ROOT / "eagle2_local" / "data" / "templates" / "chatml-tools.jinja"
TRICKY = ["back\\slash", "tab\there", "new\nline", 'say "hi"', "bell\x07", "café ☕", "\\n literally", "a/b"]
TRICKY_SCHEMA = {"type": "object", "properties": {
    'q"uote\\d': {"enum": TRICKY}, "fixed\ttab": {"const": "C:\\temp\\new"},
    "code": {"type": "string", "pattern": '^"[a-z]{2}\\\\\\d\\.x$'}, "free": {"type": "string", "maxLength": 12}},
    "required": ['q"uote\\d', "fixed\ttab", "code", "free"], "additionalProperties": False}
ITEM = {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer"}},
        "required": ["sku", "qty"]}
ORDER_TOOL = {"type": "function", "function": {"name": "place_order", "description": "Order items", "parameters": {
    "$defs": {"Item": ITEM}, "type": "object",
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1, "maxItems": 2}},
    "required": ["items"]}}}


def allows_text(grammar: Grammar, model, text: str) -> bool:
    """Whether ``grammar`` lets the model write exactly ``text`` and then end."""
    state = grammar.state(model)
    try:
        for token in model.tokenize(text, add_special=False):
            if not state.allows(token):
                return False
            state.accept(token)
        return bool(state.allows(model.eos))
    finally:
        state.close()


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with Eagle2(smollm2_path, plain=True, n_ctx=1024, n_threads=1,
                chat_template=TOOLS_TEMPLATE.read_text()) as llm:
        yield llm


@pytest.mark.parametrize("value", TRICKY + [1.5, None, {"k\\": ["\t"]}])
def test_constants_are_written_as_json_writes_them(llm, value):
    """The grammar of a const takes its JSON text (escapes and all) and refuses the raw form the old converter
    demanded (a raw tab, a lone backslash)."""
    grammar = Grammar.from_json_schema({"type": "object", "properties": {'k"\\': {"const": value}},
                                        "required": ['k"\\']})
    assert allows_text(grammar, llm.model, json.dumps({'k"\\': value}, ensure_ascii=False))
    if isinstance(value, str) and value != json.dumps(value, ensure_ascii=False)[1:-1]:
        raw = '{"k\\"\\\\": "' + value + '"}'  # the characters unescaped: not JSON
        assert not allows_text(grammar, llm.model, raw)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_answers_parse_and_validate(llm, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TRICKY_SCHEMA}}
    out = llm.create_chat_completion([{"role": "user", "content": "Fill the form as JSON."}], temperature=1.0,
                                     seed=seed, max_tokens=160, response_format=fmt)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    answer = json.loads(choice["message"]["content"])
    jsonschema.validate(answer, TRICKY_SCHEMA)
    assert re.fullmatch(TRICKY_SCHEMA["properties"]["code"]["pattern"][1:-1], answer["code"])


@pytest.mark.parametrize("choice", ["auto", "none", "required", {"type": "function",
                                                                 "function": {"name": "place_order"}}],
                         ids=["auto", "none", "required", "named"])
def test_pydantic_shaped_tools_work_under_every_choice(llm, choice):
    other = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}
    out = llm.create_chat_completion([{"role": "user", "content": "Order two apples (sku APL)."}],
                                     tools=[ORDER_TOOL, other], tool_choice=choice, temperature=1.0, seed=5,
                                     max_tokens=120)
    message = out["choices"][0]["message"]
    for call in message.get("tool_calls", []):
        if call["function"]["name"] == "place_order":
            jsonschema.validate(json.loads(call["function"]["arguments"]), ORDER_TOOL["function"]["parameters"])
    if choice not in ("auto", "none"):
        assert message["tool_calls"] and out["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("name", ["get_weather\n", "get weather", "", "x" * 65, "naïve"])
def test_tool_names_are_matched_whole(name):
    tool = {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    with pytest.raises(ToolError, match="function.name"):
        plan_tools(TOOLS_TEMPLATE.read_text(), [tool], "auto")


DEEP = '{"name": "f", "arguments": ' + '{"a": ' * 1200 + "1" + "}" * 1200 + "}"
MALFORMED = [
    '<tool_call>\n{"name": "bad\\q", "arguments": {}}\n</tool_call>',  # an invalid escape in the name
    '<tool_call>\n{"name": "ctl\x01\x02", "arguments": {}}\n</tool_call>',  # raw control characters
    "<tool_call>\n" + DEEP + "\n</tool_call>",  # nested past the recursion limit
    DEEP,  # the same without tags, at the start of the answer
    '{"name": "f", "arguments": ' + "[" * 5000,  # cut short, deep
    '<tool_call>\n{"arguments": ' + "[" * 3000 + "]" * 3000 + ', "name": "f"}\n</tool_call>',  # other key order
    '<tool_call>\n{"name": "f", "arguments": "' + '\\"' * 10 + '"}\n</tool_call>',
]


@pytest.mark.parametrize("text", MALFORMED, ids=range(len(MALFORMED)))
@pytest.mark.parametrize("constrained", [False, True])
def test_reading_calls_never_raises(text, constrained):
    """Whatever the model wrote, the answer's calls are read without an exception (unreadable ones stay
    content), whole and streamed piece by piece."""
    for fmt in (HERMES, LLAMA3):
        content, calls = fmt.parse(text, constrained)
        assert content is not None or calls
        plan = type("Plan", (), {"format": fmt, "grammar": object() if constrained else None})()
        stream = AnswerStream(plan)
        for i in range(0, len(text), 97):
            stream.feed(text[i:i + 97])
        stream.finish("stop")
