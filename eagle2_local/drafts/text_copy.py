"""Copies of the prompt's *text* inside a quoted string, where the token lookup cannot see them.

A JSON answer that quotes its passage starts each string value right after ``"``, where the passage has a space
before the word: the value "Ursula Ward" comes out as ``U`` ``rs`` ``ula`` `` Ward`` while the passage reads
`` Urs`` ``ula`` `` Ward``. The token n-grams of the answer then occur nowhere in the prompt until a word or
two later, and each of those tokens is a plain step. Matched as text, the value so far ("Urs") does occur in the
passage, and what follows it there, tokenized as the model would write it from that point ("ula Ward, ..."), is
the likely next token.

:class:`TextCopy` keeps the prompt's bytes and the answer's, and for a node (the committed answer plus a path of
drafted tokens) inside an open string proposes the first tokens of the prompt text after each occurrence of the
string's value so far, ranked by how many occurrences agree. How often the top proposal was the next token is
learned per kind of value, from every answer token it had a proposal for: a one-letter value says little, and a
value that ends inside a word of the prompt ("Urs" of " Ursula") nearly always goes on with the rest of it,
where after a whole word the value may as well end. Nothing here decides what is accepted: a wrong proposal is
a node the target rejects.
"""

from __future__ import annotations

from typing import Callable

QUOTE = b'"'
ESCAPED_QUOTE = b'\\"'  # inside a JSON string (a backslash split from its quote by a token edge is missed)
MAX_KEY = 32  # bytes of the value so far that are searched for (its end: what precedes the next token)
SPAN = 24  # bytes of the prompt after an occurrence that are tokenized: enough for the first token
MAX_OCCURRENCES = 16  # occurrences of a value looked at (the first ones in the prompt)
# learned rates per kind of value: its length (1 byte, or more) and whether its top continuation goes on inside a
# word of the prompt (mid-word: a value does not end there, so its next token is nearly sure) or after one
# (the value may end here instead)
PRIOR_RATES = (0.25, 0.35, 0.25, 0.8)  # (edge, 1 byte), (edge, 2+), (mid-word, 1 byte), (mid-word, 2+)
PRIOR_WEIGHT = 4.0
MAX_TRIALS = 48.0


def _bucket(value: bytes, mid_word: bool) -> int:
    return 2 * mid_word + (len(value) > 1)


def _is_word(byte: int) -> bool:
    return 48 <= byte <= 57 or 65 <= byte <= 90 or 97 <= byte <= 122 or byte >= 0x80 or byte == 95


def after(state: tuple[bool, bytes], piece: bytes) -> tuple[bool, bytes]:
    """``state`` (inside a string, the string's bytes so far) after the text ``piece``; an escaped quote
    neither opens nor closes one."""
    inside, value = state
    quotes = piece.count(QUOTE) - piece.count(ESCAPED_QUOTE)
    if not quotes:
        return inside, value + piece if inside else value
    inside = inside ^ bool(quotes & 1)
    return inside, piece[piece.rfind(QUOTE) + 1:] if inside else b""


