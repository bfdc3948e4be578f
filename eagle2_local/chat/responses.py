"""OpenAI's response objects, built here for both the Python API and the server: a ``text_completion`` or a
``chat.completion`` whole, its stream chunks, and its ``usage``.

One response object per answer holds what its whole object and every chunk share (the id, the creation time,
the model's name); the choices come from the answer's text, and for a chat from the calls in it, read as the
request's tool plan says (:mod:`eagle2_local.chat.tool_calls`). The two callers differ only where the protocols
they follow do: the server opens a chat stream with an empty content (as OpenAI's API does, for clients that join
every delta's content), the Python API with the role alone (as llama-cpp-python does).
"""

from __future__ import annotations

import time
import uuid

from .tool_calls import AnswerStream, ToolPlan, assistant_message


class _Response:
    """What a response's whole object and its chunks share."""

    prefix = final_object = chunk_object = ""

    def __init__(self, model: str) -> None:
        self.id = f"{self.prefix}-{uuid.uuid4()}"
        self.created = int(time.time())
        self.model = model

    def _envelope(self, obj: str, choices: list[dict], extra: dict) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def whole(self, text: str, reason: str, **extra) -> dict:
        """The whole answer as one object (``extra``: ``usage``, ``eagle``)."""
        return self._envelope(self.final_object, [self.choice(text, reason)], extra)

    def chunk(self, choices: list[dict], **extra) -> dict:
        """One stream chunk holding ``choices`` (``extra``: the last chunk's ``eagle``, ``usage``)."""
        return self._envelope(self.chunk_object, choices, extra)

    def choice(self, text: str, reason: str) -> dict:
        raise NotImplementedError


class ChatResponse(_Response):
    """A ``chat.completion`` and its ``chat.completion.chunk`` stream; calls in the answer are read as the
    request's tool ``plan`` says."""

    prefix, final_object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, model: str, plan: ToolPlan | None = None) -> None:
        super().__init__(model)
        self.plan = plan
        self.answer = AnswerStream(plan)

    @staticmethod
    def _choice(delta: dict, reason: str | None = None) -> dict:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}

    def first(self, empty_content: bool = True) -> dict:
        """The opening choice: the role, and with ``empty_content`` an empty content (see the module's
        docstring)."""
        return self._choice({"role": "assistant", "content": ""} if empty_content else {"role": "assistant"})

    def deltas(self, text: str) -> list[dict]:
        """The choices a piece of the answer's text makes (none while a call may be starting)."""
        return [self._choice(d) for d in self.answer.feed(text)]

    def finish(self, reason: str) -> list[dict]:
        """The choices still owed (content held back, the calls) and the last one, with the finish reason."""
        owed, reason = self.answer.finish(reason)
        return [self._choice(d) for d in owed] + [self._choice({}, reason)]

    def choice(self, text: str, reason: str) -> dict:
        message, reason = assistant_message(text, reason, self.plan)
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}


class CompletionResponse(_Response):
    """A ``text_completion``; its stream's chunks have the same object name."""

    prefix, final_object, chunk_object = "cmpl", "text_completion", "text_completion"

    def first(self) -> None:
        """A completion's stream opens with its text."""
        return None

    def deltas(self, text: str, reason: str | None = None) -> list[dict]:
        return [self.choice(text, reason)]

    def finish(self, reason: str) -> list[dict]:
        return [self.choice("", reason)]

    def choice(self, text: str, reason: str | None) -> dict:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": reason}


def usage(stats: dict) -> dict:
    """OpenAI's ``usage`` of a generation, from its statistics (``GenerationStats.as_dict``)."""
    return {"prompt_tokens": stats["prompt_tokens"], "completion_tokens": stats["n_tokens"],
            "total_tokens": stats["prompt_tokens"] + stats["n_tokens"]}
