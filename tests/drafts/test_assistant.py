"""Gemma 4 assistant drafts (``--draft assistant:PATH``): Gemma 4's own drafter GGUF (llama.cpp's gemma4-assistant)
grows the trees. The answer equals plain decoding, greedy and sampled; the engine's rows are what llama.cpp computes
when the assistant is driven through the C API alone, as ``common/speculative.cpp`` drives it (every step at the
root's position, the target holding the text before the root), after any number of rounds; a tree's nodes read
their own parent's hidden state; what cannot run is refused in one line."""

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
from eagle2_local.drafts import AssistantEngine, DraftSpec, open_draft, prepare_draft, with_lookup
from eagle2_local.drafts.assistant import check_assistant_fits
from eagle2_local.errors import Eagle2Error, IncompatibleDraftError, TreeError
from eagle2_local.formats.models import read_gguf_info
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp.batch import Batch
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import TreeParams
from tests.support.helpers import (GREEDY, assert_keeps_the_distribution, assert_tree_rows_follow_paths,
                                   first_divergence, forced_budget, recorded_roots, run)

SETTINGS = ContextSettings(n_ctx=1024, n_batch=256, n_seq_max=16, n_threads=1, nextn_features=True)


def agreeing_assistant(path, target_path, mix: float = 0.3):
    """An assistant that mostly proposes what its target will say, for a target whose blocks add little to the
    residual stream (its next token is about a function of the current one): ``pre_projection`` passes the target's
    embedding of the token through, plus ``mix`` times the hidden state it reads; the LM head (``token_embd``) and
    the final norm are the target's own, padded with zeros; ``post_projection`` hands the first n_embd_backbone
    features on as the next step's h. Its attention and FFN are left random: a step that reads the wrong cells, the
    wrong position or the wrong h proposes other logits (and sometimes other tokens)."""
    write_arch_model(path, "gemma4-assistant")
    target = {t.name: np.array(t.data) for t in gguf.GGUFReader(target_path).tensors
              if t.name in ("output.weight", "output_norm.weight")}
    reader = gguf.GGUFReader(path, "r+")
    for t in reader.tensors:
        if t.name == "nextn.pre_projection.weight":  # (n_embd, 2 n_bb): [x, h] -> n_embd
            n = t.data.shape[1] // 2
            t.data[:] = 0.0
            t.data[:n, :n] = np.eye(n)
            t.data[:n, n:] = mix * np.eye(n)
        elif t.name == "nextn.post_projection.weight":  # (n_bb, n_embd)
            n = t.data.shape[0]
            t.data[:] = 0.0
            t.data[:, :n] = np.eye(n)
        elif t.name == "token_embd.weight":  # (V, n_embd): the tied head
            n = target["output.weight"].shape[1]
            t.data[:] = 0.0
            t.data[:, :n] = target["output.weight"]
        elif t.name == "output_norm.weight":
            n = len(target["output_norm.weight"])
            t.data[:] = 1.0
            t.data[:n] = target["output_norm.weight"]
    del reader  # flushes the memory map
    return path


def edited(path, out, key: str, value: int):
    """A copy of a GGUF with one integer metadata field changed in place."""
    out.write_bytes(path.read_bytes())
    reader = gguf.GGUFReader(out, "r+")
    reader.fields[key].parts[-1][0] = value
    del reader
    return out


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("assistant")
    target = write_arch_model(folder / "g4.gguf", "gemma4", block_scale=0.2)
    return {"target": target,
            "random": write_arch_model(folder / "assistant.gguf", "gemma4-assistant"),
            "agree": agreeing_assistant(folder / "agree.gguf", target),
            "llama": write_arch_model(folder / "llama.gguf", "llama"),
            "folder": folder}


@pytest.fixture(scope="module")
def target_model(paths):
    model = LlamaModel(paths["target"])
    yield model
    model.close()


@pytest.fixture(scope="module")
def agree_model(paths):
    model = LlamaModel(paths["agree"])
    yield model
    model.close()


