"""The host's per-round shortcuts equal what they replaced: pure functions, no llama.cpp decode."""

from __future__ import annotations

import numpy as np

from eagle2_local.decoding.acceptance import accept_greedy
from eagle2_local.llamacpp import runtime
from eagle2_local.llamacpp.batch import Batch
from eagle2_local.tree.draft_tree import ancestor_mask, node_depths, verify_layout
from eagle2_local.tree.proposals import BOTH, LOOKUP, MODEL, Proposals, merge_row
from eagle2_local.tree.top_k import top_k_log_probs
from tests.support.helpers import random_tree
from tests.support.tree_reference import leaf_membership


def test_verify_layout_equals_depths_and_leaf_membership():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 30, 60, 120):
        parents = random_tree(rng, 50, n, 8).parents
        depths, leaves, member = verify_layout(parents)
        ref_leaves, ref_member = leaf_membership(parents)
        assert np.array_equal(depths, node_depths(parents))
        assert np.array_equal(leaves, ref_leaves) and np.array_equal(member, ref_member)


def test_ancestor_mask_on_chains_and_deep_trees():
    """Pointer doubling reaches every ancestor at every depth, 2**s levels up included (the lookup's chains)."""
    rng = np.random.default_rng(6)
    shapes = [np.arange(-1, n - 1) for n in range(1, 40)]  # chains: node i's parent is i - 1
    shapes += [random_tree(rng, 50, n, 16).parents for n in (3, 17, 64, 200)]
    for parents in shapes:
        anc = ancestor_mask(parents)
        for i in range(len(parents)):
            chain, j = set(), i
            while j >= 0:
                chain.add(j)
                j = int(parents[j])
            assert set(np.flatnonzero(anc[i]).tolist()) == chain


def test_batch_lists_each_tokens_sequences_in_leaf_order():
    rng = np.random.default_rng(4)
    batch = Batch(64, 48)
    for _ in range(30):
        n, n_seqs = int(rng.integers(1, 64)), int(rng.integers(1, 48))
        mask = rng.random((n, n_seqs)) < 0.3
        seq_ids = rng.permutation(48)[:n_seqs].astype(np.int32)
        batch.fill(np.zeros(n, np.int32), np.zeros(n, np.int32), mask, seq_ids, 0, np.ones(n, np.int8))
        for i in range(n):
            assert batch.n_seq_id[i] == mask[i].sum()
            assert batch.seq_ids[i, :batch.n_seq_id[i]].tolist() == seq_ids[mask[i]].tolist()


def test_dense_rows_are_ranked_when_read_as_wide_as_asked():
    """Logit rows become their top-k when read, as wide as the reader asks; listed rows wider than k are cut."""
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((4, 50)).astype(np.float32)
    for k in (3, 10):
        got = Proposals.from_logits(logits).best(k)
        tok, lp = top_k_log_probs(logits, k)
        assert got.tokens == tok.tolist() and got.log_probs == lp.tolist() and got.sources == [[MODEL] * k] * 4
        assert np.array_equal(got.log_prob_array, lp)
    root = Proposals.from_logits(logits[0]).best(5)
    assert root.tokens == [top_k_log_probs(logits[:1], 5)[0][0].tolist()]
    wide = Proposals([[4, 2, 9], [7]], [[-0.1, -0.2, -0.3], [-0.5]])
    assert wide.best(3) is wide and wide.best(2).tokens == [[4, 2], [7]]
    rows = Proposals.from_arrays(np.array([[1, 2, 3]]), np.log([[0.5, 0.3, 0.1]]))
    assert rows.row_mass() == np.exp(np.log([[0.5, 0.3, 0.1]])).sum(axis=1).tolist()  # numpy's summation order


def test_merge_row_keeps_the_higher_probability_and_ranks_stably():
    """A shared token keeps its place, the higher log-probability and the shared source; new ones are appended;
    the row then goes best first with ties in column order."""
    tokens, log_probs, sources = [5, 6, 7], [-0.5, -1.0, -2.0], [MODEL] * 3
    merge_row(tokens, log_probs, sources, [(7, -0.2, LOOKUP), (9, -1.0, LOOKUP)])
    assert tokens == [7, 5, 6, 9] and log_probs == [-0.2, -0.5, -1.0, -1.0]
    assert sources == [BOTH, MODEL, MODEL, LOOKUP]


def test_a_failed_call_reports_only_the_lines_llama_cpp_printed_after_its_mark():
    runtime._log_callback(runtime._LEVEL_ERROR, b"an earlier warning", None)
    mark = runtime.error_mark()
    runtime._log_callback(runtime._LEVEL_ERROR, b"the failure", None)
    runtime._log_callback(1, b"a debug line", None)
    assert runtime.errors_since(mark) == "the failure"
    assert runtime.errors_since(runtime.error_mark()) == ""


def test_batch_puts_each_token_in_its_own_sequence_without_a_mask():
    batch = Batch(16, 8)
    seqs = np.array([3, 1, 7, 2], dtype=np.int32)
    batch.fill(np.arange(4, dtype=np.int32), np.zeros(4, np.int32), None, seqs, 0, np.ones(4, np.int8))
    assert batch.n_seq_id[:4].tolist() == [1, 1, 1, 1] and batch.seq_ids[:4, 0].tolist() == seqs.tolist()
    batch.fill(np.arange(3, dtype=np.int32), np.zeros(3, np.int32), None, None, 5, np.ones(3, np.int8))
    assert batch.seq_ids[:3, 0].tolist() == [5, 5, 5]


def test_greedy_acceptance_follows_the_first_child_with_the_targets_token():
    """The (parent, token) lookup walks the path the per-step scan of the tree walked: the first child in node
    order whose token is the target's argmax, also where two siblings share a token."""
    rng = np.random.default_rng(9)
    deep = 0
    for _ in range(200):
        tree = random_tree(rng, 12, int(rng.integers(1, 40)), 6)  # a small vocabulary: siblings share tokens
        logits = rng.standard_normal((len(tree), 12)).astype(np.float32)
        follow = rng.random(len(tree) - 1) < 0.5  # raise some children's tokens in their parents' rows
        logits[tree.parents[1:][follow], tree.tokens[1:][follow]] += 4.0
        node, path = 0, [0]
        while True:
            best = int(np.argmax(logits[node]))
            kids = np.flatnonzero((tree.parents == node) & (tree.tokens == best))
            if kids.size == 0:
                break
            node = int(kids[0])
            path.append(node)
        got = accept_greedy(tree, logits)
        assert got.path.tolist() == path and got.bonus == best
        deep += len(path) > 2
    assert deep > 30, "few paths went past one node: the walk was hardly tested"


def test_reading_a_buffers_address_leaves_no_garbage():
    """Every decode reads a few llama.cpp buffer addresses; ``ctypes.cast`` left two cyclic objects per read for
    the garbage collector (four reads a plain step with the head: a collection every ~90 steps)."""
    import ctypes
    import gc
    import struct

    from eagle2_local.llamacpp.llama_ext import address

    buf = (ctypes.c_float * 8)()
    returned = struct.pack("P", ctypes.addressof(buf))  # a pointer as a C function returns it: no keep-alive
    gc.collect()
    for _ in range(50):
        assert address(ctypes.POINTER(ctypes.c_float).from_buffer_copy(returned)) == ctypes.addressof(buf)
    assert gc.collect() == 0
    assert address(ctypes.POINTER(ctypes.c_float)()) is None  # NULL
