"""EAGLE-2 tree growth and tree arrays, checked against a direct transcription of the algorithm."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from eagle2_local.drafts.lookup import LookupDraft
from eagle2_local.errors import TreeError
from eagle2_local.tree.draft_tree import (DraftTree, TreeParams, ancestor_mask, grow_candidates, node_depths,
                                          select_tree, tree_leaves)
from eagle2_local.tree.proposals import Proposals
from eagle2_local.tree.top_k import top_k_log_probs
from tests.support.helpers import path_to
from tests.support.tree_reference import leaf_membership, log_softmax, rows

V = 50


def grow_tree(root_token: int, root_logits: np.ndarray, expand, params: TreeParams) -> DraftTree:
    """Grow one EAGLE-2 tree and re-rank it to at most ``params.total_tokens`` nodes."""
    c = grow_candidates(Proposals.from_logits(root_logits), expand, params)
    return select_tree(root_token, c.tokens, c.scores, c.parents, params.total_tokens, c.sources)


def fake_draft(seed: int):
    """A deterministic 'draft': logits depend on the token and its parent chain (via the candidate path)."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((V, V)) * 3.0
    calls = []

    def expand(cand_ids, tokens, parent_ids, level):
        calls.append((list(cand_ids), list(tokens), list(parent_ids), level))
        return Proposals.from_logits(table[tokens] + 0.1 * level)

    return table, expand, calls


def reference_eagle2(root_logits, table, params):
    """Slow, literal EAGLE-2 (topK_genrate): lists of (token, parent_cand, score)."""
    k = params.top_k
    lp = log_softmax(root_logits)
    order = sorted(range(V), key=lambda t: (-lp[t], t))[:k]
    cands = [(t, -1, lp[t]) for t in order]
    frontier = list(range(len(cands)))
    for level in range(1, params.depth):
        children = []
        for f in frontier:
            tok, _, score = cands[f]
            clp = log_softmax(table[tok] + 0.1 * level)
            best = sorted(range(V), key=lambda t: (-clp[t], t))[:k]
            children += [(t, f, score + clp[t]) for t in best]
        base = len(cands)
        cands += children
        ranked = sorted(range(len(children)), key=lambda i: (-children[i][2], i))[:k]
        frontier = [base + i for i in ranked]
    keep = sorted(sorted(range(len(cands)), key=lambda i: (-cands[i][2], i))[: params.total_tokens - 1])
    return [cands[i] for i in keep], keep


@pytest.mark.parametrize("params", [TreeParams(60, 6, 10), TreeParams(10, 3, 4), TreeParams(5, 5, 1),
                                    TreeParams(200, 4, 8)])
def test_grow_tree_matches_reference(params):
    table, expand, calls = fake_draft(3)
    root_logits = np.random.default_rng(5).standard_normal(V) * 2
    tree = grow_tree(7, root_logits, expand, params)
    ref, keep = reference_eagle2(root_logits, table, params)
    max_candidates = params.top_k + (params.depth - 1) * params.top_k * params.top_k
    assert len(tree) == min(params.total_tokens, max_candidates + 1)
    assert tree.tokens[0] == 7 and tree.parents[0] == -1
    assert tree.cand_ids[1:].tolist() == keep
    assert tree.tokens[1:].tolist() == [t for t, _, _ in ref]
    np.testing.assert_allclose(tree.scores[1:], [s for _, _, s in ref])
    # every expansion feeds exactly k frontier nodes, one level deeper each time
    assert [c[3] for c in calls] == list(range(1, params.depth))
    assert all(len(c[0]) == params.top_k for c in calls)
    # parents precede children and children never outscore parents
    assert np.all(tree.parents[1:] < np.arange(1, len(tree)))
    nonroot = np.arange(1, len(tree))
    par = tree.parents[nonroot]
    assert np.all(tree.scores[nonroot][par > 0] <= tree.scores[par[par > 0]] + 1e-12)


@pytest.mark.parametrize("params", [TreeParams(60, 6, 10), TreeParams(10, 3, 4), TreeParams(5, 5, 1)])
def test_proposals_grow_the_same_tree_as_dense_logits(params):
    """A drafter that lists its candidates with log-probabilities (no dense rows), more than the tree reads, gets
    exactly the tree the same candidates give as logits: same tokens, parents, scores and candidate ids."""
    table, expand, _ = fake_draft(3)
    root_logits = np.random.default_rng(5).standard_normal(V) * 2
    dense = grow_tree(7, root_logits, expand, params)

    def listed(logits: np.ndarray, k: int) -> Proposals:
        return rows(*top_k_log_probs(np.atleast_2d(logits), k))

    def propose(cand_ids, tokens, parent_ids, level):
        return listed(table[tokens] + 0.1 * level, params.top_k + 2)

    c = grow_candidates(listed(root_logits, params.top_k), propose, params)
    tree = select_tree(7, c.tokens, c.scores, c.parents, params.total_tokens)
    for name in ("tokens", "parents", "scores", "cand_ids"):
        assert np.array_equal(getattr(tree, name), getattr(dense, name)), name


