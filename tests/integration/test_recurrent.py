"""Recurrent and hybrid models (Qwen3.5, LFM2, Mamba-2; docs/design.md "Recurrent and hybrid models"): they load and
decode plain as llama.cpp decodes them, draft chains where llama.cpp can take rejected tokens back (``n_rs_seq``) and
from saved states where it cannot (checkpoints), and every speculative answer equals plain decoding: the recurrent
state is taken back exactly after any number of rejected rounds."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from benchmarks.synthetic_model import EXPECTED_KIND, write_arch_model
from eagle2_local.api import CHAIN_TOKENS, Eagle2
from eagle2_local.decoding.target import Target
from eagle2_local.drafts.base import DraftEngine
from eagle2_local.errors import Eagle2Error, TreeError
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import DraftTree, TreeParams
from eagle2_local.tree.proposals import Proposals
from eagle2_local.tree.sampling import SamplingParams
from tests.support.helpers import N_RUNS, chi2_pvalue, first_divergence, run

CHAINED = ("qwen35", "lfm2")  # hybrids whose state llama.cpp takes back (llm_arch_supports_rs_rollback)
CHECKPOINTED = ("mamba2",)  # recurrent, no snapshots: chains from a saved state
ATTENTION = ("llama", "gemma4")
CHAIN = ContextSettings(n_ctx=1024, n_batch=256, n_seq_max=1, n_threads=1, n_rs_seq=CHAIN_TOKENS)
PROMPT = [1, 40, 41, 42, 43, 44, 45]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archs")
    return {arch: write_arch_model(folder / f"{arch}.gguf", arch) for arch in CHAINED + CHECKPOINTED + ATTENTION}


@pytest.fixture(scope="module")
def models(paths):
    loaded = {arch: LlamaModel(path) for arch, path in paths.items()}
    yield loaded
    for model in loaded.values():
        model.close()


def llama_cpp_greedy(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    """llama.cpp's own greedy decoding, through its C API alone: the prompt in one batch, then a token a decode."""
    p = llama_cpp.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch = 1024, 256, 256, 1, 1
    ctx = llama_cpp.llama_init_from_model(model.ptr, p)
    out: list[int] = []
    try:
        held = (llama_cpp.llama_token * len(prompt))(*prompt)  # the batch points into it
        batch = llama_cpp.llama_batch_get_one(held, len(prompt))
        for _ in range(n):
            assert llama_cpp.llama_decode(ctx, batch) == 0
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(model.n_vocab,))
            token = int(np.argmax(row))
            out.append(token)
            if token in model.eog_tokens:
                break
            held = (llama_cpp.llama_token * 1)(token)
            batch = llama_cpp.llama_batch_get_one(held, 1)
    finally:
        llama_cpp.llama_free(ctx)
    return out


@pytest.mark.parametrize("arch", CHAINED + CHECKPOINTED + ATTENTION)
def test_plain_decoding_is_llama_cpps_own(models, arch):
    model = models[arch]
    assert (model.recurrent, model.hybrid) == EXPECTED_KIND[arch]
    settings = CHAIN if model.recurrent or model.hybrid else ContextSettings(n_ctx=1024, n_batch=256, n_threads=1)
    ours, _, _ = run(Generator(Target(model, settings)), PROMPT, 64)
    theirs = llama_cpp_greedy(model, PROMPT, 64)
    assert ours == theirs[:len(ours)], f"diverged at {first_divergence(ours, theirs)}"


class ScriptedDraft(DraftEngine):
    """A chain draft that knows the plain answer: it proposes the right next token with probability ``sure`` and a
    wrong one otherwise, so rounds are accepted to every depth and rejected at every depth."""

    name = "scripted"
    needs_features = False

    def __init__(self, full: list[int], n_vocab: int, sure: float = 0.8, seed: int = 0) -> None:
        self.full, self.n_vocab, self.sure = full, n_vocab, sure
        self.rng = np.random.default_rng(seed)
        self.n_read = 0
        self.cands: list[tuple[int, bool]] = []  # per candidate id: its position in the text, on the plain path?

    def _row(self, pos: int, on_path: bool) -> Proposals:
        right = self.full[pos] if pos < len(self.full) else 0
        token = right if on_path and self.rng.random() < self.sure else (right + 1 + int(self.rng.integers(50))) % \
            self.n_vocab
        self.cands.append((pos, on_path and token == right))
        return Proposals([[token]], [[-0.1]])

    def catch_up(self, tokens, features=None, features_from=0) -> Proposals:
        self.n_read = len(tokens)
        self.cands = []
        on_path = list(tokens) == self.full[:len(tokens)]
        return self._row(len(tokens), on_path)

    def expand(self, cand_ids, tokens, parent_ids, level) -> Proposals:
        rows = [self._row(self.cands[c][0] + 1, self.cands[c][1]) for c in cand_ids]
        return Proposals([r.tokens[0] for r in rows], [r.log_probs[0] for r in rows])

    def rollback(self, n_tokens: int) -> None:
        self.n_read = min(self.n_read, n_tokens)

    def reset(self) -> None:
        self.n_read = 0