# ------------------------------------------------------------------ llama.cpp's assistant, through its C API alone
class Reference:
    """The target and its assistant driven as llama.cpp's ``common_speculative_impl_draft_mtp`` drives a shared-memory
    (Gemma 4) assistant: the target with unmasked nextn rows, the assistant's context made with ``ctx_other`` = the
    target's (so ``llama_get_ctx_other`` says the memory is shared), no catch-up decode, each draft step an extended
    batch of (token, h) at the root's position ``pos0`` through ``llama_process``, the next step's h the assistant's
    own masked nextn row."""

    def __init__(self, target: LlamaModel, assistant: LlamaModel) -> None:
        self.target, self.assistant = target, assistant
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch = 1024, 512, 512, 1, 1
        p.n_seq_max, p.swa_full = 1, True
        self.tgt = llama_cpp.llama_init_from_model(target.ptr, p)
        assert self.tgt
        p.ctx_other = self.tgt
        self.dft = llama_cpp.llama_init_from_model(assistant.ptr, p)
        assert self.dft
        assert llama_cpp_ext.llama_get_ctx_other(self.dft) == self.tgt  # speculative.cpp's is_mem_shared
        llama_cpp_ext.llama_set_embeddings_nextn(self.tgt, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(self.dft, True, True)
        self.batch = llama_cpp.llama_batch_ext_init(self.dft)
        self.n_embd = target.n_embd

    def close(self) -> None:
        llama_cpp.llama_batch_ext_free(self.batch)
        llama_cpp.llama_free(self.dft)
        llama_cpp.llama_free(self.tgt)

    def _step(self, token: int, pos: int, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One draft step: the assistant's logits and h output for (token, row) at ``pos``."""
        llama_cpp.llama_batch_ext_clear(self.batch)
        row = np.ascontiguousarray(row, dtype=np.float32)
        idx = llama_cpp.llama_batch_ext_add_token(self.batch, 0, int(token))
        p = llama_cpp.llama_pos(pos)
        assert llama_cpp.llama_batch_ext_set_pos(self.batch, idx, ctypes.byref(p))
        embd = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
        assert llama_cpp.llama_batch_ext_set_embd_token(self.batch, idx, embd)
        assert llama_cpp.llama_batch_ext_set_output_logits(self.batch, idx, True)
        assert llama_cpp.llama_process(self.dft, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self.batch) == 0
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.dft, 0), shape=(self.target.n_vocab,))
        h = np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn_ith(self.dft, 0), shape=(self.n_embd,))
        return logits.copy(), h.copy()

    def chain(self, text: list[int], path: list[int] = ()) -> list[np.ndarray]:
        """From an empty cache: the target over ``text[:-1]`` (the last token is the root, not in the target's KV),
        then one assistant step for the root (with the target's h of the token before it) and one per token of
        ``path`` (with the step before's h), all at the root's position; the logits of every step."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.tgt), True)
        prompt = (llama_cpp.llama_token * (len(text) - 1))(*text[:-1])
        assert llama_cpp.llama_decode(self.tgt, llama_cpp.llama_batch_get_one(prompt, len(text) - 1)) == 0
        h = np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn_ith(self.tgt, len(text) - 2),
                                  shape=(self.n_embd,)).copy()
        pos0, out = len(text) - 1, []
        for token in [text[-1], *path]:
            logits, h = self._step(token, pos0, h)
            out.append(logits)
        return out


@pytest.fixture(scope="module")
def reference(target_model, agree_model):
    ref = Reference(target_model, agree_model)
    yield ref
    ref.close()


def assert_same_row(ours: np.ndarray, theirs: np.ndarray, label) -> None:
    """Equal up to float summation order (the target's hidden states computed in other batch shapes: ~1e-3 on logits
    up to ~20): the same ranking at the top, close values. A step fed the h of the position before, a zero h, or
    placed one position later over the root's own cell moves its row by 0.7-1.2."""
    assert np.argsort(-ours)[:3].tolist() == np.argsort(-theirs)[:3].tolist(), label
    assert np.abs(ours - theirs).max() < 1e-2, f"{label}: {np.abs(ours - theirs).max()}"


# ------------------------------------------------------------------ the synthetic pair
def test_the_synthetic_assistant_runs_beside_its_target(paths):
    """benchmarks/synthetic_model.py's gemma4-assistant loads in the bundled llama.cpp (all its layers NextN layers, the
    target's width as its input and output), its context takes the gemma4 target's as ``ctx_other``, and a classic
    batch carrying both a token and an h row decodes to finite logits and a finite next h, reading no cell of its own
    (the target's cache holds what it held)."""
    target, assistant = LlamaModel(paths["target"]), LlamaModel(paths["random"])
    p = llama_cpp.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch, p.n_seq_max = 256, 64, 64, 1, 1, 1
    tgt = llama_cpp.llama_init_from_model(target.ptr, p)
    p.ctx_other = tgt
    dft = llama_cpp.llama_init_from_model(assistant.ptr, p)
    try:
        assert tgt and dft
        assert (assistant.n_layer_nextn, assistant.n_embd, assistant.n_embd_out) == (2, 128, 64)
        assert int(llama_cpp.llama_model_n_embd_inp(assistant.ptr)) == target.n_embd == 64
        llama_cpp_ext.llama_set_embeddings_nextn(tgt, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(dft, True, True)
        prompt = (llama_cpp.llama_token * 5)(1, 300, 301, 302, 303)
        assert llama_cpp.llama_decode(tgt, llama_cpp.llama_batch_get_one(prompt, 5)) == 0
        h = np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn_ith(tgt, 4), shape=(64,)).copy()
        batch = Batch(3, 1)  # three nodes at the root's position, token + h each (one llama_batch)
        batch.fill(np.array([304, 305, 306]), 5, None, None, 0, 1, embd=np.tile(h, (3, 1)))
        assert llama_cpp.llama_decode(dft, batch.struct) == 0
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(dft), shape=(3, target.n_vocab))
        h_next = np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn(dft), shape=(3, 64))
        assert np.isfinite(logits).all() and np.isfinite(h_next).all() and logits.std() > 0.1
        assert not np.allclose(logits[0], logits[1])  # one row per node
        assert llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(tgt), 0) == 4
    finally:
        if dft:
            llama_cpp.llama_free(dft)
        if tgt:
            llama_cpp.llama_free(tgt)
        assistant.close()
        target.close()


