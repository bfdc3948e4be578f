"""Lookup drafts: the n-gram index, its proposals as tree branches, merging with a model draft, and losslessness
(greedy bit-identical, sampling by chi-square) with lookup branches in the verified trees."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import eagle2_local.generation.generator as generator_mod
from eagle2_local.api import Eagle2
from eagle2_local.decoding.target import Target
from eagle2_local.drafts import DraftModelEngine, LookupDraft, MergedDraft, NgramIndex
from eagle2_local.drafts.ngram import COPY, PROMPT, REPEAT, SURE_RATE, MatchConfidence
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.tree.draft_tree import TreeParams, grow_candidates
from eagle2_local.tree.proposals import BOTH, LOOKUP, MODEL, merge_row
from eagle2_local.tree.sampling import SamplingParams
from eagle2_local.tree_policy import FixedTree, RoundPlan
from tests.support.helpers import (N_RUNS, ONE_THREAD, assert_lossless, chi2_pvalue, make, over_accepting,
                                   random_prompts, run)


def rebuilt(tokens: list[int], max_n: int = 4) -> NgramIndex:
    index = NgramIndex(max_n)
    index.extend(tokens)
    return index


def test_truncate_undoes_extend_exactly():
    rng = np.random.default_rng(0)
    text = rng.integers(0, 6, 300).tolist()  # a small alphabet: many repeated n-grams
    index = rebuilt(text)
    for cut in (290, 151, 150, 3, 0):
        index.truncate(cut)
        assert index.table() == rebuilt(text[:cut]).table()
    index.extend(text)
    assert index.table() == rebuilt(text).table()


class UncachedIndex(NgramIndex):
    """An index that ranks every followers list afresh at every use and searches the text's end afresh from
    the longest n-gram: the reference for the cached rankings and the bounded, cached tail match."""

    def ranked(self, match: tuple[int, int]) -> list[tuple[int, int]]:
        return self._ranked(match)

    def tail_match(self) -> tuple[int, int] | None:
        return self.longest_match(self.text)


def test_rankings_kept_across_extends_equal_uncached_ones():
    """Rankings stay cached across extends except for the followers lists a new token joins, and the text's end
    is searched from the previous end's match length + 1: an index queried between small extends and truncates
    (caches warm) proposes and learns exactly what an index that never caches does."""
    rng = np.random.default_rng(8)
    text = rng.integers(0, 5, 400).tolist()
    index, reference = NgramIndex(max_n=4), UncachedIndex(max_n=4)
    at = 0
    while at < len(text):
        step = int(rng.integers(0, 4))  # 0: an empty extend, as a catch-up right after next_rate makes
        for ix in (index, reference):
            ix.extend(text[at:at + step])
        at += step
        if at > 20 and rng.random() < 0.1:
            at -= int(rng.integers(1, 6))
            for ix in (index, reference):
                ix.truncate(at)
        for cut in range(1, 6):
            context = text[max(at - cut, 0):at] + [int(rng.integers(0, 5))]
            assert index.continuations(context, 3) == reference.continuations(context, 3)
        assert index.continuations(index.text, 3) == reference.continuations(reference.text, 3)
        if rng.random() < 0.5:  # the tail's match asked for between extends, or found by the next one
            assert index.proposed(index.tail_match(), 3) == reference.continuations(reference.text, 3)
    assert np.array_equal(index.confidence.hits, reference.confidence.hits)
    assert np.array_equal(index.confidence.trials, reference.confidence.trials)


def test_prompt_indexed_at_once_equals_token_by_token():
    """Unscored text (a prompt once an answer is due, a renamed copy) is indexed n by n in one pass: the same
    followers lists, rankings, tail matches and learned rates afterwards as indexing it token by token."""
    rng = np.random.default_rng(3)
    text = rng.integers(0, 6, 500).tolist()
    for prompt_len in (0, 1, 2, 3, 150, 400):
        bulk, single = NgramIndex(max_n=5), UncachedIndex(max_n=5)
        for ix in (bulk, single):
            ix.answer_from = prompt_len
        bulk.extend(text[:prompt_len + 40])  # the prompt at once, then the answer's first tokens, scored
        for tok in text[:prompt_len + 40]:
            single.extend([tok])
        assert bulk.text == single.text and bulk.table() == single.table()
        for at in range(prompt_len + 40, prompt_len + 100, 3):
            for ix in (bulk, single):
                ix.extend(text[at:at + 3])
            assert bulk.continuations(bulk.text, 3) == single.continuations(single.text, 3)
        assert np.array_equal(bulk.confidence.hits, single.confidence.hits)
        assert np.array_equal(bulk.confidence.trials, single.confidence.trials)
    renamed = NgramIndex(max_n=4)
    renamed.extend(text[:300], score=False)
    assert renamed.table() == rebuilt(text[:300]).table()
    assert np.array_equal(renamed.confidence.trials, NgramIndex(max_n=4).confidence.trials)  # learned nothing


def test_the_index_holds_nothing_the_garbage_collector_tracks():
    """A long prompt's index holds ~max_n entries per token: as lists they were scanned at every full collection
    (and brought them sooner); its chains are numbers in max_n arrays and a dictionary, whose keys are tuples of
    numbers, which a collection stops tracking."""
    import gc

    index = NgramIndex(max_n=8)
    index.extend(np.random.default_rng(1).integers(0, 50, 2000).tolist())
    gc.collect()
    tracked = [v for v in index._last.values() if gc.is_tracked(v)] + [k for k in index._last if gc.is_tracked(k)]
    assert not tracked and len(index._prev) == 8


def test_longest_match_proposes_what_followed_it():
    index = rebuilt([5, 1, 2, 3, 9, 1, 2, 3, 7, 0, 2, 3])
    toks, probs = index.continuations([0, 2, 3], 4)
    assert toks == [7, 9]  # "2 3" was followed by 9, then by 7 (ties: the most recent first)
    toks, probs = index.continuations([1, 2, 3], 4)
    assert toks[0] in (9, 7) and len(toks) == 2 and np.isclose(probs[0], probs[1])
    toks, _ = index.continuations([4, 4], 4)
    assert len(toks) == 0  # 4 never occurred


def test_several_continuations_rank_by_count_then_recency():
    index = rebuilt([8, 1, 8, 2, 8, 1, 8, 3, 8])
    toks, probs = index.continuations([8], 4)
    assert toks == [1, 3, 2]  # 1 twice; 3 more recent than 2
    assert probs[0] > probs[1] == probs[2] and sum(probs) <= 1.0 + 1e-12


def test_confidence_learns_from_the_text():
    copying = rebuilt(list(range(20)) * 6, max_n=4)  # the same span again and again: long matches are right
    noisy = rebuilt(np.random.default_rng(1).integers(0, 3, 120).tolist(), max_n=4)  # matches say nothing
    assert copying.confidence.rate(4) > 0.9
    assert noisy.confidence.rate(4) < 0.6


def test_confidence_tells_copying_the_prompt_from_repeating_the_answer():
    """Rates are learned per match length and per kind of match: an answer copying its prompt teaches the
    COPY rates only (not the prompt's own, nor the answer repeating itself); before any evidence a long match of
    the prompt is sure (a new answer that copies drafts a chain from its first rounds), a two-token one a coin flip
    (a model's answer rephrases its question's words about half the time), a one-token match in the prompt's own
    text unsure."""
    fresh = MatchConfidence(8)
    assert fresh.rate(2, COPY) < 0.6 and fresh.rate(5, COPY) > SURE_RATE and fresh.rate(8, COPY) > 0.9
    assert fresh.rate(8, REPEAT) > 0.8 and fresh.rate(1, PROMPT) < 0.2
    assert fresh.rate(2, COPY) > fresh.rate(2, REPEAT) > fresh.rate(2, PROMPT)
    prompt = np.random.default_rng(2).integers(0, 50, 60).tolist()
    engine = LookupDraft(max_branches=4, max_n=4)
    engine.catch_up(np.array(prompt))
    engine.begin_answer(len(prompt))
    conf = engine.index.confidence
    before = conf.trials.copy()
    engine.catch_up(np.array(prompt + prompt[10:40]))  # the answer copies a span of the prompt
    assert conf.rate(4, COPY) > 0.95 and (conf.trials[COPY] > before[COPY]).any()
    assert (conf.trials[[PROMPT, REPEAT]] == before[[PROMPT, REPEAT]]).all()
    toks, probs = engine.index.continuations(prompt + prompt[10:40], 4)
    assert toks[0] == prompt[40] and probs[0] == pytest.approx(conf.rate(4, COPY))
    engine.catch_up(np.array(prompt + prompt[10:40] + prompt[10:20]))  # now it repeats its own answer
    match = engine.index.longest_match(engine.index.text)
    assert engine.index.kind(len(engine.index.text), match) == REPEAT


def test_a_new_answer_keeps_the_learned_rates_at_the_priors_weight():
    """Rates learned in one answer carry into the next at no more than the prior's weight: a summary that quotes
    8 tokens of its passage and then paraphrases, after an answer that copied its prompt exactly, finds its own
    rate for such matches within a few of its misses (where the copying answer's full count would still call
    them sure, and the budget would keep drafting 16-node chains on them); an answer that copies again starts
    from the high rate."""
    rng = np.random.default_rng(4)
    prompt, passage = rng.integers(0, 5000, 300).tolist(), rng.integers(0, 5000, 300).tolist()
    answer = []
    for quote in (30, 90, 150, 210):  # four quotes of 8 tokens, each followed by a word of the answer's own
        answer += passage[quote:quote + 8] + [6000 + quote]

    def copy_then_paraphrase(weigh_as_prior: bool) -> MatchConfidence:
        engine = LookupDraft(max_branches=4, max_n=8)
        engine.catch_up(np.array(prompt))
        engine.begin_answer(len(prompt))
        engine.catch_up(np.array(prompt + prompt[20:280]))  # the answer copies its prompt exactly
        conf = engine.index.confidence
        assert conf.rate(8, COPY) > 0.97 and conf.trials[COPY, 8] > 40
        learned = conf.rate(8, COPY)
        engine.rollback(0)
        engine.catch_up(np.array(passage))
        if not weigh_as_prior:  # the copying answer's full count carried over, as before
            conf.begin_answer = lambda: None
        engine.begin_answer(len(passage))
        assert conf.rate(8, COPY) == pytest.approx(learned)
        assert (conf.trials[COPY, 8] == conf.weight[8]) == weigh_as_prior
        engine.catch_up(np.array(passage + answer))
        return conf

    assert copy_then_paraphrase(True).learned_rate(8, COPY) < 0.7
    assert copy_then_paraphrase(False).learned_rate(8, COPY) > 0.85  # the same misses against the full count


def test_an_answer_that_misses_its_sure_matches_values_them_less_until_it_copies_again():
    """The answer's own record at sure matches: a summary after a copying answer quotes its passage three to
    eight tokens at a time and then goes its own way, each miss in another cell, where every sure match promised
    a hit; one pooled count scales all its answer rates down, in the cells it has not reached yet too (the
    prompt's own rates are not the answer's), and chains are valued by it. A copy that resumes wins the record
    back, never past the learned rates, and the next answer starts afresh."""
    rng = np.random.default_rng(5)
    prompt, passage = rng.integers(0, 5000, 300).tolist(), rng.integers(0, 5000, 400).tolist()
    engine = LookupDraft(max_branches=4, max_n=8)
    engine.catch_up(np.array(prompt))
    engine.begin_answer(len(prompt))
    engine.catch_up(np.array(prompt + prompt[20:280]))  # an answer that copies its prompt exactly
    conf = engine.index.confidence
    assert conf.answer_factor == 1.0 and conf.rate(8, COPY) == conf.learned_rate(8, COPY)
    engine.rollback(0)
    engine.catch_up(np.array(passage))
    engine.begin_answer(len(passage))
    paraphrase = []
    for quote, length in zip(range(10, 330, 40), (3, 6, 4, 7, 5, 8, 3, 6)):  # each quote then a word of its own
        paraphrase += passage[quote:quote + length] + [6000 + quote]
    engine.catch_up(np.array(passage + paraphrase))
    assert conf.answer_factor < 0.9
    for kind in (COPY, REPEAT):
        assert conf.rate(8, kind) == pytest.approx(conf.learned_rate(8, kind) * conf.answer_factor)
    assert conf.rate(8, PROMPT) == conf.learned_rate(8, PROMPT)
    text = passage + paraphrase + passage[350:353]
    toks, probs = engine.index.proposed(engine.index.longest_match(text), 1)
    assert toks == [passage[353]] and probs[0] == pytest.approx(conf.rate(3, COPY))  # what a chain is valued by
    engine.catch_up(np.array(passage + paraphrase + passage[350:400]))  # the copy resumes
    assert 0.97 < conf.answer_factor <= 1.0
    engine.rollback(len(passage))
    engine.begin_answer(len(passage))
    assert conf.answer_factor == 1.0


def test_next_rate_is_the_rate_of_the_roots_match_before_any_draft():
    """The evidence a round's plan hears: the rate of the longest match at the end of the text (root
    included), 0.0 without one; the tail it indexes is the one the round's catch-up would, so that catch-up
    finds nothing new to index and proposes what the rate promised."""
    prompt = np.random.default_rng(3).integers(0, 50, 60).tolist()
    engine = LookupDraft(max_branches=4, max_n=4)
    engine.catch_up(np.array(prompt))
    engine.begin_answer(len(prompt))
    assert engine.next_rate(prompt + [99]) == 0.0  # a token never seen: no match
    text = prompt + [99] + prompt[10:20]  # the answer copies a span of the prompt
    rate = engine.next_rate(text)
    assert len(engine.index) == len(text)
    assert rate == pytest.approx(engine.index.confidence.rate(4, COPY))
    assert rate > SURE_RATE  # ten copied tokens made the copy sure
    out = engine.catch_up(np.array(text))
    assert len(engine.index) == len(text) and out.tokens[0][0] == prompt[20]
    assert np.exp(out.log_probs[0][0]) == pytest.approx(rate)
    # under a grammar that forbids the token the text suggests, that token is no evidence
    assert engine.next_rate(text, allowed=lambda token: token != prompt[20]) == 0.0
    assert engine.next_rate(text, allowed=lambda token: True) == rate


def test_lookup_draft_grows_the_copied_span_as_a_chain():
    text = [3, 10, 11, 12, 13, 14, 15, 16, 4, 10, 11]
    engine = LookupDraft(max_branches=4)
    root_out = engine.catch_up(np.array(text))
    c = grow_candidates(root_out, engine.expand, TreeParams(16, 6, 4))
    assert c.tokens.tolist()[:6] == [12, 13, 14, 15, 16, 4]  # the span after "10 11", then what followed it
    assert (c.parents[1:6] == np.arange(0, 5)).all() and (c.sources == LOOKUP).all()


def test_merge_keeps_one_child_per_token_with_the_higher_probability():
    tokens, log_probs, sources = [5, 6, 7], np.log([0.5, 0.3, 0.1]).tolist(), [MODEL] * 3
    merge_row(tokens, log_probs, sources, [(6, math.log(0.8), LOOKUP), (9, math.log(0.1), LOOKUP)])
    probs = dict(zip(tokens, np.exp(log_probs).tolist()))
    sources = dict(zip(tokens, sources))
    assert tokens == [6, 5, 7, 9]  # best first, the tie in merge order
    assert probs == pytest.approx({5: 0.5, 6: 0.8, 7: 0.1, 9: 0.1})
    assert sources == {5: MODEL, 6: BOTH, 7: MODEL, 9: LOOKUP}


def test_rollback_forgets_text_for_the_next_prompt():
    engine = LookupDraft()
    engine.catch_up(np.array([1, 2, 3, 1, 2, 3, 1]))
    engine.rollback(3)
    assert engine.n_read == 3
    out = engine.catch_up(np.array([1, 2, 3, 9, 1, 2]))
    assert out.tokens[0] == [3]


# ------------------------------------------------------------------ losslessness on llama.cpp
def lookup_gen(model: LlamaModel, draft: LlamaModel | None, params: TreeParams) -> Generator:
    """A generator whose trees come from lookups alone (no ``draft``) or merged with ``draft``'s."""
    lookup = LookupDraft(max_branches=params.top_k)
    engine = lookup if draft is None else MergedDraft(
        DraftModelEngine(draft, ONE_THREAD, params.top_k, params.depth), params.top_k, lookup)
    return Generator(Target(model, ONE_THREAD), engine, params)


