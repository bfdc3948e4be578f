"""Tool calls: the call formats found from chat templates, calls read back out of real template output (whole and
streamed), answers constrained to a valid call under ``tool_choice`` "required" / a named function, a call the
model writes by itself under "auto", conversations carrying calls and their results, and every bad input refused
in one line before anything is generated. The HTTP side (official ``openai`` client) is in test_server.py."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st

from eagle2_local import Eagle2
from eagle2_local.chat.templates import render_chat
from eagle2_local.chat.tool_calls import (HERMES, LLAMA3, AnswerStream, ToolCall, ToolError, assistant_message,
                                          call_format, plan_tools)
from eagle2_local.errors import Eagle2Error
from eagle2_local.formats.models import read_gguf_info
from tests.support.helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.smollm2

ROOT = Path(__file__).resolve().parents[2]
TOOLS_TEMPLATE = ROOT / "eagle2_local" / "data" / "templates" / "chatml-tools.jinja"
QWEN = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # benchmarks/fetch_qwen.sh
WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "unit": {"type": "string", "enum": ["C", "F"]}},
                "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": WEATHER_ARGS}}
TIME_ARGS = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
             "required": ["timezone"]}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                         "parameters": TIME_ARGS}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# A Llama 3.x style template, written for these tests: calls are a bare {"name": ..., "parameters": ...} object.
LLAMA3_STYLE = (
    "{{- bos_token }}{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    "Answer a function call as {\"name\": function name, \"parameters\": its arguments}. Functions:\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|eot_id|>{% endif %}"
    "{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>"
    "\n\n{% if m.tool_calls %}{{ '{\"name\": \"' + m.tool_calls[0].function.name + '\", \"parameters\": ' + "
    "(m.tool_calls[0].function.arguments | tojson) + '}' }}{% else %}{{ m.content }}{% endif %}<|eot_id|>"
    "{% endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def call_msg(*calls: tuple[str, dict], content: str | None = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)]}


def calls_of(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def assistant_text(template: str, message: dict, start: str, end: str) -> str:
    """What ``template`` writes for an assistant ``message`` after a user turn: the text the model would write."""
    rendered = render_chat(template, ASK + [message], tools=[WEATHER, TIME], add_generation_prompt=False)
    return rendered.rsplit(start, 1)[1].split(end, 1)[0]


@pytest.fixture(scope="module")
def template() -> str:
    return TOOLS_TEMPLATE.read_text()


# ------------------------------------------------------------------ formats and parsing (no model)
def test_formats_are_found_from_the_templates(template, smollm2_path):
    assert call_format(template) is HERMES
    assert call_format(LLAMA3_STYLE) is LLAMA3
    with pytest.raises(ToolError, match="does not render tools"):
        call_format(read_gguf_info(smollm2_path).chat_template)  # SmolLM2's own ChatML template ignores tools
    with pytest.raises(ToolError, match="no chat template"):
        call_format(None)
    own_format = template.replace("<tool_call>", "<call>").replace("</tool_call>", "</call>")
    with pytest.raises(ToolError, match="does not read"):
        call_format(own_format)


def test_vendored_template_without_tools_renders_what_smollm2s_own_does(template, smollm2_path):
    own = read_gguf_info(smollm2_path).chat_template
    for msgs in (ASK, [{"role": "system", "content": "Be brief."}] + ASK,
                 ASK + [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And Rome?"}]):
        for gen in (True, False):
            assert render_chat(template, msgs, add_generation_prompt=gen) == render_chat(own, msgs,
                                                                                          add_generation_prompt=gen)


@pytest.mark.parametrize("which", ["hermes", "llama3"])
def test_calls_written_by_the_template_parse_back(template, which):
    """The text a template writes for an assistant's calls (what a model trained on it writes) parses back to
    the same calls, with the text before them as content (Qwen2.5's own template: the slow Qwen test)."""
    _parse_back(template, which)


def _parse_back(template: str, which: str) -> None:
    if which == "llama3":
        message = call_msg(("get_weather", {"city": "Paris", "unit": "C"}))
        text = assistant_text(LLAMA3_STYLE, message, "<|start_header_id|>assistant<|end_header_id|>\n\n",
                              "<|eot_id|>")
        fmt, content = LLAMA3, None
    else:
        message = call_msg(("get_weather", {"city": "Paris", "unit": "C"}), ("get_time", {"timezone": "CET"}),
                           content="Let me look.")
        text = assistant_text(template, message, "<|im_start|>assistant\n", "<|im_end|>")
        fmt, content = HERMES, "Let me look."
    parsed, calls = fmt.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == calls_of(message) and parsed == content
    assert all(c.closed for c in calls)
    assert fmt.parse("Just text, {no call}.") == ("Just text, {no call}.", [])
    assert HERMES.parse(TAG_IN_ARGS) == ("ok", [ToolCall("get_time", '{"timezone": "</tool_call>"}')])


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}\n</tool_call>'
TAG_IN_ARGS = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "</tool_call>"}}\n</tool_call> ok'
STREAMED = [  # (tool_choice, answer, how it ended)
    ("auto", "Plain answer with trailing space  ", "stop"),
    ("auto", "Checking.\n" + CALL, "stop"),
    ("auto", CALL + "\n" + CALL.replace("Oslo", "Rome").removesuffix("\n</tool_call>"), "stop"),  # last unclosed
    ("auto", 'Sure.<tool_call>{"arguments": {"timezone": "UTC"}, "name": "get_time"}</tool_call>', "stop"),
    ("auto", "A <tool_call> that is not JSON </tool_call> stays content", "stop"),
    ("auto", "Ends on half a tag <tool_", "length"),
    ("auto", '```json\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n```', "stop"),  # Qwen2.5-Coder's way
    ("auto", '{\n  "name": "get_weather",\n  "arguments": {"city": "Rome", "unit": "C"}\n} Asked.', "stop"),
    ("auto", '{"name": "Ann", "age": 31}', "stop"),  # JSON, not a call
    ("auto", "```python\nprint('<tool_call>')\n```", "stop"),
    ("required", CALL, "stop"),
    ("required", '<tool_call>\n{"name":"get_time","arguments":{"timezone":"UTC"}}\n</tool_call>', "stop"),
    ("required", '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Eur', "length"),  # cut short
    ("auto", TAG_IN_ARGS, "stop"),
    ("required", TAG_IN_ARGS, "stop"),
]


