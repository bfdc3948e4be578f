"""Chat templates: the model's own Jinja template, sandboxed, and the documented fallback."""

from __future__ import annotations

import pytest

from eagle2_local.chat import render_chat, render_fallback
from eagle2_local.errors import Eagle2Error
from synthetic_model import CHATML

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_model_template_renders_chatml():
    out = render_chat(CHATML, MSGS)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n")


def test_fallback_without_template():
    assert render_chat(None, MSGS) == render_fallback(MSGS) == "System: Be brief.\nUser: Hi\nAssistant:"


def test_template_is_sandboxed():
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(Eagle2Error, match="chat template failed"):
        render_chat(evil, MSGS)


def test_template_raise_exception_and_bad_messages():
    with pytest.raises(Eagle2Error, match="roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", MSGS)
    with pytest.raises(Eagle2Error, match="non-empty list"):
        render_chat(CHATML, [])
    with pytest.raises(Eagle2Error, match="message 0"):
        render_chat(CHATML, [{"content": "no role"}])
