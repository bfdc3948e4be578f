"""Merged drafts: what a lookup-only child (a continuation the model did not propose) is worth in the tree, and
how that is learned from the rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eagle2_local.drafts import DraftModelEngine, LookupDraft, MergedDraft
from eagle2_local.drafts.lookup import ROOT
from eagle2_local.drafts.merged import MIN_ODDS, MIN_PROB, LookupOnlyOdds, weigh_into
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.tree.proposals import BOTH, LOOKUP, MODEL, Proposals
from tests.support.helpers import ONE_THREAD


def test_lookup_only_odds_start_at_one_and_learn_per_band():
    """Before any round every band's odds are 1 (a child is worth p * p); a band whose children never come next
    falls to the floor while another band keeps its odds, and capped counts let recent rounds bring it back."""
    odds = LookupOnlyOdds()
    weak, sure = odds.band(0.2), odds.band(0.9)
    assert weak != sure and odds.factors() == [1.0] * len(odds.factors())
    for _ in range(2000):
        odds.observe([7], [0.2], next_token=8)  # a weak match's child: never the next token
        odds.observe([7], [0.9], next_token=7)  # a sure one's: always
    assert odds.odds(weak) == MIN_ODDS
    assert odds.odds(sure) == pytest.approx(1 / 0.9 ** 2, rel=0.02)  # hits over p * p
    for _ in range(8):
        odds.observe([7], [0.2], next_token=7)
    assert odds.odds(weak) > MIN_ODDS


def test_observe_scores_each_child_by_its_own_token():
    """Two children of one row in one band: the one that came next is a hit, the other a miss."""
    odds = LookupOnlyOdds(prior=1.0, edges=())
    odds.observe([5, 6], [0.5, 0.5], next_token=6)
    assert odds.hits == [2.0] and odds.expected == [1.5]


@pytest.fixture(scope="module")
def synth(synth_q8):
    return LlamaModel(synth_q8)


def _row(out: Proposals, r: int = 0, k: int = 3) -> dict[int, tuple[float, int]]:
    """Row ``r`` of a draft's output as token -> (probability, source), its ``k`` best (dense rows as the merge
    takes them)."""
    out = out.best(k)
    return {t: (math.exp(lp), s) for t, lp, s in zip(out.tokens[r], out.log_probs[r], out.sources[r])}


def test_merged_row_gives_lookup_only_children_p_squared_and_shared_tokens_the_higher(synth):
    """The root's merged row against its parts' own rows: a model-only child keeps the model's probability, a
    shared token the higher of the two, a lookup-only child p * p at odds 1 (p: the lookup's probability), each
    within what the model's row leaves to it (1 - the mass of its other tokens)."""
    text = np.asarray(synth.tokenize("a b c d a b c e a b c f a b c g a b c"))
    merged = MergedDraft(DraftModelEngine(synth, ONE_THREAD, 3, 4), 3, LookupDraft(max_branches=3))
    got = _row(merged.catch_up(text, None), k=6)
    model = _row(DraftModelEngine(synth, ONE_THREAD, 3, 4).catch_up(text, None))
    lookup_tokens, lookup_probs = LookupDraft(max_branches=3).catch_up_rows(text)
    lookup = dict(zip(lookup_tokens[0], lookup_probs[0]))
    only = [t for t in lookup if t not in model]
    assert only and any(lookup[t] < 0.99 for t in only), "the test needs lookup-only children below p = 1"
    room = 1.0 - sum(p for p, _ in model.values())
    for tok, (p, source) in got.items():
        if tok in model and tok in lookup:
            m = model[tok][0]
            assert source == BOTH and p == pytest.approx(max(m, min(lookup[tok], room + m)))
        elif tok in model:
            assert source == MODEL and p == pytest.approx(model[tok][0])
        else:
            assert source == LOOKUP and p == pytest.approx(max(min(lookup[tok] ** 2, room), MIN_PROB))
    assert set(got) == set(model) | set(lookup)


def test_a_confident_model_leaves_lookup_entries_only_its_remaining_mass(synth):
    """Model row 0.9 / 0.05 for tokens 5 / 6: a lookup-only 7 at p = 0.8 (worth 0.64 alone) and the shared 6 at
    p = 0.6 get at most what the model leaves beside its other tokens: 0.05 and 0.05 + 0.05. A row the model is
    unsure of (0.2 / 0.1) leaves them their own worth, 0.64 and 0.6."""
    merged = MergedDraft(DraftModelEngine(synth, ONE_THREAD, 2, 4), 2, LookupDraft(max_branches=2))
    for model_probs, want in (([0.9, 0.05], [0.05, 0.1]), ([0.2, 0.1], [0.64, 0.6])):
        model = Proposals([[5, 6]], np.log([model_probs]).tolist())
        only = weigh_into(model, ([[7, 6]], [[0.8, 0.6]]), merged.odds.factors(), merged.odds.band)
        assert only == {0: ([7], [0.8])}  # unweighed: scored once the next token is known
        got = _row(model)
        assert got[6] == (pytest.approx(max(model_probs[1], want[1])), BOTH)
        assert got[7] == (pytest.approx(want[0]), LOOKUP)


def test_merged_draft_learns_from_the_token_that_came_next(synth):
    """A round's root row holds lookup-only children; once the text holds the token after the root, the next
    catch-up scores them: a token none of them was is a miss in their bands (expected hits grow, hits do not)."""
    text = synth.tokenize("a b c d a b c e a b c f a b c g a b c")
    merged = MergedDraft(DraftModelEngine(synth, ONE_THREAD, 3, 4), 3, LookupDraft(max_branches=3))
    merged.catch_up(np.asarray(text), None)
    only_tokens, only_probs = merged._only[ROOT]
    other = next(t for t in range(5, 100) if t not in only_tokens)
    hits, expected = list(merged.odds.hits), list(merged.odds.expected)
    merged.commit(np.array([], dtype=np.int64))
    merged.catch_up(np.asarray(text + [other]), None)
    for p in only_probs:
        b = merged.odds.band(p)
        expected[b] += p * p
    assert merged.odds.hits == hits and merged.odds.expected == pytest.approx(expected)


def _weigh_then_merge(model: Proposals, rows, odds: list[float], band) -> tuple[Proposals, dict]:
    """The merge written out in two steps, a dictionary per row: weigh each lookup entry beside the model's row,
    then take the union (a shared token keeps the higher log-probability and is BOTH) and rank it (stable)."""
    tokens, log_probs, sources, only = [], [], [], {}
    mass = np.exp(np.array(model.log_probs)).sum(axis=1).tolist()
    for r, (toks, lps, srcs) in enumerate(zip(model.tokens, model.log_probs, model.sources)):
        entries = {t: [lp, s] for t, lp, s in zip(toks, lps, srcs)}
        room = max(1.0 - mass[r], 0.0)
        for tok, p in zip(*(row[r] for row in rows)):
            mine = dict(zip(toks, lps)).get(tok)
            if mine is None:
                only.setdefault(r, ([], []))
                only[r][0].append(tok)
                only[r][1].append(p)
                w = max(min(p * min(1.0, p * odds[band(p)]), room), MIN_PROB)
            else:
                w = min(p, room + math.exp(mine))
            if w <= 0.0:
                continue
            if tok in entries:
                entries[tok] = [max(entries[tok][0], math.log(w)), BOTH]
            else:
                entries[tok] = [math.log(w), LOOKUP]
        order = sorted(entries, key=lambda t: -entries[t][0])  # stable: the model's columns, then the new tokens
        tokens.append(order)
        log_probs.append([entries[t][0] for t in order])
        sources.append([entries[t][1] for t in order])
    return Proposals(tokens, log_probs, sources), only


def test_the_merge_is_weighing_then_merging(synth):
    """The merged draft's one pass (``weigh_into``) against the two steps written out: shared tokens, confident and
    unsure rows, lookup rows holding a probability of 0, empty rows, learned odds, ties; the same rows bit for bit
    and the same lookup-only children kept."""
    rng = np.random.default_rng(23)
    merged = MergedDraft(DraftModelEngine(synth, ONE_THREAD, 2, 4), 2, LookupDraft(max_branches=4))
    for _ in range(20):
        merged.odds.observe([7], [float(rng.uniform(0.05, 1.0))], next_token=int(rng.integers(6, 9)))
    odds, band = merged.odds.factors(), merged.odds.band
    n_checked = 0
    for n_rows, km in [(1, 3), (10, 10), (6, 4), (4, 1)]:
        for trial in range(60):
            tokens = np.stack([rng.permutation(16)[:km] for _ in range(n_rows)])
            lp = np.log(rng.dirichlet(np.full(km + 1, 0.3 if trial % 3 else 3.0), n_rows)[:, :km] + 1e-9)
            lp = -np.sort(-lp, axis=1)
            if trial % 5 == 0:
                lp[:, 1:] = lp[:, :1]  # ties
            rows = ([], [])
            for _ in range(n_rows):
                n = int(rng.integers(0, 5))
                row = rng.permutation(16)[:n].tolist()  # model tokens now and then
                probs = rng.uniform(0.0, 1.0, n)
                probs[rng.random(n) < 0.15] = 0.0
                rows[0].append(row)
                rows[1].append(probs.tolist())
            model = Proposals.from_arrays(tokens, lp)
            want, want_only = _weigh_then_merge(Proposals.from_arrays(tokens, lp), rows, odds, band)
            only = weigh_into(model, rows, odds, band)
            assert (model.tokens, model.log_probs, model.sources) == (want.tokens, want.log_probs, want.sources)
            assert only == want_only
            n_checked += sum(map(len, model.tokens)) > tokens.size
    assert n_checked > 100, "few rows took lookup entries: the merge was hardly tested"
