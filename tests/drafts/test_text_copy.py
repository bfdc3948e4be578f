"""Text-level copies inside quoted strings (drafts/text_copy.py) and how the lookup takes them (drafts/lookup.py).

A word tokenizer keeps the texts readable and shows the problem the text copy solves: " Ursula" (with its
space) in the passage and "Ursula" right after a quote in the answer are different tokens, so the token n-grams
of a quoted value match nothing in the prompt."""

from __future__ import annotations

import re

import numpy as np
import pytest

from eagle2_local.drafts.lookup import COPY, LookupDraft
from eagle2_local.drafts.text_copy import PRIOR_RATES, TextCopy, after
from eagle2_local.llamacpp.llama import LlamaModel

PROMPT = 'Passage: The nurse Ursula Ward lives in Leeds. Answer as JSON with "name" and "city".\n'
PIECE = re.compile(rb" ?\w+|[^\w ]| ")


class Words:
    """A tokenizer of words with their leading space, growing its vocabulary as it reads."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}
        self.pieces: list[bytes] = []

    def tokenize(self, text: bytes | str) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        return [self._id(p) for p in PIECE.findall(data)]

    def tokens(self, *pieces: str) -> list[int]:
        """Tokens for exactly these pieces (the way a model may split a word, not the tokenizer's way)."""
        return [self._id(p.encode()) for p in pieces]

    def piece(self, token: int) -> bytes:
        return self.pieces[token]

    def _id(self, piece: bytes) -> int:
        if piece not in self.ids:
            self.ids[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self.ids[piece]


def draft_after(w: Words, answer: list[int]) -> tuple[LookupDraft, list[int]]:
    """A lookup with a text copy that has read PROMPT and then ``answer``; the whole text."""
    draft = LookupDraft(max_branches=4, text=TextCopy(w.piece, w.tokenize))
    prompt = w.tokenize(PROMPT)
    draft.catch_up_rows(np.array(prompt))
    draft.begin_answer(len(prompt))
    text = prompt + answer
    draft.catch_up_rows(np.array(text))
    return draft, text


def test_the_open_string_is_followed_through_quotes():
    state = (False, b"")
    for piece, want in [(b"{", (False, b"")), (b' "', (True, b"")), (b"name", (True, b"name")),
                        (b'":', (False, b"")), (b' "', (True, b"")), (b"Urs", (True, b"Urs")),
                        (b"ula", (True, b"Ursula")), (b' Ward"}', (False, b"")), (b'"x', (True, b"x")),
                        (b' \\"y\\"', (True, b'x \\"y\\"')), (b'"', (False, b""))]:
        state = after(state, piece)
        assert state == want, piece


def test_a_quoted_value_is_continued_from_the_prompts_text():
    w = Words()
    answer = w.tokens("{", '"', "name", '"', ":", " ", '"', "Urs")
    draft, text = draft_after(w, answer)
    assert draft.text.value([]) == b"Urs"
    tokens, probs = draft.catch_up_rows(np.array(text))
    # the passage reads " Ursula Ward": after "Urs", its text goes on with "ula" (a token the prompt never had)
    assert [w.piece(t) for t in tokens[0]] == [b"ula"]
    assert probs[0][0] == pytest.approx(PRIOR_RATES[3])  # inside a word: the prior of a value that goes on
    # a deeper node reads its path: after "Urs" + "ula" comes " Ward", after a whole word (the value may end)
    tokens, probs = draft.expand_rows([0], [w.ids[b"ula"]], [-1], 1)
    assert [w.piece(t) for t in tokens[0]] == [b" Ward"]
    assert probs[0][0] == pytest.approx(PRIOR_RATES[1])


def test_tree_nodes_read_their_strings_from_their_parents():
    """Each node's string state comes from its parent's, kept per candidate: three levels of a tree, one node
    opening a string on its own path and siblings sharing a parent, give the rows of a replay of each node's
    whole path (the text copy's own value of it)."""
    w = Words()
    answer = w.tokens("{", '"', "name", '"', ":", " ")
    draft, text = draft_after(w, answer)
    draft.catch_up_rows(np.array(text))
    levels = [([0, 1], w.tokens('"', " The"), [-1, -1]), ([2, 3, 4], w.tokens("Urs", "U", " nurse"), [0, 0, 1]),
              ([5, 6], w.tokens("ula", "rs"), [2, 3])]
    paths = {-1: []}
    n_text = 0
    for cands, toks, parents in levels:
        tokens, probs = draft.expand_rows(cands, toks, parents, 1)
        for i, (cand, tok, parent) in enumerate(zip(cands, toks, parents)):
            paths[cand] = paths[parent] + [tok]
            value = draft.text.value(paths[cand])
            if value is not None and draft.index.longest_match(text + paths[cand]) is None:
                want = draft.text.continuations(value, 4)
                assert (tokens[i], probs[i]) == want and want[0], paths[cand]
                n_text += 1
    assert n_text >= 3, "few nodes took the text copy's rows"


def test_nothing_is_proposed_outside_a_string_or_for_an_empty_value():
    """There the rows are the token lookup's own, as without a text copy."""
    w = Words()
    for answer in [w.tokens("{", '"', "name", '"', ":"), w.tokens("{", '"')]:
        draft, text = draft_after(w, answer)
        assert draft.text.value([]) is None
        plain = LookupDraft(max_branches=4)
        plain.catch_up_rows(np.array(text[:len(text) - len(answer)]))
        plain.begin_answer(len(text) - len(answer))
        assert draft.catch_up_rows(np.array(text)) == plain.catch_up_rows(np.array(text))


def test_a_long_token_match_keeps_the_token_rows():
    """Where the tokens themselves match the prompt on two or more, the text copy is not asked."""
    w = Words()
    answer = w.tokens("{", '"', "name", '"', ":", " ", '"', " The", " nurse")
    draft, text = draft_after(w, answer)
    assert draft.text.value([]) == b" The nurse"
    tokens, probs = draft.catch_up_rows(np.array(text))
    assert [w.piece(t) for t in tokens[0]] == [b" Ursula"]
    assert draft.index.last_match == 2
    assert probs[0][0] == pytest.approx(draft.index.confidence.rate(2, COPY))  # the token match's own rate


def test_the_rate_is_learned_from_the_answer():
    w = Words()
    copy = TextCopy(w.piece, w.tokenize)
    copy.start(w.tokenize(PROMPT))
    hit, miss = w.tokens("ula")[0], w.tokens("x")[0]
    before = copy.continuations(b"Urs", 1)[1][0]
    for _ in range(6):
        copy.observe(b"Urs", miss)
    assert copy.continuations(b"Urs", 1)[1][0] < before
    for _ in range(40):
        copy.observe(b"Urs", hit)
    assert copy.continuations(b"Urs", 1)[1][0] > 0.8


def test_rollback_leaves_the_text_as_a_fresh_read_of_the_same_tokens():
    w = Words()
    answer = w.tokens("{", '"', "name", '"', ":", " ", '"', "Urs", "ula", '"', ",", " ", '"', "city")
    draft, text = draft_after(w, answer)
    for keep in (len(text) - 1, len(text) - 6, len(text) - len(answer)):
        draft.rollback(keep)
        fresh, _ = draft_after(w, text[len(text) - len(answer):keep])
        assert draft.text.value([]) == fresh.text.value([]) and draft.text.n_answer == fresh.text.n_answer
    draft.rollback(3)  # into the prompt: no answer is open any more
    assert not draft.text.started


@pytest.mark.smollm2
def test_the_models_own_tokenizer_continues_a_value(smollm2_path):
    """With SmolLM2's tokenizer the value's first word splits unlike the passage's word, and the text copy
    proposes the model's first token of what follows it in the passage."""
    model = LlamaModel(smollm2_path)
    try:
        copy = TextCopy.for_model(model)
        draft = LookupDraft(max_branches=4, text=copy)
        prompt = model.tokenize(PROMPT, add_special=False)
        draft.catch_up_rows(np.array(prompt))
        draft.begin_answer(len(prompt))
        answer = model.tokenize('{"name": "Urs', add_special=False)
        tokens, _ = draft.catch_up_rows(np.array(prompt + answer))
        assert copy.value([]) == b"Urs"
        assert tokens[0][0] == model.tokenize("ula Ward lives", add_special=False)[0]
    finally:
        model.close()
