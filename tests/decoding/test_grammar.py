"""Structured output through llama.cpp's grammar engine: answers follow GBNF grammars and JSON schemas, greedy is
the argmax of the allowed tokens, sampling follows the warped distribution of the masked logits (llama.cpp's
order: the grammar first, then the warpers), and bad grammars or schemas are one-line errors."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from scipy.stats import chi2

from eagle2_local import Eagle2
from eagle2_local.decoding.grammar import Grammar, GrammarError, response_grammar
from eagle2_local.tree.sampling import SamplingParams
from tests.support.helpers import assert_follows_grammar, assert_one_line_error, run_cli

pytestmark = pytest.mark.smollm2

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "likes_tea": {"type": "boolean"}},
          "required": ["name", "age", "likes_tea"], "additionalProperties": False}
# What llama-cpp-python's schema converter enforces of PERSON (it drops minimum and maximum): the rule a sampled
# answer must follow whatever the machine.
ENFORCED = {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer"}}}
COLOURS = 'root ::= " red" | " green" | " blue" | " yellow" | " purple" | " black"'


@pytest.fixture(scope="module")
def llm(smollm2_path, smollm2_head):
    with Eagle2(smollm2_path, head_path=smollm2_head, n_ctx=1024, n_threads=1, total_tokens=12, depth=4) as llm:
        yield llm


def test_greedy_json_schema_answer_is_the_argmax_of_allowed_tokens(llm):
    """The answer validates against the schema, and every token is the argmax of the target's logits over what
    the grammar allowed at that point (recomputed independently, with the full mask, by plain decoding from an
    empty cache: one thread is batch-invariant, so its logits are a fresh evaluation's)."""
    prompt = llm.chat_tokens([{"role": "user", "content": "Describe Ann, 31, who likes tea, as JSON."}])
    grammar = Grammar.from_json_schema(PERSON)
    out = list(llm.generate(prompt, temp=0.0, max_tokens=60, grammar=grammar))
    assert llm.last_stats.tree_sizes  # decoded speculatively: the head's trees, constrained
    text = llm.detokenize(out).decode()
    jsonschema.validate(json.loads(text), PERSON)
    state = grammar.state(llm.model)
    llm.reset()
    logits = llm.target.prefill(prompt, aligned=True).logits[0]
    for i, token in enumerate(out):
        masked = state.constrain(logits)
        assert token == int(np.argmax(masked)), (i, text)
        state.accept(token)
        logits = llm.target.decode_one(token).logits[0]
    llm.reset()
    state.close()


def test_sampling_under_a_grammar_follows_the_masked_distribution(llm):
    """200 seeded first tokens under a grammar with top-k 3: the counts fit the warped distribution of the masked
    logits (p > 1e-3) and reject warping before masking (the biased order: p < 1e-4 on the same counts)."""
    prompt = llm.tokenize(b"My favourite colour is")
    grammar = Grammar(COLOURS)
    sampling = SamplingParams(temperature=1.0, top_k=3)
    counts: dict[int, int] = {}
    for seed in range(200):
        chunk = next(iter(llm.stream(prompt, 1, sampling, seed=seed, grammar=grammar)))
        counts[chunk.tokens[0]] = counts.get(chunk.tokens[0], 0) + 1
    state = grammar.state(llm.model)
    logits = llm.next_token_logits(prompt)
    right = sampling.probs(state.constrain(logits))
    wrong = np.where(state.mask(), sampling.probs(logits), 0.0)
    wrong /= wrong.sum()
    support = np.flatnonzero((right > 0) | (wrong > 0))
    assert set(counts) <= set(np.flatnonzero(right > 0).tolist())
    observed = np.array([counts.get(int(t), 0) for t in support], dtype=float)
    assert _pvalue(observed, right[support]) > 1e-3
    assert _pvalue(observed, wrong[support]) < 1e-4


def _pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square goodness of fit (a zero-probability cell that was observed makes p vanish)."""
    expected = np.maximum(probs, 1e-12) * observed.sum()
    return float(chi2.sf(((observed - expected) ** 2 / expected).sum(), len(observed) - 1))


def test_response_formats_and_grammar_text(llm):
    msgs = [{"role": "user", "content": "Describe Ann, 31, who likes tea, as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = llm.create_chat_completion(msgs, max_tokens=160, temperature=0.8, seed=5, response_format=fmt)
    assert_follows_grammar(llm.model, out["choices"][0], Grammar.from_json_schema(PERSON),
                           lambda v: jsonschema.validate(v, ENFORCED))
    obj = llm.create_chat_completion(msgs, max_tokens=160, temperature=0, response_format={"type": "json_object"})
    assert_follows_grammar(llm.model, obj["choices"][0], Grammar.json_object(),
                           lambda v: isinstance(v, dict) or pytest.fail(v))
    word = llm.create_completion("My favourite colour is", max_tokens=4, temperature=0, grammar=COLOURS)
    assert word["choices"][0]["text"] in [w.strip('"') for w in COLOURS.split("::=")[1].split(" | ")]
    spec = llm.create_completion("My favourite colour is", max_tokens=4, temperature=0, grammar=COLOURS,
                                 speculative=True)
    assert spec["choices"][0]["text"] == word["choices"][0]["text"]


@pytest.mark.parametrize("kwargs, needle", [
    ({"grammar": "root ::= ("}, r"invalid grammar: expecting '\)'"),
    ({"grammar": "root ::= foo"}, "invalid grammar"),
    ({"json_schema": "[1"}, "not JSON"),
    ({"json_schema": [1, 2]}, "must be an object"),
    ({"response_format": {"type": "xml"}}, "not one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "needs"),
    ({"grammar": "root ::= \"a\"", "json_schema": {}}, "give one of"),
])
def test_bad_grammars_and_schemas_are_one_line_errors(llm, kwargs, needle):
    with pytest.raises(GrammarError, match=needle) as info:
        grammar = response_grammar(**kwargs)
        grammar.state(llm.model)
    assert "\n" not in str(info.value)


def test_cli_json_schema_and_bad_grammar(tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    proc = run_cli("generate", "--chat", "--json", "--temperature", "0", "-n", "60", "--threads", "1",
                   "--total-tokens", "12", "--depth", "4",  # a fixed tree: no calibration
                   "--json-schema", f"@{schema}", "-p", "Describe Ann, 31, who likes tea, as JSON.")
    assert proc.returncode == 0, proc.stderr
    jsonschema.validate(json.loads(json.loads(proc.stdout)["text"]), PERSON)
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= (")
    assert_one_line_error(run_cli("generate", "-p", "hi", "--grammar-file", str(bad)), "invalid grammar")
    assert_one_line_error(run_cli("generate", "-p", "hi", "--json-schema", "[1"), "not JSON")