@pytest.mark.parametrize("arch, checkpoints", [(arch, False) for arch in CHAINED + CHECKPOINTED + ("llama",)]
                         + [(arch, True) for arch in CHAINED])
def test_rejected_chains_leave_the_state_as_plain_decoding_does(models, arch, checkpoints):
    """≥ 200 tokens with chains rejected at every depth: the answer is plain decoding's, token for token, so every
    rollback (snapshots, or a checkpoint put back and the accepted tokens decoded again) left the recurrent state
    exactly where plain decoding has it."""
    model = models[arch]
    chain = model.recurrent or model.hybrid
    settings = CHAIN if chain else ContextSettings(n_ctx=1024, n_batch=256, n_threads=1)
    endless = frozenset()  # no end-of-generation token: 240 tokens whatever the random model writes
    plain, _, _ = run(Generator(Target(model, settings), stop_tokens=endless), PROMPT, 240)
    assert len(plain) == 240
    draft = ScriptedDraft(PROMPT + plain, model.n_vocab)
    target = Target(model, settings, checkpoints=checkpoints)
    assert target.checkpoints == (checkpoints or arch in CHECKPOINTED)
    gen = Generator(target, draft, TreeParams(CHAIN_TOKENS + 1, CHAIN_TOKENS, 1), stop_tokens=endless)
    spec, _, _ = run(gen, PROMPT, 240)
    assert spec == plain, f"diverged at {first_divergence(spec, plain)}"
    stats = gen.last_stats
    drafted = sum((size - 1) * count for size, count in stats.tree_sizes.items())
    accepted = sum(stats.accepted_per_depth)
    assert stats.target_passes < len(plain) * 0.6  # chains were accepted, several tokens a pass
    assert drafted - accepted >= 30  # and rejected: most rounds took tokens back


@pytest.mark.parametrize("arch", CHAINED)
def test_a_hybrid_verifies_chains_only(models, arch):
    target = Target(models[arch], CHAIN)
    assert target.chain_only and target.max_tree_nodes == CHAIN_TOKENS + 1
    target.prefill(PROMPT)
    with pytest.raises(TreeError, match="chains only"):
        target.verify(DraftTree.from_parents([5, 6, 7], [-1, 0, 0]))
    with pytest.raises(TreeError, match="take back"):
        target.verify(DraftTree.from_parents(list(range(5, 5 + CHAIN_TOKENS + 2)), np.arange(-1, CHAIN_TOKENS + 1)))


@pytest.mark.parametrize("arch", CHAINED + CHECKPOINTED)
def test_a_cut_the_state_cannot_make_empties_it(models, arch):
    """A recurrent state is taken back only within its last decode: a longer cut empties the memory and says so,
    and the next answer (re-evaluated from the start) is plain decoding's."""
    model = models[arch]
    gen = Generator(Target(model, CHAIN))
    first, _, _ = run(gen, PROMPT, 20)
    assert gen.target.rollback(len(PROMPT) + 5) == 0 and gen.target.n_past == 0
    gen.tokens = []
    again, _, _ = run(gen, PROMPT, 20)
    fresh, _, _ = run(Generator(Target(model, CHAIN)), PROMPT, 20)
    assert first == again == fresh