def reassemble(deltas: list[dict]) -> tuple[str, list[tuple[str, str]]]:
    """The content and the (name, arguments) calls a client rebuilds from stream deltas."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:
                assert c["index"] == len(calls) and c["function"]["arguments"] == "" and c["id"].startswith("call_")
                calls[c["index"]] = [c["function"]["name"], ""]
            calls[c["index"]][1] += c["function"]["arguments"]
    return "".join(d.get("content", "") for d in deltas), [tuple(c) for c in calls.values()]


@pytest.mark.parametrize("choice, text, reason", STREAMED)
@pytest.mark.parametrize("step", [1, 5])
def test_streamed_deltas_add_up_to_the_whole_message(template, choice, text, reason, step):
    """Content is sent as soon as it cannot be part of a call; a call's id and name once written, its arguments
    as they come under a grammar (all at once when it closes otherwise): the deltas reassemble to exactly the
    whole answer's message, a call cut short keeping its partial arguments and "length"."""
    plan = plan_tools(template, [WEATHER, TIME], choice)
    stream = AnswerStream(plan)
    deltas = [d for i in range(0, len(text), step) for d in stream.feed(text[i:i + step])]
    whole, whole_reason = assistant_message(text, reason, plan)
    if whole.get("tool_calls"):  # nothing of a call was sent as content while it was being written
        assert "<" not in reassemble(deltas)[0]
    if choice == "required" and step == 1:  # the arguments came in pieces, before the answer ended
        assert sum("arguments" in d["tool_calls"][0]["function"] for d in deltas if "tool_calls" in d) > 5
    owed, got_reason = stream.finish(reason)
    content, calls = reassemble(deltas + owed)
    assert content == (whole["content"] or "") and got_reason == whole_reason
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in whole.get("tool_calls", [])]
    assert whole_reason == ("tool_calls" if calls and reason == "stop" else reason)


