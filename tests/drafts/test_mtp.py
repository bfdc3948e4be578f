"""MTP drafts (``--draft mtp``): a model's own multi-token-prediction (NextN) layers draft the tree. The answer equals
plain decoding, greedy and sampled; the engine's proposals are what llama.cpp's MTP graph computes when driven
through the C API alone, as ``common/speculative.cpp`` drives it, after any number of rounds; trees grow one MTP
sequence per branch; a model that carries MTP layers drafts with them by default."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import gguf
import llama_cpp
import numpy as np
import pytest
from llama_cpp import llama_cpp_ext

from benchmarks.synthetic_model import write_arch_model
from eagle2_local.api import Eagle2
from eagle2_local.decoding.target import Target
from eagle2_local.drafts import DraftSpec, open_draft, prepare_draft, with_lookup
from eagle2_local.drafts.mtp import MtpEngine, has_mtp
from eagle2_local.errors import Eagle2Error
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp import backend_topk
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import TreeParams
from tests.support.helpers import (GREEDY, assert_keeps_the_distribution, assert_tree_rows_follow_paths,
                                   first_divergence, forced_budget, recorded_roots, run)

SETTINGS = ContextSettings(n_ctx=1024, n_batch=256, n_seq_max=1, n_threads=1, n_rs_seq=8, nextn_features=True)


def agreeing_mtp(path, block_scale: float = 0.05, mix: float = 0.3, attention: float = 0.1):
    """A Qwen3.5 whose MTP layer mostly predicts what the trunk will: the trunk adds little to the residual stream
    (``block_scale``), so its next token is about a function of the current one, and the MTP layer passes the token's
    normalised embedding to the shared head, with ``mix`` times the hidden state it reads (``eh_proj`` = [I, mix I])
    and ``attention`` times its attention's output (its FFN adds nothing): an entry paired with the wrong hidden
    state, or attending to the wrong entries, proposes other tokens."""
    write_arch_model(path, "qwen35", mtp=True, block_scale=block_scale)
    reader = gguf.GGUFReader(path, "r+")
    mtp_block = f"blk.{int(reader.fields['qwen35.block_count'].parts[-1][0]) - 1}."
    for t in reader.tensors:
        if not t.name.startswith(mtp_block):
            continue
        if t.name.endswith("nextn.eh_proj.weight"):
            n = t.data.shape[0]
            t.data[:] = 0.0
            t.data[:, :n] = np.eye(n, dtype=t.data.dtype)
            t.data[:, n:] = mix * np.eye(n, dtype=t.data.dtype)
        elif t.name.endswith("attn_output.weight"):
            t.data[:] *= attention
        elif t.name.endswith("ffn_down.weight"):
            t.data[:] = 0.0
    del reader  # flushes the memory map
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp")
    return {"random": write_arch_model(folder / "q35-mtp.gguf", "qwen35", mtp=True),
            "agree": agreeing_mtp(folder / "q35-agree.gguf"),
            "no_mtp": write_arch_model(folder / "q35.gguf", "qwen35"),
            "llama": write_arch_model(folder / "llama.gguf", "llama")}


@pytest.fixture(scope="module")
def agree_model(paths):
    model = LlamaModel(paths["agree"], load_mtp=True)
    yield model
    model.close()


# ------------------------------------------------------------------ llama.cpp's MTP, through its C API alone
class Reference:
    """The target and its MTP layer driven as llama.cpp's ``common_speculative_impl_draft_mtp`` does: the target
    with unmasked nextn rows, an MTP context fed (x_p, h_{p-1}) through extended batches and ``llama_process``, draft
    steps reading the MTP context's own nextn row."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch = 1024, 512, 512, 1, 1
        p.n_seq_max = 1
        self.tgt = llama_cpp.llama_init_from_model(model.ptr, p)
        p.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        self.dft = llama_cpp.llama_init_from_model(model.ptr, p)
        assert self.tgt and self.dft
        llama_cpp_ext.llama_set_embeddings_nextn(self.tgt, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(self.dft, True, True)
        self.batch = llama_cpp.llama_batch_ext_init(self.dft)
        self.n_embd = model.n_embd_out

    def close(self) -> None:
        llama_cpp.llama_batch_ext_free(self.batch)
        llama_cpp.llama_free(self.dft)
        llama_cpp.llama_free(self.tgt)

    def _entries(self, tokens, pos0: int, rows: np.ndarray, outputs) -> int:
        """One MTP batch: token i at pos0 + i with hidden row i; returns llama_process's code."""
        llama_cpp.llama_batch_ext_clear(self.batch)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        for i, tok in enumerate(tokens):
            idx = llama_cpp.llama_batch_ext_add_token(self.batch, 0, int(tok))
            pos = llama_cpp.llama_pos(pos0 + i)
            assert llama_cpp.llama_batch_ext_set_pos(self.batch, idx, ctypes.byref(pos))
            embd = llama_cpp.llama_embd(rows[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
            assert llama_cpp.llama_batch_ext_set_embd_token(self.batch, idx, embd)
            assert llama_cpp.llama_batch_ext_set_output_logits(self.batch, idx, bool(outputs[i]))
        return llama_cpp.llama_process(self.dft, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self.batch)

    def chain(self, text: list[int], path: list[int] = ()) -> list[np.ndarray]:
        """From an empty cache: the target over ``text[:-1]``, the MTP layer over all of it (the last token the
        root), then one draft step per token of ``path``; the MTP logits of the root and of every path token."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.tgt), True)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.dft), True)
        prompt = (llama_cpp.llama_token * (len(text) - 1))(*text[:-1])
        h = np.zeros((len(text), self.n_embd), dtype=np.float32)  # h[p] = the target's row at p - 1
        if len(text) > 1:
            assert llama_cpp.llama_decode(self.tgt, llama_cpp.llama_batch_get_one(prompt, len(text) - 1)) == 0
            for k in range(len(text) - 1):
                row = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.tgt, k)
                h[k + 1] = np.ctypeslib.as_array(row, shape=(self.n_embd,))
            # the prompt's entries (process()), then the root as the first draft step (draft())
            assert self._entries(text[:-1], 0, h[:-1], [0] * (len(text) - 1)) == 0
        logits = []
        tok, row = text[-1], h[-1]
        for i in range(len(path) + 1):
            assert self._entries([tok], len(text) - 1 + i, row[None], [1]) == 0
            logits.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.dft, 0),
                                                shape=(self.model.n_vocab,)).copy())
            row = np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn_ith(self.dft, 0),
                                        shape=(self.n_embd,)).copy()
            if i < len(path):
                tok = path[i]
        return logits


@pytest.fixture(scope="module")
def reference(agree_model):
    ref = Reference(agree_model)
    yield ref
    ref.close()


def assert_same_row(ours: np.ndarray, theirs: np.ndarray, label) -> None:
    """Equal up to float summation order (batches of other shapes): the same ranking at the top, close values."""
    assert np.argsort(-ours)[:3].tolist() == np.argsort(-theirs)[:3].tolist(), label
    assert np.abs(ours - theirs).max() < 1e-3, f"{label}: {np.abs(ours - theirs).max()}"


# ------------------------------------------------------------------ lossless
@pytest.mark.parametrize("which, prompt", [("random", "the a and"), ("agree", "hello world")])
def test_greedy_mtp_equals_plain(paths, which, prompt):
    plain = Eagle2(paths[which], plain=True, n_threads=1)
    try:
        tokens = plain.tokenize(prompt)
        ref = list(plain.generate(tokens, temp=0, max_tokens=240))
    finally:
        plain.close()
    assert len(ref) >= 200
    for kw in (dict(budget="fixed", total_tokens=9, lookup=False), dict()):  # a chain every round; the defaults
        llm = Eagle2(paths[which], draft="mtp", n_threads=1, **kw)
        try:
            out = list(llm.generate(tokens, temp=0, max_tokens=240))
            stats = llm.last_stats
        finally:
            llm.close()
        assert out == ref, f"{kw}: diverged at {first_divergence(out, ref)}"
        if which == "agree" and kw:
            assert stats.tau > 2.0, stats.as_dict()  # the MTP layer agrees with the trunk: long chains accepted


def test_in_graph_top_k_drafts_the_same(paths, monkeypatch):
    """Where the top-k is taken in llama.cpp's graph (GPU builds), the same answer and the same acceptance."""
    results = []
    for in_graph in (False, True):
        monkeypatch.setattr(backend_topk, "IN_GRAPH_TOP_K", in_graph)
        with Eagle2(paths["agree"], draft="mtp", n_threads=1, budget="fixed", total_tokens=9, lookup=False) as llm:
            assert (llm.generator.engine.backend_top_k is not None) == in_graph
            out = list(llm.generate(llm.tokenize("hello world"), temp=0, max_tokens=120))
            results.append((out, llm.last_stats.tau))
    assert results[0] == results[1] and results[0][1] > 2.0


def test_sampling_keeps_the_distribution(agree_model):
    """T=1: the MTP draft's tokens at positions 1 and 2 are distributed as plain sampling's (chi-square)."""
    plain = Generator(Target(agree_model, SETTINGS))
    target = Target(agree_model, SETTINGS)
    spec = Generator(target, MtpEngine(agree_model, target.ctx, 1, 3), TreeParams(4, 3, 1))
    assert_keeps_the_distribution(plain, spec, [1, 40, 41, 42, 43], runs=1000)


# ------------------------------------------------------------------ what the engine proposes
@pytest.mark.parametrize("in_graph, n_batch", [(False, 256), (True, 256), (False, 16)],
                         ids=["dense", "in-graph-top-k", "batches-of-16"])
def test_proposals_are_llama_cpps_mtp(agree_model, reference, in_graph, n_batch):
    """The engine's root row, and the rows of a chain grown on its own outputs, are llama.cpp's MTP logits (dense
    rows, or the top-k taken in llama.cpp's graph; the text caught up in one batch or several)."""
    target = Target(agree_model, replace(SETTINGS, n_batch=n_batch))
    engine = MtpEngine(agree_model, target.ctx, 3, 4, in_graph_top_k=in_graph)
    try:
        text = [1] + agree_model.tokenize("hello world, the water is long and little, the code we made was "
                                          "very long", add_special=False)
        assert len(text) > 2 * n_batch or n_batch > len(text)
        feats = target.prefill(text[:-1]).features
        rows = [engine.catch_up(np.asarray(text), feats, 0).best(3)]
        path = []
        for level in range(1, 4):
            path.append(rows[-1].tokens[0][0])
            rows.append(engine.expand([level - 1], [path[-1]], [level - 2 if level > 1 else -1], level).best(3))
        for level, (ours, ref) in enumerate(zip(rows, reference.chain(text, path))):
            log_probs = ref - ref.max() - np.log(np.exp(ref - ref.max()).sum())
            top = np.argsort(-ref)[:3]
            assert ours.tokens[0] == top.tolist(), f"level {level}"
            assert np.allclose(ours.log_probs[0], log_probs[top], atol=1e-3), f"level {level}"
    finally:
        engine.close()
        target.close()


@pytest.mark.parametrize("policy", ["fixed", "lookup", "budget"])
def test_every_round_reads_the_right_hidden_states(agree_model, reference, policy):
    """After rounds of accepted and rejected chains, plain steps, lookup rounds and a new prompt, every root row the
    engine proposes is llama.cpp's MTP over the text so far, computed afresh: each entry paired the right token
    with the right target hidden state. ``fixed``: a chain every round; ``lookup``: merged with lookups; ``budget``:
    merged, under a budget that also takes plain steps and lookup rounds (whose hidden states wait in the
    backlog)."""
    params = TreeParams(9, 8, 1)
    target = Target(agree_model, SETTINGS)
    mtp = MtpEngine(agree_model, target.ctx, 1, 8)
    engine = mtp if policy == "fixed" else with_lookup(mtp, params, agree_model)
    gen = Generator(target, engine, params, policy=forced_budget(9, 8) if policy == "budget" else None)
    seen, stats = recorded_roots(gen, mtp, 80 if policy == "budget" else 50)
    assert len(seen) >= 5 and stats.tau > 1.5, stats.as_dict()
    if policy == "budget":
        assert stats.plain_steps > 0, stats.as_dict()
    for i, (text, ours) in enumerate(seen):
        assert_same_row(ours, reference.chain(text)[0], f"round {i} ({len(text)} tokens)")


def test_trees_grow_one_sequence_per_branch(agree_model, reference):
    """Top-3 at each level, three levels: every node's row is the MTP chain along its own path."""
    target = Target(agree_model, SETTINGS)
    engine = MtpEngine(agree_model, target.ctx, 3, 4)
    assert_tree_rows_follow_paths(engine, target, agree_model, reference, assert_same_row)


# ------------------------------------------------------------------ choosing and refusing the draft
def test_a_model_with_mtp_layers_drafts_with_them_by_default(paths):
    from eagle2_local.formats.models import read_gguf_info

    assert has_mtp(read_gguf_info(paths["random"])) and not has_mtp(read_gguf_info(paths["no_mtp"]))
    with Eagle2(paths["random"], n_threads=1, budget="fixed", total_tokens=4) as llm:
        assert llm.engine_name == "mtp:q35-mtp.gguf+lookup" and llm.model.load_mtp
    with Eagle2(paths["random"], n_threads=1, lookup=False, budget="fixed", total_tokens=4) as llm:
        assert llm.engine_name == "mtp:q35-mtp.gguf"
    with Eagle2(paths["random"], n_threads=1, plain=True) as llm:  # plain: the MTP weights are not even loaded
        assert llm.engine_name == "plain" and not llm.model.load_mtp
    with Eagle2(paths["random"], n_threads=1, draft="lookup") as llm:  # another draft named: that one
        assert llm.engine_name.startswith("lookup") and not llm.model.load_mtp
    with Eagle2(paths["no_mtp"], n_threads=1) as llm:
        assert llm.engine_name == "plain"


@pytest.mark.parametrize("which", ["no_mtp", "llama"])
def test_mtp_on_a_model_without_mtp_layers_is_refused(paths, which):
    with pytest.raises(Eagle2Error) as err:
        Eagle2(paths[which], draft="mtp", n_threads=1)
    assert "\n" not in str(err.value) and "MTP" in str(err.value)
    with pytest.raises(Eagle2Error, match="reads no file"):
        Eagle2(paths["random"], draft="mtp:x.gguf", n_threads=1)


def test_open_draft_sets_the_target_up(agree_model):
    """The registry's two steps: the target context gets the hidden states the MTP layer reads, then the engine."""
    plain = ContextSettings(n_ctx=1024, n_batch=256, n_seq_max=1, n_threads=1, n_rs_seq=8)
    prepared = prepare_draft(DraftSpec("mtp"), agree_model, plain)
    assert prepared.settings == SETTINGS
    target = Target(agree_model, prepared.settings)
    engine = open_draft(DraftSpec("mtp"), target, TreeParams(9, 8, 1))
    try:
        out, _, _ = run(Generator(target, engine, TreeParams(9, 8, 1)), [1, 40, 41, 42], 60, GREEDY)
        assert len(out) > 0
    finally:
        engine.close()
        target.close()
