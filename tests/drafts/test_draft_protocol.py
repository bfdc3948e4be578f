"""The draft protocol's output, the draft factory, and what the loop counts per target pass.

A drafter that already has candidates lists them (tokens with log-probabilities) where a neural draft hands over
dense logit rows; the tree, the verification and so the output must not depend on which form carries the
same candidates. τ counts what each target pass produced (EAGLE's count), so it is never below 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eagle2_local.decoding.target import Target
from eagle2_local.drafts import DraftEngine, DraftModelEngine, DraftSpec, Proposals, draft_spec
from eagle2_local.errors import Eagle2Error
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp import backend_topk
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.tree.draft_tree import TreeParams
from tests.support.helpers import ONE_THREAD, make, random_prompts, run

PARAMS = TreeParams(24, 6, 4)


@pytest.fixture(autouse=True)
def dense_rows(monkeypatch):
    """These tests compare drafters that return dense rows with ones that return proposals: the draft-model
    engines here keep dense rows (the in-graph top-k has its own tests in tests/llamacpp/test_backend_topk.py)."""
    monkeypatch.setattr(backend_topk, "IN_GRAPH_TOP_K", False)


class ProposingEngine(DraftEngine):
    """A drafter that lists the tree's candidates with log-probabilities, never dense rows: the top
    ``skip + width`` tokens of an inner draft model, without the ``skip`` best (skip=1 against the target
    itself makes a draft whose every token the greedy target rejects)."""

    needs_features = False

    def __init__(self, inner: DraftModelEngine, width: int, skip: int = 0) -> None:
        self.inner, self.width, self.skip = inner, width, skip
        self.name = f"proposals:{inner.name}"
        self.weights_path = inner.weights_path

    @property
    def n_read(self) -> int:
        return self.inner.n_read

    def _propose(self, dense: Proposals) -> Proposals:
        p = dense.best(self.skip + self.width)
        return Proposals([row[self.skip:] for row in p.tokens], [row[self.skip:] for row in p.log_probs])

    def catch_up(self, tokens, features=None, features_from=0) -> Proposals:
        return self._propose(self.inner.catch_up(tokens, features, features_from))

    def expand(self, cand_ids, tokens, parent_ids, level) -> Proposals:
        return self._propose(self.inner.expand(cand_ids, tokens, parent_ids, level))

    def reset(self) -> None:
        self.inner.reset()

    def rollback(self, n_tokens: int) -> None:
        self.inner.rollback(n_tokens)

    def begin_answer(self, prompt_tokens: int) -> None:
        self.inner.begin_answer(prompt_tokens)

    def commit(self, accepted_cand_ids) -> None:
        self.inner.commit(accepted_cand_ids)

    def close(self) -> None:
        self.inner.close()


def proposing(model: LlamaModel, draft: LlamaModel, skip: int = 0) -> Generator:
    engine: DraftEngine = ProposingEngine(DraftModelEngine(draft, ONE_THREAD, PARAMS.top_k, PARAMS.depth),
                                          PARAMS.top_k, skip)
    return Generator(Target(model, ONE_THREAD), engine, PARAMS)


def test_proposals_drafter_is_lossless_and_grows_the_dense_trees(synth_q8, synth_q8_weak):
    """The same candidates as Proposals or as dense rows: the same trees every round (same sizes, same
    acceptance), and the output of plain decoding."""
    model = LlamaModel(synth_q8)
    plain, dense = make(model, None), make(model, LlamaModel(synth_q8_weak), PARAMS)
    lookup = proposing(model, LlamaModel(synth_q8_weak))
    for i, prompt in enumerate(random_prompts(model, 8, seed=4)):
        ref, _, _ = run(plain, prompt, 48)
        for gen in (dense, lookup):
            out, _, _ = run(gen, prompt, 48)
            assert out == ref, i
        a, b = dense.last_stats, lookup.last_stats
        assert (a.tree_sizes, a.accepted_per_depth, a.target_passes) == (b.tree_sizes, b.accepted_per_depth,
                                                                          b.target_passes)


def test_tau_counts_what_each_pass_produced(synth_q8):
    """τ = tokens the target passes produced / passes. A draft the greedy target always rejects produces one
    token a pass: τ is exactly 1, also when the answer is cut by max_tokens (counting emitted tokens, the
    prefill's token made it 48/47) or ends at once (0 passes: 0/0 reported 0). The target drafting for
    itself: τ = 1 + accepted draft tokens per pass, also past a stop inside an accepted path."""
    model = LlamaModel(synth_q8)
    never = proposing(model, model, skip=1)
    plain = make(model, None)
    reasons = []
    for i, prompt in enumerate(random_prompts(model, 4, seed=5)):
        ref, _, _ = run(plain, prompt, 48)
        out, _, reason = run(never, prompt, 48)
        s = never.last_stats
        assert out == ref and s.accepted_per_depth == [] and s.tau == 1.0, (i, s.tau)
        assert s.target_passes == len(out) - (reason == "length")  # an end-of-generation token costs a pass
        reasons.append(reason)
    assert "length" in reasons
    first = run(plain, random_prompts(model, 1, seed=5)[0], 1)[0][0]
    ends_at_once = Generator(never.target, never.engine, PARAMS, stop_tokens=frozenset({first}))
    assert run(ends_at_once, random_prompts(model, 1, seed=5)[0], 48)[0] == []
    assert ends_at_once.last_stats.tau == 1.0
    selfdraft = make(model, model, PARAMS)
    for prompt in random_prompts(model, 4, seed=6):
        ref, _, _ = run(plain, prompt, 60)
        end = next(i for i in range(20, len(ref)) if ref[i] not in ref[:i])  # an end-of-generation token there
        spec = Generator(selfdraft.target, selfdraft.engine, PARAMS, stop_tokens=frozenset({ref[end]}))
        out, _, reason = run(spec, prompt, 60)
        s = spec.last_stats
        assert out == ref[:end] and reason == "stop"
        assert s.tau == pytest.approx(1 + sum(s.accepted_per_depth) / s.target_passes) and s.tau > 3
        assert s.pass_tokens >= s.n_tokens  # the end-of-generation token (and any after it) count too


def test_draft_spec_names_one_draft():
    assert DraftSpec.parse("head:/x/h.gguf") == DraftSpec("head", Path("/x/h.gguf"))
    assert str(DraftSpec.parse("draft-model:d.gguf")) == "draft-model:d.gguf"
    assert draft_spec() is None and draft_spec(draft_model="d.gguf").kind == "draft-model"
    with pytest.raises(Eagle2Error, match="not both"):
        draft_spec(head="h.gguf", draft_model="d.gguf")


def test_eagle2_opens_any_draft_kind_from_a_spec(synth_q8, synth_q8_weak):
    """``Eagle2(draft="KIND:PATH")`` goes through the factory; engines declare their weights file."""
    from eagle2_local import Eagle2

    kw = dict(n_ctx=512, n_threads=1, total_tokens=12, depth=4, tree_top_k=3)
    with Eagle2(synth_q8, draft=f"draft-model:{synth_q8_weak}", **kw) as llm:
        assert llm.engine_name.startswith("draft-model:") and llm.draft_weights == synth_q8_weak
        assert llm.draft_model is not None and llm.draft_model.path == synth_q8_weak
        with Eagle2(synth_q8, draft_model_path=synth_q8_weak, **kw) as same:
            prompt = llm.tokenize("the cat")
            assert list(llm.generate(prompt, temp=0, max_tokens=16)) == list(same.generate(prompt, temp=0,
                                                                                            max_tokens=16))
    with pytest.raises(Eagle2Error, match="unknown draft kind 'ngram'"):
        Eagle2(synth_q8, draft="ngram:x", **kw)
    with pytest.raises(Eagle2Error, match="once"):
        Eagle2(synth_q8, draft=f"draft-model:{synth_q8}", head_path=synth_q8, **kw)


def test_eagle2_generate_yields_tokens_like_llama_generate(synth_q8, synth_q8_weak):
    """``Eagle2.generate`` takes ``Llama.generate``'s leading parameters and yields token ids: speculative
    and plain give the same ones; ``reset=False`` continues after the cached text; a timer given at
    construction hears every draft call."""
    from eagle2_local import Eagle2
    from eagle2_local.measure.microbench import DraftTimes

    times = DraftTimes()
    with Eagle2(synth_q8, draft_model_path=synth_q8_weak, n_ctx=512, n_threads=1, total_tokens=12, depth=4,
                tree_top_k=3, draft_timer=times) as llm:
        prompt = llm.tokenize("the cat")
        plain = list(llm.generate(prompt, top_k=40, top_p=0.95, min_p=0.05, temp=0.0, max_tokens=24,
                                  speculative=False))
        assert times.catch_up_s == []  # plain decoding never runs the draft
        spec = list(llm.generate(prompt, temp=0.0, max_tokens=24))
        assert spec == plain and len(spec) == 24
        stats = llm.stats()  # a round with one token left to emit is a plain step: nothing to draft
        assert len(times.catch_up_s) == stats["target_passes"] - stats["plain_steps"]
        assert set(times.level_s) <= {1, 2, 3}
        more = llm.tokenize(" and the", add_bos=False)
        cont = list(llm.generate(more, temp=0.0, reset=False, max_tokens=8))
        assert llm.stats()["prompt_tokens_reused"] >= len(prompt) + 23  # the last yielded token was never decoded
        assert cont == list(llm.generate(prompt + spec + more, temp=0.0, max_tokens=8, speculative=False))
        stream = llm.generate(prompt, temp=0.0, max_tokens=24)
        assert [next(stream) for _ in range(3)] == spec[:3]
        stream.close()  # an abandoned stream leaves the cache at what it yielded, ready for the next call
        assert list(llm.generate(prompt, temp=0.0, max_tokens=24)) == spec
        with pytest.raises(Eagle2Error, match="typical_p"):
            next(llm.generate(prompt, typical_p=0.5))


def test_n_read_is_what_the_next_catch_up_ingests(synth_q8):
    """The one count of what a draft has read: text from ``n_read`` on is what its next catch-up ingests; a
    merged draft's count is its model's, which a round of its free part alone leaves behind."""
    from eagle2_local.drafts.lookup import LookupDraft
    from eagle2_local.drafts.merged import MergedDraft

    model = LlamaModel(synth_q8)
    toks = np.asarray(model.tokenize("the water is very long and the code is short"))
    merged = MergedDraft(DraftModelEngine(model, ONE_THREAD, 3, 4), 3)
    for engine in (LookupDraft(), DraftModelEngine(model, ONE_THREAD, 3, 4), merged):
        assert engine.n_read == 0
        engine.catch_up(toks, None)
        assert engine.n_read == len(toks)
        engine.rollback(4)
        assert engine.n_read == 4
        engine.catch_up(toks[:7], None)
        assert engine.n_read == 7
    merged.free_part.catch_up(toks, None)
    assert merged.n_read == 7 and merged.free_part.n_read == len(toks)
