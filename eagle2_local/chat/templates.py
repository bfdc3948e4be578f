"""Chat templates: render a conversation into a prompt with the model's own Jinja2 template.

Templates come from the GGUF's ``tokenizer.chat_template`` and run in Jinja2's immutable sandbox (a template is
untrusted input). Models without a template (base models such as Gemma-3-270M) get a documented plain-text
fallback: ``User: ...`` / ``Assistant: ...`` lines, ending with ``Assistant:`` when a reply is wanted.
"""

from __future__ import annotations

import datetime
import json
import logging
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import Eagle2Error

log = logging.getLogger(__name__)

FALLBACK_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}


def _raise(message: str):
    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def _tojson(value, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    """``tojson`` as the templates' authors render it (Hugging Face's chat templating): keys in their own order,
    no HTML escaping. Jinja2's own filter sorts keys and escapes ``<``, which would change a tool's signature."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def check_template(template: str) -> None:
    """Refuse a chat template that does not compile (one line), before anything loads or renders."""
    try:
        _compile(template)
    except TemplateError as exc:
        raise Eagle2Error(f"the chat template does not compile: {exc}") from None


def validate_messages(messages: list[dict]) -> None:
    """OpenAI-style messages: a list of {"role": ..., "content": str}; an assistant message that calls tools
    carries ``tool_calls`` (``[{"function": {"name", "arguments"}}]``) and may have no content."""
    if not isinstance(messages, list) or not messages:
        raise Eagle2Error("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise Eagle2Error(f"message {i} must be a dict with a 'role' and a string 'content'")
        calls = m.get("tool_calls")
        if not isinstance(m.get("content", ""), str) and not (calls and m.get("content") is None):
            raise Eagle2Error(f"message {i} must be a dict with a 'role' and a string 'content'")
        if calls is not None and (not isinstance(calls, list) or not all(_is_call(c) for c in calls)):
            raise Eagle2Error(f"message {i}: tool_calls must be a list of {{'function': {{'name': str, "
                              "'arguments': JSON text}}")


def _is_call(call) -> bool:
    fn = call.get("function") if isinstance(call, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), (str, dict))


def _template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates expect them: a call's ``arguments`` an object, not OpenAI's JSON text (the
    templates write ``arguments | tojson``)."""
    out = []
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": _arguments(c, i)}}
                                     for c in m["tool_calls"]]}
        out.append(m)
    return out


def _arguments(call: dict, i: int):
    args = call["function"]["arguments"]
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except json.JSONDecodeError:
        raise Eagle2Error(f"message {i}: the arguments of tool call {call['function']['name']!r} are not JSON") \
            from None


def render_chat(template: str | None, messages: list[dict], *, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """The prompt text for ``messages``; BOS is left to the tokenizer when the template adds none. ``tools``
    (OpenAI's function entries) are passed to the template, which offers them to the model if it knows how."""
    validate_messages(messages)
    if not template:
        return render_fallback(messages, add_generation_prompt)
    extra = {"tools": tools} if tools else {}
    try:
        return _compile(template).render(messages=_template_messages(messages),
                                         add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                                         eos_token=eos_token, **extra)
    except TemplateError as exc:
        raise Eagle2Error(f"the model's chat template failed: {exc}") from None
    except TypeError as exc:  # e.g. a template concatenating a message's missing content
        raise Eagle2Error(f"the model's chat template failed on these messages: {exc}") from None


def render_fallback(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Plain-text transcript for models that ship no chat template."""
    lines = [f"{FALLBACK_ROLES.get(m['role'], m['role'].title())}: {m.get('content') or ''}" for m in messages]
    text = "\n".join(lines) + "\n"
    if add_generation_prompt:
        text += "Assistant:"
    return text


def special_text(model, token: int) -> str:
    """The text of a special token (e.g. BOS), or "" when the model has none."""
    return model.token_bytes(token, special=True).decode("utf-8", "replace") if token >= 0 else ""


def render_for_model(model, messages: list[dict], template: str | None = None,
                     tools: list[dict] | None = None) -> str:
    """``messages`` rendered with ``template`` (default: ``model``'s own, or the fallback), ready for a reply."""
    return render_chat(template or model.info.chat_template, messages, bos_token=special_text(model, model.bos),
                       eos_token=special_text(model, model.eos), tools=tools)


def prompt_tokens(model, text: str) -> list[int]:
    """The one way prompt text (raw, or rendered by a chat template) becomes tokens.

    Special tokens are parsed. BOS is added when the model wants one, unless the text already starts with it:
    templates such as Llama-3's or Gemma's write ``{{ bos_token }}`` themselves, and a second BOS changes what
    the model sees."""
    bos = special_text(model, model.bos)
    return model.tokenize(text, add_special=not (bos and text.startswith(bos)), parse_special=True)