def test_short_rows_and_a_level_without_proposals():
    """A lookup drafter with few continuations proposes short rows (padding never becomes a candidate or a frontier
    node), and a level without proposals ends the growth (no expand with nothing to run)."""
    calls = []

    def lookup(cand_ids, tokens, parent_ids, level):
        calls.append(list(tokens))
        tokens = np.asarray(tokens)
        # token t continues with t + 1 only while below 5 (a single chain per branch), then nothing
        nxt = np.where(tokens < 5, tokens + 1, 0)
        lp = np.where(tokens < 5, np.log(0.9), -np.inf)
        return rows(np.stack([nxt, np.full_like(nxt, 9)], 1), np.stack([lp, np.full(len(lp), -np.inf)], 1))

    root = rows([[2, 3, 0]], [[np.log(0.6), np.log(0.3), -np.inf]])  # two branches and a padding column
    c = grow_candidates(root, lookup, TreeParams(60, 6, 4))
    assert 9 not in c.tokens.tolist() and np.all(np.isfinite(c.scores))
    assert c.tokens.tolist() == [2, 3, 3, 4, 4, 5, 5]  # two chains: 2-3-4-5 and 3-4-5
    assert calls == [[2, 3], [3, 4], [4, 5], [5]]  # the last frontier proposes nothing: growth stops
    tree = select_tree(1, c.tokens, c.scores, c.parents, 60)
    assert len(tree) == 8 and tree.tokens[path_to(tree, 7)].tolist() == [1, 2, 3, 4, 5]


def test_end_of_generation_tokens_get_no_children():
    """A candidate that ends the answer (an end-of-generation token) is never expanded: its children could only
    be verified for nothing. The other branches grow as before, and the final token itself stays a candidate."""
    calls = []

    def chain(cand_ids, tokens, parent_ids, level):
        calls.append(list(tokens))
        return Proposals([[t + 1] for t in tokens], [[np.log(0.9)] for _ in tokens])

    root = Proposals([[7, 2]], [[np.log(0.6), np.log(0.3)]])
    c = grow_candidates(root, chain, TreeParams(60, 4, 4), final_tokens=frozenset({7, 4}))
    assert calls == [[2], [3]]  # 7 ends the answer at once; the branch 2-3-4 stops at 4
    assert c.tokens.tolist() == [7, 2, 3, 4]
    plain = grow_candidates(root, chain, TreeParams(60, 4, 4))
    assert plain.tokens.tolist() == [7, 2, 8, 3, 9, 4, 10, 5]


def test_level_done_hears_every_level_and_should_expand_only_asks():
    """The tree builder tells ``level_done`` of every level grown (the last included) and only asks
    ``should_expand`` before a deeper one; a "no" stops the growth."""
    _, expand, _ = fake_draft(1)
    root_logits = Proposals.from_logits(np.random.default_rng(2).standard_normal(V))
    done, asked = [], []
    grow_candidates(root_logits, expand, TreeParams(60, 4, 3), lambda s, f, n, *_: asked.append(n) or True, done.append)
    assert done == [1, 2, 3, 4] and asked == [1, 2, 3]
    done, asked = [], []
    c = grow_candidates(root_logits, expand, TreeParams(60, 4, 3), lambda s, f, n, *_: asked.append(n) or n < 2,
                        done.append)
    assert c.levels == 2 and done == [1, 2] and asked == [1, 2]


def _reference_growth(root: list[tuple[int, float, int]], row, params: TreeParams, stop_at: int,
                      final: set[int]) -> tuple[list[tuple[int, int, float, int]], int, list]:
    """EAGLE-2's levels written out literally on rows of (token, log-probability, source), best first: each level
    the k best frontier nodes (ties to the earlier candidate) that do not end the answer get each their row's k
    best; ``stop_at`` levels at most. Returns the candidates (token, parent, score, source), the levels grown and
    what a should_expand was asked."""
    k = params.top_k
    cands = [(t, -1, lp, s) for t, lp, s in root[:k]]
    frontier = [i for i, c in enumerate(cands) if c[0] not in final]
    levels, asked = 1, []
    for level in range(2, params.depth + 1):
        if not frontier:
            break
        asked.append(([c[2] for c in cands], [cands[i][2] for i in frontier], [c[3] for c in cands],
                      [cands[i][3] for i in frontier]))
        if levels >= stop_at:
            break
        first = len(cands)
        for f in frontier:
            cands += [(t, f, cands[f][2] + lp, s) for t, lp, s in row(cands[f][0], level - 1)[:k]]
        ranked = sorted(range(first, len(cands)), key=lambda i: (-cands[i][2], i))
        frontier = [i for i in ranked if cands[i][0] not in final][:k]
        levels = level
    return cands, levels, asked


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 8), top_k=st.integers(1, 5),
       stop_at=st.integers(1, 9), n_final=st.integers(0, 3))
