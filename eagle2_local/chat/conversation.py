"""A chat conversation that stays within the context: its turns, and the dropping of the oldest turns when the next
prompt would not fit (llama-cli's context shift, done by whole turns).

Dropping whole turns and rendering the kept ones again means the answer after a shift is the answer a fresh chat
gives to the kept turns: the prompt is exactly that chat's prompt, and the KV cache keeps only the cells a fresh
evaluation would reproduce (the runtime's same-request-same-answer rule).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from ..errors import ContextFullError

log = logging.getLogger(__name__)

# With no --max-tokens, this share of the context is kept free for the answer when turns are dropped (a quarter:
# llama-cli's shift frees half of what follows the kept prefix; a turn-level shift needs less to go on).
ANSWER_SHARE = 4


def answer_room(n_ctx: int, max_tokens: int | None) -> int:
    """Tokens kept free for the next answer: its ``max_tokens``, at most half the context, and a quarter of the
    context when no limit is set."""
    wanted = max_tokens if max_tokens else n_ctx // ANSWER_SHARE
    return max(1, min(wanted, n_ctx // 2))


def fit_turns(system: Sequence[dict], turns: Sequence[dict], tokenize: Callable[[list[dict]], list[int]],
              limit: int) -> tuple[list[dict], int, list[int]]:
    """The newest turns that fit: drop the oldest user/assistant exchanges (never the system messages, never the
    last message) until ``tokenize(system + kept)`` holds at most ``limit`` tokens. Returns the kept turns, how many
    messages were dropped and the prompt's tokens (rendered once per try); raises :class:`ContextFullError` when
    the last message alone does not fit."""
    kept = list(turns)
    dropped = 0
    while len(prompt := tokenize([*system, *kept])) > limit:
        if len(kept) <= 1:
            raise ContextFullError(f"the message does not fit the context ({len(prompt)} prompt tokens, {limit} "
                                   f"allowed with room for the answer); raise --n-ctx")
        cut = _oldest_exchange(kept)
        del kept[:cut]
        dropped += cut
    return kept, dropped, prompt


def _oldest_exchange(turns: list[dict]) -> int:
    """How many messages the oldest exchange spans: a user message and every reply up to the next user message
    (assistant and tool messages belong to the question they answer); never the last message."""
    end = 1
    while end < len(turns) - 1 and turns[end].get("role") != "user":
        end += 1
    return end


@dataclass
class Conversation:
    """The messages of one chat, kept within ``n_ctx`` by dropping the oldest turns before an answer.

    ``context_shift`` False keeps every turn: a prompt that does not fit raises :class:`ContextFullError`, as
    llama-cli's ``--no-context-shift``."""

    llm: object  # an Eagle2: chat_tokens(), stream(), n_ctx(), reset()
    system_prompt: str | None = None
    context_shift: bool = True
    turns: list[dict] = field(default_factory=list)
    dropped: int = 0  # messages dropped by the last shift (0: none)

    @property
    def system(self) -> list[dict]:
        return [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    @property
    def messages(self) -> list[dict]:
        return [*self.system, *self.turns]

    def reset(self) -> None:
        self.turns.clear()
        self.dropped = 0
        self.llm.reset()

    def ask(self, text: str, max_tokens: int | None, sampling, seed: int | None) -> Iterator:
        """Stream the answer to ``text`` (the model's chunks); the caller adds the answer with :meth:`answered`.
        Turns are dropped first when the prompt and room for the answer would not fit; on an error the caller
        takes the question back (:meth:`take_back`), so the conversation is as before."""
        self.turns.append({"role": "user", "content": text})
        return self.llm.stream(self._prompt(max_tokens), max_tokens, sampling, seed=seed)

    def answered(self, answer: str) -> None:
        self.turns.append({"role": "assistant", "content": answer})

    def take_back(self) -> None:
        """Forget the last question (its answer failed)."""
        if self.turns and self.turns[-1]["role"] == "user":
            self.turns.pop()

    def _prompt(self, max_tokens: int | None) -> list[int]:
        self.dropped = 0
        if not self.context_shift:
            return self.llm.chat_tokens(self.messages)
        limit = self.llm.n_ctx() - answer_room(self.llm.n_ctx(), max_tokens)
        kept, self.dropped, prompt = fit_turns(self.system, self.turns, self.llm.chat_tokens, limit)
        if self.dropped:
            log.info("context shift: dropped the %d oldest messages to fit n_ctx=%d", self.dropped,
                     self.llm.n_ctx())
            self.turns[:] = kept
        return prompt
