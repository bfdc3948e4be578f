"""Plain decoding matches llama-cpp-python; speculative decoding matches plain decoding (lossless).

Bit-identical demands hold where the build is batch-invariant (measured in tests/decoding/test_target.py:
quantized weights, one thread, trees under 64 nodes). The F32 synthetic model is not batch-invariant, so there a
divergence passes only at a genuine near-tie: at the first divergent position the target's top-2 logits differ by
< F32_TOL.
"""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.decoding.target import PROMPT_CHUNK, Target
from eagle2_local.drafts import DraftModelEngine
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import TreeParams
from eagle2_local.tree_policy import PLAIN_STEP, FixedTree, RoundPlan
from tests.support.helpers import (GREEDY, ONE_THREAD, assert_lossless, chat_prompt, first_divergence, forced_budget,
                                   make, random_prompts, run)
from tests.support.prompts import load_prompts

F32_TOL = 1e-2


def top2_gap(model: LlamaModel, settings: ContextSettings, tokens: list[int]) -> float:
    """Target top-2 logit gap after ``tokens``, decoded plainly."""
    t = Target(model, settings)
    logits = t.prefill(tokens).logits[0]
    t.close()
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


# ------------------------------------------------------------------ plain baseline
@pytest.mark.smollm2
@pytest.mark.parametrize("cache_prompt, llama_batch", [(False, PROMPT_CHUNK), (True, 512)])
def test_plain_greedy_equals_llama_cpp_python(smollm2_path, cache_prompt, llama_batch):
    """Token for token llama-cpp-python's greedy output when it evaluates prompts in the same batches: ours in
    PROMPT_CHUNK batches by default (reproducible), in n_batch batches with cache_prompt (as Llama does)."""
    from llama_cpp import Llama

    model = LlamaModel(smollm2_path)
    gen = make(model, None, settings=ContextSettings(n_ctx=1024, n_batch=512, n_seq_max=8, n_threads=1))
    for text in load_prompts(4):
        prompt = chat_prompt(model, text)
        gen.reset()  # a fresh prefill, like a fresh Llama (prompts >= 64 tokens take other kernels than slices)
        ours, _, _ = run(gen, prompt, 32, cache_prompt=cache_prompt)
        # a fresh Llama per prompt: Llama.reset() keeps stale KV cells that the next prompt then shares
        ref = Llama(str(smollm2_path), n_ctx=1024, n_threads=1, n_threads_batch=1, flash_attn=True,
                    n_batch=llama_batch, n_ubatch=llama_batch, verbose=False, seed=0)
        theirs = []
        for tok in ref.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            if tok in model.eog_tokens or len(theirs) == 32:
                break
            theirs.append(tok)
        ref.close()
        assert ours == theirs


# ------------------------------------------------------------------ lossless greedy
@pytest.mark.smollm2
@pytest.mark.slow
def test_lossless_greedy_smollm2_50_prompts(smollm2_path, smollm2_weak):
    model = LlamaModel(smollm2_path)
    weak = LlamaModel(smollm2_weak)
    plain = make(model, None)
    self_draft = make(model, model, TreeParams(10, 5, 2))
    weak_draft = make(model, weak, TreeParams(6, 3, 2))
    taus = {"self": [], "weak": []}
    for text in load_prompts(50):
        prompt = chat_prompt(model, text)
        ref, _, _ = run(plain, prompt, 128)
        for name, gen in (("self", self_draft), ("weak", weak_draft)):
            out, _, _ = run(gen, prompt, 128)
            assert out == ref, f"{name} draft diverged at {first_divergence(out, ref)} for prompt {text[:60]!r}"
            taus[name].append(gen.last_stats.tau)
    assert np.mean(taus["self"]) > 3.0  # the target drafting for itself is accepted (almost) always
    assert np.mean(taus["self"]) > np.mean(taus["weak"]) > 1.0


def sweep_slices(fast: int) -> list:
    """A sweep of 50 prompts x 128 tokens: the first ``fast`` in the default run, the others with ``-m slow``."""
    return [pytest.param(slice(0, fast), id="fast"),
            pytest.param(slice(fast, 50), id="rest", marks=pytest.mark.slow)]