@pytest.mark.parametrize("draft_kind", ["lookup", "weak+lookup"])
def test_lossless_greedy_with_lookup_branches_bit_identical(synth_q8, synth_q8_weak, draft_kind):
    model = LlamaModel(synth_q8)
    draft = LlamaModel(synth_q8_weak) if draft_kind == "weak+lookup" else None
    plain = make(model, None)
    spec = lookup_gen(model, draft, TreeParams(24, 8, 4))
    accepted_lookup = 0
    for i, prompt in enumerate(random_prompts(model, 20, seed=3)):
        assert_lossless(plain, spec, prompt, 96, i)
        accepted_lookup += spec.last_stats.accepted_by_source.get("lookup", 0)
    assert accepted_lookup > 40, "lookup branches were hardly ever accepted: the test would not see a bug"


def looping_prompt(model: LlamaModel) -> list[int]:
    """A prompt ending in the target's own greedy text: a random model falls into a loop, so the text repeats
    what the target is likely to sample next and lookups propose it."""
    start = [1, 40, 41]
    greedy, _, _ = run(make(model, None), start, 60)
    return start + greedy


def sampled_counts(gen: Generator, prompt: list[int],
                   sampling: SamplingParams) -> tuple[dict[int, dict[int, int]], int, int]:
    """Tokens at positions 1 and 2 (-1: the generation had ended) over ``N_RUNS`` seeded runs, and how many
    lookup-proposed nodes were verified and accepted."""
    counts: dict[int, dict[int, int]] = {1: {}, 2: {}}
    nodes = accepted = 0
    for seed in range(N_RUNS):
        toks, _, _ = run(gen, prompt, 4, sampling, seed=seed)  # 4: a tree may still reach position 2
        for p in counts:
            tok = toks[p] if p < len(toks) else -1
            counts[p][tok] = counts[p].get(tok, 0) + 1
        stats = gen.last_stats
        nodes += stats.nodes_by_source.get("lookup", 0) + stats.nodes_by_source.get("both", 0)
        accepted += stats.accepted_by_source.get("lookup", 0) + stats.accepted_by_source.get("both", 0)
    return counts, nodes, accepted