@pytest.mark.parametrize("arch", CHAINED)
def test_a_chat_reuses_the_state_between_turns(models, paths, arch):
    """cache_prompt: the second turn's prompt starts with the first turn's text, whose state is kept (no cut)."""
    with Eagle2(paths[arch], draft="lookup", n_threads=1, n_ctx=1024, budget="fixed", total_tokens=9,
                cache_prompt=True) as llm, Eagle2(paths[arch], plain=True, n_threads=1, n_ctx=1024) as ref:
        prompt = llm.tokenize("the cat and the dog and the cat")
        answer = [t for ch in llm.stream(prompt, max_tokens=30) for t in ch.tokens]
        follow = prompt + answer + llm.tokenize(" and the dog", add_bos=False)
        second = [t for ch in llm.stream(follow, max_tokens=30) for t in ch.tokens]
        assert llm.last_stats.prompt_tokens_reused > 0
        expected = [t for ch in ref.stream(follow, max_tokens=30) for t in ch.tokens]
        assert second == expected


@pytest.mark.parametrize("arch", CHAINED + CHECKPOINTED)
def test_lookup_and_forced_tokens_equal_plain(paths, arch):
    """The drafts a model without a head has (lookups in the text, a grammar's forced tokens) on a recurrent or
    hybrid model: the answer is plain decoding's, whichever way the state is taken back."""
    from eagle2_local.decoding.grammar import Grammar

    text = "the cat and the dog " * 6 + "code def return the cat and the dog"
    schema = '{"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", ' \
             '"items": {"type": "string"}}}, "required": ["name", "tags"]}'

    with Eagle2(paths[arch], plain=True, n_threads=1, n_ctx=1024) as ref, \
            Eagle2(paths[arch], draft="lookup", n_threads=1, n_ctx=1024, budget="fixed", total_tokens=9) as llm:
        assert llm.speculative and llm.target.checkpoints == (arch in CHECKPOINTED)
        prompt = ref.tokenize(text)
        want = [t for ch in ref.stream(prompt, max_tokens=200) for t in ch.tokens]
        got = [t for ch in llm.stream(prompt, max_tokens=200) for t in ch.tokens]
        assert got == want, f"lookup diverged at {first_divergence(got, want)}"
        grammar = Grammar.from_json_schema(schema)
        want = [t for ch in ref.stream(prompt, max_tokens=80, grammar=grammar) for t in ch.tokens]
        got = [t for ch in llm.stream(prompt, max_tokens=80, grammar=grammar) for t in ch.tokens]
        assert got == want, f"grammar diverged at {first_divergence(got, want)}"
        assert llm.last_stats.accepted_by_source.get("forced", 0) > 0  # the grammar's tokens drafted free


def test_a_recurrent_draft_model_is_refused(paths):
    with pytest.raises(Eagle2Error, match="hybrid model"):
        Eagle2(paths["llama"], draft_model_path=paths["qwen35"], n_threads=1)


POSITIONS = (1, 2, 3)


def token_counts(gen: Generator, sampling: SamplingParams, runs: int) -> dict[int, dict[int, int]]:
    counts: dict[int, dict[int, int]] = {p: {} for p in POSITIONS}
    for seed in range(runs):
        toks = [t for ch in gen.generate(PROMPT, max(POSITIONS) + 2, sampling, seed=seed,
                                          speculative=gen.engine is not None) for t in ch.tokens]
        for p in POSITIONS:
            token = toks[p] if p < len(toks) else -1
            counts[p][token] = counts[p].get(token, 0) + 1
    return counts


def test_sampling_on_a_hybrid_keeps_the_targets_distribution(models):
    """T=1 chains drafted by an attention model with the same vocabulary, on Qwen3.5: the tokens the chains emit
    follow the target's distribution (chi-square against plain sampling)."""
    from eagle2_local.drafts import DraftModelEngine

    target_model, draft_model = models["qwen35"], models["llama"]
    sampling = SamplingParams(temperature=1.0)
    plain = token_counts(Generator(Target(target_model, CHAIN)), sampling, N_RUNS)
    engine = DraftModelEngine(draft_model, CHAIN, 1, CHAIN_TOKENS)
    spec = Generator(Target(target_model, CHAIN), engine, TreeParams(CHAIN_TOKENS + 1, CHAIN_TOKENS, 1))
    got = token_counts(spec, sampling, N_RUNS)
    for position in POSITIONS:
        p = chi2_pvalue(plain[position], got[position])
        assert p > 0.01, f"position {position}: speculative differs from plain (p={p:.2e})"
    assert spec.last_stats.target_passes >= 1
