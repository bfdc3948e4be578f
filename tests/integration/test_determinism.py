"""Same question, same answer: at temperature 0 a request's tokens do not depend on what was asked before.

The hazard is real on this build: a prompt of 64+ tokens evaluated in one batch takes another flash-attention
kernel than the same tokens evaluated in smaller pieces, so reusing a cached prefix and re-evaluating only the
prompt's last token changes its logits (``test_the_hazard_is_real``). By default prompts are evaluated in
aligned PROMPT_CHUNK batches and the cache is reused only where a fresh evaluation reproduces it bit for bit;
these tests hold the API to that at 1 thread (everything reusable) and 2 threads (single-token decodes split
long KV ranges differently, so only aligned prompt cells are reused), and show that plain and speculative
decoding give the same answer after the same history.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from eagle2_local import Eagle2
from eagle2_local.decoding.target import PROMPT_CHUNK, Target
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import DraftTree
from tests.support.prompts import load_prompts

pytestmark = pytest.mark.smollm2

N_TOKENS = 20
HISTORY_TOKENS = 6  # an answer that only fills the cache with another history
TIE = 0.5  # bench's default tie tolerance: a top-2 logit gap below it is a near-tie


@pytest.fixture(scope="module")
def long_prompts(smollm2_path) -> list[str]:
    """Two prompts past 64 tokens (the batch size where kernels switch) and one short one, from EAGLE's sets."""
    model = LlamaModel(smollm2_path)
    texts = load_prompts(12)
    long = [t[:500] for t in texts if len(model.tokenize(t[:500])) > 3 * PROMPT_CHUNK]
    short = [t for t in texts if len(model.tokenize(t)) < PROMPT_CHUNK]
    model.close()
    assert len(long) >= 2 and short
    return [long[0], long[1], short[0]]


def ask(llm: Eagle2, text: str, history: list[dict] | None = None, **kw) -> dict:
    """A greedy chat answer and its statistics (the token ids and how much of the prompt was reused)."""
    msgs = (history or []) + [{"role": "user", "content": text}]
    out = llm.create_chat_completion(msgs, **{"max_tokens": N_TOKENS, **kw}, temperature=0)
    return {"text": out["choices"][0]["message"]["content"], "reused": out["eagle"]["prompt_tokens_reused"],
            "prompt_tokens": out["usage"]["prompt_tokens"], "engine": out["eagle"]["engine"]}


@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=pytest.mark.all_cores)])
def test_the_hazard_is_real_and_aligned_reuse_is_exact(smollm2_path, long_prompts, threads):
    """Re-evaluating a 64+ token prompt's last token alone changes its logits (what full reuse does); reusing
    aligned chunks and evaluating the rest in the aligned schedule is bit-identical to a fresh evaluation, at 1
    and at 2 threads."""
    model = LlamaModel(smollm2_path)
    prompt = model.tokenize(long_prompts[0])
    n = len(prompt)
    target = Target(model, ContextSettings(n_ctx=1024, n_batch=512, n_seq_max=4, n_threads=threads))
    big = target.prefill(prompt).logits[0].copy()
    assert target.n_exact == 0  # a 64+ token batch is nobody's fresh evaluation, even on an invariant build
    target.rollback(n - 1)
    last_alone = target.prefill(prompt[-1:]).logits[0].copy()
    assert np.abs(big - last_alone).max() > 1e-3, "a 64+ token batch and a single token computed alike"
    target.reset()
    fresh = target.prefill(prompt, aligned=True).logits[0].copy()
    assert target.n_exact == n - n % PROMPT_CHUNK or target.batch_invariant
    for keep in range(PROMPT_CHUNK, n, PROMPT_CHUNK):
        target.rollback(keep)
        again = target.prefill(prompt[keep:], aligned=True).logits[0]
        assert np.array_equal(again, fresh), (threads, keep)
    target.close()
    model.close()


