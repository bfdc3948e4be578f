"""Tool calls (OpenAI ``tools`` / ``tool_choice``): what the chat template is given, how the answer is constrained,
and how calls are read back out of it, for both the Python API and the server.

A model calls a tool by writing text in the format its chat template taught it. Two formats are known, and which
one a template uses is found by rendering a probe call through it (the template is the only description of the
model's format there is): Hermes / Qwen2.5 (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) and
Llama 3.x (a bare ``{"name": ..., "parameters": {...}}``). A template that does not render the tools it is given
cannot be used with tools: refused, as llama-server refuses it.

``tool_choice``: ``"required"`` and a named function constrain the answer with a grammar (the call's JSON made by
the same JSON-schema converter as ``response_format``, wrapped in the format's tags), so the answer is always a
call whose arguments follow the function's ``parameters``. ``"auto"`` leaves the answer free and parses calls
out of it afterwards (text before a call stays content). ``"none"`` still renders the tools into the prompt, as
llama-server does, but nothing is parsed: the answer is plain content.

Streamed, a call under a grammar goes out as it is generated (its name, then its arguments piece by piece),
because there whatever follows the name is surely the call; under "auto" only once it is closed, because free
text may still turn out not to be a call and what was sent cannot be taken back.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

from ..decoding.grammar import Grammar, GrammarError
from .templates import render_chat
from .tool_grammar import ToolError, call_grammar

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names (matched whole: fullmatch)
PROBE_NAME = "eagle2_probe_function"
PROBE_TOOL = {"type": "function", "function": {"name": PROBE_NAME, "description": "probe",
                                               "parameters": {"type": "object",
                                                              "properties": {"probe_arg": {"type": "integer"}}}}}
NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI: a function without ``parameters`` takes none


# ---------------------------------------------------------------- calls and formats
@dataclass(frozen=True)
class ToolCall:
    """One call as read from an answer: ``arguments`` is the arguments' JSON text as the model wrote it (all of it
    once ``closed``; a call cut short by ``max_tokens`` keeps what was written, as OpenAI returns it)."""

    name: str
    arguments: str
    closed: bool = True

    def as_dict(self, call_id: str) -> dict:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


_JSON = json.JSONDecoder()
UNREADABLE = (ValueError, RecursionError)  # what decoding a model's JSON may raise (JSONDecodeError is a ValueError)
_CLOSING = re.compile(r"\s*\}\s*")  # what follows a call's arguments: the end of its object
# A call's start up to its arguments, name first, as the templates and the grammar write it (either arguments key)
HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')
CALL_START = '{"name":"'  # HEADER's start without whitespace
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may write it before a call
# what may come before a call written without tags: Llama 3.1's python tag, a Markdown fence (Qwen2.5-Coder's way)
LEAD = re.compile(r"\s*(?:<\|python_tag\|>\s*)?(?P<fence>```(?:json)?[ \t]*\n\s*)?")
FENCE_END = re.compile(r"\s*```")


@dataclass(frozen=True)
class CallFormat:
    """How a template's model writes a call: ``{"name": ..., <args_key>: {...}}``, between the tags ``open`` and
    ``close`` when the format has them (read with any whitespace inside, written with a newline, as the
    templates write them); ``parallel``: several calls in one answer. A call at the very start of an answer is
    also read without tags, after a python tag or inside a ```json fence (as llama-server reads them): models
    such as Qwen2.5-Coder drop the tags."""

    name: str
    args_key: str
    open: str = ""
    close: str = ""
    parallel: bool = False

    def read(self, text: str, final: bool, constrained: bool) -> tuple[list[tuple[int, int]], list[ToolCall]]:
        """The calls in ``text`` so far (``final``: the whole answer) and where each is written. A call counts
        once it is closed; under a grammar (``constrained``), where whatever follows a call's name is its
        arguments, as soon as its name is written, so that its arguments can be streamed as they come."""
        spans, calls = [], []
        for start, end, body, ended, tagged in self._blocks(text, final):
            call = _read_call(body, ended, tagged)
            if call is not None and (call.closed or constrained):
                spans.append((start, end))
                calls.append(call)
        return spans, calls

    def parse(self, text: str, constrained: bool = False) -> tuple[str | None, list[ToolCall]]:
        """The content and the calls of a whole answer: the text outside the calls, without the whitespace that
        touches them (None if nothing is left); without a call the content is ``text`` unchanged."""
        spans, calls = self.read(text, final=True, constrained=constrained)
        if not calls:
            return text, []
        cuts = [0] + [i for span in spans for i in span] + [len(text)]
        pieces = [text[a:b] for a, b in zip(cuts[::2], cuts[1::2])]
        kept = [pieces[0].rstrip()] + [p.strip() for p in pieces[1:]]
        return "\n".join(p for p in kept if p) or None, calls

    def content_end(self, text: str) -> int:
        """How much of a partial answer is surely content, whatever follows (streaming sends that much): text
        before anything that is or may become a call, without trailing whitespace (dropped before a call)."""
        if _may_start_with_call(text):
            return 0
        if not self.open:
            return len(text)
        at = text.find(self.open)
        end = at if at >= 0 else len(text) - _partial_suffix(text, self.open)
        return len(text[:end].rstrip())

    def _blocks(self, text: str, final: bool) -> Iterator[tuple[int, int, str, bool, bool]]:
        """Each place a call may be written: its span, its text, whether it has ended (its closing tag or object
        written, or the answer over), and whether tags delimit it. First an object at the answer's start, then
        the tagged blocks after it."""
        lead = LEAD.match(text)
        at = 0
        if text.startswith("{", lead.end()):
            try:
                end = _JSON.raw_decode(text, lead.end())[1]
            except UNREADABLE:  # not closed yet, or never readable (nested past the recursion limit)
                yield 0, len(text), text[lead.end():], final, False
                return
            fence = FENCE_END.match(text, end) if lead.group("fence") else None
            at = fence.end() if fence else end
            yield 0, at, text[lead.end():end], True, False
        if not self.open:
            return
        at = text.find(self.open, at)
        while at >= 0:
            body = at + len(self.open)
            shut = self._shut(text, body)
            if shut < 0:
                yield at, len(text), text[body:], final, True
                return
            yield at, shut + len(self.close), text[body:shut], True, True
            at = text.find(self.open, shut + len(self.close))

    def _shut(self, text: str, body: int) -> int:
        """Where the closing tag of the block whose text starts at ``body`` is (-1: not written): after the call's
        object when the block starts like a call (a closing tag inside one of its strings does not end it), else
        the first one."""
        if HEADER.match(text, body) is None:
            return text.find(self.close, body)
        try:
            end = _JSON.raw_decode(text, text.index("{", body))[1]
        except UNREADABLE:  # not closed yet (or never: then the block runs to the answer's end)
            return -1
        return text.find(self.close, end)


def _read_call(body: str, ended: bool, tagged: bool) -> ToolCall | None:
    """The call a block holds, as far as it is written (None: not a call, or not one yet). Without tags only
    the name-first form counts: streaming must know early that text is a call."""
    m = HEADER.match(body)
    if m is None:  # another key order or layout: read only once whole, and only between tags
        return _whole_call(body) if ended and tagged else None
    try:
        name = json.loads(m.group(1))
    except UNREADABLE:  # an invalid escape or a raw control character in the name: not a call, content
        return None
    try:
        args, end = _JSON.raw_decode(body, m.end())
    except UNREADABLE:  # not closed yet (or unreadable): everything after the name is arguments
        return ToolCall(name, body[m.end():], closed=False)
    if not isinstance(args, dict):
        return None
    return ToolCall(name, body[m.end():end], closed=ended and _CLOSING.fullmatch(body, end) is not None)


def _whole_call(body: str) -> ToolCall | None:
    """A whole ``{"name": str, "arguments" | "parameters": object}`` (arguments re-serialised); None: not one."""
    try:
        obj = json.loads(body)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters"))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            args = json.loads(args)
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False)) if isinstance(args, dict) else None
    except UNREADABLE:
        return None


def _may_start_with_call(text: str) -> bool:
    """Whether a partial answer is, or may still become, one that starts with a call written without tags
    (what :data:`LEAD` and :data:`HEADER` read): streaming holds such text back until it is decided."""
    head = text.lstrip()
    if PYTHON_TAG.startswith(head):
        return True
    if head.startswith(PYTHON_TAG):
        head = head[len(PYTHON_TAG):].lstrip()
    if "```".startswith(head):
        return True
    if head.startswith("```"):
        info, newline, rest = head[3:].partition("\n")
        if not newline:
            return "json".startswith(info.strip())
        if info.strip() not in ("", "json"):
            return False
        head = rest.lstrip()
    compact = "".join(head[:64].split())
    return CALL_START.startswith(compact) or compact.startswith(CALL_START)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (a tag still being written)."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if marker.startswith(text[-n:])), 0)