def test_growth_matches_the_literal_levels(seed, depth, top_k, stop_at, n_final):
    """The grower against a literal transcription of its levels on listed rows: the same candidates (scores bit for
    bit), levels and should_expand questions, with ties (few distinct log-probabilities), rows wider than top_k,
    empty rows, end-of-generation tokens and a should_expand that stops."""
    rng = np.random.default_rng(seed)
    table = {}  # (token, level) -> its row, drawn once

    def row(token: int, level: int) -> list[tuple[int, float, int]]:
        if (token, level) not in table:
            width = int(rng.integers(0, 8))
            toks = rng.choice(12, size=width, replace=False).tolist()
            lps = sorted(rng.choice([0.0, -0.5, -0.5, -1.25, -3.0], size=width).tolist(), reverse=True)
            table[token, level] = list(zip(toks, lps, rng.integers(0, 3, width).tolist()))
        return table[token, level]

    def as_proposals(listed: list[list[tuple[int, float, int]]]) -> Proposals:
        return Proposals([[e[0] for e in r] for r in listed], [[e[1] for e in r] for r in listed],
                         [[e[2] for e in r] for r in listed])

    def expand(cand_ids, tokens, parent_ids, level):
        return as_proposals([row(t, level) for t in tokens])

    final = set(rng.choice(12, size=n_final, replace=False).tolist())
    params = TreeParams(60, depth, top_k)
    asked, done = [], []

    def ask(scores, frontier, levels, sources, frontier_sources):
        asked.append((scores.tolist(), frontier.tolist(), sources.tolist(), frontier_sources.tolist()))
        return levels < stop_at

    got = grow_candidates(as_proposals([row(-1, 0)]), expand, params, ask, done.append, frozenset(final))
    cands, levels, ref_asked = _reference_growth(row(-1, 0), row, params, stop_at, final)
    assert got.levels == levels and asked == ref_asked
    assert got.tokens.tolist() == [c[0] for c in cands] and got.parents.tolist() == [c[1] for c in cands]
    assert got.scores.tolist() == [c[2] for c in cands] and got.sources.tolist() == [c[3] for c in cands]
    assert done == list(range(1, levels + 1))  # every level grown, the last included


def test_lookup_grows_its_own_tree():
    """A real lookup over a repetitive text: a sure chain, and the branches the text took after it."""
    text = [5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7, 8, 3, 5, 6]
    lookup = LookupDraft()
    lookup.begin_answer(10)
    grown = grow_candidates(lookup.catch_up(np.array(text)), lookup.expand, TreeParams(16, 6, 4))
    # "5 6" went on as 7 each time, then as 8, 1 and 8: one sure child, and three branches below it
    assert grown.tokens[:3].tolist() == [7, 8, 1] and grown.parents[:3].tolist() == [-1, 0, 0]


def test_tree_params_validation():
    for kw in (dict(top_k=0), dict(depth=0), dict(total_tokens=1), dict(total_tokens=1000)):
        with pytest.raises(TreeError):
            TreeParams(**kw)


def test_malformed_trees_rejected():
    with pytest.raises(TreeError, match="root"):
        DraftTree.from_parents([1, 2], [0, -1])
    with pytest.raises(TreeError, match="not an earlier node"):
        DraftTree.from_parents([1, 2, 3], [-1, 2, 0])
    with pytest.raises(TreeError, match="at most"):
        DraftTree.from_parents(list(range(300)), [-1] + list(range(299)))


@st.composite
def random_parents(draw, max_nodes=64):
    n = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