@pytest.mark.parametrize("prompts", sweep_slices(8))
@pytest.mark.parametrize("draft_kind", ["self", "weak"])
def test_lossless_greedy_synthetic_bit_identical(synth_q8, synth_q8_weak, draft_kind, prompts):
    model = LlamaModel(synth_q8)
    draft = model if draft_kind == "self" else LlamaModel(synth_q8_weak)
    plain = make(model, None)
    spec = make(model, draft, TreeParams(24, 6, 4))
    accepted = 0
    for i, prompt in list(enumerate(random_prompts(model, 50, seed=0)))[prompts]:
        assert_lossless(plain, spec, prompt, 128, i)
        accepted += sum(spec.last_stats.accepted_per_depth)
    assert accepted > 0, "no drafted token was accepted: the test would not see a bug"
    if draft_kind == "self":
        assert spec.last_stats.tau > 3.0


@pytest.mark.all_cores
@pytest.mark.parametrize("prompts", sweep_slices(20))
def test_lossless_greedy_f32_near_ties_only(synth_f32, prompts):
    """F32 is not batch-invariant: divergences may only happen at near-ties of the target (and rarely do: at
    least 90% of the answers are identical)."""
    model = LlamaModel(synth_f32)
    settings = ContextSettings(n_ctx=2048, n_batch=256, n_seq_max=64, n_threads=2)
    plain = make(model, None, settings=settings)
    spec = make(model, model, TreeParams(24, 6, 4), settings=settings)
    rng = np.random.default_rng(1)
    all_prompts = [[1] + list(rng.integers(5, model.n_vocab, int(rng.integers(2, 40)))) for _ in range(50)]
    identical = near_ties = 0
    for i, prompt in list(enumerate(all_prompts))[prompts]:
        ref, _, _ = run(plain, prompt, 128)
        out, _, _ = run(spec, prompt, 128)
        at = first_divergence(out, ref)
        if at is None:
            identical += 1
            continue
        gap = top2_gap(model, settings, prompt + ref[:at])
        assert gap < F32_TOL, f"prompt {i}: diverged at {at} where the top-2 gap is {gap} (not a near-tie)"
        near_ties += 1
    assert identical >= 0.9 * (identical + near_ties), (identical, near_ties)


def test_near_tie_check_catches_a_real_bug(synth_q8):
    """The near-tie criterion has teeth: a draft loop that accepts wrong tokens is caught by it."""
    import eagle2_local.generation.generator as generator_mod
    from eagle2_local.decoding.acceptance import Acceptance

    model = LlamaModel(synth_q8)
    plain = make(model, None)
    spec = make(model, model, TreeParams(24, 6, 4))
    real_accept = generator_mod.accept

    def sloppy(tree, logits, params, history, rng):  # blindly accepts the root's second-best child
        kids = tree.children(0)
        if len(kids) > 1:
            return Acceptance(np.array([0, kids[1]]), int(np.argmax(logits[kids[1]])))
        return real_accept(tree, logits, params, history, rng)

    generator_mod.accept = sloppy
    try:
        caught = 0
        rng = np.random.default_rng(2)
        for _ in range(10):
            prompt = [1] + list(rng.integers(5, model.n_vocab, 10))
            ref, _, _ = run(plain, prompt, 64)
            out, _, _ = run(spec, prompt, 64)
            at = first_divergence(out, ref)
            if at is not None and top2_gap(model, ONE_THREAD, prompt + ref[:at]) >= F32_TOL:
                caught += 1
        assert caught >= 8
    finally:
        generator_mod.accept = real_accept


