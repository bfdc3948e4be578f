"""Self-generated training data: the target's own greedy answers to real user prompts, with their rows.

Why: at inference the head drafts continuations of the *target's own* text. Training contexts written by the
target (instead of by the humans / GPT models of ShareGPT) match that distribution, which is what acceptance
length depends on. Generation and feature extraction are one pass (:meth:`FeatureExtractor.generate`); the
answers are also appended to ``answers.jsonl`` in the cache, so the data can be inspected and reused (after
an interrupted run it may repeat the answers of the shard that was lost).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..chat.templates import prompt_tokens, render_for_model
from ..llamacpp.llama import LlamaModel
from .features import ExtractSettings, FeatureExtractor, fill_cache

log = logging.getLogger(__name__)


def fitting_prompts(model: LlamaModel, prompts: Iterable[list[dict]], max_prompt_tokens: int):
    """(messages, tokens) of each prompt rendered for a reply, skipping prompts longer than the limit."""
    for msgs in prompts:
        tokens = prompt_tokens(model, render_for_model(model, msgs))
        if len(tokens) <= max_prompt_tokens:
            yield msgs, tokens


def self_generate_to_cache(model: LlamaModel, prompts: Iterable[list[dict]], cache: Path,
                           settings: ExtractSettings, *, max_tokens: int, max_new: int = 256,
                           max_prompt_tokens: int = 384, n_threads: int | None = None, n_parallel: int = 16,
                           progress: Callable[[int, int], None] | None = None) -> int:
    """Answer prompts greedily, ``n_parallel`` at once, until the cache holds ``max_tokens`` tokens; return the
    number it holds."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "answers.jsonl").open("a", encoding="utf-8") as answers:
        def answer_all(extractor: FeatureExtractor, items: Iterator[tuple[list[dict], list[int]]]):
            pending: deque[tuple[list[dict], int]] = deque()  # (messages, prompt length) handed out, in order

            def tokens_of() -> Iterator[list[int]]:
                for msgs, tokens in items:
                    pending.append((msgs, len(tokens)))
                    yield tokens

            for rows in extractor.generate_many(tokens_of(), max_new):
                msgs, n_prompt = pending.popleft()
                text = model.detokenize(rows.tokens[n_prompt:])
                answers.write(json.dumps({"messages": msgs + [{"role": "assistant",
                                                               "content": text.decode("utf-8", "replace")}]}) + "\n")
                yield rows

        return fill_cache(model, cache, settings, fitting_prompts(model, prompts, max_prompt_tokens), answer_all,
                          max_tokens=max_tokens, docs_per_shard=16, n_threads=n_threads, progress=progress,
                          n_parallel=n_parallel)
