"""Published EAGLE head layouts (SafeAILab .bin, SpecForge, ModelOpt shards, speculators, upstream llama.cpp
GGUFs, EAGLE-1/2 Qwen2 biases): each converts to the feature layers and RoPE the publisher meant and drafts
losslessly against SmolLM2; each shape the eagle3 graph cannot run is refused with one line, exit 1, no file."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from convert.eagle1 import convert_head
from convert.torch_pickle import load_torch_state_dict
from eagle2_local.api import Eagle2
from eagle2_local.errors import ModelError
from eagle2_local.formats.eagle1_format import read_head
from eagle2_local.formats.gguf_fields import copy_gguf
from eagle2_local.formats.gguf_tensors import tensor_index
from eagle2_local.formats.models import read_gguf_info
from tests.support.eagle_heads import head_config, head_tensors, write_head_dir
from tests.support.publisher_heads import (LLAMA3_SCALING, SMOL_LAYERS, llama_layer_config, modelopt_eagle3,
                                           safeailab_eagle3, specforge_eagle3, speculators_eagle3, tensors)
from tests.support.synthetic_model import vocab

PROMPT = "The three primary colors are"
pytestmark = pytest.mark.smollm2


def convert_cli(*args: str):
    from cli import main

    return CliRunner().invoke(main, ["convert", *map(str, args)])


def fields(path) -> dict:
    """Metadata without the long tokenizer arrays (gguf-py's reader takes seconds on a 49k vocabulary)."""
    return read_gguf_info(path).metadata


def gguf_tensor(path, name: str) -> np.ndarray:
    """The stored values (f32, f16, i64) or, for quantized types, the raw bytes."""
    entry = tensor_index(path)[name]
    raw = np.fromfile(path, dtype=np.uint8, count=entry.n_bytes, offset=entry.offset)
    views = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
             gguf.GGMLQuantizationType.I64: np.int64}
    return raw.view(views.get(gguf.GGMLQuantizationType(entry.qtype), np.uint8))