def test_trees_end_where_the_answer_ends(synth_q8):
    """Near ``max_tokens`` a tree is no deeper than the answer can still take (a path of depth d emits d + 1
    tokens): the sure chains of a looping text would otherwise be verified past the end for nothing."""
    model = LlamaModel(synth_q8)
    prompt = looping_prompt(model)
    gen = lookup_gen(model, None, TreeParams(12, 6, 3))
    toks, _, reason = run(gen, prompt, 4)
    stats = gen.last_stats
    assert reason == "length" and len(toks) == 4 and stats.nodes_by_source.get("lookup", 0) > 0
    assert stats.pass_tokens == 3  # the prefill gave the first token; no pass produced one past the fourth
    assert run(gen, prompt, 40)[0][:4] == toks


@pytest.mark.parametrize("draft_kind", ["lookup", "self+lookup"])
def test_sampling_with_lookup_branches_matches_plain(synth_q8, draft_kind):
    """Tree rejection sampling treats a lookup child like any other: plain and speculative sampling agree."""
    model = LlamaModel(synth_q8)
    sampling = SamplingParams(temperature=1.0)
    prompt = looping_prompt(model)
    plain, _, _ = sampled_counts(make(model, None), prompt, sampling)
    spec = lookup_gen(model, model if draft_kind == "self+lookup" else None, TreeParams(12, 4, 3))
    counts, nodes, accepted = sampled_counts(spec, prompt, sampling)
    assert nodes >= N_RUNS and accepted > N_RUNS // 4, (nodes, accepted)  # lookup branches were really in the trees
    for p in (1, 2):
        pvalue = chi2_pvalue(plain[p], counts[p])
        assert pvalue > 0.01, f"position {p}: speculative with lookup branches differs from plain (p={pvalue:.2e})"


