"""One-pass tree verification on real llama.cpp: tree logits equal sequential decoding, commits keep the cache
exactly as if the accepted tokens had been decoded one by one, and bad trees never reach llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from eagle2_local.decoding.target import Target
from eagle2_local.errors import ContextFullError, TreeError
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import DraftTree, tree_leaves
from tests.support.helpers import (SETTINGS, Restores, check_thousand_rounds_leak_no_cells, path_to, random_tree,
                                   sequential_logits)

# F32 matmuls take different kernels for different batch sizes on CPU: results differ in the last bits.
F32_TOL = 1e-2


@pytest.fixture(scope="module")
def f32_model(synth_f32):
    return LlamaModel(synth_f32)


@pytest.fixture(scope="module")
def q8_model(synth_q8):
    return LlamaModel(synth_q8)


@pytest.fixture(scope="module")
def smol_model(smollm2_path):
    return LlamaModel(smollm2_path)


def check_tree_equals_paths(model, prefix, tree, tol):
    t = Target(model, SETTINGS)
    t.prefill(prefix)
    ver = t.verify(tree)
    assert ver.logits.shape == (len(tree), model.n_vocab)
    t.abort_tree()
    t.close()
    # every root-to-leaf path covers its nodes; check each node once. Sequential decoding on one context: the
    # prefix once, then each path's tokens one at a time after rolling back to what it shares with the last path
    seq_target = Target(model, SETTINGS)
    seq_target.prefill(prefix)
    decoded: list[int] = []
    rows: list[np.ndarray] = []
    for leaf in tree_leaves(tree.parents):
        path = path_to(tree, int(leaf))
        tokens = [int(tok) for tok in tree.tokens[path]]
        keep = next((i for i, (a, b) in enumerate(zip(decoded, tokens)) if a != b), min(len(decoded), len(tokens)))
        seq_target.rollback(len(prefix) + keep)
        decoded, rows = tokens, rows[:keep] + [seq_target.decode_one(tok).logits[0] for tok in tokens[keep:]]
        seq = np.array(rows)
        diff = np.abs(seq - ver.logits[path]).max()
        assert diff <= tol, f"path to leaf {leaf}: max |diff| {diff}"
        top2 = np.sort(seq, axis=1)[:, -2:]
        decided = (top2[:, 1] - top2[:, 0]) > 2 * tol
        assert np.array_equal(seq.argmax(1)[decided], ver.logits[path].argmax(1)[decided])
    seq_target.close()


@pytest.mark.parametrize("which", ["f32", "q8"])
@given(data=st.data())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_trees_equal_sequential_synthetic(which, data, f32_model, q8_model):
    model = f32_model if which == "f32" else q8_model
    n = data.draw(st.integers(1, 63))
    max_depth = data.draw(st.integers(1, 10))
    seed = data.draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, model.n_vocab, n, max_depth)
    prefix = list(rng.integers(5, model.n_vocab, int(rng.integers(1, 20))))
    check_tree_equals_paths(model, prefix, tree, F32_TOL if which == "f32" else 0.0)


@pytest.mark.smollm2
def test_random_trees_equal_sequential_smollm2(smol_model):
    rng = np.random.default_rng(0)
    prefix = smol_model.tokenize("The history of the printing press begins")
    for n, depth in [(63, 10), (40, 3), (17, 16), (2, 1)]:
        check_tree_equals_paths(smol_model, prefix, random_tree(rng, smol_model.n_vocab, n, depth), 0.0)
    # 64+ nodes: flash attention's tiled kernel; equal within a tolerance, argmax equal where decided
    check_tree_equals_paths(smol_model, prefix, random_tree(rng, smol_model.n_vocab, 64, 10), 1.5)


def test_batch_invariance_measured(f32_model, q8_model):
    """The premise of the bit-identical tests: with one thread and batches under 64 tokens, Q8_0 kernels give
    the same logits whatever the batch size; F32 ones differ slightly (so F32 tests use a tolerance)."""
    prompt = list(range(10, 60))
    results = {}
    for name, model in (("f32", f32_model), ("q8", q8_model)):
        one = sequential_logits(model, [1], prompt)[-1]
        t = Target(model, SETTINGS)
        batched = t.prefill([1] + prompt).logits[0]
        results[name] = np.abs(one - batched).max()
    assert results["q8"] == 0.0
    assert 0.0 < results["f32"] <= F32_TOL


def commit_rounds(model, rounds, seed, settings=SETTINGS, tree_size=(1, 24)):
    """Random verify/commit rounds; returns the target, the committed token list and the count of commits that
    moved accepted rows."""
    rng = np.random.default_rng(seed)
    t = Target(model, settings)
    restores = Restores(t)
    committed = list(rng.integers(5, model.n_vocab, 8))
    t.prefill(committed)
    for _ in range(rounds):
        tree = random_tree(rng, model.n_vocab, int(rng.integers(*tree_size)), int(rng.integers(1, 6)))
        t.verify(tree)
        path = path_to(tree, int(rng.choice(len(tree))))
        t.commit(path)
        committed += [int(x) for x in tree.tokens[path]]
        assert t.n_past == len(committed)
        assert t.ctx.seq_pos_max(0) == len(committed) - 1
    return t, committed, restores


@pytest.mark.parametrize("which", ["q8", "smollm2"])
def test_commit_is_bit_identical_to_sequential(which, q8_model, request):
    model = q8_model if which == "q8" else request.getfixturevalue("smol_model")
    t, committed, restores = commit_rounds(model, 40, seed=1)
    assert restores.n > 0  # some commits had to move accepted rows
    assert len(committed) > 100
    probe = [17, 23, 99]
    spec = [t.decode_one(tok).logits[0] for tok in probe]
    ref = Target(model, SETTINGS)
    ref.prefill(committed[:1])
    for tok in committed[1:]:
        ref.decode_one(tok)
    plain = [ref.decode_one(tok).logits[0] for tok in probe]
    assert np.array_equal(np.array(spec), np.array(plain))
    # rollback leaves the same layout as never having decoded the probe
    t.rollback(len(committed))
    again = [t.decode_one(tok).logits[0] for tok in probe]
    assert np.array_equal(np.array(again), np.array(plain))


def test_commit_with_tolerance_f32(f32_model):
    t, committed, _ = commit_rounds(f32_model, 20, seed=2)
    probe = t.decode_one(42).logits[0]
    ref = sequential_logits(f32_model, committed[:1], committed[1:] + [42])[-1]
    assert np.abs(probe - ref).max() <= F32_TOL


def test_thousand_rounds_leak_no_cells(q8_model):
    check_thousand_rounds_leak_no_cells(q8_model)


def test_validation_before_llama(q8_model):
    small = ContextSettings(n_ctx=64, n_batch=16, n_seq_max=6, n_threads=1)
    t = Target(q8_model, small)
    t.prefill([1, 5])
    with pytest.raises(TreeError, match="exceeds the batch"):
        t.verify(DraftTree.from_parents(np.full(17, 9), [-1] + [0] * 16))
    with pytest.raises(TreeError, match="leaves"):
        t.verify(DraftTree.from_parents(np.full(6, 9), [-1, 0, 0, 0, 0, 0]))
    with pytest.raises(TreeError, match="not an earlier node"):
        t.verify(DraftTree.from_parents(np.full(3, 9), [-1, 2, 0]))
    with pytest.raises(TreeError, match="vocabulary"):
        t.verify(DraftTree.from_parents(np.array([9, 10**6]), [-1, 0]))
    fill = t.n_ctx - 10 - t.n_past  # llama.cpp may round n_ctx up; use what it reports
    for start in range(0, fill, 16):
        t.prefill([7] * min(16, fill - start))
    chain = DraftTree.from_parents(np.full(16, 9), [-1] + list(range(15)))  # needs 16 cells, 10 are left
    with pytest.raises(ContextFullError, match="context full"):
        t.verify(chain)
    # the process survived and the context still works
    t.verify(DraftTree.from_parents(np.full(4, 9), [-1, 0, 1, 1]))
    t.commit([0, 1])
    assert t.n_past == t.n_ctx - 8
    with pytest.raises(TreeError, match="without a verified tree"):
        t.commit([0])


def test_more_sequences_than_batch_does_not_abort(q8_model):
    """llama.cpp reserves an output per sequence and aborts when that exceeds n_outputs_max (= n_batch by
    default); the context must be created so that never happens."""
    t = Target(q8_model, ContextSettings(n_ctx=256, n_batch=16, n_seq_max=40, n_threads=1))
    t.prefill([1, 5, 6])
    t.verify(DraftTree.from_parents(np.full(16, 9), [-1] + [0] * 15))
    t.commit([0, 3])
    assert t.n_past == 5


@pytest.mark.parametrize("kind", ["layer_inputs", "embeddings"])
def test_verified_features_of_chosen_nodes_equal_the_verify_rows(synth_q8, kind):
    """The generator copies only the accepted path's features after a verify; they equal those rows of the
    full copy (EAGLE-3 layer inputs and EAGLE-1/2 hidden states)."""
    model = LlamaModel(synth_q8)
    extra = {"layer_inputs": (0, 1)} if kind == "layer_inputs" else {"embeddings": True}
    target = Target(model, ContextSettings(n_ctx=256, n_batch=64, n_seq_max=8, n_threads=1, **extra))
    target.prefill(model.tokenize("the water is very long"))
    tree = DraftTree.from_parents([5, 6, 7, 8, 9, 10], [-1, 0, 0, 1, 3, 3])
    full = target.verify(tree).features
    nodes = np.array([0, 1, 3, 5])
    assert full.shape[0] == 6
    np.testing.assert_array_equal(target.verified_features(nodes), full[nodes])
    target.abort_tree()
    assert target.verify(tree, features=False).features is None
    np.testing.assert_array_equal(target.verified_features(nodes), full[nodes])