def test_only_batches_under_64_tokens_extend_the_exact_prefix(smollm2_path):
    """On the batch-invariant build (1 thread, Q4_1) a committed tree of 10 nodes extends the exact prefix, one
    of 68 (another kernel) does not, and neither does a prompt evaluated in one 512-token batch."""
    model = LlamaModel(smollm2_path)
    target = Target(model, ContextSettings(n_ctx=1024, n_batch=512, n_seq_max=4, n_threads=1))
    assert target.batch_invariant
    target.prefill(list(range(100, 132)), aligned=True)
    for n_nodes, exact_after in ((10, 42), (68, 42)):
        base = target.n_past
        target.verify(DraftTree.from_parents(np.arange(200, 200 + n_nodes), np.arange(-1, n_nodes - 1)))
        target.commit(np.arange(n_nodes))
        assert (target.n_past, target.n_exact) == (base + n_nodes, exact_after)
    target.close()
    model.close()


def _same_request_checks(llm: Eagle2, a: str, b: str, short: str) -> None:
    fresh = ask(llm, a)
    again = ask(llm, a)
    ask(llm, b, max_tokens=HISTORY_TOKENS)
    ask(llm, short, max_tokens=HISTORY_TOKENS)
    after_b = ask(llm, a)
    assert again["reused"] > 0, "the repeat reused nothing: the test would not see a reuse bug"
    assert again["text"] == fresh["text"] and after_b["text"] == fresh["text"]
    llm.reset()
    assert ask(llm, a)["text"] == fresh["text"]


def test_same_request_same_answer_one_thread(smollm2_path, smollm2_head, long_prompts):
    """1 thread, the shipped head on small trees: A, A, B, short, A and A after a reset are one answer; plain
    and speculative after the same history agree; a second turn equals the same conversation sent fresh."""
    a, b, short = long_prompts
    with Eagle2(smollm2_path, head_path=smollm2_head, n_ctx=2048, n_threads=1, total_tokens=8, depth=3) as llm:
        _same_request_checks(llm, a, b, short)
        spec = ask(llm, a, speculative=True)
        plain = ask(llm, a, speculative=False)
        assert spec["engine"] != "plain" and plain["engine"] == "plain"
        assert plain["text"] == spec["text"]
        # a second turn reuses the whole first one (one thread: every cell is exact) and answers as fresh
        history = [{"role": "user", "content": a}, {"role": "assistant", "content": spec["text"]}]
        turn2 = ask(llm, "Say that again in one sentence.", history)
        assert turn2["reused"] >= spec["prompt_tokens"]
        llm.reset()
        assert ask(llm, "Say that again in one sentence.", history)["text"] == turn2["text"]


@pytest.mark.all_cores
def test_same_request_same_answer_two_threads_plain(smollm2_path, long_prompts):
    """2 threads, plain decoding: exact too (only aligned prompt cells are reused; the rest is recomputed)."""
    a, b, short = long_prompts
    with Eagle2(smollm2_path, n_ctx=2048, n_threads=2, plain=True) as llm:
        _same_request_checks(llm, a, b, short)
        history = [{"role": "user", "content": a}, {"role": "assistant", "content": ask(llm, a)["text"]}]
        turn2 = ask(llm, "Say that again in one sentence.", history)
        llm.reset()
        assert ask(llm, "Say that again in one sentence.", history)["text"] == turn2["text"]


@pytest.mark.all_cores
def test_two_threads_speculative_differs_from_plain_only_at_near_ties(smollm2_path, smollm2_head, long_prompts):
    """2 threads: a tree verifies tokens in a batch where plain decoding takes single-token kernels, so the two
    can part at a near-tie (not a history effect: the same holds after a reset). Every parting is one."""
    with Eagle2(smollm2_path, head_path=smollm2_head, n_ctx=2048, n_threads=2, total_tokens=8, depth=3) as llm:
        for text in long_prompts:
            ask(llm, long_prompts[1], max_tokens=HISTORY_TOKENS)  # some history first
            prompt = llm.chat_tokens([{"role": "user", "content": text}])
            plain = list(llm.generate(prompt, temp=0.0, max_tokens=N_TOKENS, speculative=False))
            ask(llm, long_prompts[0], max_tokens=HISTORY_TOKENS)
            spec = list(llm.generate(prompt, temp=0.0, max_tokens=N_TOKENS, speculative=True))
            at = next((i for i, (x, y) in enumerate(zip(plain, spec)) if x != y), None)
            if at is None:
                assert len(plain) == len(spec) or N_TOKENS in (len(plain), len(spec))
                continue
            logits = llm.next_token_logits(prompt + plain[:at])
            top2 = np.sort(logits)[-2:]
            assert top2[1] - top2[0] < TIE, (text[:40], at, top2)