PIECES = ["<tool_call>", "</tool_call>", "\n", " ", "```", "json", "{", "}", '"name"', ":", ",", '"get_time"',
          '"arguments"', '"parameters"', '"timezone"', '"UTC"', "<|python_tag|>", "Sure.", "<tool_", "x",
          '{"name": "get_time", "arguments": {"timezone": "UTC"}}', '{"name": "get_time", "parameters": {"tim',
          '{"arguments": {}, "name": "get_time"}', '<tool_call>\n{"name": "get_time", "arguments": {']


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=30), cuts=st.lists(st.integers(1, 7), min_size=1),
       choice=st.sampled_from(["auto", "required"]), fmt=st.sampled_from(["hermes", "llama3"]))
def test_any_answer_streams_to_its_whole_message(pieces, cuts, choice, fmt):
    """Whatever the text and however it is cut into chunks, the stream's deltas add up to the whole message."""
    text = "".join(pieces)
    plan = plan_tools(TOOLS_TEMPLATE.read_text() if fmt == "hermes" else LLAMA3_STYLE, [WEATHER, TIME], choice)
    stream = AnswerStream(plan)
    deltas, at, i = [], 0, 0
    while at < len(text):
        deltas += stream.feed(text[at:at + cuts[i % len(cuts)]])
        at, i = at + cuts[i % len(cuts)], i + 1
    owed, reason = stream.finish("stop")
    whole, whole_reason = assistant_message(text, "stop", plan)
    content, calls = reassemble(deltas + owed)
    assert content == (whole["content"] or "") and reason == whole_reason
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in whole.get("tool_calls", [])]


@pytest.mark.parametrize("tools, choice, needle, param", [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None,
     "must be a JSON schema of type \"object\"", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"not": {"type": "string"}}}}}}], None, "unsupported JSON schema", "tools"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "not among the tools", "tool_choice"),
    ([{"type": "function", "name": "f"}], None, "tools[0] must be", "tools"),
    (["get_weather"], None, "tools[0] must be", "tools"),
    ([{"type": "function", "function": {"name": "has space"}}], None, "1-64 letters", "tools"),
    ([WEATHER, WEATHER], None, "a second function", "tools"),
    ([WEATHER], "always", "tool_choice must be", "tool_choice"),
    (None, "required", "needs tools", "tool_choice"),
])
def test_bad_tools_are_one_line_errors(template, tools, choice, needle, param):
    with pytest.raises(ToolError, match=needle.replace("[", r"\[").replace("(", r"\(")) as err:
        plan_tools(template, tools, choice)
    assert "\n" not in str(err.value) and err.value.param == param


# ------------------------------------------------------------------ answers from the model
@pytest.mark.parametrize("fmt, text", [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}\n</tool_call>\n'
             '<tool_call>\n{"name":"get_time","arguments":{"timezone":"UTC"}}\n</tool_call>'),
    (LLAMA3, '{"name": "get_time", "parameters": {"timezone": "UTC"}}'),
], ids=["hermes", "llama3"])
def test_call_grammars_take_the_calls_the_formats_read(llm, fmt, text):
    """The grammar of each format, compiled by llama.cpp for the model's vocabulary, lets the model write a call
    token by token, exactly as its parser reads it, and then end; a call of a function not offered is refused."""
    from eagle2_local.chat.tool_calls import call_grammar, check_tools

    grammar = call_grammar(fmt, check_tools([WEATHER, TIME]), parallel=True)
    state = grammar.state(llm.model)
    for token in llm.tokenize(text.encode(), add_bos=False, special=True):
        assert state.allows(token), (text, llm.detokenize([token]))
        state.accept(token)
    assert state.allows(llm.model.eos)
    assert [c.name for c in fmt.parse(text, constrained=True)[1]] == [n for n in ("get_weather", "get_time")
                                                                       if n in text]
    refused = grammar.state(llm.model)
    wrong = text.replace("get_time", "get_stock")
    tokens = llm.tokenize(wrong.encode(), add_bos=False, special=True)
    assert not all(refused.allows(t) and refused.accept(t) is None for t in tokens)
    state.close()
    refused.close()


