"""EAGLE-3 heads in llama.cpp: the converter, the engine's numerics against a float64 reference, losslessness."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from benchmarks.head_checkpoints import random_eagle3
from convert.eagle3 import convert_eagle3, permute_rope_rows
from eagle2_local.api import Eagle2
from eagle2_local.decoding.target import Target
from eagle2_local.drafts.base import TreeSequences
from eagle2_local.drafts.eagle3_llama import Eagle3Engine
from eagle2_local.errors import DecodeError, IncompatibleDraftError, ModelError, TreeError
from eagle2_local.llamacpp import backend_topk
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.top_k import top_k_log_probs
from tests.support.eagle3_reference import Eagle3Reference
from tests.support.eagle_heads import chat_turn_outputs
from tests.support.prompts import load_prompts
from tests.support.synthetic_model import write_model

LAYERS = [0, 2, 3]


@pytest.fixture(scope="module")
def target4(synth_dir):
    """A 4-layer Q8_0 synthetic llama target (layer inputs are exposed for the llama architecture)."""
    return write_model(synth_dir / "synth4-q8.gguf", seed=3, n_layer=4, qtype="q8_0")


@pytest.fixture(scope="module")
def head(tmp_path_factory, target4):
    d, tensors, config = random_eagle3(tmp_path_factory.mktemp("e3") / "head", hidden=64, target_hidden=64,
                                       n_head=4, n_head_kv=2, ffn=128, vocab=604, draft_vocab=300, layers=LAYERS,
                                       scale=0.15, norm_before_fc=True)
    out = convert_eagle3(d, d.parent / "head-f32.gguf", target4, outtype="f32")
    return out, tensors, config, d


def token_embd(path) -> np.ndarray:
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == "token_embd.weight")
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, 64)


def engine_on(head_path, target_path, max_width: int = 3, max_depth: int = 4):
    """The target (its layer inputs on, one thread) and a dense-row engine for the head."""
    model = LlamaModel(target_path)
    target = Target(model, ContextSettings(n_ctx=256, n_batch=64, n_seq_max=8, n_threads=1,
                                           layer_inputs=tuple(LAYERS)))
    engine = Eagle3Engine(LlamaModel(head_path), target.ctx, max_width=max_width, max_depth=max_depth, n_threads=1,
                          in_graph_top_k=False)
    return model, target, engine


def test_convert_round_trip(head):
    path, tensors, config, _ = head
    r = gguf.GGUFReader(str(path))
    got = {t.name: np.array(t.data) for t in r.tensors}
    np.testing.assert_array_equal(got["fc.weight"].reshape(64, -1), tensors["fc.weight"])
    np.testing.assert_array_equal(got["blk.0.attn_q.weight"].reshape(64, -1),
                                  permute_rope_rows(tensors["midlayer.self_attn.q_proj.weight"], 4))
    np.testing.assert_array_equal(got["blk.0.attn_k.weight"].reshape(32, -1),
                                  permute_rope_rows(tensors["midlayer.self_attn.k_proj.weight"], 2))
    np.testing.assert_array_equal(got["d2t"], tensors["d2t"] + np.arange(300))
    np.testing.assert_array_equal(got["enc.output_norm.weight"], tensors["input_norm.weight"])
    assert list(r.fields["eagle3.target_layers"].contents()) == LAYERS
    assert r.fields["tokenizer.ggml.model"].contents() == "llama"


def test_engine_matches_reference_on_tree(head, target4):
    """Root, level-1 and level-3 logits of the llama.cpp engine equal the float64 reference (tree masks included)."""
    path, tensors, config, _ = head
    model, target, engine = engine_on(path, target4)
    ref = Eagle3Reference(tensors, config, token_embd(target4))
    prompt = model.tokenize("the water is very long and the code")
    ver = target.prefill(prompt)
    root = int(np.argmax(ver.logits[0]))
    text = prompt + [root]
    n = len(prompt)

    got_root = engine.catch_up(np.asarray(text), ver.features, 0).logits
    g = ref.encode(ver.features)
    for p in range(n):
        want_root, root_out, _ = ref.entry(text[p + 1], g[p], p, list(range(p)))
    finite = np.isfinite(want_root)
    assert np.array_equal(finite, np.isfinite(got_root))
    scale = np.abs(want_root[finite]).max()
    assert np.abs(got_root[finite] - want_root[finite]).max() < 2e-3 * scale

    # level 1: three children of the root; level 2: two children of node 0, one of node 2; level 3: below those
    committed = list(range(n))
    levels = [([0, 1, 2], [11, 57, 300], [-1, -1, -1]), ([3, 4, 5], [80, 81, 82], [0, 0, 2]),
              ([6, 7], [90, 91], [3, 5])]
    ref_state = {-1: (root_out, [])}
    for level, (ids, toks, parents) in enumerate(levels, start=1):
        got = np.array(engine.expand(np.array(ids), np.array(toks), np.array(parents), level).logits)
        for row, (cid, tok, par) in enumerate(zip(ids, toks, parents)):
            g_par, anc = ref_state[par]
            want, out, idx = ref.entry(tok, g_par, n - 1 + level, committed + anc)
            ref_state[cid] = (out, anc + [idx])
            if level in (1, 3):
                fin = np.isfinite(want)
                assert np.abs(got[row][fin] - want[fin]).max() < 2e-3 * np.abs(want[fin]).max(), (level, cid)
    engine.close()
    target.close()
    model.close()


def test_embedding_rows_of_the_wrong_width_are_refused(head, target4):
    """llama.cpp reads a batch's embedding rows at its graph's width: a wrong width is one clear error, before
    any decode, and the engine still drafts afterwards."""
    path, _, _, _ = head
    model, target, engine = engine_on(path, target4, max_width=2, max_depth=3)
    prompt = model.tokenize("the water is")
    ver = target.prefill(prompt)
    text = np.asarray(prompt + [int(np.argmax(ver.logits[0]))])
    with pytest.raises(TreeError, match="the head reads 192"):
        engine.catch_up(text, ver.features[:, :64], 0)
    with pytest.raises(DecodeError, match="reads 64"):
        engine.ctx.decode(text[:2], np.arange(2, dtype=np.int32), np.ones(2, np.int8),
                          embd=np.zeros((2, 63), np.float32))
    assert engine.catch_up(text, ver.features, 0).logits.shape == (model.n_vocab,)
    engine.close()
    target.close()
    model.close()


def test_a_level_reads_its_parents_from_the_level_before(head, target4):
    """A node's g is its parent's row of the last decode's pre-norm output: a level whose parent was decoded two
    levels up (or not at all) is one clear error, and the tree goes on from the level before."""
    path, _, _, _ = head
    model, target, engine = engine_on(path, target4, max_width=2, max_depth=4)
    prompt = model.tokenize("the water is")
    ver = target.prefill(prompt)
    engine.catch_up(np.asarray(prompt + [int(np.argmax(ver.logits[0]))]), ver.features, 0)
    engine.expand(np.array([0, 1]), np.array([11, 12]), np.array([-1, -1]), 1)
    engine.expand(np.array([2, 3]), np.array([13, 14]), np.array([0, 1]), 2)
    for parents in ([-1, 2], [0, 3], [2, 9]):
        with pytest.raises(TreeError, match="parents must be the nodes of the level before"):
            engine.expand(np.array([4, 5]), np.array([15, 16]), np.array(parents), 3)
    assert np.array(engine.expand(np.array([4, 5]), np.array([15, 16]), np.array([2, 3]), 3).logits).shape[0] == 2
    engine.close()
    target.close()
    model.close()


def test_in_graph_top_k_equals_numpy_on_dense_rows(head, target4):
    """The in-graph top-k (llama.cpp backend sampling) gives each row's k best tokens and log-probabilities as
    numpy's top_k_log_probs does on the same head's dense rows: same tokens in the same order, log-probabilities
    within float32 soft-max rounding; on the root row and on three tree levels (sequences reused by level)."""
    path = head[0]
    model = LlamaModel(target4)
    target = Target(model, ContextSettings(n_ctx=256, n_batch=64, n_seq_max=8, n_threads=1,
                                           layer_inputs=tuple(LAYERS)))
    engines = [Eagle3Engine(LlamaModel(path), target.ctx, max_width=3, max_depth=4, n_threads=1,
                            in_graph_top_k=in_graph) for in_graph in (False, True)]
    # the same KV layout in both (a tree that reuses sequences fills freed cells, whose order moves the last bits)
    engines[0].seqs = TreeSequences(engines[0].ctx, pool=3)
    prompt = model.tokenize("the water is very long and the code")
    ver = target.prefill(prompt)
    text = np.asarray(prompt + [int(np.argmax(ver.logits[0]))])
    dense, graph = (e.catch_up(text, ver.features, 0) for e in engines)
    outputs = [(dense.logits[None], graph)]
    levels = [([0, 1, 2], [11, 57, 300], [-1, -1, -1]), ([3, 4, 5], [80, 81, 82], [0, 0, 2]),
              ([6, 7, 8], [90, 91, 92], [3, 5, 5])]
    for level, (ids, toks, parents) in enumerate(levels, start=1):
        dense, graph = (e.expand(np.array(ids), np.array(toks), np.array(parents), level) for e in engines)
        outputs.append((np.array(dense.logits), graph))
    for dense, graph in outputs:
        want_tok, want_lp = top_k_log_probs(dense, 3)
        np.testing.assert_array_equal(graph.tokens, want_tok)
        np.testing.assert_allclose(graph.log_probs, want_lp, rtol=0, atol=1e-5)
        assert all(lp <= 0 for row in graph.log_probs for lp in row)
        assert all(row == sorted(row, reverse=True) for row in graph.log_probs)  # best first, as every row is
    for e in engines:
        e.close()
    target.close()
    model.close()


def test_llama3_rope_scaling_matches_reference(tmp_path, target4):
    """A head trained with llama3 rope_scaling: the converter's rope_freqs make llama.cpp rotate q/k exactly as
    the float64 reference does (frequencies scaled per transformers' definition), at every committed position."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    d, tensors, config = random_eagle3(tmp_path / "h", hidden=64, target_hidden=64, n_head=4, n_head_kv=2, ffn=128,
                                       vocab=604, draft_vocab=300, layers=LAYERS, scale=0.3)
    config["rope_scaling"] = scaling
    (d / "config.json").write_text(json.dumps(config))
    path = convert_eagle3(d, tmp_path / "h.gguf", target4, outtype="f32")
    model, target, engine = engine_on(path, target4)
    prompt = model.tokenize("the water is very long and the code is short and the cat sat on it")
    ver = target.prefill(prompt)
    text = prompt + [int(np.argmax(ver.logits[0]))]
    got = engine.catch_up(np.asarray(text), ver.features, 0).logits
    for with_scaling, close in ((True, True), (False, False)):
        ref = Eagle3Reference(tensors, dict(config, rope_scaling=scaling if with_scaling else None),
                              token_embd(target4))
        g = ref.encode(ver.features)
        for p in range(len(prompt)):
            want, _, _ = ref.entry(text[p + 1], g[p], p, list(range(p)))
        fin = np.isfinite(want)
        err = np.abs(got[fin] - want[fin]).max() / np.abs(want[fin]).max()
        assert (err < 2e-3) == close, (with_scaling, err)  # and plain RoPE would not match
    engine.close()
    target.close()
    model.close()