# ------------------------------------------------------------------ lossless
@pytest.mark.parametrize("which, prompt", [("random", "the a and"), ("agree", "hello world")])
def test_greedy_assistant_equals_plain(paths, which, prompt):
    plain = Eagle2(paths["target"], plain=True, n_threads=1)
    try:
        tokens = plain.tokenize(prompt)
        ref = list(plain.generate(tokens, temp=0, max_tokens=240))
    finally:
        plain.close()
    assert len(ref) >= 200
    draft = f"assistant:{paths[which]}"
    for kw in (dict(budget="fixed", total_tokens=12, lookup=False), dict()):  # trees every round; the defaults
        with Eagle2(paths["target"], draft=draft, n_threads=1, **kw) as llm:
            assert llm.engine_name.startswith(f"assistant:{paths[which].name}")
            out = list(llm.generate(tokens, temp=0, max_tokens=240))
            stats = llm.last_stats
        assert out == ref, f"{which} {kw}: diverged at {first_divergence(out, ref)}"
        if which == "agree" and kw:
            assert stats.tau > 2.0, stats.as_dict()  # the assistant agrees with its target: long paths accepted


def test_sampling_keeps_the_distribution(target_model, agree_model):
    """T=1: the assistant's tokens at positions 1 and 2 are distributed as plain sampling's (chi-square)."""
    plain = Generator(Target(target_model, SETTINGS))
    target = Target(target_model, SETTINGS)
    spec = Generator(target, AssistantEngine(agree_model, target.ctx, 3, 3, owns_model=False), TreeParams(6, 3, 3))
    assert_keeps_the_distribution(plain, spec, [1, 40, 41, 42, 43], runs=600)


# ------------------------------------------------------------------ what the engine proposes
def test_root_and_chain_rows_are_llama_cpps(target_model, agree_model, reference):
    """The engine's root row, and the rows of a chain grown on its own outputs, are llama.cpp's: the root is (root,
    the target's h of the token before it) at the root's position, each deeper step (its token, the step before's
    h) at the same position, over the target's cells of the text before the root."""
    target = Target(target_model, SETTINGS)
    engine = AssistantEngine(agree_model, target.ctx, 3, 4, owns_model=False)
    try:
        text = [1] + target_model.tokenize("hello world, the water is long and little, the code we made was "
                                           "very long", add_special=False)
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
        assert target.n_past == len(text) - 1  # the assistant wrote nothing into the target's cache
    finally:
        engine.close()
        target.close()


def test_trees_read_each_parents_hidden_state(target_model, agree_model, reference):
    """Top-3 at each level, three levels, each level one batch at one position: every node's row is llama.cpp's
    chain along its own path (its parent's h, none of its siblings')."""
    target = Target(target_model, SETTINGS)
    engine = AssistantEngine(agree_model, target.ctx, 3, 4, owns_model=False)
    assert_tree_rows_follow_paths(engine, target, target_model, reference, assert_same_row)


