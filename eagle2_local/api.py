"""The public Python API, shaped like llama-cpp-python's ``Llama`` so its users feel at home.

    from eagle2_local import Eagle2
    llm = Eagle2()                       # built-in default model (and default head once one ships)
    out = llm.create_completion("Q: 2+2? A:", max_tokens=16, temperature=0)
    print(out["choices"][0]["text"], out["eagle"]["tau"])

Returned dicts follow the OpenAI / llama-cpp-python shapes; ``stream=True`` yields chunks of the same shapes.
Each result also carries an ``eagle`` field with the speculative statistics (τ, target passes, tokens/s).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Callable, Iterator, Sequence

from .budget import TreeBudget
from .chat import prompt_tokens, render_for_model
from .drafts import DraftModelEngine, check_same_vocab
from .drafts.open_head import check_head_fits, open_head, read_head_info, target_settings_for
from .errors import Eagle2Error
from .generator import Generator
from .costs import CostKey, cached_or_measured, file_identity
from .llama import ContextSettings, LlamaModel, system_info
from .microbench import check_costs, measure_costs
from .models import default_head_path, resolve_model
from .rpc import parse_servers
from .sampling import SamplingParams
from .target import Target
from .tree import TreeParams

log = logging.getLogger(__name__)


class Eagle2:
    """A target model with an optional draft (draft model or EAGLE head), ready to generate."""

    def __init__(self, model_path: str | os.PathLike | None = None, head_path: str | os.PathLike | None = None,
                 draft_model_path: str | os.PathLike | None = None, *, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int | None = None, seed: int | None = None,
                 total_tokens: int | None = None, depth: int = 6, tree_top_k: int = 10, plain: bool = False,
                 verbose: bool = False, budget: str | None = None, recalibrate: bool = False,
                 progress: Callable[[str], None] | None = None,
                 rpc_servers: str | Sequence[str] | None = None) -> None:
        """``rpc_servers``: llama.cpp RPC servers (``"HOST:PORT,..."`` or a list) that receive ``n_gpu_layers``
        layers (default: all) of the target and of the draft model / EAGLE-3 head; without servers
        ``n_gpu_layers`` (default 0) goes to a CUDA/Metal build's GPU. ``budget``: "auto" sizes each round's
        tree by measured cost and expected acceptance (at most ``total_tokens`` nodes, default 60); "fixed"
        verifies ``total_tokens`` nodes every round (EAGLE-2). Default: "fixed" when ``total_tokens`` is
        given, else "auto". ``recalibrate`` re-measures the costs instead of reading them from the cache;
        ``progress`` receives the calibration's progress lines."""
        mode = budget or ("fixed" if total_tokens is not None else "auto")
        if mode not in ("auto", "fixed"):
            raise Eagle2Error(f"budget must be 'auto' or 'fixed', got {budget!r}")
        total_tokens = 60 if total_tokens is None else total_tokens
        self.budget_mode = mode
        if head_path is not None and draft_model_path is not None:
            raise Eagle2Error("give either a head or a draft model, not both")
        if model_path is None and head_path is None and draft_model_path is None:
            head_path = default_head_path()  # the default model comes with its trained head
        head_info = read_head_info(head_path) if head_path is not None and not plain else None
        self.model_path = resolve_model(model_path)
        self.tree_params = TreeParams(total_tokens=total_tokens, depth=depth, top_k=tree_top_k)
        n_seq = min(256, max(3, self.tree_params.total_tokens + 2))
        self.settings = ContextSettings(n_ctx=n_ctx, n_batch=max(n_batch, total_tokens), n_seq_max=n_seq,
                                        n_threads=n_threads)
        self.rpc_servers = parse_servers(rpc_servers)
        offload = dict(n_gpu_layers=n_gpu_layers, verbose=verbose, rpc_servers=self.rpc_servers)
        self.model = LlamaModel(self.model_path, **offload)
        if head_info is not None:
            check_head_fits(head_info, self.model)  # before any context exists
            self.settings = target_settings_for(head_info, self.settings)
        self.target = Target(self.model, self.settings)
        self.draft_model: LlamaModel | None = None
        engine = None
        if head_info is not None:
            engine = open_head(head_info, self.target, self.tree_params, **offload)
        if draft_model_path is not None and not plain:
            path = resolve_model(draft_model_path)
            self.draft_model = self.model if path.resolve() == self.model_path.resolve() else \
                LlamaModel(path, **offload)
            check_same_vocab(self.model, self.draft_model)
            engine = DraftModelEngine(self.draft_model, self.settings, tree_top_k, depth)
        tree_budget = None
        if engine is not None and mode == "auto":
            tree_budget = self._tree_budget(engine, self.model.n_gpu_layers, recalibrate, progress)
        self.generator = Generator(self.target, engine, self.tree_params, budget=tree_budget)
        self.seed = seed

    def _tree_budget(self, engine, n_gpu_layers: int, recalibrate: bool,
                     progress: Callable[[str], None] | None) -> TreeBudget:
        """The auto budget, with costs from the on-disk cache (checked by a quick timing) or a fresh calibration
        (a few seconds; cached only if it passed its consistency checks)."""
        import llama_cpp

        p = self.tree_params
        key = CostKey(model=file_identity(self.model_path),
                      draft=file_identity(getattr(engine, "weights_path", None)) or engine.name,
                      build=f"{llama_cpp.__version__} {system_info().strip()}", threads=self.settings.threads(),
                      n_gpu_layers=n_gpu_layers, tree_top_k=p.top_k,
                      extra={"engine": engine.name, "max_nodes": p.total_tokens, "depth": p.depth,
                             **({"rpc": list(self.rpc_servers)} if self.rpc_servers else {})})
        costs, info = cached_or_measured(key, lambda: measure_costs(self.target, engine, p, progress),
                                         refresh=recalibrate, check=lambda c: check_costs(self.target, c, p))
        return TreeBudget(costs, max_nodes=p.total_tokens, max_depth=p.depth,
                          calibration={**info, **costs.summary()})

    # ------------------------------------------------------------------ info
    @property
    def speculative(self) -> bool:
        return self.generator.engine is not None

    @property
    def engine_name(self) -> str:
        return self.generator.engine.name if self.generator.engine is not None else "plain"

    def n_ctx(self) -> int:
        return self.target.n_ctx

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids, like ``Llama.tokenize`` (BOS added when the model wants one and ``add_bos``)."""
        return self.model.tokenize(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: list[int], special: bool = False) -> bytes:
        return self.model.detokenize(tokens, special=special)

    def reset(self) -> None:
        """Forget the KV cache (the next call prefills from scratch)."""
        self.generator.reset()

    # ------------------------------------------------------------------ completion
    def create_completion(self, prompt: str | list[int], max_tokens: int | None = 16, temperature: float = 0.8,
                          top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, repeat_penalty: float = 1.0,
                          stop: str | list[str] | None = None, seed: int | None = None, stream: bool = False,
                          speculative: bool | None = None):
        """Complete ``prompt``. Returns an OpenAI ``text_completion`` dict, or an iterator of chunks."""
        tokens = prompt if isinstance(prompt, list) else prompt_tokens(self.model, prompt)
        chunks = self._run(tokens, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, stop, seed,
                           speculative)
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        if stream:
            return self._stream_completion(chunks, cid, created)
        text, reason = _collect(chunks)
        return {
            "id": cid, "object": "text_completion", "created": created, "model": str(self.model_path),
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}],
            "usage": self._usage(), "eagle": self.stats(),
        }

    def create_chat_completion(self, messages: list[dict], max_tokens: int | None = None, temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               repeat_penalty: float = 1.0, stop: str | list[str] | None = None,
                               seed: int | None = None, stream: bool = False, speculative: bool | None = None):
        """Answer a conversation rendered with the model's chat template; OpenAI ``chat.completion`` shapes."""
        tokens = self.chat_tokens(messages)
        chunks = self._run(tokens, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, stop, seed,
                           speculative)
        cid, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())
        if stream:
            return self._stream_chat(chunks, cid, created)
        text, reason = _collect(chunks)
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": str(self.model_path),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": reason}],
            "usage": self._usage(), "eagle": self.stats(),
        }

    def render_chat(self, messages: list[dict]) -> str:
        """The prompt text the chat template makes of ``messages`` (with the generation prompt)."""
        return render_for_model(self.model, messages)

    def chat_tokens(self, messages: list[dict]) -> list[int]:
        """Prompt tokens for ``messages``: the rendered template, with BOS unless the template wrote one."""
        return prompt_tokens(self.model, self.render_chat(messages))

    def stats(self) -> dict:
        """Statistics of the last generation (the ``eagle`` field of results)."""
        return self.generator.last_stats.as_dict()

    # ------------------------------------------------------------------ internals
    def _run(self, tokens, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, stop, seed, speculative):
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                  repeat_penalty=repeat_penalty)
        if max_tokens is None or max_tokens <= 0:
            max_tokens = self.target.n_ctx - len(tokens)
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        return self.generator.generate(list(tokens), max_tokens, sampling, stop=stops,
                                       seed=self.seed if seed is None else seed, speculative=speculative)

    def _usage(self) -> dict:
        s = self.generator.last_stats
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.n_tokens,
                "total_tokens": s.prompt_tokens + s.n_tokens}

    def _stream_completion(self, chunks, cid: str, created: int) -> Iterator[dict]:
        for ch in chunks:
            if not ch.text and ch.finish_reason is None:
                continue
            yield {"id": cid, "object": "text_completion", "created": created, "model": str(self.model_path),
                   "choices": [{"text": ch.text, "index": 0, "logprobs": None, "finish_reason": ch.finish_reason}]}

    def _stream_chat(self, chunks, cid: str, created: int) -> Iterator[dict]:
        def chunk(delta: dict, reason: str | None) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": str(self.model_path),
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}

        yield chunk({"role": "assistant"}, None)
        reason = None
        for ch in chunks:
            if ch.text:
                yield chunk({"content": ch.text}, None)
            reason = ch.finish_reason or reason
        yield chunk({}, reason or "stop")

    def close(self) -> None:
        """Free the llama.cpp contexts and models."""
        if self.generator.engine is not None:
            self.generator.engine.close()
        self.target.close()
        if self.draft_model is not None and self.draft_model is not self.model:
            self.draft_model.close()
        self.model.close()

    def __enter__(self) -> "Eagle2":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _collect(chunks) -> tuple[str, str | None]:
    """Run a chunk stream to the end: the whole text and the finish reason."""
    text, reason = "", None
    for ch in chunks:
        text += ch.text
        reason = ch.finish_reason or reason
    return text, reason