@pytest.fixture(scope="module")
def llm(smollm2_path, smollm2_head, template):
    with Eagle2(smollm2_path, head_path=smollm2_head, n_ctx=1024, n_threads=1, total_tokens=12, depth=4,
                chat_template=template) as llm:
        yield llm


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_required_and_named_choices_answer_one_valid_call(llm, choice):
    out = llm.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=60)
    (name, args), = calls_of(out["choices"][0]["message"])
    assert out["choices"][0]["finish_reason"] == "tool_calls" and out["choices"][0]["message"]["content"] is None
    assert name == "get_time" if isinstance(choice, dict) else name in ("get_weather", "get_time")
    jsonschema.validate(args, WEATHER_ARGS if name == "get_weather" else TIME_ARGS)
    chunks = list(llm.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice=choice, temperature=0,
                                             max_tokens=60, stream=True))
    streamed = [c["choices"][0]["delta"] for c in chunks]
    assert streamed[1]["tool_calls"][0]["function"]["name"] == name
    assert json.loads("".join(d["tool_calls"][0]["function"]["arguments"] for d in streamed
                              if "tool_calls" in d)) == args
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_sampled_required_call_is_valid(llm):
    out = llm.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required", temperature=1.0, seed=7,
                                     max_tokens=60)
    (name, args), = calls_of(out["choices"][0]["message"])
    assert name == "get_weather"
    jsonschema.validate(args, WEATHER_ARGS)


