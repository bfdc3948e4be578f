"""Converting EAGLE-1/2 head folders to GGUF: round trips of all variants and file formats, and clear refusals."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from convert.eagle1 import convert_head
from eagle2_local.errors import IncompatibleDraftError, ModelError
from eagle2_local.formats.eagle1_format import ARCH, TENSOR_NAMES, read_head
from tests.support.eagle_heads import VARIANTS, head_config, head_tensors, write_head_dir
from tests.support.synthetic_model import vocab

SYNTH_VOCAB = len(vocab()[0])


def from_gguf_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint's own names for a converted head's tensors (the converter's naming, inverted)."""
    hf_name = {gguf_name: hf for hf, gguf_name in TENSOR_NAMES.items()}
    return {hf_name[name]: arr for name, arr in tensors.items()}


def round_trip(tmp_path, variant: str, fmt: str, dtype, outtype: str) -> tuple[dict, dict]:
    cfg = head_config(variant)
    tensors = head_tensors(cfg, seed=3, dtype=dtype)
    folder = write_head_dir(tmp_path / f"{variant}-{fmt}", cfg, tensors, fmt)
    head = read_head(convert_head(folder, tmp_path / f"{variant}-{fmt}.gguf", outtype=outtype))
    return tensors, head


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("fmt", ["safetensors", "torch", "handmade"])
def test_round_trip_identical(tmp_path, variant, fmt):
    """f32 and f16 checkpoints come back bit-identical from an f32 / f16 GGUF; biases follow the variant."""
    for dtype, outtype in ((np.float32, "f32"), (np.float16, "f16")):
        tensors, head = round_trip(tmp_path / outtype, variant, fmt, dtype, outtype)
        back = from_gguf_names(head.tensors)
        assert sorted(back) == sorted(tensors)
        for name, arr in tensors.items():
            assert np.array_equal(back[name], arr.astype(np.float32)), name
    p = head.params
    assert (p.fc_bias, p.qkv_bias) == (VARIANTS[variant]["bias"], variant == "qwen2")
    assert p.rope_base == VARIANTS[variant]["rope_theta"]
    assert p.n_head_kv == 4 // VARIANTS[variant]["kv_div"]
    assert head.provenance["source.format"] == ("safetensors" if fmt == "safetensors" else "pytorch")
    assert head.provenance["target.name"] == f"synthetic-{variant}-target"
    assert json.loads(head.provenance["source.config"])["model_type"] == VARIANTS[variant]["model_type"]


def test_bf16_torch_checkpoint_widens_exactly(tmp_path):
    import torch  # bf16 files need torch to write; the reader itself is torch-free
    cfg = head_config("llama3")
    tensors = head_tensors(cfg, seed=1)
    folder = tmp_path / "bf16"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    bf = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()}
    torch.save(bf, folder / "pytorch_model.bin")
    head = read_head(convert_head(folder, tmp_path / "bf16.gguf", outtype="f32"))
    back = from_gguf_names(head.tensors)
    for name, t in bf.items():
        assert np.array_equal(back[name], t.float().numpy()), name


def test_q8_0_is_close_and_keeps_norms_exact(tmp_path):
    tensors, head = round_trip(tmp_path, "qwen2", "safetensors", np.float32, "q8_0")
    back = from_gguf_names(head.tensors)
    norm = "layers.0.post_attention_layernorm.weight"
    assert np.array_equal(back[norm], tensors[norm])
    assert np.array_equal(back["fc.bias"], tensors["fc.bias"])
    w = tensors["fc.weight"]
    assert np.abs(back["fc.weight"] - w).max() <= np.abs(w).max() / 127 + 1e-6
    assert (tmp_path / "qwen2-safetensors.gguf").stat().st_size < 0.4 * sum(v.nbytes for v in tensors.values())