def test_chi_square_catches_biased_acceptance_of_lookup_branches(synth_q8, monkeypatch):
    """The test above can fail: accepting lookup children twice as often as their target probability shows."""
    model = LlamaModel(synth_q8)
    sampling = SamplingParams(temperature=1.0)
    prompt = looping_prompt(model)
    plain, _, _ = sampled_counts(make(model, None), prompt, sampling)
    monkeypatch.setattr(generator_mod, "accept", over_accepting)
    biased, _, _ = sampled_counts(lookup_gen(model, None, TreeParams(12, 4, 3)), prompt, sampling)
    assert chi2_pvalue(plain[1], biased[1]) < 1e-4


class Alternating(FixedTree):
    """A fixed tree whose model draft sits out every other drafted round (lookup branches only)."""

    def __init__(self, max_nodes: int) -> None:
        super().__init__(max_nodes)
        self.asked = 0

    def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
        self.asked += 1
        return replace(super().plan(fresh_tokens), free_only=self.asked % 2 == 1)


def test_model_draft_sitting_out_rounds_stays_lossless(synth_q8, synth_q8_weak):
    """Lookup-only rounds leave the model draft behind; it catches up on their tokens in its next round."""
    model, weak = LlamaModel(synth_q8), LlamaModel(synth_q8_weak)
    plain = make(model, None)
    spec = lookup_gen(model, weak, TreeParams(16, 6, 4))
    spec.policy = Alternating(16)
    for i, prompt in enumerate(random_prompts(model, 10, seed=5)):
        assert_lossless(plain, spec, prompt, 96, i)
    assert spec.policy.asked > 40


