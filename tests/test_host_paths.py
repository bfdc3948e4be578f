"""The host's per-round shortcuts equal what they replaced: pure functions, no llama.cpp decode."""

from __future__ import annotations

import numpy as np

from eagle2_local.llamacpp import runtime
from eagle2_local.decoding.acceptance import accept_greedy
from eagle2_local.llamacpp.batch import Batch
from eagle2_local.decoding.tree import (Proposals, ancestor_mask, leaf_membership, node_depths, top_children,
                                        verify_layout)
from tests.support.helpers import random_tree


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


def test_ranked_proposals_pass_top_children_unchanged_and_others_are_ranked():
    """A row already best first (ties in place) is what the stable ranking would return; any other is ranked."""
    tokens = np.array([[4, 2, 9], [7, 1, 3]])
    ranked = Proposals(tokens, np.log([[0.5, 0.2, 0.2], [0.6, 0.3, 0.1]]))
    tok, lp, _ = top_children(ranked, 3)
    assert np.array_equal(tok, tokens) and np.array_equal(lp, ranked.log_probs)
    unranked = Proposals(tokens, np.log([[0.2, 0.5, 0.2], [0.6, 0.3, 0.1]]))
    tok, lp, _ = top_children(unranked, 3)
    assert tok.tolist() == [[2, 4, 9], [7, 1, 3]]
    assert tok.shape == (2, 3) and (np.diff(lp, axis=1) <= 0).all()
    tok, _, _ = top_children(unranked, 2)
    assert tok.tolist() == [[2, 4], [7, 1]]


def test_rows_flagged_ranked_give_the_ranking_of_unflagged_rows():
    """Rows a producer flags best first (the in-graph top-k, numpy's top-k, the lookup) give top_children the
    same children as the check and the stable ranking do, wider than k too (ties kept in place)."""
    rng = np.random.default_rng(7)
    for width, k in ((3, 3), (5, 3), (12, 10), (4, 6)):
        lp = -np.sort(rng.integers(0, 4, (6, width)) * 0.5, axis=1)  # non-increasing, with ties
        lp[:, -1] = -np.inf
        tokens = rng.integers(0, 99, (6, width))
        flagged = top_children(Proposals(tokens, lp, ranked=True), k)
        plain = top_children(Proposals(tokens, lp), k)
        for a, b in zip(flagged, plain):
            assert np.array_equal(a, b)
    logits = rng.standard_normal((4, 50)).astype(np.float32)
    assert Proposals.from_logits(logits, 5).ranked



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