# ------------------------------------------------------------------ refusals
def test_folder_without_weights_or_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(head_config("vicuna")))
    with pytest.raises(ModelError, match="has no weights: expected model.safetensors or pytorch_model.bin"):
        convert_head(tmp_path, tmp_path / "x.gguf")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        convert_head(empty, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_unknown_or_inconsistent_config(tmp_path):
    cfg = head_config("vicuna")
    tensors = head_tensors(cfg)
    write_head_dir(tmp_path / "a", dict(cfg, model_type="gpt2"), tensors)
    with pytest.raises(ModelError, match="unknown head config \\(model_type 'gpt2'\\)"):
        convert_head(tmp_path / "a", tmp_path / "a.gguf")
    write_head_dir(tmp_path / "b", {k: v for k, v in cfg.items() if k != "hidden_size"}, tensors)
    with pytest.raises(ModelError, match="config.json lacks hidden_size"):
        convert_head(tmp_path / "b", tmp_path / "b.gguf")
    write_head_dir(tmp_path / "c", dict(cfg, bias=False), tensors)
    with pytest.raises(ModelError, match="config says fc bias is off but the weights contain it"):
        convert_head(tmp_path / "c", tmp_path / "c.gguf")
    write_head_dir(tmp_path / "d", cfg, dict(tensors, **{"layers.1.mlp.up_proj.weight": tensors["fc.bias"]}))
    with pytest.raises(ModelError, match="unexpected tensor 'layers.1.mlp.up_proj.weight'"):
        convert_head(tmp_path / "d", tmp_path / "d.gguf")
    write_head_dir(tmp_path / "e", dict(cfg, intermediate_size=128), tensors)
    with pytest.raises(ModelError, match="blk.0.ffn_gate.weight has shape \\(96, 64\\), expected \\(128, 64\\)"):
        convert_head(tmp_path / "e", tmp_path / "e.gguf")


def test_pickle_with_foreign_global_is_refused(tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(head_config("vicuna")))
    with zipfile.ZipFile(folder / "pytorch_model.bin", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueR.")
    with pytest.raises(ModelError, match="refusing to load os.system"):
        convert_head(folder, tmp_path / "x.gguf")
    (folder / "pytorch_model.bin").write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="not a zip archive"):
        convert_head(folder, tmp_path / "x.gguf")


def test_truncated_torch_file_is_refused(tmp_path):
    cfg = head_config("vicuna")
    folder = write_head_dir(tmp_path / "h", cfg, head_tensors(cfg), "handmade")
    path = folder / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[:-4000])
    with pytest.raises(ModelError):
        convert_head(folder, tmp_path / "x.gguf")


def test_target_mismatch_is_refused(tmp_path, synth_q8):
    """synth_q8 has hidden size 64 and a SYNTH_VOCAB-token vocabulary."""
    for cfg, needle in ((head_config("vicuna", hidden=32, vocab=SYNTH_VOCAB), "hidden size is 32 but synth-q8"),
                        (head_config("vicuna", hidden=64, vocab=SYNTH_VOCAB + 5), "vocabulary has"),
                        (dict(head_config("vicuna", vocab=SYNTH_VOCAB), bos_token_id=7), "BOS token is 7")):
        folder = write_head_dir(tmp_path / needle[:5], cfg, head_tensors(cfg, with_embedding=False))
        with pytest.raises(IncompatibleDraftError, match=needle):
            convert_head(folder, tmp_path / "x.gguf", target=synth_q8)
    cfg = head_config("vicuna", vocab=SYNTH_VOCAB)
    folder = write_head_dir(tmp_path / "tok", cfg, head_tensors(cfg, with_embedding=False))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"<unk>": 0, "<s>": 1, "hello": 5}}}))
    with pytest.raises(IncompatibleDraftError, match="tokenizers differ at token 5"):
        convert_head(folder, tmp_path / "x.gguf", target=synth_q8)
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"<unk>": 0, "<s>": 1}}}))
    assert read_head(convert_head(folder, tmp_path / "ok.gguf", target=synth_q8)).params.vocab_size == SYNTH_VOCAB


def test_read_head_errors(tmp_path, synth_q8):
    with pytest.raises(ModelError, match=f"not an EAGLE-1/2 head \\('{ARCH}'\\)"):
        read_head(synth_q8)
    cfg = head_config("llama3")
    good = convert_head(write_head_dir(tmp_path / "h", cfg, head_tensors(cfg)), tmp_path / "h.gguf", outtype="f32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:-1000])
    with pytest.raises(ModelError, match="truncated"):
        read_head(cut)


def test_cli_convert_progress_and_errors(tmp_path):
    from cli import main

    cfg = head_config("qwen2")
    folder = write_head_dir(tmp_path / "q", cfg, head_tensors(cfg), "torch")
    out = tmp_path / "q.gguf"
    res = CliRunner().invoke(main, ["convert", str(folder), "-o", str(out), "--outtype", "q8_0"])
    assert res.exit_code == 0, res.output
    assert "converting" in res.output and f"wrote {out}" in res.output
    assert read_head(out).params.qkv_bias
    (folder / "pytorch_model.bin").unlink()
    res = CliRunner().invoke(main, ["convert", str(folder), "-o", str(out)])
    assert res.exit_code == 1 and "has no weights" in res.output and "Traceback" not in res.output