@pytest.fixture(scope="module")
def plain_text(smollm2_path) -> str:
    with Eagle2(smollm2_path, n_threads=1, n_ctx=256) as llm:
        return llm.create_completion(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"]


def assert_lossless(smollm2_path, head, plain_text: str) -> None:
    """Greedy output through EAGLE-2 trees drafted by the converted head equals plain greedy output."""
    with Eagle2(smollm2_path, head_path=head, n_threads=1, n_ctx=256, total_tokens=8, depth=3, tree_top_k=3) as llm:
        assert llm.engine_name.startswith("eagle3:")
        text = llm.create_completion(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"]
    assert text == plain_text


def converted(tmp_path, folder, smollm2_path, *extra: str):
    out = tmp_path / f"{folder.name}.gguf"
    res = convert_cli(folder, "-o", out, "--target", smollm2_path, *extra)
    assert res.exit_code == 0, res.output
    assert "choices made for you" in res.output
    return out, res.output, fields(out)


def test_safeailab_bin_with_int64_and_bool_buffers(tmp_path, smollm2_path, plain_text):
    folder = safeailab_eagle3(tmp_path / "EAGLE3-SmolLM2")
    raw = load_torch_state_dict(folder / "pytorch_model.bin")  # torch-free reader
    want = tensors()
    assert raw["d2t"].dtype == np.int64 and np.array_equal(raw["d2t"], want["d2t"])
    assert raw["t2d"].dtype == np.bool_ and np.array_equal(raw["t2d"], want["t2d"])
    out, printed, f = converted(tmp_path, folder, smollm2_path)
    assert f["eagle3.target_layers"] == [2, 15, 27]  # EAGLE-3's default for a 30-layer target
    assert "EAGLE-3's default" in printed and f["eagle2_local.feature_layers.source"] == "default"
    assert f["eagle3.rope.freq_base"] == 500000.0 and "base 500000 (rope_theta)" in printed
    assert np.array_equal(gguf_tensor(out, "d2t"), want["d2t"] + np.arange(want["d2t"].size))
    assert "1024 of the target's 49152 tokens" in f["eagle2_local.choice.draft_vocabulary"]
    assert "pytorch" in f["eagle2_local.choice.dtype"] and "float16" in f["eagle2_local.choice.dtype"]
    assert_lossless(smollm2_path, out, plain_text)


def test_specforge_nested_ids_are_layer_outputs(tmp_path, smollm2_path, plain_text):
    folder = specforge_eagle3(tmp_path / "specforge", ids=[1, 14, 26])
    out, printed, f = converted(tmp_path, folder, smollm2_path)
    assert f["eagle3.target_layers"] == [2, 15, 27]  # outputs of 1, 14, 26 = inputs of 2, 15, 27
    assert f["eagle2_local.feature_layers.meaning"] == "output"
    assert f["eagle2_local.feature_layers.config_ids"] == [1, 14, 26]
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in printed
    assert f["eagle3.rope.freq_base"] == 250000.0  # transformers-5 rope_parameters
    assert "rope_parameters.rope_theta" in f["eagle2_local.choice.rope"]
    assert_lossless(smollm2_path, out, plain_text)
    # the user may say the ids were written the other way
    res = convert_cli(folder, "-o", tmp_path / "as-inputs.gguf", "--target", smollm2_path, "--layer-ids-mean",
                      "input")
    assert res.exit_code == 0, res.output
    assert fields(tmp_path / "as-inputs.gguf")["eagle3.target_layers"] == [1, 14, 26]
    # and give the RoPE base its training code really used (AngelSlim's ignores the config's)
    res = convert_cli(folder, "-o", tmp_path / "theta.gguf", "--target", smollm2_path, "--rope-theta", "10000")
    assert res.exit_code == 0 and "base 10000 (--rope-theta)" in res.output, res.output
    assert fields(tmp_path / "theta.gguf")["eagle3.rope.freq_base"] == 10000.0


def test_modelopt_sharded_with_custom_ids(tmp_path, smollm2_path, plain_text):
    folder = modelopt_eagle3(tmp_path / "modelopt", ids=[3, 12, 24])
    assert sorted(p.name for p in folder.glob("*.safetensors")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    out, printed, f = converted(tmp_path, folder, smollm2_path)
    assert f["eagle3.target_layers"] == [4, 13, 25]
    assert "safetensors (2 shards)" in f["eagle2_local.choice.dtype"]
    assert_lossless(smollm2_path, out, plain_text)


def test_speculators_top_level_ids_and_llama3_rope(tmp_path, smollm2_path, plain_text):
    folder = speculators_eagle3(tmp_path / "speculators", ids=[2, 15, 27])
    out, printed, f = converted(tmp_path, folder, smollm2_path)
    assert f["eagle3.target_layers"] == [2, 15, 27] and f["eagle2_local.feature_layers.meaning"] == "input"
    assert f["eagle3.norm_before_residual"] is True
    assert f["eagle3.rope.freq_base"] == 500000.0 and "llama3 scaling" in printed
    # llama3 scaling as frequency divisors, computed here from the definition
    s = LLAMA3_SCALING
    inv = 500000.0 ** -(np.arange(0, 64, 2) / 64)
    wavelen = 2 * np.pi / inv
    ctx = s["original_max_position_embeddings"]
    smooth = (ctx / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    scaled = np.where(wavelen > ctx / s["low_freq_factor"], inv / s["factor"], inv)
    medium = (wavelen >= ctx / s["high_freq_factor"]) & (wavelen <= ctx / s["low_freq_factor"])
    scaled = np.where(medium, (1 - smooth) * inv / s["factor"] + smooth * inv, scaled)
    got = gguf_tensor(out, "rope_freqs.weight")
    np.testing.assert_allclose(got, inv / scaled, rtol=1e-5)
    assert got.min() == 1.0 and got.max() == s["factor"]  # both ends of the spectrum are present
    assert_lossless(smollm2_path, out, plain_text)


def test_upstream_llama_cpp_gguf_is_translated(tmp_path, smollm2_path, plain_text, monkeypatch):
    """An eagle3 GGUF naming its layers eagle3.extract_layers: `--head` translates it once into the cache and
    drafts losslessly; `convert upstream.gguf` writes the same translation where the user wants it."""
    monkeypatch.setenv("EAGLE2_LOCAL_CACHE", str(tmp_path / "cache"))
    ours, _, _ = converted(tmp_path, safeailab_eagle3(tmp_path / "src"), smollm2_path)
    upstream = tmp_path / "upstream.gguf"
    copy_gguf(ours, upstream, {"eagle3.target_layers": "eagle3.extract_layers"}, "eagle3")
    assert "eagle3.target_layers" not in fields(upstream) and fields(upstream)["eagle3.extract_layers"] == [2, 15, 27]
    assert_lossless(smollm2_path, upstream, plain_text)
    cached = list((tmp_path / "cache").rglob("*.gguf"))
    assert len(cached) == 1 and fields(cached[0])["eagle3.target_layers"] == [2, 15, 27]
    res = convert_cli(upstream, "-o", tmp_path / "local.gguf")
    assert res.exit_code == 0, res.output
    assert "renamed to eagle3.target_layers" in res.output
    f = fields(tmp_path / "local.gguf")
    assert f["eagle3.target_layers"] == [2, 15, 27] and "eagle3.extract_layers" not in f
    for name in ("fc.weight", "d2t", "blk.0.attn_q.weight"):
        assert np.array_equal(gguf_tensor(tmp_path / "local.gguf", name), gguf_tensor(ours, name))
    res = convert_cli(ours, "-o", tmp_path / "again.gguf")
    assert res.exit_code == 1 and "already stores eagle3.target_layers" in res.output
    res = convert_cli(upstream, "-o", tmp_path / "again.gguf", "--rope-theta", "1")
    assert res.exit_code == 1 and "--rope-theta apply to EAGLE-3 head folders only" in res.output


def _qwen3_speculators(d):
    t = tensors(prefix="layers.0.")
    t["layers.0.self_attn.q_norm.weight"] = t["layers.0.self_attn.k_norm.weight"] = np.ones(64, np.float32)
    return speculators_eagle3(d, ids=[2, 15, 27], t=t)


REFUSALS = {
    "q_norm": (_qwen3_speculators, "tensor layers.0.self_attn.k_norm.weight|tensor layers.0.self_attn.q_norm.weight"),
    "fc_norm": (lambda d: specforge_eagle3(d, [1, 14, 26], t={**tensors(), "fc_norm.weight": np.ones(576, "f4")}),
                "tensor fc_norm.weight"),
    "q_bias": (lambda d: safeailab_eagle3(d, {**tensors(), "midlayer.self_attn.q_proj.bias": np.zeros(576, "f4")}),
               "tensor midlayer.self_attn.q_proj.bias"),
    "unknown": (lambda d: specforge_eagle3(d, [1, 14, 26], t={**tensors(), "extra.weight": np.ones(4, "f4")}),
                "unexpected tensor extra.weight"),
    "two_layers": (lambda d: speculators_eagle3(d, [2, 15, 27], layer=llama_layer_config(num_hidden_layers=2)),
                   "this head has 2 decoder layers; the eagle3 graph runs 1"),
    "yarn": (lambda d: speculators_eagle3(d, [2, 15, 27], layer=llama_layer_config(
        {"rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})), "rope_scaling type 'yarn'"),
    "last_layer_output": (lambda d: specforge_eagle3(d, [1, 14, 29]),
                          "feature layer id 29 .*output of the target's last layer"),
    "two_id_sets": (lambda d: speculators_eagle3(d, [2, 15, 27], eagle_config={
        "eagle_aux_hidden_state_layer_ids": [2, 15, 27]}), "two different feature layer sets"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_unsupported_heads_are_refused_in_one_line(tmp_path, smollm2_path, case):
    import re

    build, needle = REFUSALS[case]
    folder = build(tmp_path / case)
    out = tmp_path / "out.gguf"
    res = convert_cli(folder, "-o", out, "--target", smollm2_path)
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and re.search(needle, lines[0]), res.output
    assert not out.exists() and not list(tmp_path.glob("*.part"))


def test_missing_shard_is_refused(tmp_path, smollm2_path):
    folder = modelopt_eagle3(tmp_path / "m", ids=[1, 14, 26])
    (folder / "model-00002-of-00002.safetensors").unlink()
    res = convert_cli(folder, "-o", tmp_path / "x.gguf", "--target", smollm2_path)
    assert res.exit_code == 1 and "lists shards that are missing: model-00002-of-00002" in res.output
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("flag", ["qkv_bias", "attention_bias"])
def test_eagle1_qwen2_biases_from_either_key(tmp_path, synth_q8, flag):
    """SafeAILab's EAGLE-1/2 code reads ``qkv_bias``; transformers writes ``attention_bias``. A head whose
    config says model_type llama but carries q/k/v biases converts when either key says so, and drafts
    losslessly (the numpy engine applies the biases)."""
    cfg = head_config("qwen2", vocab=len(vocab()[0]))
    t = head_tensors(cfg, seed=5, scale=0.3, with_embedding=False)
    cfg = dict(cfg, model_type="llama", **{flag: True}, rope_parameters={"rope_theta": 20000.0, "rope_type": "default"})
    del cfg["rope_theta"]
    head = convert_head(write_head_dir(tmp_path / "h", cfg, t), tmp_path / "h.gguf", target=synth_q8)
    info = read_head(head)
    assert info.params.qkv_bias and info.params.rope_base == 20000.0
    assert "rope_parameters.rope_theta" in json.loads(info.provenance["source.choices"])["RoPE"]
    runs = []
    for extra in ({"head_path": head}, {}):
        with Eagle2(synth_q8, n_threads=1, n_ctx=256, **extra) as llm:
            runs.append(llm.create_completion("the cat sat on", max_tokens=24, temperature=0)["choices"][0]["text"])
    assert runs[0] == runs[1]
    write_head_dir(tmp_path / "bad", dict(cfg, attention_bias=not cfg.get("attention_bias", True), qkv_bias=True), t)
    with pytest.raises(ModelError, match="disagrees with itself about q/k/v biases"):
        convert_head(tmp_path / "bad", tmp_path / "bad.gguf")
    write_head_dir(tmp_path / "scaled", dict(cfg, rope_scaling={"type": "linear", "factor": 2.0}), t)
    with pytest.raises(ModelError, match="this head format runs plain RoPE"):  # the numpy engine has no scaling
        convert_head(tmp_path / "scaled", tmp_path / "scaled.gguf")
    assert not list(tmp_path.glob("bad*.gguf")) and not list(tmp_path.glob("scaled*.gguf"))