def test_parallel_tool_calls_under_required(llm):
    """With parallel_tool_calls the grammar allows several <tool_call> blocks: asked about two cities, SmolLM2
    calls (twice on the CPUs met so far: Paris, then Rome), each call valid under the tool's schema."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}]
    ask = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
    out = llm.create_chat_completion(ask, tools=tools, tool_choice="required", parallel_tool_calls=True,
                                     temperature=0, max_tokens=120)
    calls = calls_of(out["choices"][0]["message"])
    assert calls and all(name == "get_weather" and set(args) == {"city"} and isinstance(args["city"], str)
                         and len(args["city"]) <= 20 for name, args in calls), calls
    assert out["choices"][0]["finish_reason"] == "tool_calls"


def few_shot(city: str) -> list[dict]:
    """Two earlier turns answered by calls: enough for SmolLM2 to answer the third by a call of its own."""
    msgs: list[dict] = []
    for c in ("Rome", "Oslo"):
        msgs += [{"role": "user", "content": f"Weather in {c}?"}, call_msg(("get_weather", {"city": c}))]
    return msgs + [{"role": "user", "content": f"Weather in {city}?"}]


def test_auto_reads_a_call_the_model_writes_and_none_reads_nothing(llm):
    tools = [{"type": "function", "function": {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    out = llm.create_chat_completion(few_shot("Paris"), tools=tools, temperature=0, max_tokens=40)
    assert calls_of(out["choices"][0]["message"]) == [("get_weather", {"city": "Paris"})]
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    none = llm.create_chat_completion(few_shot("Paris"), tools=tools, tool_choice="none", temperature=0,
                                      max_tokens=4)
    assert "tool_calls" not in none["choices"][0]["message"]
    assert none["choices"][0]["message"]["content"].startswith("<tool_call")  # the same text, not read


def test_tool_results_render_and_the_answer_goes_on(llm, template):
    msgs = ASK + [call_msg(("get_weather", {"city": "Paris", "unit": "C"})),
                  {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 18, \"sky\": \"clear\"}"}]
    prompt = llm.render_chat(msgs, tools=[WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\n<tool_response>\n{\"temp\": 18" in prompt
    out = llm.create_chat_completion(msgs, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8)
    assert out["choices"][0]["message"]["content"] and out["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("kwargs, needle", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "not among the tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "of type \"object\""),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "not both"),
    ({"messages": ASK + [{**call_msg(("get_weather", {})), "content": 5}]}, "string 'content'"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "get_weather", "arguments": "{city"}}]}]}, "not JSON"),
])
def test_bad_input_in_the_api_generates_nothing(llm, kwargs, needle):
    before = llm.last_stats
    with pytest.raises(Eagle2Error, match=needle) as err:
        llm.create_chat_completion(**{"messages": ASK, **kwargs}, max_tokens=4)
    assert "\n" not in str(err.value) and llm.last_stats is before


def test_a_template_without_tools_is_refused(smollm2_path):
    with Eagle2(smollm2_path, plain=True, n_ctx=256, n_threads=1) as plain:
        with pytest.raises(ToolError, match="does not render tools"):
            plain.create_chat_completion(ASK, tools=[WEATHER])


@pytest.mark.slow
def test_qwen_calls_tools_through_its_own_template():
    """Qwen2.5-Coder-0.5B with its GGUF's template: under auto it answers the weather question by a call of its
    own (written without the <tool_call> tags, in a ```json fence or bare: read all the same), a haiku by text;
    under required its call validates."""
    if not QWEN.exists():
        pytest.skip("Qwen2.5-Coder GGUF not fetched (benchmarks/fetch_qwen.sh)")
    own = read_gguf_info(QWEN).chat_template
    assert call_format(own) is HERMES
    _parse_back(own, "qwen2.5")  # the calls its template writes parse back
    with Eagle2(QWEN, plain=True, n_threads=1, n_ctx=1024) as qwen:
        out = qwen.create_chat_completion(ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=60)
        (name, args), = calls_of(out["choices"][0]["message"])
        assert name == "get_weather" and args["city"] == "Paris" and out["choices"][0]["finish_reason"] == "tool_calls"
        haiku = qwen.create_chat_completion([{"role": "user", "content": "Write a haiku about autumn."}],
                                            tools=[WEATHER, TIME], temperature=0, max_tokens=40)
        assert "tool_calls" not in haiku["choices"][0]["message"] and haiku["choices"][0]["message"]["content"]
        forced = qwen.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0,
                                             max_tokens=60)
        (name, args), = calls_of(forced["choices"][0]["message"])
        jsonschema.validate(args, WEATHER_ARGS if name == "get_weather" else TIME_ARGS)


# ------------------------------------------------------------------ the command line
def test_cli_chat_template_file(tmp_path):
    """The vendored template without tools renders what SmolLM2's own does, so `generate --chat` answers the
    same; a template that does not compile, a missing file or a template without --chat: one line each."""
    args = ("generate", "--plain", "--threads", "1", "--n-ctx", "256", "--chat", "--json", "--temperature", "0",
            "-n", "6", "-p", "Name a colour.")
    own = run_cli(*args)
    vendored = run_cli(*args, "--chat-template-file", str(TOOLS_TEMPLATE))
    assert own.returncode == vendored.returncode == 0, own.stderr + vendored.stderr
    assert json.loads(own.stdout)["tokens"] == json.loads(vendored.stdout)["tokens"]
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    assert_one_line_error(run_cli(*args, "--chat-template-file", str(broken)), "does not compile")
    assert_one_line_error(run_cli(*args, "--chat-template-file", str(tmp_path / "none.jinja")), "none.jinja")
    assert_one_line_error(run_cli("generate", "-p", "x", "--chat-template-file", str(TOOLS_TEMPLATE)), "--chat")
    assert_one_line_error(run_cli("serve", "--port", "0", "--chat-template-file", str(broken)), "does not compile")