def test_lossless_greedy_synthetic(head, target4):
    path = head[0]
    # fresh contexts for both: re-evaluating a cached prompt in smaller batches changes numerics (NOTES.md#lossless)
    for prompt in load_prompts(4):
        with Eagle2(target4, head_path=path, n_threads=1, n_ctx=512, total_tokens=12, depth=4, tree_top_k=3) as llm:
            spec = llm.create_completion(prompt[:200], max_tokens=40, temperature=0)
        with Eagle2(target4, n_threads=1, n_ctx=512) as llm:
            plain = llm.create_completion(prompt[:200], max_tokens=40, temperature=0)
        assert spec["choices"][0]["text"] == plain["choices"][0]["text"]


def test_head_for_other_target_is_refused(head, synth_dir):
    wide = write_model(synth_dir / "synth-wide.gguf", seed=1, n_embd=96, n_head=4, qtype="q8_0")
    with pytest.raises(IncompatibleDraftError, match="hidden size"):
        Eagle2(wide, head_path=head[0], n_threads=1)
    shallow = write_model(synth_dir / "synth-2layer.gguf", seed=1, n_layer=2, qtype="q8_0")
    with pytest.raises(IncompatibleDraftError, match="layers"):
        Eagle2(shallow, head_path=head[0], n_threads=1)