@pytest.mark.smollm2
def test_head_catches_up_after_lookup_only_rounds_on_smollm2(smollm2_path):
    """The EAGLE-3 head reads target features: after lookup-only rounds it must get those rounds' features
    from the backlog. Alternating rounds, one thread: bit-identical to plain, and both kinds of rounds ran."""
    prompt = "Repeat exactly, three times: the quick brown fox jumps over the lazy dog."
    outs = {}
    for name, kw in (("plain", dict(plain=True)), ("alternating", dict(lookup=True))):
        with Eagle2(n_threads=1, total_tokens=16, **kw) as llm:
            if name == "alternating":
                llm.generator.policy = Alternating(16)
            outs[name] = list(llm.generate(llm.chat_tokens([{"role": "user", "content": prompt}]), temp=0.0,
                                           top_k=0, top_p=1.0, min_p=0.0, max_tokens=64))
            stats = llm.stats()
    assert outs["alternating"] == outs["plain"]
    assert stats["accepted_by_source"].get("model", 0) + stats["accepted_by_source"].get("both", 0) > 0
    assert stats["accepted_by_source"].get("lookup", 0) > 0


@pytest.mark.smollm2
def test_shipped_head_with_lookup_is_lossless_on_smollm2(smollm2_path):
    """The default model: lookup alone and merged with the shipped head, bit-identical to plain (one thread)."""
    prompts = ["Repeat exactly, three times: the quick brown fox jumps over the lazy dog.",
               "Rewrite this with type hints:\ndef add(a, b):\n    total = a + b\n    return total\n",
               "List the numbers from 1 to 30, separated by commas."]
    outs = {}
    for name, kw in (("plain", dict(plain=True)), ("lookup", dict(draft="lookup")), ("head+lookup", dict(lookup=True))):
        with Eagle2(n_threads=1, total_tokens=24, **kw) as llm:
            outs[name] = []
            for text in prompts:
                llm.reset()
                toks = list(llm.generate(llm.chat_tokens([{"role": "user", "content": text}]), temp=0.0,
                                         top_k=0, top_p=1.0, min_p=0.0, max_tokens=32))
                outs[name].append((toks, llm.stats()["accepted_by_source"]))
    for name in ("lookup", "head+lookup"):
        assert [t for t, _ in outs[name]] == [t for t, _ in outs["plain"]], name
    assert sum(s.get("lookup", 0) + s.get("both", 0) for _, s in outs["head+lookup"]) > 0
    assert sum(s.get("lookup", 0) for _, s in outs["lookup"]) > 10


