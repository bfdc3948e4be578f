"""Speculative decoding under a grammar is lossless: constrained greedy answers are bit-identical to plain
constrained greedy ones (one thread) whatever drafts (the shipped head with lookups, lookups alone, a draft model,
forced tokens alone), no tree node the grammar forbids is ever verified, and forced tokens are drafted and
counted as their own source."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from eagle2_local import Eagle2
from eagle2_local.decoding.grammar import Grammar
from eagle2_local.drafts import constrained
from eagle2_local.drafts.forced import ForcedDraft, VocabForest
from eagle2_local.tree_policy import PLAIN_STEP, FixedTree, RoundPlan
from tests.support.helpers import assert_follows_grammar, first_divergence

pytestmark = pytest.mark.smollm2

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "likes_tea": {"type": "boolean"},
                                           "pets": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
          "required": ["name", "age", "likes_tea", "pets"], "additionalProperties": False}
VERDICT = 'root ::= "Verdict: " ("yes" | "no" | "maybe") ". Reason: " [a-z ,]+ "."'
# What llama-cpp-python's schema converter enforces of PERSON (no minimum / maximum in its GBNF).
ENFORCED = {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer"}}}
CASES = {"schema": (Grammar.from_json_schema(PERSON), "Describe Ann, 31, who likes tea and has a cat, as JSON."),
         "gbnf": (Grammar(VERDICT), "Is tea better than coffee? Answer with a verdict and a reason.")}
DRAFTS = ("head", "lookup", "draft-model", "forced")
N_TOKENS = 32


@pytest.fixture(scope="module")
def plain_answers(smollm2_path):
    """Plain constrained greedy answers (the reference), one per case."""
    with Eagle2(smollm2_path, plain=True, n_ctx=1024, n_threads=1, total_tokens=12, depth=4) as llm:
        return {name: list(llm.generate(llm.chat_tokens([{"role": "user", "content": q}]), temp=0.0,
                                        max_tokens=N_TOKENS, grammar=g))
                for name, (g, q) in CASES.items()}


def _open(smollm2_path, smollm2_head, draft: str) -> Eagle2:
    """A fixed tree of 12 nodes with: the shipped head (and lookups, the default), lookups, SmolLM2 drafting
    for itself, or nothing (the model alone: forced tokens are its only draft)."""
    kwargs = {"head": {"head_path": smollm2_head}, "lookup": {"draft": "lookup"},
              "draft-model": {"draft": f"draft-model:{smollm2_path}"}, "forced": {"lookup": False}}[draft]
    return Eagle2(smollm2_path, n_ctx=1024, n_threads=1, total_tokens=12, depth=4, **kwargs)


@pytest.mark.parametrize("draft", DRAFTS)
def test_constrained_greedy_is_bit_identical_to_plain(smollm2_path, smollm2_head, plain_answers, draft):
    with _open(smollm2_path, smollm2_head, draft) as llm:
        for name, (grammar, question) in CASES.items():
            out = list(llm.generate(llm.chat_tokens([{"role": "user", "content": question}]), temp=0.0,
                                    max_tokens=N_TOKENS, grammar=grammar))
            stats = llm.last_stats
            assert stats.engine != "plain" and stats.tree_sizes, (draft, name)
            assert out == plain_answers[name], f"{draft}/{name}: diverged at {first_divergence(out, plain_answers[name])}"
            assert stats.accepted_by_source.get("forced", 0) >= 3, (draft, name, stats.accepted_by_source)
            assert stats.tau > 1.0
        answer = plain_answers["schema"]  # valid JSON if it finished, else a prefix the grammar accepts
        choice = {"text": llm.detokenize(answer).decode(),
                  "finish_reason": "stop" if len(answer) < N_TOKENS else "length"}
        assert_follows_grammar(llm.model, choice, CASES["schema"][0], lambda v: jsonschema.validate(v, ENFORCED))


def test_forbidden_children_are_never_verified(smollm2_path, smollm2_head, monkeypatch):
    """Every node of every verified tree is allowed by the grammar state of its parent (replayed independently
    from the answer so far), while the head did propose forbidden ones (dropped), so the check is not vacuous."""
    grammar, question = CASES["schema"]
    dropped = []

    def counting(before, states):
        rows, refused = real_filter(before, states)
        dropped.append(sum(map(len, before.tokens)) - sum(map(len, rows.tokens)))
        return rows, refused
    real_filter = constrained.allowed
    monkeypatch.setattr(constrained, "allowed", counting)
    with _open(smollm2_path, smollm2_head, "head") as llm:
        prompt = llm.chat_tokens([{"role": "user", "content": question}])
        gen = llm.generator
        trees = []
        verify = gen.target.verify
        monkeypatch.setattr(gen.target, "verify",
                            lambda tree, copy=True, features=True: (trees.append((list(gen.tokens), tree)),
                                                                    verify(tree, copy, features))[1])
        list(llm.generate(prompt, temp=0.0, max_tokens=N_TOKENS, grammar=grammar))
        checked = 0
        for tokens, tree in trees:
            answer = tokens[len(prompt):] + [int(tree.tokens[0])]
            for node in range(1, len(tree)):
                path, up = [], node
                while up > 0:
                    path.append(int(tree.tokens[up]))
                    up = int(tree.parents[up])
                state = grammar.state(llm.model)
                for tok in answer + path[:0:-1]:
                    state.accept(tok)
                assert state.allows(path[0]), (llm.detokenize(answer), node)
                state.close()
                checked += 1
        assert checked >= 10 and sum(dropped) >= 10, (checked, dropped)


def test_forced_search_finds_exactly_the_allowed_tokens(smollm2_path):
    """The prefix-forest search returns the grammar's whole allowed set where it is small (the full mask says
    the same), proposes a single allowed token with probability 1 and a chain as its longest token, and gives
    up inside free text."""
    from eagle2_local.llamacpp.llama import LlamaModel
    model = LlamaModel(smollm2_path)
    forest = VocabForest(model)
    state = Grammar.from_json_schema(PERSON).state(model)
    sizes = []
    for tok in model.tokenize('{"name": "Ann", "age": 31, "likes_tea": true', add_special=False):
        allowed, deepest = forest.allowed_set(state)
        mask = np.flatnonzero(state.mask())
        if allowed is None:
            assert len(mask) > 6  # more first steps than a forced spot has
        else:
            assert allowed.tolist() == mask.tolist()
            sizes.append(len(allowed))
        state.accept(tok)
    assert 1 in sizes and max(sizes) > 2
    letters = Grammar('root ::= [a-z]+').state(model)  # none of the first roots (punctuation, digits) allowed
    assert forest.allowed_set(letters)[0] is None and len(np.flatnonzero(letters.mask())) > 6
    digit = Grammar('root ::= [7]').state(model)
    assert forest.allowed_set(digit)[0].tolist() == np.flatnonzero(digit.mask()).tolist()
    draft = ForcedDraft(forest)
    fresh = Grammar('root ::= "likes_tea"').state(model)
    row = draft.propose([fresh], [-1])
    assert model.token_bytes(int(row.tokens[0][0])) == b"likes" and 0 > row.log_probs[0][0] > -1
    fresh.accept(int(row.tokens[0][0]))
    row = draft.propose([fresh], [-1])
    assert model.token_bytes(int(row.tokens[0][0])) == b"_" and row.log_probs[0][0] == 0.0
    branching = Grammar('root ::= ("x" | "y") "z"').state(model)  # two allowed tokens, not a chain
    assert not draft.proposes_at(branching)  # a set not met before: no guess
    draft.chose(model.tokenize("y", add_special=False)[0])  # the target picked "y" where it just looked
    draft.reset()  # a new generation keeps the model's habits
    picked = draft.propose([branching], [-1])
    assert model.token_bytes(int(picked.tokens[0][0])) == b"y"
    assert picked.log_probs[0][0] > np.log(0.9)  # one earlier pick is a habit: a key's forced run can pay at once
    for s in (state, fresh, branching, letters, digit):
        s.close()
    model.close()


class PlainAlways(FixedTree):
    """A policy that never plans a tree: every drafted round is one the loop runs where the grammar forces."""

    def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
        return PLAIN_STEP


def test_lookups_join_the_rounds_a_grammar_forces(smollm2_path):
    """With lookups as the only draft and a policy that never drafts, every tree is a round of free drafts where
    the grammar forces the root: lookup branches (the answer copies the prompt) join the forced tokens there,
    and the answer stays bit-identical to plain constrained greedy."""
    grammar = Grammar.from_json_schema(PERSON)
    question = 'Repeat this JSON exactly: {"name": "Ann Smith", "age": 31, "likes_tea": true, "pets": ["cat"]}'
    messages = [{"role": "user", "content": question}]
    with Eagle2(smollm2_path, plain=True, n_ctx=1024, n_threads=1) as llm:
        plain = list(llm.generate(llm.chat_tokens(messages), temp=0.0, max_tokens=N_TOKENS, grammar=grammar))
        assert llm.last_stats.engine == "plain"  # plain means no speculation, not even on forced tokens
        assert llm.last_stats.target_passes == len(plain)
    with Eagle2(smollm2_path, draft="lookup", n_ctx=1024, n_threads=1, total_tokens=12, depth=6) as llm:
        llm.generator.policy = PlainAlways(12)
        out = list(llm.generate(llm.chat_tokens(messages), temp=0.0, max_tokens=N_TOKENS, grammar=grammar))
        stats = llm.last_stats
    assert out == plain, f"diverged at {first_divergence(out, plain)}"
    assert stats.tree_sizes and stats.accepted_by_source.get("lookup", 0) >= 10, stats.accepted_by_source
