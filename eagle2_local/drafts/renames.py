"""Renames a code edit makes, learned from the answer as it is written, so that lookups copy the edited code.

A rename (a variable, an argument, a function) changes one identifier everywhere in a function the answer
re-emits. A lookup copying the prompt drafts the old name at every later occurrence, misses, and needs a few
plain steps to find its place again, at every occurrence. Once the answer has re-emitted one occurrence with
the new name, the rename is known: the prompt as the answer will re-emit it (each whole-word occurrence of the
old name replaced) becomes a second text for the lookup to copy from (drafts/lookup.py), where the edited
spans match at full length.

The n-gram index reports where a long copy missed (a divergence). A few tokens later, once the new word is
complete, the prompt's words around the copy's source are aligned with the answer's words since just before
the miss (difflib, a few dozen words: ~0.2 ms, at most four times after a miss): a single-word
replacement of one identifier by another is a rename. Nothing here decides what is accepted: a rename that
turns out wrong only drafts tokens the target rejects.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Callable

WORDS = re.compile(r"\w+|[^\w\s]")
IDENTIFIER = re.compile(r"[^\W\d]\w*")
CONTEXT = 8  # tokens before a divergence that both sides of the alignment start with
WINDOW = 48  # tokens of the prompt after a divergence that the answer's words are aligned with
PATIENCE = 24  # answer tokens after a divergence within which its rename must show
FIRST_LOOK = 2  # answer tokens after a divergence at the first look for its rename


@dataclass(frozen=True)
class Divergence:
    """A long copy missed: the text's position ``source`` (in the prompt) was predicted for position
    ``answer`` (in the answer), which came out differently."""

    source: int
    answer: int


class RenameLearner:
    """The renames an answer has made so far, and the prompt's tokens with them applied.

    ``detokenize`` / ``tokenize``: the model's (special tokens kept as text, and parsed back)."""

    def __init__(self, detokenize: Callable[[list[int]], str], tokenize: Callable[[str], list[int]]) -> None:
        self._detokenize = detokenize
        self._tokenize = tokenize
        self.renames: dict[str, str] = {}
        self._pending: list[tuple[Divergence, int]] = []  # and the answer tokens after it at the next look

    @classmethod
    def for_model(cls, model) -> "RenameLearner":
        """A learner with ``model``'s (a :class:`~eagle2_local.llamacpp.llama.LlamaModel`) tokenizer."""
        return cls(lambda tokens: b"".join(map(model.piece, tokens)).decode("utf-8", "replace"),
                   lambda text: model.tokenize(text, add_special=False, parse_special=True))

    def reset(self) -> None:
        self.renames = {}
        self._pending = []

    def diverged(self, divergences: list[Divergence]) -> None:
        self._pending.extend((d, FIRST_LOOK) for d in divergences)

    def learn(self, text: list[int], answer_from: int) -> bool:
        """Look for renames at the pending divergences of ``text`` (the answer starts at ``answer_from``);
        True when a new one was found. Each divergence is looked at when the answer has gone 2, 4, 8 and 16
        tokens past it (a new name shows within a few tokens), not at every catch-up."""
        found = False
        keep = []
        for d, look_at in self._pending:
            past = len(text) - d.answer
            if past < look_at:
                keep.append((d, look_at))
                continue
            new = self._renames_at(text, answer_from, d)
            if new:
                self.renames.update(new)
                found = True
            elif 2 * past <= PATIENCE:  # beyond: no rename showed there, an edit of another kind
                keep.append((d, 2 * past))
        self._pending = keep
        return found

    def _renames_at(self, text: list[int], answer_from: int, d: Divergence) -> dict[str, str]:
        """Single-identifier replacements between the prompt's words around ``d.source`` and the answer's
        words around ``d.answer`` (the answer's last word left out: it may not be complete yet)."""
        source = WORDS.findall(self._detokenize(text[max(d.source - CONTEXT, 0):d.source + WINDOW]))
        answer = WORDS.findall(self._detokenize(text[max(d.answer - CONTEXT, answer_from):]))[:-1]
        found = {}
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, source, answer, autojunk=False).get_opcodes():
            if op != "replace" or i2 - i1 != 1 or j2 - j1 != 1:
                continue
            old, new = source[i1], answer[j1]
            if IDENTIFIER.fullmatch(old) and IDENTIFIER.fullmatch(new) and old not in self.renames:
                found[old] = new
        return found

    def edited(self, prompt: list[int]) -> list[int]:
        """``prompt`` as the answer would re-emit it: every whole-word occurrence of a renamed identifier
        replaced by its new name."""
        text = self._detokenize(prompt)
        for old, new in self.renames.items():
            text = re.sub(rf"\b{re.escape(old)}\b", new, text)
        return self._tokenize(text)
