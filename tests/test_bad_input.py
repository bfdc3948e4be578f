"""Bad input gives one clear line and a non-zero exit, never a traceback or a crash."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eagle2_local.errors import ContextFullError, ModelError, UnsupportedModelError
from eagle2_local.llama import LlamaModel
from eagle2_local.models import read_gguf_info, resolve_model
from synthetic_model import write_model


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, input=stdin,
                          timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert needle in lines[0], lines[0]


@pytest.fixture()
def not_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("this is not a model\n" * 10)
    return p


@pytest.fixture()
def truncated(tmp_path, synth_f32):
    p = tmp_path / "cut.gguf"
    data = synth_f32.read_bytes()
    p.write_bytes(data[: len(data) * 2 // 3])
    return p


@pytest.fixture()
def header_only(tmp_path, synth_f32):
    p = tmp_path / "header.gguf"
    p.write_bytes(synth_f32.read_bytes()[:100])
    return p


def test_missing_file_api(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        resolve_model(tmp_path / "nope.gguf")


def test_not_gguf_api(not_gguf):
    with pytest.raises(ModelError, match="not a GGUF file"):
        resolve_model(not_gguf)


def test_truncated_api(truncated, header_only):
    with pytest.raises(ModelError, match="truncated"):
        read_gguf_info(truncated)
    with pytest.raises(ModelError, match="truncated or corrupt"):
        read_gguf_info(header_only)


def test_recurrent_architecture_refused(tmp_path):
    p = write_model(tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(UnsupportedModelError, match="recurrent"):
        LlamaModel(p)


def test_unknown_architecture(tmp_path):
    p = write_model(tmp_path / "alien.gguf", arch="alienformer")
    with pytest.raises(ModelError, match="alienformer"):
        LlamaModel(p)


@pytest.mark.parametrize("case", ["missing", "not_gguf", "truncated", "arch"])
def test_cli_bad_model(case, tmp_path, not_gguf, truncated):
    path, needle = {
        "missing": (tmp_path / "nope.gguf", "not found"),
        "not_gguf": (not_gguf, "not a GGUF"),
        "truncated": (truncated, "truncated"),
        "arch": (write_model(tmp_path / "m.gguf", arch="mamba"), "recurrent"),
    }[case]
    proc = run_cli("generate", "--model", str(path), "--prompt", "hi", "--plain", "-n", "4")
    assert_one_line_error(proc, needle)


def test_cli_prompt_longer_than_context(synth_f32):
    proc = run_cli("generate", "--model", str(synth_f32), "--prompt", "the cat " * 200, "--plain",
                   "--n-ctx", "64", "-n", "4")
    assert_one_line_error(proc, "context")


def test_cli_tree_larger_than_batch(synth_f32):
    proc = run_cli("generate", "--model", str(synth_f32), "--draft-model", str(synth_f32), "--prompt", "hi",
                   "--total-tokens", "300", "-n", "4")
    assert_one_line_error(proc, "total_tokens")


def test_api_prompt_longer_than_context(synth_f32):
    from eagle2_local.api import Eagle2
    with Eagle2(synth_f32, n_ctx=64) as llm:
        with pytest.raises(ContextFullError, match="context"):
            llm.create_completion("the cat " * 200, max_tokens=4)
        # nothing is lost: the same object still works afterwards
        out = llm.create_completion("the cat", max_tokens=4, temperature=0)
        assert out["usage"]["completion_tokens"] >= 1


def test_api_empty_prompt_is_not_a_full_context(synth_f32):
    from eagle2_local.api import Eagle2
    from eagle2_local.errors import EmptyPromptError
    with Eagle2(synth_f32, n_ctx=64) as llm:
        with pytest.raises(EmptyPromptError, match="empty") as info:
            llm.create_completion([], max_tokens=4)
        assert not isinstance(info.value, ContextFullError)


def test_cli_help_lists_commands():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for cmd in ("generate", "chat"):
        assert cmd in proc.stdout
    for cmd in ("generate", "chat"):
        sub = run_cli(cmd, "--help")
        assert sub.returncode == 0 and "--model" in sub.stdout and "--temperature" in sub.stdout


@pytest.mark.parametrize("draft, needle", [("lookup:x.gguf", "reads no file"), ("guess", "unknown draft kind"),
                                           ("head", "needs a file")])
def test_cli_bad_draft_kind(synth_f32, draft, needle):
    proc = run_cli("generate", "--model", str(synth_f32), "--draft", draft, "--prompt", "hi", "-n", "4")
    assert_one_line_error(proc, needle)