@given(random_parents())
@settings(max_examples=200, deadline=None)
def test_masks_and_leaves(parents):
    parents = np.asarray(parents)
    n = len(parents)
    depths = node_depths(parents)
    anc = ancestor_mask(parents)
    leaves, member = leaf_membership(parents)
    for i in range(n):
        chain = set()
        j = i
        while j >= 0:
            chain.add(j)
            j = parents[j]
        assert set(np.flatnonzero(anc[i])) == chain
        assert depths[i] == len(chain) - 1
    assert set(leaves.tolist()) == set(range(n)) - set(parents[1:].tolist())
    assert np.array_equal(tree_leaves(parents), leaves)
    # node i carries leaf l's id exactly when i is an ancestor-or-self of l; so with the KV mask "cell holds
    # my first seq id", node i sees node j iff j is an ancestor-or-self of i
    for i in range(n):
        first = np.flatnonzero(member[i])[0]
        visible = member[:, first]
        visible_before = visible & (depths <= depths[i])
        assert set(np.flatnonzero(visible_before)) == set(np.flatnonzero(anc[i]))


def test_top_k_exact_and_fast_path_agree():
    from eagle2_local.tree.top_k import log_normalizer, top_k_log_probs, top_k_rows
    rng = np.random.default_rng(0)
    for width in (50, 5000, 150000):
        x = (rng.standard_normal((4, width)) * 3).astype(np.float32)
        x[1, :] = 0.5  # all tied: the lowest indices win
        idx, vals = top_k_rows(x, 10)
        ref = np.argsort(-x, axis=-1, kind="stable")[:, :10]
        assert np.array_equal(idx, ref)
        _, lp = top_k_log_probs(x, 10)
        np.testing.assert_allclose(lp, log_softmax(x)[np.arange(4)[:, None], ref], atol=1e-6)
        np.testing.assert_allclose(log_normalizer(x), log_normalizer(x.astype(np.float64)), atol=1e-6)


def _top_k_rows_per_row(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-row top-k that tree.top_k_rows replaced (one sampled pre-filter and one partition per row), kept
    as the reference the vectorised one must reproduce exactly."""
    values = np.atleast_2d(values)
    n, width = values.shape
    k = min(k, width)
    if width <= 4096:
        idx = np.lexsort((np.broadcast_to(np.arange(width), values.shape), -values), axis=-1)[:, :k]
    else:
        idx = np.empty((n, k), dtype=np.int64)
        for r in range(n):
            row = values[r]
            sample = row[:: max(1, width // 2048)]
            bound = np.partition(sample, len(sample) - k)[len(sample) - k] if len(sample) >= k else row.min()
            cand = np.flatnonzero(row >= bound)
            idx[r] = cand[np.lexsort((cand, -row[cand]))[:k]]
    vals = np.take_along_axis(values, idx, axis=-1)
    order = np.lexsort((idx, -vals), axis=-1)
    idx = np.take_along_axis(idx, order, axis=-1)
    return idx, np.take_along_axis(values, idx, axis=-1)


@pytest.mark.parametrize("width", [50, 4096, 4097, 16000, 49152, 49155, 151936])
def test_vectorised_top_k_equals_the_per_row_one(width):
    """Same indices and values, ties included (lower index first), on rows with many exact ties, rows of a few
    distinct values, rows mostly -inf (an EAGLE-3 head's scattered draft vocabulary), float32 and float64."""
    from eagle2_local.tree.top_k import log_normalizer, top_k_log_probs, top_k_rows
    rng = np.random.default_rng(width)
    rows = [np.round(rng.standard_normal(width) * 2, 1),  # ~80 distinct values: ties everywhere
            rng.integers(0, 3, width).astype(float),  # three values: the top k are all tied
            np.full(width, 0.25),
            rng.standard_normal(width) * 4]
    sparse = np.full(width, -np.inf)
    sparse[rng.choice(width, max(1, width // 3), replace=False)] = rng.standard_normal(max(1, width // 3))
    rows.append(sparse)
    few = np.full(width, -np.inf)
    few[rng.choice(width, 5, replace=False)] = 1.0  # fewer finite entries than k
    rows.append(few)
    x = np.stack(rows)
    for dtype in (np.float32, np.float64):
        xd = x.astype(dtype)
        for k in (1, 3, 10, 17):
            idx, vals = top_k_rows(xd, k)
            ref_idx, ref_vals = _top_k_rows_per_row(xd, k)
            assert np.array_equal(idx, ref_idx) and np.array_equal(vals, ref_vals), (dtype, k)
        idx, lp = top_k_log_probs(xd[:5], 10)  # (the all -inf-but-5 row has no finite log-probs to compare)
        norm = log_normalizer(xd[:5])
        assert np.array_equal(lp, np.take_along_axis(xd[:5], idx, -1).astype(np.float64) - norm[:, None])
    one = top_k_rows(x[0], 10)  # one row given as a vector
    assert np.array_equal(one[0], _top_k_rows_per_row(x[0], 10)[0])
