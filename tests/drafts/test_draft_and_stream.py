"""Draft-model vocabulary checks, UTF-8-safe streaming and the generate command's JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle2_local.decoding.stopping import TokenEmitter
from eagle2_local.drafts import check_same_vocab
from eagle2_local.errors import IncompatibleDraftError
from eagle2_local.llamacpp.llama import LlamaModel
from tests.support.synthetic_model import write_model


def test_vocab_mismatch_names_first_difference(tmp_path, synth_q8, smollm2_path):
    target = LlamaModel(synth_q8)
    check_same_vocab(target, LlamaModel(write_model(tmp_path / "same.gguf", seed=3)))  # same vocab, other weights
    renamed = LlamaModel(write_model(tmp_path / "renamed.gguf", rename={300: "\u2581zebra"}))
    with pytest.raises(IncompatibleDraftError, match=r"token 300 differs"):
        check_same_vocab(target, renamed)
    with pytest.raises(IncompatibleDraftError, match="vocabulary sizes differ"):
        check_same_vocab(target, LlamaModel(smollm2_path))


def test_cli_refuses_incompatible_draft(tmp_path, synth_q8):
    renamed = write_model(tmp_path / "renamed.gguf", rename={300: "\u2581zebra"})
    proc = subprocess.run([sys.executable, "-m", "cli", "generate", "--model", str(synth_q8), "--draft-model",
                           str(renamed), "-p", "hi", "-n", "4"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "token 300 differs" in proc.stderr and "Traceback" not in proc.stderr


def test_streaming_never_splits_a_utf8_character(synth_q8):
    model = LlamaModel(synth_q8)
    byte_token = {model.token_text(t): t for t in range(model.n_vocab)}
    e_acute = [byte_token[b"<0xC3>"], byte_token[b"<0xA9>"]]
    assert [model.token_bytes(t) for t in e_acute] == [b"\xc3", b"\xa9"]  # byte-fallback tokens
    em = TokenEmitter(model, max_tokens=10)
    assert em.push(e_acute[0]) == ""  # half a character: held back
    assert em.push(e_acute[1]) == "\u00e9"
    cut = TokenEmitter(model, max_tokens=1)
    assert cut.push(e_acute[0]) == "\ufffd" and cut.finish_reason == "length"  # a cut character is replaced


def test_stop_string_prefix_is_held_back(synth_q8):
    model = LlamaModel(synth_q8)
    toks = model.tokenize("the cat sat", add_special=False)
    em = TokenEmitter(model, max_tokens=10, stop=(" sat",))
    shown = "".join(em.push(t) for t in toks)
    assert em.finish_reason == "stop" and shown == em.text == " the cat"


def test_generate_json_fields(synth_q8):
    proc = subprocess.run([sys.executable, "-m", "cli", "generate", "--model", str(synth_q8), "--draft-model",
                           str(synth_q8), "-p", "the cat", "-n", "20", "--temperature", "0", "--total-tokens", "8",
                           "--depth", "4", "--tree-top-k", "2", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("text", "tokens", "n_tokens", "finish_reason"):
        assert key in out
    for key in ("tau", "target_passes", "accepted_per_depth", "draft_s", "verify_s", "tokens_per_s", "engine",
                "prompt_tokens"):
        assert key in out["stats"]
    assert out["n_tokens"] == len(out["tokens"]) == 20 and out["stats"]["tau"] > 1
    plain = subprocess.run([sys.executable, "-m", "cli", "generate", "--model", str(synth_q8), "--plain",
                            "-p", "the cat", "-n", "20", "--temperature", "0", "--json"], capture_output=True,
                           text=True, timeout=120)
    assert json.loads(plain.stdout)["tokens"] == out["tokens"]
