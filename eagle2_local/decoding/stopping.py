"""Turning a token stream into text, and deciding where it stops.

Plain and speculative decoding feed their tokens one at a time through the same :class:`TokenEmitter`, so EOS,
stop strings and ``max_tokens`` cut both at exactly the same place, even when the stop falls in the middle of a
path the target accepted in one pass.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

from ..llamacpp.llama import LlamaModel


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
        self.text += self._decoder.decode(self.model.token_bytes(token))
        for s in self.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text = self.text[:at]
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
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return hold