def test_cli_lookup_draft_reports_its_sources(synth_q8):
    """`generate --draft lookup` on any GGUF: no model draft, deeper default trees, accepted tokens by source."""
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "cli", "generate", "--model", str(synth_q8), "--draft", "lookup",
                          "--threads", "1", "--total-tokens", "16", "--temperature", "0", "-n", "96", "--json",
                          "-p", "a b c a b c a b c"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["engine"] == "lookup" and set(stats["accepted_by_source"]) <= {"lookup"}
    assert stats["accepted_by_source"].get("lookup", 0) > 0 and stats["tau"] > 1.0
    assert len(stats["accepted_per_depth"]) > 6  # chains deeper than a model draft's default 6 levels


def test_lookup_tree_levels_equal_unbounded_lookups():
    """Each node's lookup starts at its parent's match length + 1 (and rankings are cached per round): the
    proposals equal a full search of every node's own context, over trees grown on repetitive text."""
    rng = np.random.default_rng(5)
    n_rows = 0
    for _ in range(60):
        text = np.tile(rng.integers(0, 5, 30), 4)  # a repeated span, with some tokens changed
        text = np.where(rng.random(len(text)) < 0.15, rng.integers(0, 5, len(text)), text).tolist()
        engine = LookupDraft(max_branches=4)
        rows = [engine.catch_up(np.array(text))]
        contexts = [list(text)]
        params = TreeParams(total_tokens=40, depth=5, top_k=4)

        def expand(cand_ids, tokens, parent_ids, level):
            for cand, tok, parent in zip(cand_ids, tokens, parent_ids):
                contexts_of[cand] = (contexts_of[parent] if parent >= 0 else text) + [tok]
            out = engine.expand(cand_ids, tokens, parent_ids, level)
            rows.append(out)
            contexts.extend(contexts_of[c] for c in cand_ids)
            return out

        contexts_of: dict[int, list[int]] = {}
        grow_candidates(rows[0], expand, params)
        reference = NgramIndex(engine.index.max_n)
        reference.extend(text)
        got_tokens = [row for r in rows for row in r.tokens]
        got_lp = [row for r in rows for row in r.log_probs]
        assert len(contexts) == len(got_tokens)
        n_rows += len(contexts)
        for context, toks_row, lp_row in zip(contexts, got_tokens, got_lp):
            toks, probs = reference.continuations(context, 4)
            assert toks_row == toks
            assert lp_row == [math.log(p) for p in probs]  # the lookup takes math.log
            assert lp_row == sorted(lp_row, reverse=True)  # best first, as every draft's rows are
    assert n_rows > 300, "the trees hardly grew: the test would not see a wrong bound"
