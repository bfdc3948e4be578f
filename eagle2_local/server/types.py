"""What the API reads, and which statistics its answers show: the request bodies (pydantic models, with the fields
this server refuses rather than ignores; a field a request leaves out takes the server's
:class:`~eagle2_local.tree.sampling.SamplingDefaults`) and :func:`eagle_stats`. The response objects are built
in :mod:`eagle2_local.chat.responses`, as the Python API's are."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..tree.sampling import MIN_TEMPERATURE, REPEAT_PENALTY_RANGE
from .errors import APIError

MAX_STOPS = 16
"""Stop strings a request may give (OpenAI allows 4): each is followed character by character."""
MAX_STOP_CHARS = 4096
"""The longest stop string: matching is linear in the answer whatever their length, but a stop string is held
back from a stream until it is ruled out, and one longer than any answer is a mistake."""


# ---------------------------------------------------------------- requests
class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields both endpoints accept, as llama-cpp-python's server does; unknown fields are ignored. Python's JSON
    parser reads ``NaN`` and ``Infinity``: refused here, they would poison the sampling arithmetic."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    cache_prompt: bool | None = None  # llama-server's field; None: the server's default (serve --cache-prompt)
    grammar: str | None = None  # llama-server's GBNF
    json_schema: dict | None = None  # llama-server's JSON schema
    response_format: dict | None = None  # OpenAI's: {"type": "text" | "json_object" | "json_schema", ...}
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        """At most :data:`MAX_STOPS` stop strings of at most :data:`MAX_STOP_CHARS` characters each."""
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        longest = max((len(s) for s in stops), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop string may have at most {MAX_STOP_CHARS} characters, got {longest}")
        return stop

    @field_validator("temperature")
    @classmethod
    def _greedy_below_floor(cls, t: float | None) -> float | None:
        """A temperature in (0, :data:`MIN_TEMPERATURE`) is greedy (0), as documented in docs/server.md."""
        return 0.0 if t is not None and 0 < t < MIN_TEMPERATURE else t

    @field_validator("repeat_penalty")
    @classmethod
    def _penalty_in_range(cls, p: float | None) -> float | None:
        low, high = REPEAT_PENALTY_RANGE
        if p is not None and not low <= p <= high:
            raise ValueError(f"repeat_penalty must be between {low:g} and {high:g} (1 = off), got {p:g}")
        return p

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self) -> None:
        """Fields a client may set that this server cannot honour: refused rather than silently ignored."""
        extra = self.model_extra or {}
        unsupported = {
            "n": self.n not in (None, 1), "presence_penalty": self.presence_penalty not in (None, 0.0),
            "frequency_penalty": self.frequency_penalty not in (None, 0.0),
            "logprobs": bool(extra.get("logprobs")), "top_logprobs": bool(extra.get("top_logprobs")),
            "echo": bool(extra.get("echo")), "best_of": extra.get("best_of") not in (None, 1),
            "suffix": bool(extra.get("suffix")), "logit_bias": bool(extra.get("logit_bias")),
            "functions": bool(extra.get("functions")), "function_call": bool(extra.get("function_call")),
        }
        for name, bad in unsupported.items():
            if bad:
                raise APIError(400, f"{name}: not supported by this server (only n=1, no logprobs; functions "
                               "through tools)", code="unsupported_parameter", param=name)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    # what an assistant's calls and a tool's result carry besides role and content
    TOOL_FIELDS: ClassVar[tuple[str, ...]] = ("tool_calls", "tool_call_id", "name")

    def as_dict(self) -> dict:
        """``{"role", "content": str}`` plus the tool fields given; text parts are joined, other parts (images,
        audio) refused. An assistant message that only calls tools keeps its content None."""
        if isinstance(self.content, list):
            if any(p.type != "text" or p.text is None for p in self.content):
                raise APIError(400, "messages: only text content parts are supported", param="messages")
            content = "".join(p.text for p in self.content)
        else:
            extra = self.model_extra or {}
            content = None if self.content is None and extra.get("tool_calls") else self.content or ""
        return {"role": self.role, "content": content,
                **{k: v for k, v in (self.model_extra or {}).items() if k in self.TOOL_FIELDS}}


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list[Any] | None = None  # OpenAI's function entries; checked by eagle2_local.chat.tool_calls
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None


# ---------------------------------------------------------------- what an answer shows
# The figures of a generation that its request alone decides: the answer is the same whatever else the server
# was asked (lossless decoding, exact prefix reuse), so these say nothing about other clients.
OWN_STATS = ("engine", "prompt_tokens", "n_tokens")


def eagle_stats(result: dict, expose: bool = False) -> dict:
    """The generated token ids and the statistics a response may carry. Most statistics depend on other
    clients' requests: the prefix reused from the cache and the prefill time tell whether another request just
    sent the same text, and τ, tree sizes and timings follow a tree budget that learns from every request. So
    by default only :data:`OWN_STATS`; ``expose`` (``serve --expose-stats``, for a single user) gives all."""
    stats = result["stats"] if expose else {k: result["stats"][k] for k in OWN_STATS if k in result["stats"]}
    detail = {"finish_detail": result["finish_detail"]} if "finish_detail" in result else {}  # why it ended early
    return {**stats, "tokens": result["tokens"], **detail}