def test_converter_refuses_bad_folders(tmp_path, target4):
    with pytest.raises(ModelError, match="config.json"):
        convert_eagle3(tmp_path, tmp_path / "x.gguf", target4)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 1}))
    with pytest.raises(ModelError, match="no weights"):
        convert_eagle3(tmp_path, tmp_path / "x.gguf", target4)
    d, _, _ = random_eagle3(tmp_path / "h", hidden=64, target_hidden=64, n_head=4, n_head_kv=2, ffn=128,
                            vocab=604, draft_vocab=300, layers=LAYERS)
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="vocabulary"):
        convert_eagle3(d, tmp_path / "x.gguf", target4)
    assert not (tmp_path / "x.gguf").exists()


def test_qwen2_target_needs_final_norm_head(tmp_path, synth_dir, head, monkeypatch):
    """qwen2's llama.cpp graph exposes no layer inputs: such heads are refused with a pointer to the fallback,
    and a head trained on the final_norm convention runs (numerics checked, output lossless)."""
    monkeypatch.setattr(backend_topk, "IN_GRAPH_TOP_K", False)  # dense rows, to compare with the reference
    qwen = write_model(synth_dir / "synth-qwen2.gguf", seed=1, n_layer=4, arch="qwen2", qtype="q8_0")
    with pytest.raises(IncompatibleDraftError, match="final_norm"):
        Eagle2(qwen, head_path=convert_eagle3(head[3], tmp_path / "li.gguf", qwen, outtype="f32"),
               n_threads=1)
    d, tensors, config = random_eagle3(tmp_path / "fn", hidden=64, target_hidden=64, n_head=4, n_head_kv=2,
                                       ffn=128, vocab=604, draft_vocab=300, layers=[1, 1, 1], scale=0.15,
                                       feature_source="final_norm")
    path = convert_eagle3(d, tmp_path / "fn.gguf", qwen, outtype="f32")
    with Eagle2(qwen, head_path=path, n_threads=1, n_ctx=256, total_tokens=8, depth=3, tree_top_k=3,
                lookup=False) as llm:
        prompt = llm.tokenize("the water is long")
        ver = llm.target.prefill(prompt)
        assert ver.features.shape == (len(prompt), 64)  # post-norm hidden states
        got = llm.generator.engine.catch_up(np.asarray(prompt + [7]), ver.features, 0).logits
        ref = Eagle3Reference(tensors, config, token_embd(qwen))
        g = ref.encode(np.tile(ver.features, (1, 3)))
        for p in range(len(prompt)):
            want, _, _ = ref.entry((prompt + [7])[p + 1], g[p], p, list(range(p)))
        fin = np.isfinite(want)
        assert np.abs(got[fin] - want[fin]).max() < 2e-3 * np.abs(want[fin]).max()
        llm.reset()
        spec = llm.create_completion("the water is long and", max_tokens=24, temperature=0)
    with Eagle2(qwen, n_threads=1, n_ctx=256) as llm:
        plain = llm.create_completion("the water is long and", max_tokens=24, temperature=0)
    assert spec["choices"][0]["text"] == plain["choices"][0]["text"]