@pytest.mark.parametrize("policy", ["fixed", "lookup", "budget"])
def test_every_round_reads_the_right_hidden_state(target_model, agree_model, reference, policy):
    """After rounds of accepted and rejected trees, plain steps, lookup rounds and new prompts, every root row the
    engine proposes is llama.cpp's assistant over the text so far, computed afresh: the root paired with the target's
    h of the token before it, at its position, over exactly the text before it. ``fixed``: a tree every round;
    ``lookup``: merged with lookups; ``budget``: merged, under a budget that also takes plain steps and lookup
    rounds (whose hidden states wait in the backlog)."""
    params = TreeParams(9, 6, 2)
    target = Target(target_model, SETTINGS)
    assistant = AssistantEngine(agree_model, target.ctx, 2, 6, owns_model=False)
    engine = assistant if policy == "fixed" else with_lookup(assistant, params, target_model)
    gen = Generator(target, engine, params, policy=forced_budget(9, 6) if policy == "budget" else None)
    seen, stats = recorded_roots(gen, assistant, 80 if policy == "budget" else 50)
    assert len(seen) >= 5 and stats.tau > 1.5, stats.as_dict()
    drafted_rounds = sum(stats.tree_sizes.values())
    assert 0 < stats.accepted_per_depth[0] < drafted_rounds, stats.as_dict()  # some roots' drafts were rejected
    if policy == "budget":
        assert stats.plain_steps > 0, stats.as_dict()
    for i, (text, ours) in enumerate(seen):
        assert_same_row(ours, reference.chain(text)[0], f"round {i} ({len(text)} tokens)")


# ------------------------------------------------------------------ opening and refusing the draft
def test_open_draft_sets_the_target_up(target_model, paths):
    """The registry's two steps: the target context gets the hidden states the assistant reads, then the engine."""
    plain = replace(SETTINGS, nextn_features=False)
    spec = DraftSpec.parse(f"assistant:{paths['agree']}")
    prepared = prepare_draft(spec, target_model, plain)
    assert prepared.settings == SETTINGS
    target = Target(target_model, prepared.settings)
    engine = prepared.open(target, TreeParams(9, 6, 3))
    try:
        assert engine.name == "assistant:agree.gguf" and engine.weights_path == paths["agree"]
        out, _, _ = run(Generator(target, engine, TreeParams(9, 6, 3)), [1, 40, 41, 42], 60, GREEDY)
        assert len(out) > 0
    finally:
        engine.close()
        target.close()
    target = Target(target_model, plain)  # open_draft refuses a target context without the hidden states
    try:
        with pytest.raises(Eagle2Error, match="lacks what"):
            open_draft(spec, target, TreeParams(9, 6, 3))
    finally:
        target.close()


def test_the_assistant_opens_before_the_target_decodes(target_model, agree_model):
    """llama.cpp resets the shared cell list when it creates the assistant's context: refused once the target holds
    text (it would lose it), and a target without hidden states is refused too."""
    target = Target(target_model, SETTINGS)
    try:
        target.prefill([1, 40, 41])
        with pytest.raises(TreeError, match="before the target decodes"):
            AssistantEngine(agree_model, target.ctx, 3, 3, owns_model=False)
        assert target.ctx.seq_pos_max(0) == 2
    finally:
        target.close()
    target = Target(target_model, replace(SETTINGS, nextn_features=False))
    try:
        with pytest.raises(TreeError, match="nextn_features"):
            AssistantEngine(agree_model, target.ctx, 3, 3, owns_model=False)
    finally:
        target.close()


def one_line_refusal(target, draft: str, *needles: str) -> None:
    with pytest.raises(Eagle2Error) as err:
        Eagle2(target, draft=draft, n_threads=1)
    message = str(err.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message


def test_refusals(paths):
    folder = paths["folder"]
    # a target that is not Gemma 4
    one_line_refusal(paths["llama"], f"assistant:{paths['random']}", "Gemma 4 targets only", "'llama'")
    # a file that is not an assistant (the target itself)
    one_line_refusal(paths["target"], f"assistant:{paths['target']}", "not a Gemma 4 assistant", "'gemma4'")
    # an assistant made for a target of another width
    narrow = edited(paths["random"], folder / "narrow.gguf", "gemma4-assistant.embedding_length_out", 32)
    one_line_refusal(paths["target"], f"assistant:{narrow}", "width 32", "has 64")
    # attention that does not fit the target layers whose K/V it reads
    heads = edited(paths["random"], folder / "heads.gguf", "gemma4-assistant.attention.head_count_kv", 1)
    one_line_refusal(paths["target"], f"assistant:{heads}", "1 K/V heads", "has 2")
    # the kind needs a file
    one_line_refusal(paths["target"], "assistant", "needs a file")


def test_another_vocabulary_is_refused(paths, target_model):
    info = read_gguf_info(paths["random"])
    check_assistant_fits(info, target_model)  # the pair fits
    other = replace(info, metadata={**info.metadata, "eagle2_local.n_tokens": target_model.n_vocab + 8})
    with pytest.raises(IncompatibleDraftError, match=f"{target_model.n_vocab + 8}-token vocabulary"):
        check_assistant_fits(other, target_model)
