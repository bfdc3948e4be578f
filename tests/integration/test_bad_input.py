"""Bad input gives one clear line and a non-zero exit, never a traceback or a crash."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eagle2_local.errors import ContextFullError, Eagle2Error, IncompatibleDraftError, ModelError
from eagle2_local.formats.models import read_gguf_info, resolve_model
from eagle2_local.llamacpp.llama import LlamaModel
from tests.support.helpers import assert_one_line_error, run_cli
from tests.support.synthetic_model import write_model


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


def test_architecture_without_its_tensors_gets_llamas_reason(tmp_path):
    """No architecture is refused by name: a file that is not what its architecture needs gets llama.cpp's own
    reason (recurrent models load and decode: tests/integration/test_recurrent.py)."""
    p = write_model(tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(ModelError, match="mamba.ssm.conv_kernel"):
        LlamaModel(p)


def test_unknown_architecture(tmp_path):
    p = write_model(tmp_path / "alien.gguf", arch="alienformer")
    with pytest.raises(ModelError, match="alienformer"):
        LlamaModel(p)


@pytest.mark.parametrize("case", ["missing", "not_gguf", "truncated", "arch", "diffusion"])
def test_cli_bad_model(case, tmp_path, not_gguf, truncated):
    path, needle = {
        "missing": (tmp_path / "nope.gguf", "not found"),
        "not_gguf": (not_gguf, "not a GGUF"),
        "truncated": (truncated, "truncated"),
        "arch": (write_model(tmp_path / "m.gguf", arch="mamba"), "mamba.ssm.conv_kernel"),
        "diffusion": (write_model(tmp_path / "d.gguf", arch="dream"), "diffusion model"),
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


@pytest.mark.parametrize("command, args, needle", [
    ("generate", ("--prompt", "hi", "--plain", "--max-tokens", "-5"), "--max-tokens must be 0 or more, got -5"),
    ("chat", ("--plain", "-n", "-1"), "--max-tokens must be 0 or more, got -1"),
    ("verify-cost", ("--sizes", "8,x"), "--sizes takes comma-separated whole numbers"),
    ("verify-cost", ("--sizes", "0,8"), "every tree size must be 1 or more"),
])
def test_cli_bad_numbers(synth_f32, command, args, needle):
    proc = run_cli(command, "--model", str(synth_f32), *args)
    assert_one_line_error(proc, needle)
    assert proc.returncode == 1


def test_cli_zero_max_tokens_means_up_to_the_context(synth_f32):
    """0 is llama-cpp-python's "no limit but the context" (as in the API and the server), not "nothing"."""
    proc = run_cli("generate", "--model", str(synth_f32), "--prompt", "hi", "--plain", "-n", "0", "--json",
                   "--temperature", "0", "--n-ctx", "64")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["n_tokens"] > 0


@pytest.mark.parametrize("lines, args, needle", [
    (['{"turns": ["hello"]}', "[1, 2]"], (), ":2: a record must be a JSON object, got [1, 2]"),
    (['"just a string"'], (), ":1: a record must be a JSON object"),
    (['{"turns": 5}'], (), ":1: record has neither 'turns' nor 'prompt'"),
    (['{"turns": ["hello"]}'], ("--repeat", "0"), "--repeat must be 1 or more, got 0"),
    (['{"turns": ["hello"], "schema": {"type": "object"}}'], ("--plain",),
     "bench runs plain decoding beside speculation by itself: drop --plain"),
])
def test_cli_bench_bad_prompts_and_repeat(synth_f32, tmp_path, lines, args, needle):
    prompts = tmp_path / "set.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    proc = run_cli("bench", "--model", str(synth_f32), "--prompts", str(prompts), *args)
    assert_one_line_error(proc, needle)
    assert proc.returncode == 1


def test_bench_refuses_zero_repeats_in_the_api():
    from eagle2_local.bench.harness import Bench
    from eagle2_local.tree.sampling import SamplingParams
    with pytest.raises(Eagle2Error, match="repeat must be 1 or more"):
        Bench(llm=None, sampling=SamplingParams(), max_tokens=8, repeat=0)