HERMES = CallFormat("hermes", "arguments", "<tool_call>", "</tool_call>", parallel=True)
LLAMA3 = CallFormat("llama3", "parameters")


@lru_cache(maxsize=8)
def call_format(template: str | None) -> CallFormat:
    """The format ``template`` writes calls in, found by rendering a probe tool and a probe call through it."""
    how = "give one that does (chat_template= in the API, --chat-template-file on the command line)"
    if not template:
        raise ToolError(f"the model has no chat template, so it cannot be offered tools; {how}")
    asked = [{"role": "user", "content": "hi"}]
    if PROBE_NAME not in render_chat(template, asked, tools=[PROBE_TOOL]):
        raise ToolError(f"the model's chat template does not render tools; {how}")
    called = asked + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_probe", "type": "function", "function": {"name": PROBE_NAME, "arguments": '{"probe_arg": 1}'}}]}]
    written = render_chat(template, called, tools=[PROBE_TOOL], add_generation_prompt=False)
    if any(c.name == PROBE_NAME for c in HERMES.parse(written)[1]):
        return HERMES
    if re.search(r'\{\s*"name"\s*:\s*"' + PROBE_NAME + r'"\s*,\s*"parameters"\s*:', written):
        return LLAMA3
    raise ToolError("the model's chat template writes tool calls in a format eagle2-local does not read (it reads "
                    f"Hermes / Qwen2.5 <tool_call> blocks and Llama 3.x JSON); {how}")


