"""Turning a token stream into text, and deciding where it stops.

Plain and speculative decoding feed their tokens one at a time through the same :class:`TokenEmitter`, so EOS,
stop strings and ``max_tokens`` cut both at exactly the same place, even when the stop falls in the middle of a
path the target accepted in one pass.

Stop strings are followed by one :class:`StopMatcher` each (Knuth-Morris-Pratt): every new character advances
them in amortized constant time, and each knows the longest end of the text that begins its string (what must be
held back). Searching the whole text for every string at every token, and testing every prefix for the hold,
cost time quadratic in the answer: 16 stop strings of 60K characters took seconds a token (issue 74).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

from ..llamacpp.llama import LlamaModel


class StopMatcher:
    """Where one stop string stands against a growing text: ``matched`` characters of it end the text now."""

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.matched = 0
        fail = [0] * len(stop)  # fail[i]: the longest proper border of stop[:i + 1]
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            fail[i] = k
        self._fail = fail

    def feed(self, text: str) -> int:
        """Advance over ``text``; the index in it just past the first whole match, or -1."""
        stop, fail, k = self.stop, self._fail, self.matched
        for i, c in enumerate(text):
            while k and c != stop[k]:
                k = fail[k - 1]
            if c == stop[k]:
                k += 1
            if k == len(stop):
                self.matched = k
                return i + 1
        self.matched = k
        return -1


@dataclass
class TokenEmitter:
    """Accumulates generated tokens; yields UTF-8-safe text deltas, holding back possible stop-string prefixes."""

    model: LlamaModel
    max_tokens: int
    stop: tuple[str, ...] = ()
    stop_tokens: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    _emitted: int = 0
    _cut: bool = False

    def __post_init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = tuple(s for s in self.stop if s)
        self._matchers = [StopMatcher(s) for s in self.stop]
        if self.max_tokens <= 0:
            self.finish_reason = "length"

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def push(self, token: int) -> str:
        """Add one token; return the text that may be shown now. After a stop, further pushes are ignored."""
        if self.done:
            return ""
        if token in self.stop_tokens:
            self.finish_reason = "stop"
            return self._flush(final=True)
        self.tokens.append(int(token))
        piece = self._decoder.decode(self.model.token_bytes(token))
        start = len(self.text)
        self.text += piece
        ends = [(m.feed(piece), m) for m in self._matchers]
        found = [start + end - len(m.stop) for end, m in ends if end >= 0]
        if found:  # the earliest of the stops this piece completes, as llama-server cuts
            self.text = self.text[:min(found)]
            self.finish_reason = "stop"
            self._cut = True
            return self._flush(final=True)
        if len(self.tokens) >= self.max_tokens:
            self.finish_reason = "length"
            return self._flush(final=True)
        return self._flush(final=False)

    def finish(self, reason: str) -> str:
        """End the stream for an outside reason (context full, interrupted)."""
        if not self.done:
            self.finish_reason = reason
        return self._flush(final=True)

    def _flush(self, final: bool) -> str:
        if final:
            tail = self._decoder.decode(b"", final=True)  # an incomplete UTF-8 character becomes U+FFFD
            if not self._cut:
                self.text += tail
            safe = len(self.text)
        else:
            safe = len(self.text) - self._held_back()
        delta = self.text[self._emitted:safe]
        self._emitted = max(self._emitted, safe)
        return delta

    def _held_back(self) -> int:
        """Characters at the end of the text that could be the start of a stop string."""
        return max((m.matched for m in self._matchers), default=0)
