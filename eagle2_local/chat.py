"""Chat templates: render a conversation into a prompt with the model's own Jinja2 template.

Templates come from the GGUF's ``tokenizer.chat_template`` and run in Jinja2's immutable sandbox (a template is
untrusted input). Models without a template (base models such as Gemma-3-270M) get a documented plain-text
fallback: ``User: ...`` / ``Assistant: ...`` lines, ending with ``Assistant:`` when a reply is wanted.
"""

from __future__ import annotations

import datetime
import logging
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import Eagle2Error

log = logging.getLogger(__name__)

FALLBACK_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}


def _raise(message: str):
    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)


def validate_messages(messages: list[dict]) -> None:
    """OpenAI-style messages: a list of {"role": ..., "content": str}."""
    if not isinstance(messages, list) or not messages:
        raise Eagle2Error("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content", ""), str):
            raise Eagle2Error(f"message {i} must be a dict with a 'role' and a string 'content'")


def render_chat(template: str | None, messages: list[dict], *, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages``; BOS is left to the tokenizer when the template adds none."""
    validate_messages(messages)
    if not template:
        return render_fallback(messages, add_generation_prompt)
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token, eos_token=eos_token)
    except TemplateError as exc:
        raise Eagle2Error(f"the model's chat template failed: {exc}") from None


def render_fallback(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Plain-text transcript for models that ship no chat template."""
    lines = [f"{FALLBACK_ROLES.get(m['role'], m['role'].title())}: {m.get('content', '')}" for m in messages]
    text = "\n".join(lines) + "\n"
    if add_generation_prompt:
        text += "Assistant:"
    return text


def special_text(model, token: int) -> str:
    """The text of a special token (e.g. BOS), or "" when the model has none."""
    return model.token_bytes(token, special=True).decode("utf-8", "replace") if token >= 0 else ""


def render_for_model(model, messages: list[dict]) -> str:
    """``messages`` rendered with ``model``'s own template (or the fallback), ready for a reply."""
    return render_chat(model.info.chat_template, messages, bos_token=special_text(model, model.bos),
                       eos_token=special_text(model, model.eos))


def prompt_tokens(model, text: str) -> list[int]:
    """The one way prompt text (raw, or rendered by a chat template) becomes tokens.

    Special tokens are parsed. BOS is added when the model wants one, unless the text already starts with it:
    templates such as Llama-3's or Gemma's write ``{{ bos_token }}`` themselves, and a second BOS changes what
    the model sees."""
    bos = special_text(model, model.bos)
    return model.tokenize(text, add_special=not (bos and text.startswith(bos)), parse_special=True)