def test_a_prompt_cancelled_between_batches_changes_no_later_answer(smollm2_path, smollm2_head, long_prompts):
    """A server's client that leaves while its prompt is evaluated (``cancelled`` says yes) stops it between two
    batches; the cache is back to what it held, so the same prompt and another one after it answer as on a
    fresh model, and the next request still reuses the kept prefix."""
    from eagle2_local.errors import PrefillCancelled

    a, b, short = long_prompts
    with Eagle2(smollm2_path, head_path=smollm2_head, n_ctx=2048, n_threads=1, total_tokens=8, depth=3,
                budget="fixed") as llm:
        fresh = {text: ask(llm, text, max_tokens=8)["text"] for text in (a, b)}
        llm.reset()
        ask(llm, short, max_tokens=8)
        asked = []
        stream = llm.stream(llm.chat_tokens([{"role": "user", "content": a}]), 8,
                            cancelled=lambda: asked.append(1) or len(asked) > 2)
        with pytest.raises(PrefillCancelled):
            next(stream)
        assert len(asked) == 3  # two batches evaluated, then stopped before the third
        again = ask(llm, a, max_tokens=8)
        assert again["reused"] > 0 and again["text"] == fresh[a]
        assert ask(llm, b, max_tokens=8)["text"] == fresh[b]


@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=pytest.mark.all_cores)])
def test_a_restored_prompt_decodes_as_its_fresh_evaluation(smollm2_path, smollm2_head, long_prompts, threads):
    """``bench --prefill-once``: a prompt evaluated once, its KV cells and the head's features put back before a
    call, leaves the call's KV cells, tokens and rounds exactly as evaluating the prompt afresh does, plain and
    speculative (EAGLE-2's fixed tree, so both runs draft the same trees); only the last aligned chunk is
    evaluated again. The merged draft's learned odds carry from one answer to the next by design, so both runs
    start from the same odds: left to carry, they changed the second run's trees on an AVX2-only build of
    llama.cpp (NOTES.md#an-avx2-only-llamacpp-build-on-the-amx-vm-a-steeper-curve-issue-44s-rows-on-it)."""
    with Eagle2(smollm2_path, head_path=smollm2_head, n_ctx=2048, n_threads=threads, total_tokens=8,
                depth=3) as llm:
        prompt = llm.tokenize(long_prompts[0])
        gen = llm.generator
        snap = gen.prompt_snapshot(prompt)
        assert snap.features is not None and len(snap.features) == len(prompt)
        for speculative in (False, True):
            learned = copy.deepcopy(gen.engine.odds)
            llm.reset()
            fresh = list(llm.generate(prompt, temp=0, max_tokens=N_TOKENS, speculative=speculative))
            fresh_cells, fresh_stats = gen.target.ctx.save_seq(0), llm.last_stats
            assert fresh_stats.prompt_tokens_reused == 0
            gen.engine.odds = learned  # a copy taken before the fresh run, used once
            gen.restore(snap)
            again = list(llm.generate(prompt, temp=0, max_tokens=N_TOKENS, speculative=speculative))
            assert again == fresh and gen.target.ctx.save_seq(0) == fresh_cells
            reused = llm.last_stats.prompt_tokens_reused
            assert 0 < len(prompt) - reused <= PROMPT_CHUNK, (reused, len(prompt))
            assert llm.last_stats.target_passes == fresh_stats.target_passes
            assert llm.last_stats.accepted_per_depth == fresh_stats.accepted_per_depth