# ---------------------------------------------------------------- the request
def check_tools(tools: list) -> list[dict]:
    """OpenAI ``tools`` entries, each ``{"type": "function", "function": {"name", "description"?,
    "parameters"?}}``, with ``parameters`` an object schema (filled in when left out)."""
    if not isinstance(tools, list):
        raise ToolError("tools must be a list of {\"type\": \"function\", \"function\": {...}} entries")
    checked, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-', got {name!r}")
        if name in names:
            raise ToolError(f"tools[{i}]: a second function named {name!r}")
        if not isinstance(fn.get("description", ""), str):
            raise ToolError(f"tools[{i}].function.description must be a string")
        params = fn.get("parameters", NO_PARAMETERS)
        if not isinstance(params, dict) or params.get("type") != "object":
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema of type \"object\" (the "
                            "arguments are one JSON object)")
        names.add(name)
        checked.append({"type": "function", "function": {**fn, "parameters": params}})
    return checked


def chosen(tool_choice, names: list[str]) -> str:
    """``tool_choice`` as one word: "none", "auto", "required", or the name of the function to call."""
    if tool_choice is None:
        return "auto" if names else "none"
    if tool_choice in ("none", "auto", "required"):
        if tool_choice == "required" and not names:
            raise ToolError("tool_choice \"required\" needs tools", "tool_choice")
        return tool_choice
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(fn, dict) or tool_choice.get("type", "function") != "function":
        raise ToolError("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}", "tool_choice")
    if fn.get("name") not in names:
        raise ToolError(f"tool_choice names {fn.get('name')!r}, which is not among the tools "
                        f"({', '.join(names) or 'none given'})", "tool_choice")
    return fn["name"]


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools mean for one answer: ``tools`` to render into the prompt, the ``grammar`` the
    answer must follow (None: free), and the ``format`` calls are parsed in (None: nothing is parsed)."""

    tools: list[dict]
    grammar: Grammar | None
    format: CallFormat | None

    def constrain(self, other: Grammar | None) -> Grammar | None:
        """The answer's one constraint: tool calls and a ``grammar`` / ``response_format`` do not mix."""
        if other is not None and self.format is not None:
            raise ToolError("give either tools (with a tool_choice other than \"none\") or a grammar / "
                            "response_format, not both", "tool_choice")
        return self.grammar or other


