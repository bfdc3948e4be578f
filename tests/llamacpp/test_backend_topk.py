"""The in-graph top-k (llama.cpp backend sampling) of draft-model engines: same candidates as numpy's top-k on
the same model's dense rows, and the same greedy output as plain decoding."""

from __future__ import annotations

import numpy as np

from eagle2_local.drafts.draft_model import DraftModelEngine
from eagle2_local.llamacpp.backend_topk import BackendTopK
from eagle2_local.llamacpp.llama import LlamaContext, LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.top_k import top_k_log_probs
from tests.support.helpers import ONE_THREAD, assert_lossless, make, random_prompts

SETTINGS = ContextSettings(n_ctx=512, n_batch=8, n_seq_max=8, n_threads=1)


def test_draft_model_rows_equal_numpy_top_k(synth_q8):
    """A prompt longer than a batch (its only output is the last token of the last chunk), then three tree
    levels: each row's k tokens and log-probabilities equal numpy's top_k_log_probs on the dense rows."""
    model = LlamaModel(synth_q8)
    dense, graph = (DraftModelEngine(model, SETTINGS, 3, 4, in_graph_top_k=flag) for flag in (False, True))
    tokens = np.r_[1, np.random.default_rng(5).integers(5, model.n_vocab, 20)]  # 21 tokens: three batches
    outputs = [(dense.catch_up(tokens).logits[None], graph.catch_up(tokens))]
    levels = [([0, 1, 2], [11, 57, 300], [-1, -1, -1]), ([3, 4, 5], [80, 81, 82], [0, 0, 2]),
              ([6, 7, 8], [90, 91, 92], [3, 5, 5])]
    for level, (ids, toks, parents) in enumerate(levels, start=1):
        args = (np.array(ids), np.array(toks), np.array(parents), level)
        outputs.append((np.array(dense.expand(*args).logits), graph.expand(*args)))
    for rows, got in outputs:
        want_tok, want_lp = top_k_log_probs(rows, 3)
        np.testing.assert_array_equal(got.tokens, want_tok)
        np.testing.assert_allclose(got.log_probs, want_lp, rtol=0, atol=1e-5)
        assert all(row == sorted(row, reverse=True) for row in got.log_probs)  # best first, as every row is
    dense.close()
    graph.close()
    model.close()


def test_draft_model_in_graph_is_lossless(synth_q8, synth_q8_weak):
    """Greedy speculative decoding with a draft model drafting through the in-graph top-k equals plain
    decoding (one thread, a batch-invariant target), over several rounds and commits."""
    from eagle2_local.decoding.target import Target
    from eagle2_local.generation.generator import Generator
    from eagle2_local.tree.draft_tree import TreeParams

    model, weak = LlamaModel(synth_q8), LlamaModel(synth_q8_weak)
    params = TreeParams(16, 5, 4)
    plain = make(model, None)
    assert DraftModelEngine(weak, ONE_THREAD, 4, 5).backend_top_k is None  # a CPU-only draft: numpy rows by default
    spec = Generator(Target(model, ONE_THREAD), DraftModelEngine(weak, ONE_THREAD, params.top_k, params.depth,
                                                                 in_graph_top_k=True), params)
    for i, prompt in enumerate(random_prompts(model, 2, seed=11)):
        assert_lossless(plain, spec, prompt, 40, i)


def test_rows_come_back_carried_by_one_row_or_row_by_row(synth_q8):
    """One output row carries every row's values where they fit its slot (here the row of the lowest active
    sequence, the batch's last), else each row carries its own (n * k beyond the 604-token vocabulary): either
    way each row's tokens and log-probabilities equal numpy's top-k of the same context's dense rows."""
    model = LlamaModel(synth_q8)
    prompt = np.r_[1, np.random.default_rng(9).integers(5, model.n_vocab, 12)].astype(np.int32)
    for k, n, carrier in ((3, 5, 4), (40, 16, None)):
        settings = ContextSettings(n_ctx=256, n_batch=32, n_seq_max=n + 1, n_threads=1)
        dense, graph = LlamaContext(model, settings), LlamaContext(model, settings)
        top = BackendTopK(graph.ptr, model.n_vocab, k, range(n + 1))
        seqs = list(range(n, 0, -1))
        toks = np.arange(20, 20 + n, dtype=np.int32)
        top.activate((), 0)
        for ctx in (dense, graph):
            ctx.decode(prompt, np.arange(len(prompt), dtype=np.int32), 0, seq=0)
            ctx.seq_cp_many([0] * n, seqs)
        top.activate(seqs, n)
        for ctx in (dense, graph):
            ctx.decode(toks, len(prompt), 1, seq_ids=seqs)
        assert top.carrier == carrier
        got_tok, got_lp = top.read(n)
        want_tok, want_lp = top_k_log_probs(dense.logits(n), k)
        np.testing.assert_array_equal(got_tok, want_tok)
        np.testing.assert_allclose(got_lp, want_lp, rtol=0, atol=1e-5)
        dense.close()
        graph.close()
    model.close()
