"""benchmarks/synthetic_model.py: every architecture it writes loads in the bundled llama.cpp, says what kind of
memory it has (recurrent, hybrid), and greedy-decodes with finite logits."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest

from benchmarks.synthetic_model import ARCHS, EXPECTED_KIND, write_arch_model
from tests.support.synthetic_model import write_model


def greedy(path: Path, n_tokens: int, *, load_mtp: bool = False, n_rs_seq: int = 0) -> dict:
    """Load ``path`` with plain llama_cpp calls, decode a short prompt and ``n_tokens`` greedy tokens one at a time;
    return the tokens, whether every logit was finite, and what llama.cpp reports of the model and context."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.load_mtp = load_mtp
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    assert model, f"llama.cpp could not load {path.name}"
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 256, 64, 64
    cparams.n_threads = cparams.n_threads_batch = 1
    cparams.n_rs_seq = n_rs_seq
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    try:
        assert ctx, f"llama.cpp could not create a context for {path.name}"
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        text = b"the water is long and the code will return"
        buf = (llama_cpp.llama_token * 64)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, 64, True, False)
        assert 0 < n < 64
        batch_tokens, out, finite = list(buf[:n]), [], True
        for _ in range(n_tokens + 1):
            arr = (llama_cpp.llama_token * len(batch_tokens))(*batch_tokens)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(batch_tokens))) == 0
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            finite &= bool(np.isfinite(logits).all())
            batch_tokens = [int(np.argmax(logits))]
            out.append(batch_tokens[0])
        return {"tokens": out[:n_tokens], "finite": finite,
                "recurrent": llama_cpp.llama_model_is_recurrent(model),
                "hybrid": llama_cpp.llama_model_is_hybrid(model),
                "n_rs_seq": llama_cpp.llama_n_rs_seq(ctx),
                "n_layer_nextn": llama_cpp.llama_model_n_layer_nextn(model)}
    finally:
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_loads_and_decodes(tmp_path, arch):
    t0 = time.perf_counter()
    path = write_arch_model(tmp_path / f"{arch}.gguf", arch)
    assert time.perf_counter() - t0 < 1.0, "tiny models must be quick to write"
    assert path.stat().st_size < 4 << 20
    got = greedy(path, 20)
    assert got["finite"]
    assert (got["recurrent"], got["hybrid"]) == EXPECTED_KIND[arch]
    assert got["n_layer_nextn"] == 0


def test_weights_follow_the_seed(tmp_path):
    a = write_arch_model(tmp_path / "a.gguf", "qwen35", seed=1).read_bytes()
    b = write_arch_model(tmp_path / "b.gguf", "qwen35", seed=1).read_bytes()
    c = write_arch_model(tmp_path / "c.gguf", "qwen35", seed=2).read_bytes()
    assert a == b and a != c


def test_llama_is_write_models_model(tmp_path):
    """The llama control has write_model's tensors, bit for bit, for the same seed and block scale."""
    ours = gguf.GGUFReader(write_arch_model(tmp_path / "a.gguf", "llama", seed=3, block_scale=0.5)).tensors
    theirs = gguf.GGUFReader(write_model(tmp_path / "b.gguf", seed=3, block_scale=0.5)).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(ours, theirs))


def test_qwen35_mtp_block(tmp_path):
    """--mtp: one NextN block after the trunk, loaded with load_mtp; the trunk decodes as without it."""
    plain = write_arch_model(tmp_path / "plain.gguf", "qwen35")
    mtp = write_arch_model(tmp_path / "mtp.gguf", "qwen35", mtp=True)
    got = greedy(mtp, 20, load_mtp=True, n_rs_seq=4)
    assert got["finite"] and got["n_layer_nextn"] == 1 and got["hybrid"]
    assert got["n_rs_seq"] == 4  # qwen35 supports recurrent-state rollback
    # the trunk's weights come first in the random stream, so the MTP file's trunk is the plain file's
    assert greedy(mtp, 20)["tokens"] == greedy(plain, 20)["tokens"]


def test_rollback_support(tmp_path):
    """n_rs_seq sticks for the hybrids that support partial rollback and is clamped to 0 for Mamba-2."""
    for arch, expected in (("lfm2", 4), ("mamba2", 0), ("llama", 0)):
        path = write_arch_model(tmp_path / f"{arch}.gguf", arch)
        assert greedy(path, 2, n_rs_seq=4)["n_rs_seq"] == expected, arch


def test_unknown_shape_and_flags(tmp_path):
    with pytest.raises(ValueError):
        write_arch_model(tmp_path / "x.gguf", "mamba2", shape="qwen3.5-0.8b")
    with pytest.raises(ValueError):
        write_arch_model(tmp_path / "x.gguf", "lfm2", mtp=True)
    with pytest.raises(ValueError):
        write_arch_model(tmp_path / "x.gguf", "gpt9")