def plan_tools(template: str | None, tools: list | None, tool_choice=None,
               parallel_tool_calls: bool | None = None) -> ToolPlan | None:
    """Check a request's ``tools`` and ``tool_choice`` against the chat ``template`` (every refusal here, before
    anything is generated); None when there are no tools."""
    checked = check_tools(tools) if tools else []
    choice = chosen(tool_choice, [t["function"]["name"] for t in checked])
    if not checked:
        return None
    for i, t in enumerate(checked):  # a schema the converter refuses is refused whatever the choice
        try:
            Grammar.from_json_schema(t["function"]["parameters"], f"tools[{i}].function.parameters")
        except GrammarError as exc:
            raise ToolError(str(exc)) from None
    if choice == "none":
        return ToolPlan(checked, None, None)
    fmt = call_format(template)
    if choice == "auto":
        return ToolPlan(checked, None, fmt)
    named = checked if choice == "required" else [t for t in checked if t["function"]["name"] == choice]
    return ToolPlan(checked, call_grammar(fmt, named, parallel=bool(parallel_tool_calls)), fmt)


# ---------------------------------------------------------------- the answer
def finish_reason(calls: list[ToolCall], reason: str | None) -> str | None:
    """"tool_calls" for an answer that calls and ended by itself; a cut-short one keeps "length", as OpenAI's."""
    return "tool_calls" if calls and reason != "length" else reason


def assistant_message(text: str, reason: str | None, plan: ToolPlan | None) -> tuple[dict, str | None]:
    """The ``message`` of a whole chat answer, its calls read as ``plan`` says (None: none are read), and its
    finish reason."""
    fmt = plan.format if plan is not None else None
    content, calls = fmt.parse(text, plan.grammar is not None) if fmt is not None else (text, [])
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [c.as_dict(new_call_id()) for c in calls]
    return message, finish_reason(calls, reason)


class AnswerStream:
    """A streamed chat answer as OpenAI's ``delta`` objects, adding up to :func:`assistant_message` of the whole
    text: content as soon as it surely is content; a call's id and name once its name is written, then its
    arguments as they are written when a grammar holds the answer to calls (otherwise all of them once the call
    is closed: free text may still turn out not to be a call)."""

    def __init__(self, plan: ToolPlan | None) -> None:
        self.format = plan.format if plan is not None else None
        self.constrained = plan is not None and plan.grammar is not None
        self.text = ""
        self.sent = 0  # characters of content already sent
        self.ids: list[str] = []  # of the calls announced
        self.args_sent: list[int] = []  # characters of each announced call's arguments already sent

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        if self.format is None:
            self.sent = len(self.text)
            return [{"content": piece}] if piece else []
        deltas = self._content(self.text[:self.format.content_end(self.text)])
        return deltas + self._calls(self.format.read(self.text, final=False, constrained=self.constrained)[1])

    def finish(self, reason: str | None) -> tuple[list[dict], str | None]:
        """The deltas still owed once generation ended, and the answer's finish reason."""
        if self.format is None:
            return [], reason
        content, calls = self.format.parse(self.text, self.constrained)
        return self._content(content or "") + self._calls(calls), finish_reason(calls, reason)

    def _content(self, content: str) -> list[dict]:
        """A delta with the part of ``content`` not sent yet."""
        if not content.startswith(self.text[:self.sent]):  # cannot happen by content_end's rule
            log.warning("streamed content is not a prefix of the answer's content; its rest is not sent")
            return []
        if len(content) <= self.sent:
            return []
        piece, self.sent = content[self.sent:], len(content)
        return [{"content": piece}]

    def _calls(self, calls: list[ToolCall]) -> list[dict]:
        """Deltas for what ``calls`` add to what was sent: new calls' ids and names, then new argument text."""
        deltas = []
        for i, call in enumerate(calls):
            if i == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(0)
                deltas.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
            if len(call.arguments) > self.args_sent[i]:
                piece, self.args_sent[i] = call.arguments[self.args_sent[i]:], len(call.arguments)
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        return deltas
