"""Drafts from earlier answers (drafts/history.py): the index (longest matches with counts, bounded memory,
eviction), its file (round trip, atomic replace, refusals in one line), and losslessness with history nodes in
the trees (greedy bit-identical on SmolLM2, sampling by chi-square on the synthetic model)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

from eagle2_local.api import Eagle2
from eagle2_local.decoding.target import Target
from eagle2_local.drafts import LookupDraft
from eagle2_local.drafts.history import ANCHOR, MAGIC, HistoryIndex, load, save, vocab_fingerprint
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.tree.draft_tree import TreeParams
from eagle2_local.tree.sampling import SamplingParams
from tests.support.helpers import N_RUNS, ONE_THREAD, chi2_pvalue, make, run

VOCAB = "v1"


def test_longest_match_among_answers_with_counts():
    h = HistoryIndex()
    h.add([10, 11, 12, 13, 14], prompt=[1, 2, 3])
    h.add([10, 11, 12, 20], prompt=[1, 2, 3])
    h.add([9, 11, 12, 13], prompt=[5])
    toks, probs = h.continuations([7, 1, 2, 3, 10, 11, 12], 5)
    assert h.last_match == 6 and toks == [20, 13]  # the two records matched on 6 tokens; the newest first on a tie
    assert probs[0] == probs[1] > 0
    assert h.continuations([8, 11, 12], 5)[0] == [] and h.last_match == 0  # 2 tokens: below the anchor
    assert ANCHOR == 3
    toks, probs = h.continuations([10, 11, 12, 13], 5)
    assert toks == [14] and h.last_match == 4
    assert h.continuations([11, 12, 13], 5)[0] == [14]  # 3 tokens: 13 followed by 14 once, the separator never
    assert h.answers() == [([1, 2, 3], [10, 11, 12, 13, 14]), ([1, 2, 3], [10, 11, 12, 20]), ([5], [9, 11, 12, 13])]


def test_counts_rank_continuations_and_scale_probabilities():
    h = HistoryIndex()
    for nxt in (5, 5, 5, 6):
        h.add([1, 2, 3, 4, nxt])
    toks, probs = h.continuations([1, 2, 3, 4], 5)
    assert toks == [5, 6] and probs[1] == pytest.approx(probs[0] / 3)


def test_evicts_the_oldest_by_records_and_by_tokens():
    h = HistoryIndex(max_tokens=10_000, max_answers=3)
    for i in range(5):
        h.add([100 + i, 1, 2, 3, 200 + i])
    assert len(h) == 3 and [a[0] for _, a in h.answers()] == [102, 103, 104]
    assert h.continuations([100, 1, 2, 3], 5)[0] == [204, 203, 202]  # evicted answers propose nothing
    h = HistoryIndex(max_tokens=50, max_answers=1000)
    for i in range(40):
        h.add([i] * 9)
        assert h.n_tokens <= 50 and len(h.text) <= 2 * 50 + 10  # compacted when half is dead
    assert [a[0] for _, a in h.answers()] == [35, 36, 37, 38, 39]
    assert h.continuations([36, 36, 36], 5)[0] == [36]
    assert h.continuations([30, 30, 30], 5)[0] == []


def test_memory_stays_bounded():
    rng = np.random.default_rng(0)
    h = HistoryIndex(max_tokens=20_000, max_answers=10_000)
    batches = [rng.integers(0, 5000, (100, 200)).tolist() for _ in range(4)]
    tracemalloc.start()
    sizes = []
    for batch in batches:
        for answer in batch:
            h.add(answer)
        sizes.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    assert h.n_tokens <= 20_000
    assert sizes[-1] < 1.6 * sizes[0], sizes  # 4x the cap added, memory stays near one cap's


def test_held_adds_the_first_runs_answers_after_the_block():
    h = HistoryIndex()
    with h.held(keep=1):
        h.add([1, 2, 3, 4])
        h.add([1, 2, 3, 5])
        assert len(h) == 0
    assert h.answers() == [([], [1, 2, 3, 4])]


# ---------------------------------------------------------------------- files
def filled() -> HistoryIndex:
    h = HistoryIndex()
    h.add([10, 11, 12, 13, 14], prompt=[1, 2, 3])
    h.add([300_000, 11, 12], prompt=[])
    return h


def test_file_round_trip(tmp_path):
    path = tmp_path / "h.bin"
    save(filled(), path, VOCAB)
    h = HistoryIndex()
    assert load(h, path, VOCAB)
    assert h.answers() == filled().answers()
    assert load(HistoryIndex(), tmp_path / "missing.bin", VOCAB) is False


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "other vocab", "other version"])
def test_bad_files_are_refused_in_one_line(tmp_path, caplog, damage):
    path = tmp_path / "h.bin"
    save(filled(), path, VOCAB)
    data = path.read_bytes()
    vocab = VOCAB
    if damage == "garbage":
        data = b"\x00\x01 not a history"
    elif damage == "truncated":
        data = data[:-3]
    elif damage == "flipped":
        data = data[:-1] + bytes([data[-1] ^ 1])
    elif damage == "other vocab":
        vocab = "v2"
    else:
        data = data.replace(b'"version": 1', b'"version": 9')
    path.write_bytes(data)
    h = HistoryIndex()
    with caplog.at_level(logging.WARNING):
        assert load(h, path, vocab) is False
    assert len(h) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0] and "refused" in lines[0], lines


def test_a_kill_during_a_write_leaves_the_old_file(tmp_path):
    """A writer killed halfway through its write (SIGKILL, no cleanup) leaves the old file whole and readable."""
    path = tmp_path / "h.bin"
    save(filled(), path, VOCAB)
    before = path.read_bytes()
    child = textwrap.dedent(f"""
        import os, signal
        import eagle2_local.drafts.history as history
        real_open = open
        class Dying:
            def __init__(self, f): self.f = f
            def __enter__(self): return self
            def __exit__(self, *a): self.f.close()
            def write(self, data):
                self.f.write(data[:len(data) // 2]); self.f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        history.open = lambda p, mode: Dying(real_open(p, mode))
        h = history.HistoryIndex()
        for i in range(100):
            h.add(list(range(i, i + 50)))
        history.save(h, {str(path)!r}, {VOCAB!r})
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    assert path.read_bytes() == before
    h = HistoryIndex()
    assert load(h, path, VOCAB) and h.answers() == filled().answers()
    assert path.read_bytes().startswith(MAGIC)  # the part file the child left does not matter: a save replaces it
    save(h, path, VOCAB)
    assert load(HistoryIndex(), path, VOCAB)


# ---------------------------------------------------------------------- with models
@pytest.mark.smollm2
def test_greedy_with_history_is_plain_and_drafts_from_the_first_answer(smollm2_path):
    """SmolLM2, one thread, lookups with history: every answer bit-identical to plain; the same request asked
    a second time drafts from the first answer (history tokens accepted, τ higher). A fixed tree: the auto
    budget's choices depend on the machine's load, which would make the counts vary."""
    prompts = ["Write a short poem about the sea, in four lines.",
               "Explain in two sentences what a compiler does."]
    kw = dict(temp=0.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=48)
    with Eagle2(n_threads=1, plain=True) as llm:
        chats = [llm.chat_tokens([{"role": "user", "content": p}]) for p in prompts]
        plain = [list(llm.generate(t, **kw)) for t in chats]
    with Eagle2(n_threads=1, draft="lookup", history=True, total_tokens=24) as llm:  # fixed trees: no timing
        taus, accepted = [], []
        for ask in range(2):
            for t, ref in zip(chats, plain):
                llm.reset()
                assert list(llm.generate(t, **kw)) == ref
                taus.append(llm.stats()["tau"])
                accepted.append(llm.history.accepted)
        assert len(llm.history) == 4
    assert accepted[1] == 0 < accepted[3]  # no history tokens while the history held no such answer
    assert taus[2] > taus[0] and taus[3] > taus[1], taus


def test_sampling_with_history_nodes_keeps_the_distribution(synth_q8):
    """T=1 with a history of the target's own sampled answers to the same prompt: history nodes are verified and
    accepted, and the tokens at positions 1 and 2 are distributed as plain sampling's (chi-square)."""
    model = LlamaModel(synth_q8)
    sampling = SamplingParams(temperature=1.0)
    prompt = [1, 40, 41, 42, 43]
    plain_gen = make(model, None)
    history = HistoryIndex()
    for seed in range(200):
        toks, _, _ = run(plain_gen, prompt, 8, sampling, seed=seed + 10_000)
        history.add(toks, prompt)
    lookup = LookupDraft(max_branches=3)
    lookup.use_history(history)
    spec_gen = Generator(Target(model, ONE_THREAD), lookup, TreeParams(12, 4, 3))

    def counts(gen, runs):
        out = {1: {}, 2: {}}
        for seed in range(runs):
            toks, _, _ = run(gen, prompt, 4, sampling, seed=seed)
            for p in out:
                tok = toks[p] if p < len(toks) else -1
                out[p][tok] = out[p].get(tok, 0) + 1
        return out

    plain = counts(plain_gen, N_RUNS)
    before = history.accepted
    spec = counts(spec_gen, N_RUNS)
    assert history.accepted - before > N_RUNS // 4 and history.drafted > N_RUNS
    assert len(history) == 200  # a Generator alone adds nothing: Eagle2 records answers
    for p in (1, 2):
        pvalue = chi2_pvalue(plain[p], spec[p])
        assert pvalue > 0.01, f"position {p}: speculative with history nodes differs from plain (p={pvalue:.2e})"


def test_history_file_through_the_cli(synth_q8, tmp_path):
    """`generate --draft lookup --history-file F` writes F at exit; the next run reads it and drafts from it; a
    damaged F is refused in one line of stderr and the run goes on."""
    path = tmp_path / "answers.history"

    def generate(*extra):
        import json
        proc = subprocess.run([sys.executable, "-m", "cli", "generate", "--model", str(synth_q8), "--draft", "lookup",
                               "--threads", "1", "--total-tokens", "16", "--temperature", "0", "-n", "32", "--json",
                               "-p", "x y z",
                               "--history-file", str(path), *extra], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout), proc.stderr

    first, err = generate()
    assert path.exists() and "history" not in err
    second, err = generate()
    assert second["tokens"] == first["tokens"] and "history" not in err
    assert second["stats"]["tau"] > first["stats"]["tau"]
    path.write_bytes(b"junk")
    third, err = generate()
    assert third["tokens"] == first["tokens"]
    lines = [line for line in err.splitlines() if "history" in line]
    assert len(lines) == 1 and "refused" in lines[0], err
    h = HistoryIndex()
    model = LlamaModel(synth_q8)
    assert load(h, path, vocab_fingerprint(model)) and len(h) == 1  # rewritten at exit: this run's answer
