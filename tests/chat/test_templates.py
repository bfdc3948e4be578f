"""Chat templates: the model's own Jinja template, sandboxed, and the documented fallback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle2_local.chat.templates import prompt_tokens, render_chat, render_fallback, render_for_model
from eagle2_local.errors import Eagle2Error
from eagle2_local.llamacpp.llama import LlamaModel
from tests.support.synthetic_model import CHATML, CHATML_WITH_BOS, write_model

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


@pytest.fixture(scope="module")
def bos_template_model(synth_dir):
    """A model whose chat template writes ``{{ bos_token }}`` itself, as Llama-3's and Gemma's do."""
    return write_model(synth_dir / "synth-bos-template.gguf", qtype="q8_0", chat_template=CHATML_WITH_BOS)


def test_prompt_tokens_start_with_one_bos(bos_template_model, synth_q8):
    """Whether the template writes BOS or leaves it to the tokenizer, the prompt starts with exactly one."""
    for path in (bos_template_model, synth_q8):
        model = LlamaModel(path)
        for text in (render_for_model(model, MSGS), "the cat sat"):
            tokens = prompt_tokens(model, text)
            assert tokens[0] == model.bos and tokens.count(model.bos) == 1, (path.name, text, tokens[:4])
        model.close()


def test_generate_chat_prompt_has_one_bos(bos_template_model):
    """Regression: `generate --chat` rendered the template, then tokenized with BOS added: two BOS tokens."""
    model = LlamaModel(bos_template_model)
    want = prompt_tokens(model, render_for_model(model, [{"role": "user", "content": "the cat"}]))
    model.close()
    proc = subprocess.run([sys.executable, "-m", "cli", "generate", "--model", str(bos_template_model), "--plain",
                           "--chat", "-p", "the cat", "-n", "2", "--temperature", "0", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["prompt_tokens"] == len(want)