def test_chat_reuse_mixing_plain_and_speculative_calls(head, target4):
    """Chat-like calls that extend the previous text, alternating plain and speculative: every answer equals
    plain decoding's, and the head is never short of features (it re-reads what it lacks)."""
    outputs = chat_turn_outputs(target4, head[0], total_tokens=10, depth=4, tree_top_k=3)
    assert outputs["eagle"] == outputs["plain"]


@pytest.mark.smollm2
def test_default_model_uses_its_shipped_head_losslessly(smollm2_path):
    """`Eagle2()` loads SmolLM2 with the trained head that ships in the package; greedy output through real
    EAGLE-3 trees (many accepted tokens) equals plain greedy output (1 thread, trees < 64 nodes: bit-identical).
    This is the default run's lossless sweep on the real model, one prompt from each of five sets; the long one
    (50 prompts x 128 tokens) runs with ``-m slow``."""
    from eagle2_local.formats.models import default_head_path

    assert default_head_path() is not None, "the default head must ship with the package"
    prompts = load_prompts(5)
    with Eagle2(n_threads=1, n_ctx=1024, total_tokens=10, depth=4, tree_top_k=3) as llm:
        assert llm.engine_name.startswith("eagle3:")
        spec = [llm.create_chat_completion([{"role": "user", "content": p}], max_tokens=24, temperature=0)
                for p in prompts]
        accepted = sum(llm.stats()["accepted_per_depth"] or [0])
    with Eagle2(smollm2_path, n_threads=1, n_ctx=1024) as llm:
        plain = [llm.create_chat_completion([{"role": "user", "content": p}], max_tokens=24, temperature=0)
                 for p in prompts]
    assert [c["choices"][0]["message"]["content"] for c in spec] == \
        [c["choices"][0]["message"]["content"] for c in plain]
    assert accepted > 0  # the head really drafted accepted tokens in the last answer