def test_cli_train_init_from_a_checkpoint_for_another_model(tmp_path, synth_f32):
    """A warm start from a head trained for another target is refused in one line, before any extraction."""
    torch = pytest.importorskip("torch")
    from eagle2_local.train.pipeline import build_head
    from eagle2_local.train.target_weights import read_target_weights

    other = read_target_weights(write_model(tmp_path / "wide.gguf", n_embd=96, n_head=4, n_ff=160))
    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"head": build_head(other, np.arange(8), seed=0).state_dict()}, ckpt)
    not_a_checkpoint = tmp_path / "notes.pt"
    not_a_checkpoint.write_text("not a checkpoint")
    for path, needle in ((ckpt, "does not fit this target: input_norm.weight is (288,) there, (192,) here"),
                         (not_a_checkpoint, "is not a checkpoint written by `eagle2-local train`")):
        proc = run_cli("train", "-m", str(synth_f32), "--out", str(tmp_path / "head.gguf"), "--init-from",
                       str(path), "-t", "1")
        assert_one_line_error(proc, needle)
        assert proc.returncode == 1
        assert not (tmp_path / "head.work" / "cache").exists()  # refused before extracting a single feature


def test_speculative_without_a_draft_is_the_package_error(synth_f32):
    from eagle2_local.api import Eagle2
    with Eagle2(synth_f32, n_ctx=64) as llm:
        assert not llm.speculative
        with pytest.raises(Eagle2Error, match="needs a draft") as info:
            llm.create_completion("the cat", max_tokens=4, speculative=True)
        assert not isinstance(info.value, ValueError)
        assert llm.create_completion("the cat", max_tokens=4, temperature=0)["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("fails", ["draft", "calibration"])
def test_eagle2_frees_what_it_loaded_when_the_draft_fails(synth_f32, tmp_path, monkeypatch, fails):
    """A failed constructor returns no object to close(): the target's model, context and any opened draft
    must be freed before the error propagates."""
    import eagle2_local.api as api

    opened: list = []

    class Recorded(api.LlamaModel):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            opened.append(self)

    class RecordedTarget(api.Target):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            opened.append(self.ctx)

    monkeypatch.setattr(api, "LlamaModel", Recorded)
    monkeypatch.setattr(api, "Target", RecordedTarget)
    if fails == "draft":  # another vocabulary: refused when the draft is checked against the target
        kw = dict(draft_model_path=write_model(tmp_path / "other.gguf", rename={5: "zzz-renamed"}))
        expected = IncompatibleDraftError
    else:  # the draft opened, the auto budget's calibration fails afterwards
        def broken(*_a, **_kw):
            raise RuntimeError("calibration broke")
        monkeypatch.setattr(api.Eagle2, "_tree_budget", broken)
        kw = dict(draft_model_path=synth_f32, budget="auto")
        expected = RuntimeError
    with pytest.raises(expected):
        api.Eagle2(synth_f32, n_ctx=64, **kw)
    assert opened and all(o._closed for o in opened), [(type(o).__name__, o._closed) for o in opened]
    if fails == "calibration":
        assert len(opened) == 2  # the target's model and context were both opened, then freed


def test_asking_for_more_prompts_than_the_sets_hold_is_an_error(tmp_path):
    """Once an endless loop in the tests' prompt loader; the package's interleaving refuses instead."""
    from eagle2_local.bench.prompt_sets import PromptSet, interleaved
    from tests.support.prompts import load_prompts
    sets = [PromptSet("a", ["a0", "a1", "a2"]), PromptSet("b", ["b0"])]
    assert interleaved(sets, 4) == ["a0", "b0", "a1", "a2"]
    with pytest.raises(Eagle2Error, match="asked for 5 prompts but the sets \\(a, b\\) hold 4"):
        interleaved(sets, 5)
    with pytest.raises(pytest.fail.Exception, match="hold"):
        load_prompts(10 ** 6)