# ------------------------------------------------------------------ stops inside accepted paths
def test_stops_inside_accepted_path_cut_like_plain(synth_q8):
    model = LlamaModel(synth_q8)
    prompt = [1, 50, 60, 70, 80]
    plain = make(model, None)
    ref, ref_text, _ = run(plain, prompt, 60)
    assert len(ref) == 60
    # EOS: pretend the 20th generated token ends the turn
    eos = ref[19]
    first = ref.index(eos)
    for gen in (make(model, None), make(model, model, TreeParams(24, 8, 3))):
        gen.stop_tokens = frozenset({eos})
        out, text, reason = run(gen, prompt, 60)
        assert out == ref[:first] and reason == "stop"
        assert text == model.detokenize(ref[:first]).decode("utf-8", "replace")
    # a stop string that first appears in the middle of the text
    stop = ref_text[len(ref_text) // 2: len(ref_text) // 2 + 3]
    cut = ref_text.index(stop)
    spec = make(model, model, TreeParams(24, 8, 3))
    outs = [run(g, prompt, 60, stop=(stop,)) for g in (make(model, None), spec)]
    assert outs[0] == outs[1]
    assert outs[1][1] == ref_text[:cut] and outs[1][2] == "stop"
    assert spec.last_stats.tau > 2  # the stop really fell inside multi-token accepted paths
    # max_tokens
    for n in (1, 2, 7, 13):
        a = run(make(model, None), prompt, n)
        b = run(make(model, model, TreeParams(24, 8, 3)), prompt, n)
        assert a == b and len(b[0]) == n and b[2] == "length"


def test_context_end_cuts_like_plain(synth_q8):
    """Near a full context the tree shrinks; both loops stop with "length" after the same tokens."""
    model = LlamaModel(synth_q8)
    settings = ContextSettings(n_ctx=256, n_batch=64, n_seq_max=32, n_threads=1)
    plain = make(model, None, settings=settings)
    spec = make(model, model, TreeParams(24, 6, 4), settings=settings)
    n_ctx = plain.target.n_ctx
    rng = np.random.default_rng(5)
    for left in (1, 2, 3, 7, 20):
        prompt = [1] + list(rng.integers(5, model.n_vocab, n_ctx - left - 1))
        ref, _, ref_reason = run(plain, prompt, 100)
        out, _, reason = run(spec, prompt, 100)
        assert ref_reason == reason == "length"
        assert out == ref and len(out) == n_ctx - len(prompt) + 1


def test_abandoned_stream_does_not_corrupt_the_next_call(synth_q8):
    model = LlamaModel(synth_q8)
    for draft in (None, model):
        gen = make(model, draft, TreeParams(12, 4, 3))
        a = gen.generate([1, 40, 41, 42], 50, GREEDY)
        next(a)
        next(a)
        b, _, _ = run(gen, [1, 60, 61, 62, 63], 30)  # a newer call takes over the cache
        a.close()  # the abandoned stream must leave it alone
        c, _, _ = run(gen, [1, 60, 61, 62, 63] + b[:10], 30)  # reuses the prefix of b's KV
        fresh = make(model, None)
        assert c == run(fresh, [1, 60, 61, 62, 63] + b[:10], 30)[0]
        a2 = gen.generate([1, 40, 41, 42], 50, GREEDY)
        next(a2)
        run(gen, [1, 70], 5)
        with pytest.raises(Exception, match="newer generation"):
            next(a2)


# ------------------------------------------------------------------ lossless with the tree budget on
def test_lossless_greedy_with_budget_synthetic(synth_q8, synth_q8_weak):
    model = LlamaModel(synth_q8)
    plain = make(model, None)
    params = TreeParams(24, 6, 4)
    sizes: set[int] = set()
    plain_steps = 0
    for draft in (model, LlamaModel(synth_q8_weak)):
        engine = DraftModelEngine(draft, ONE_THREAD, params.top_k, params.depth)
        spec = Generator(Target(model, ONE_THREAD), engine, params, policy=forced_budget(24, 6))
        for i, prompt in enumerate(random_prompts(model, 12, seed=3)):
            assert_lossless(plain, spec, prompt, 96, i)
            stats = spec.last_stats.as_dict()
            sizes |= set(stats["tree_size_hist"])
            plain_steps += stats["plain_steps"]
            assert stats["budget"]["mode"] == "auto"
    assert len(sizes) >= 4 and plain_steps > 0, (sizes, plain_steps)


class FeatureCheckingEngine(DraftModelEngine):
    """A draft model that checks it is handed the features of every token it catches up on, and keeps the length
    of each catch-up's text."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.caught_up: list[int] = []

    def catch_up(self, tokens, features=None, features_from=0):
        self.caught_up.append(len(tokens))
        assert features is not None and len(features) == len(tokens) - 1 - features_from
        return super().catch_up(tokens, features, features_from)


def test_budget_plain_steps_keep_features_for_the_next_catch_up(synth_q8):
    """Engines that read target features (EAGLE heads) must get every committed position's features, also
    those of plain steps taken while the draft was not run."""
    from dataclasses import replace

    settings = replace(ONE_THREAD, embeddings=True)
    model = LlamaModel(synth_q8)
    params = TreeParams(24, 6, 4)

    class EveryEighth(FixedTree):
        """Plain steps, a tree every eighth round: the draft sits out seven rounds in eight."""

        asked = 0

        def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
            self.asked += 1
            return super().plan(fresh_tokens) if self.asked % 8 == 0 else PLAIN_STEP

    weak = FeatureCheckingEngine(model, ONE_THREAD, params.top_k, params.depth)
    spec = Generator(Target(model, settings), weak, params, policy=EveryEighth(24))
    run(spec, [1, 50, 60, 70], 60)
    assert spec.last_stats.plain_steps > 20 and len(weak.caught_up) >= 2
    assert max(np.diff(weak.caught_up)) > params.depth + 1  # some catch-up came after plain steps


def test_a_plain_run_is_lossless_and_each_of_its_steps_is_observed_and_counted(synth_q8):
    """A plan of ``steps`` plain steps runs them without asking again: the answer is plain decoding's, the policy
    and the statistics hear of every step in order (a run's later steps carry no decision time), a feature-fed
    draft still gets every step's features, and a stream closed inside a run still reports the steps taken."""
    from dataclasses import replace

    settings = replace(ONE_THREAD, embeddings=True)
    model = LlamaModel(synth_q8)
    params = TreeParams(24, 6, 4)

    class RunsOfFive(FixedTree):
        """Plain runs of five steps, a tree at every fourth ask."""

        def __init__(self, max_nodes: int) -> None:
            super().__init__(max_nodes)
            self.asked, self.heard = 0, []

        def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
            self.asked += 1
            return super().plan(fresh_tokens) if self.asked % 4 == 0 else replace(PLAIN_STEP, steps=5)

        def observe(self, result) -> None:
            self.heard.append(result)

        def summary(self) -> dict:
            return {"heard": len(self.heard)}

    plain = make(model, None, params, settings)
    policy = RunsOfFive(24)
    engine = FeatureCheckingEngine(model, settings, params.top_k, params.depth)
    spec = Generator(Target(model, settings), engine, params, policy=policy)
    for i, prompt in enumerate(random_prompts(model, 3, seed=5)):
        policy.asked, policy.heard = 0, []
        assert_lossless(plain, spec, prompt, 80, i)
        stats = spec.last_stats
        assert len(policy.heard) == stats.target_passes and stats.plain_steps >= 4 * (stats.target_passes // 8)
        starts = [r.times.start for r in policy.heard]
        assert starts == sorted(starts)  # in the order they ran
        decided = [r.times.decide_s for r in policy.heard]
        # every round the policy planned was decided, and so were the last ones, which only fit the root
        assert policy.asked <= sum(d is not None for d in decided) < len(decided)
        assert all(d is None or d >= 0.0 for d in decided)
    assert max(np.diff(engine.caught_up)) > 5  # a catch-up after a run's plain steps, with all their features
    policy.asked, policy.heard = 0, []
    stream = spec.generate(random_prompts(model, 1, seed=6)[0], 80, GREEDY)
    emitted = [next(stream) for _ in range(3)]  # the root, the run's first step, one step inside the run
    stream.close()
    assert len(policy.heard) == spec.last_stats.target_passes == len(emitted) - 1 == 2
    assert spec.last_stats.budget == {"heard": 2}  # the policy heard the run's step before its summary was read


# ------------------------------------------------------------------ host time
def test_host_time_adds_up(synth_q8):
    """Every generation reports its rounds' host time (wall minus llama.cpp) on both sides, per round and per
    drafted node: non-negative, and host + llama.cpp = the rounds' wall time."""
    model = LlamaModel(synth_q8)
    plain, spec = make(model, None), make(model, model)
    prompt = random_prompts(model, 1, seed=3)[0]
    for gen, drafts in ((plain, False), (spec, True)):
        run(gen, prompt, 24)
        s = gen.last_stats.as_dict()
        assert s["rounds"] == s["target_passes"] > 0
        for key in ("rounds_s", "llama_s", "host_s", "host_draft_s", "host_verify_s", "host_ms_per_round",
                    "host_draft_ms_per_round", "host_verify_ms_per_round"):
            assert s[key] >= 0.0, (key, s)
        assert s["llama_s"] > 0.0 and s["host_s"] > 0.0
        assert abs(s["host_s"] + s["llama_s"] - s["rounds_s"]) < 1e-5, s
        assert abs(s["host_draft_s"] + s["host_verify_s"] - s["host_s"]) < 1e-5, s
        assert s["rounds_s"] <= s["total_s"] - s["prefill_s"] + 1e-6, s
        assert abs(s["host_ms_per_round"] - 1e3 * s["host_s"] / s["rounds"]) < 1e-3, s
        if drafts:
            assert s["drafted_nodes"] > 0 and s["host_draft_s"] > 0.0
            assert abs(s["host_us_per_node"] - 1e6 * s["host_s"] / s["drafted_nodes"]) < 1e-2, s
        else:  # plain decoding drafts nothing: its host time is the sampling around each decode
            assert s["drafted_nodes"] == 0 and s["host_us_per_node"] is None and s["host_draft_s"] == 0.0
