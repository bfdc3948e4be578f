"""Renames learned from the answer (drafts/renames.py) and the lookup's second, renamed text (drafts/lookup.py).

A character tokenizer keeps the texts readable: one token per character, so a copy "matches on n tokens"
when its last n characters occurred before."""

from __future__ import annotations

import numpy as np

from eagle2_local.drafts.lookup import COPY, LookupDraft
from eagle2_local.drafts.renames import RenameLearner

PROMPT = "Rename check.\n```\ndef f(check):\n    if check > 1:\n        return check + 1\n    return 0\n```\n"


def chars_learner() -> RenameLearner:
    return RenameLearner(lambda tokens: "".join(map(chr, tokens)), lambda text: [ord(c) for c in text])


def tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


def chain(draft: LookupDraft, text: str, depth: int) -> str:
    """The lookup's best chain after ``text`` (its top continuation at each level), as text."""
    row_t, _ = draft.catch_up_rows(np.array(tokens(text)))
    out = []
    for cand in range(depth):
        if not row_t[0]:
            break
        out.append(row_t[0][0])
        row_t, _ = draft.expand_rows(np.array([cand]), np.array([out[-1]]), np.array([cand - 1]), cand + 1)
    return "".join(map(chr, out))


def answer_with(draft: LookupDraft, answer: str) -> None:
    draft.reset()
    draft.catch_up_rows(np.array(tokens(PROMPT)))
    draft.begin_answer(len(PROMPT))


def test_a_rename_in_the_answer_is_copied_at_every_later_occurrence():
    """The answer renames ``check`` at its first occurrence: the lookup learns it once the new word is out and
    from then on copies the renamed code, where the prompt alone would draft the old name."""
    learner = chars_learner()
    draft, plain = LookupDraft(max_n=24, renames=learner), LookupDraft(max_n=24)  # 24 characters: a few words
    answer = "```\ndef f(last_word):\n    if last_word > 1:\n        return last_word + 1\n"
    for d in (draft, plain):
        answer_with(d, answer)
    upto = answer.index("    if ") + len("    if ")
    assert chain(plain, PROMPT + answer[:upto], 12) == "check > 1:\n "
    assert chain(draft, PROMPT + answer[:upto], 12) == "last_word > "
    assert learner.renames == {"check": "last_word"}
    upto = answer.index("return ") + len("return ")
    assert chain(draft, PROMPT + answer[:upto], 14) == "last_word + 1\n"
    assert draft.next_rate(tokens(PROMPT + answer[:upto])) > plain.next_rate(tokens(PROMPT + answer[:upto]))


def test_an_edit_that_is_no_rename_teaches_nothing_and_answers_forget_renames():
    """A changed operator is no rename; a rename is forgotten when the next answer begins, and a rollback
    into the prompt drops the renamed text."""
    learner = chars_learner()
    draft = LookupDraft(max_n=24, renames=learner)
    answer_with(draft, "")
    fixed = "```\ndef f(check):\n    if check >= 1:\n        return check + 1\n"
    draft.catch_up_rows(np.array(tokens(PROMPT + fixed)))
    assert learner.renames == {} and draft.edited is None
    answer_with(draft, "")
    renamed = "```\ndef f(last_word):\n    if last_word"
    draft.catch_up_rows(np.array(tokens(PROMPT + renamed)))
    assert learner.renames == {"check": "last_word"} and draft.edited is not None
    draft.rollback(len(PROMPT) + 6)  # inside the answer: the renamed text follows
    assert len(draft.edited) == draft.edited.answer_from + 6
    draft.begin_answer(len(PROMPT) + 6)
    assert learner.renames == {} and draft.edited is None


def test_an_answer_that_paraphrases_learns_no_renames():
    """Where the answer's copies of a few tokens often stop (a summary rewording its passage), a swapped word
    is no rename: nothing is learned and no renamed text is built."""
    learner = chars_learner()
    draft = LookupDraft(max_n=24, renames=learner)
    answer_with(draft, "")
    for _ in range(40):  # copies matched on 4 tokens went on less than half the time
        draft.index.confidence.observe(4, False, COPY)
        draft.index.confidence.observe(4, True, COPY)
    renamed = "```\ndef f(last_word):\n    if last_word"
    draft.catch_up_rows(np.array(tokens(PROMPT + renamed)))
    assert learner.renames == {} and draft.edited is None