class TextCopy:
    """Text-level continuations of an open quoted string from the prompt's text.

    ``piece``: a token's bytes; ``tokenize``: bytes -> tokens as the model writes them (no BOS)."""

    def __init__(self, piece: Callable[[int], bytes], tokenize: Callable[[bytes], list[int]]) -> None:
        self._piece = piece
        self._tokenize = tokenize
        self.clear()

    def clear(self) -> None:
        """Forget the answer and what was learned (a new conversation)."""
        self.stop()
        self.hits = [PRIOR_WEIGHT * r for r in PRIOR_RATES]
        self.trials = [PRIOR_WEIGHT] * len(PRIOR_RATES)

    @classmethod
    def for_model(cls, model) -> "TextCopy":
        """A text copy with ``model``'s (a :class:`~eagle2_local.llamacpp.llama.LlamaModel`) pieces and tokenizer."""
        return cls(model.piece, lambda text: model.tokenize(text, add_special=False, parse_special=False))

    @property
    def started(self) -> bool:
        return self.prompt is not None

    @property
    def n_answer(self) -> int:
        return len(self._states)

    def start(self, prompt: list[int]) -> None:
        """A new answer after ``prompt`` (tokens): its text is what values are copied from."""
        self.stop()
        self.prompt = b"".join(map(self._piece, prompt))

    def stop(self) -> None:
        """No answer is open (its prompt is not known yet); the learned rates stay."""
        self.prompt: bytes | None = None
        self._states: list[tuple[bool, bytes]] = []  # the answer's string state after each of its tokens
        self._first: dict[int, int | None] = {}  # prompt byte offset -> first token of the text from there
        # a value -> its continuations (most agreed first) and whether the top one goes on inside a word
        self._ranked: dict[bytes, tuple[list[tuple[int, int]], bool]] = {}

    def extend(self, token: int) -> None:
        self._states.append(after(self.state(), self._piece(token)))

    def truncate(self, n_answer: int) -> None:
        del self._states[n_answer:]

    def state(self) -> tuple[bool, bytes]:
        """Inside a string after the committed answer, and the string's bytes so far."""
        return self._states[-1] if self._states else (False, b"")

    def value(self, path: list[int]) -> bytes | None:
        """The open string's bytes after the committed answer plus ``path`` (None: no string is open, or it is
        still empty: a value's first token has nothing to match)."""
        state = self.state()
        for token in path:
            state = after(state, self._piece(token))
        inside, value = state
        return value[-MAX_KEY:] if inside and value else None

    def continuations(self, value: bytes, width: int) -> tuple[list[int], list[float]]:
        """The tokens that follow ``value`` in the prompt's text, most agreed first, and their probabilities
        (the learned rate of such a value, scaled by agreement as the token lookup scales by count)."""
        ranked, mid_word = self.ranked(value)
        if not ranked:
            return [], []
        bucket = _bucket(value, mid_word)
        rate, top = self.hits[bucket] / self.trials[bucket], ranked[0][1]
        probs = [rate * count / top for _, count in ranked[:width]]
        total = sum(probs)
        if total > 1.0:
            probs = [p / total for p in probs]
        return [token for token, _ in ranked[:width]], probs

    def ranked(self, value: bytes) -> tuple[list[tuple[int, int]], bool]:
        """Distinct first tokens of the prompt text after ``value``'s occurrences with their counts, and
        whether the top one continues a word the value ends inside of."""
        ranked = self._ranked.get(value)
        if ranked is None:
            ranked = self._ranked[value] = self._rank(value)
        return ranked

    def _rank(self, value: bytes) -> tuple[list[tuple[int, int]], bool]:
        counts: dict[int, int] = {}
        inside_word: dict[int, bool] = {}
        word_end = _is_word(value[-1])
        at = self.prompt.find(value)
        for _ in range(MAX_OCCURRENCES):
            if at < 0:
                break
            end = at + len(value)
            token = self._first_token(end)
            if token is not None:
                counts[token] = counts.get(token, 0) + 1
                inside_word.setdefault(token, word_end and _is_word(self.prompt[end]))
            at = self.prompt.find(value, at + 1)
        ranked = sorted(counts.items(), key=lambda item: -item[1])  # stable: the earliest occurrence breaks ties
        return ranked, bool(ranked) and inside_word[ranked[0][0]]

    def _first_token(self, offset: int) -> int | None:
        """The first token of the prompt's text from byte ``offset`` (None: nothing there, or the middle of a
        character, or a token that may run past the span)."""
        if offset not in self._first:
            span = self.prompt[offset:offset + SPAN]
            token = None
            if span and not 0x80 <= span[0] < 0xC0:
                tokens = self._tokenize(span)
                if len(tokens) > 1 or len(span) < SPAN and tokens:
                    token = tokens[0]
            self._first[offset] = token
        return self._first[offset]

    def observe(self, value: bytes, token: int) -> None:
        """Learn from the answer's next token after ``value``, where a proposal was made for it."""
        ranked, mid_word = self.ranked(value)
        if not ranked:
            return
        bucket = _bucket(value, mid_word)
        self.trials[bucket] += 1.0
        self.hits[bucket] += float(ranked[0][0] == token)
        if self.trials[bucket] > MAX_TRIALS:
            scale = MAX_TRIALS / self.trials[bucket]
            self.trials[bucket] *= scale
            self.hits[bucket] *= scale
