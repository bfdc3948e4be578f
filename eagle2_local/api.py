"""The public Python API, shaped like llama-cpp-python's ``Llama`` so its users feel at home.

    from eagle2_local import Eagle2
    llm = Eagle2()                       # built-in default model (and default head once one ships)
    out = llm.create_completion("Q: 2+2? A:", max_tokens=16, temperature=0)
    print(out["choices"][0]["text"], out["eagle"]["tau"])

Returned dicts follow the OpenAI / llama-cpp-python shapes; ``stream=True`` yields chunks of the same shapes.
Each result also carries an ``eagle`` field with the speculative statistics (τ, target passes, tokens/s).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .chat.responses import ChatResponse, CompletionResponse, usage
from .chat.templates import check_template, prompt_tokens, render_for_model
from .chat.tool_calls import ToolPlan, plan_tools
from .decoding.grammar import Grammar, response_grammar
from .decoding.stats import GenerationStats
from .decoding.target import Target
from .drafts import DraftEngine, DraftSpec, draft_spec, prepare_draft, with_lookup
from .drafts.history import HistoryIndex, close_history, open_history, recorded
from .drafts.mtp import has_mtp
from .errors import Eagle2Error
from .formats.models import default_head_path, read_gguf_info, resolve_model
from .generation.generator import Chunk, DraftTimer, Generator
from .llamacpp.llama import MAX_SEQ, LlamaModel
from .llamacpp.rpc import parse_servers
from .llamacpp.runtime import system_info
from .llamacpp.settings import ContextSettings
from .measure.cost_cache import CostKey, cached_or_measured, file_identity
from .measure.microbench import check_costs, measure_costs
from .tree.draft_tree import EAGLE2_DEPTH, EAGLE2_TOP_K, EAGLE2_TOTAL_TOKENS, LOOKUP_DEPTH, TreeParams
from .tree.sampling import CHAT_TEMPERATURE, COMPLETION_MAX_TOKENS, DEFAULTS, SamplingParams
from .tree_policy import CostModel, TreeBudget

log = logging.getLogger(__name__)

# Tokens a recurrent / hybrid model's state keeps snapshots of (llama.cpp's n_rs_seq): the draft tokens of the
# longest chain it verifies. Each costs one more copy of the recurrent state (docs/design.md "Recurrent and hybrid models").
CHAIN_TOKENS = 8


class Eagle2:
    """A target model with an optional draft (draft model or EAGLE head), ready to generate."""

    def __init__(self, model_path: str | os.PathLike | None = None, head_path: str | os.PathLike | None = None,
                 draft_model_path: str | os.PathLike | None = None, *, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int | None = None, seed: int | None = None,
                 total_tokens: int | None = None, depth: int | None = None, tree_top_k: int = EAGLE2_TOP_K,
                 plain: bool = False, verbose: bool = False, budget: str | None = None, recalibrate: bool = False,
                 progress: Callable[[str], None] | None = None,
                 rpc_servers: str | Sequence[str] | None = None, draft: DraftSpec | str | None = None,
                 lookup: bool | None = None, draft_timer: DraftTimer | None = None,
                 cache_prompt: bool = False, chat_template: str | None = None,
                 history: bool | HistoryIndex | None = None, history_file: str | os.PathLike | None = None,
                 costs: CostModel | Callable[[CostKey, Callable[[], CostModel]], CostModel] | None = None) -> None:
        """``rpc_servers``: llama.cpp RPC servers (``"HOST:PORT,..."`` or a list) that receive ``n_gpu_layers``
        layers (default: all) of the target and of the draft model / EAGLE-3 head; without servers
        ``n_gpu_layers`` (default 0) goes to a CUDA/Metal build's GPU. ``budget``: "auto" sizes each round's
        tree by measured cost and expected acceptance (at most ``total_tokens`` nodes, default 60); "fixed"
        verifies ``total_tokens`` nodes every round (EAGLE-2). Default: "fixed" when ``total_tokens`` is
        given, else "auto". ``recalibrate`` re-measures the costs instead of reading them from the cache;
        ``progress`` receives the calibration's progress lines.

        The draft: ``head_path`` or ``draft_model_path``, or ``draft`` for any kind (``"head:h.gguf"``, a
        :class:`DraftSpec`, ``"lookup"``, ``"mtp"``: the model's own MTP layers, ``"assistant:a.gguf"``: a Gemma 4
        target's own drafter); none and no ``model_path``: the default model's shipped head; none for a model that
        carries MTP layers: those.
        ``plain``: none, and no speculation at all (not even on the tokens a grammar forces): the baseline.
        ``depth``: draft levels (default 6; 16 for a lookup draft alone, whose levels cost
        nothing). ``lookup``: merge n-gram lookups in the text into the draft's trees (None, the default:
        into a head's or draft model's trees; True: also alone when no other draft is named; False: never).
        ``draft_timer`` hears how long each draft call takes (benchmarks). ``cache_prompt``: the default of
        every call's ``cache_prompt`` (see :meth:`stream`). ``chat_template``: a Jinja chat template used instead
        of the GGUF's (llama-server's ``--chat-template-file``), e.g. one that renders tools. ``costs``: the auto
        budget's calibration given, not read from the cache nor checked: a cost model, or a function of the cache
        key and the measuring function that returns one (benchmarks/budget_replay.py). ``history``: draft from
        earlier answers too (drafts/history.py; True, or a ``HistoryIndex`` to share; off by default, on with a
        ``history_file``, which is loaded now and written at :meth:`close`); only a draft with lookups uses it.
        Every speculative call adds its answer (what was emitted) to :attr:`history`."""
        if chat_template is not None:
            check_template(chat_template)
        mode = budget or ("fixed" if total_tokens is not None else "auto")
        if mode not in ("auto", "fixed"):
            raise Eagle2Error(f"budget must be 'auto' or 'fixed', got {budget!r}")
        total_tokens = EAGLE2_TOTAL_TOKENS if total_tokens is None else total_tokens
        self.budget_mode = mode
        self.plain = plain
        spec = _draft_of(model_path, head_path, draft_model_path, draft)
        self.model_path = resolve_model(model_path)
        info = read_gguf_info(self.model_path)
        if spec is None and model_path is not None and not plain and has_mtp(info):
            spec = DraftSpec("mtp")  # the model's own MTP layers: the default draft of a model that has them
        if spec is None and lookup:
            spec = DraftSpec("lookup")
        if depth is None:  # a lookup's levels cost nothing, and copied spans run long
            depth = LOOKUP_DEPTH if spec is not None and spec.kind == "lookup" and not plain else EAGLE2_DEPTH
        self.tree_params = TreeParams(total_tokens=total_tokens, depth=depth, top_k=tree_top_k)
        n_seq = min(MAX_SEQ, max(3, self.tree_params.total_tokens + 2))
        self.settings = ContextSettings(n_ctx=n_ctx, n_batch=max(n_batch, total_tokens), n_seq_max=n_seq,
                                        n_threads=n_threads)
        self.rpc_servers = parse_servers(rpc_servers)
        offload = dict(n_gpu_layers=n_gpu_layers, verbose=verbose, rpc_servers=self.rpc_servers)
        load_mtp = not plain and spec is not None and spec.kind == "mtp"  # their weights only when they draft
        self.model = LlamaModel(self.model_path, info=info, load_mtp=load_mtp, **offload)
        target = engine = None
        try:
            if self.model.recurrent or self.model.hybrid:
                self._fit_recurrent(plain)
            prepared = None
            if spec is not None and not plain:
                prepared = prepare_draft(spec, self.model, self.settings, **offload)
                self.settings = prepared.settings
            self.target = target = Target(self.model, self.settings)
            engine = prepared.open(self.target, self.tree_params) if prepared is not None else None
            if engine is not None and lookup is not False:
                engine = with_lookup(engine, self.tree_params, self.model)
            tree_budget = None
            if engine is not None and mode == "auto":
                tree_budget = self._tree_budget(engine, self.model.n_gpu_layers, recalibrate, progress, costs)
            self.generator = Generator(self.target, engine, self.tree_params, policy=tree_budget, timer=draft_timer)
            self.history = open_history(engine, history, history_file, self.model)
        except BaseException:  # nobody gets an object to close(): free what was loaded before re-raising
            for opened in (engine, target, self.model):
                if opened is not None:
                    opened.close()
            raise
        self.seed = seed
        self.cache_prompt = cache_prompt
        self.chat_template = chat_template or self.model.info.chat_template

    def _fit_recurrent(self, plain: bool) -> None:
        """Context and tree for a recurrent / hybrid model: one sequence (its memory holds a state per sequence),
        snapshots of the last CHAIN_TOKENS tokens so that a rejected draft is taken back, chains of top-1
        proposals."""
        from dataclasses import replace

        # llama.cpp keeps a batch's last n_rs_seq + 1 tokens in one ubatch, and aborts unless a batch holds more
        n_batch = self.settings.n_batch if plain else max(self.settings.n_batch, CHAIN_TOKENS + 2)
        self.settings = replace(self.settings, n_seq_max=1, n_rs_seq=0 if plain else CHAIN_TOKENS, n_batch=n_batch)
        p = self.tree_params
        self.tree_params = TreeParams(total_tokens=min(p.total_tokens, CHAIN_TOKENS + 1),
                                      depth=min(p.depth, CHAIN_TOKENS), top_k=1)

    def _tree_budget(self, engine: DraftEngine, n_gpu_layers: int, recalibrate: bool,
                     progress: Callable[[str], None] | None, supplied=None) -> TreeBudget:
        """The auto budget, with costs from the on-disk cache (checked by a quick timing) or a fresh calibration
        (a few seconds; cached only if it passed its consistency checks)."""
        import llama_cpp

        p = self.tree_params
        key = CostKey(model=file_identity(self.model_path),
                      draft=file_identity(engine.weights_path) or engine.name,
                      build=f"{llama_cpp.__version__} {system_info().strip()}", threads=self.settings.threads(),
                      n_gpu_layers=n_gpu_layers, tree_top_k=p.top_k,
                      extra={"engine": engine.name, "max_nodes": p.total_tokens, "depth": p.depth,
                             **({"rpc": list(self.rpc_servers)} if self.rpc_servers else {})})
        measure = lambda: measure_costs(self.target, engine, p, progress)  # noqa: E731
        costs, info = (supplied(key, measure) if callable(supplied) else supplied), {"source": "supplied"}
        if supplied is None:
            costs, info = cached_or_measured(key, measure, refresh=recalibrate,
                                             check=lambda c: check_costs(self.target, c, p))
        return TreeBudget(costs, max_nodes=p.total_tokens, max_depth=p.depth,
                          calibration={**info, **costs.summary()}, free_lookup=engine.free_part is not None,
                          model_draft=engine.model_draft, context_of=lambda: self.target.n_past)

    # ------------------------------------------------------------------ info
    @property
    def speculative(self) -> bool:
        return self.generator.engine is not None

    @property
    def engine_name(self) -> str:
        return self.generator.engine.name if self.generator.engine is not None else "plain"

    @property
    def draft_weights(self) -> Path | None:
        """The file the draft's weights came from (None: no draft, or one without a weights file)."""
        engine = self.generator.engine
        return engine.weights_path if engine is not None else None

    @property
    def draft_model(self) -> LlamaModel | None:
        """The draft model, when the draft is a same-vocabulary GGUF (not a head)."""
        engine = self.generator.engine
        return engine.draft_model if engine is not None else None

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

    # ------------------------------------------------------------------ generation
    def generate(self, tokens: Sequence[int], top_k: int = DEFAULTS.top_k, top_p: float = DEFAULTS.top_p,
                 min_p: float = DEFAULTS.min_p, typical_p: float = 1.0, temp: float = DEFAULTS.temperature,
                 repeat_penalty: float = DEFAULTS.repeat_penalty, reset: bool = True, *,
                 max_tokens: int | None = None, stop: str | list[str] | None = None, seed: int | None = None,
                 speculative: bool | None = None, cache_prompt: bool | None = None,
                 grammar: str | Grammar | None = None) -> Iterator[int]:
        """Yield the generated token ids for the prompt ``tokens``, like llama-cpp-python's ``Llama.generate``
        (same leading parameters; ``typical_p`` must stay 1.0).

        ``reset=True`` reuses the KV cache for the longest common prefix, as ``Llama.generate`` does (only where
        that leaves the answer unchanged, unless ``cache_prompt``); ``reset=False`` continues the previous call:
        ``tokens`` follow its prompt and every token it yielded.
        Unlike ``Llama.generate``, the stream ends by itself: at an end-of-generation token (not yielded), a
        ``stop`` string, ``max_tokens`` or a full context. ``stats()`` then describes the generation.
        """
        if typical_p != 1.0:
            raise Eagle2Error("typical_p sampling is not supported (keep typical_p=1.0)")
        prompt = list(tokens) if reset else self.generator.transcript + list(tokens)
        sampling = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                  repeat_penalty=repeat_penalty)
        with contextlib.closing(self.stream(prompt, max_tokens, sampling, stop=stop, seed=seed,
                                            speculative=speculative, cache_prompt=cache_prompt,
                                            grammar=grammar)) as chunks:
            for chunk in chunks:
                yield from chunk.tokens

    def stream(self, tokens: Sequence[int], max_tokens: int | None = None, sampling: SamplingParams | None = None,
               *, stop: str | list[str] | None = None, seed: int | None = None,
               speculative: bool | None = None, cache_prompt: bool | None = None,
               grammar: str | Grammar | None = None,
               cancelled: Callable[[], bool] | None = None) -> Iterator[Chunk]:
        """Stream :class:`~eagle2_local.generation.generator.Chunk` pieces (text, the token ids it came from, and the
        finish reason on the last) for the prompt ``tokens``; what the completion methods and the CLI use.

        ``max_tokens`` None: up to the context's end; ``sampling`` None: greedy; ``seed`` None: the
        model's seed; ``speculative`` None: draft when a draft is attached or a grammar given (never for a
        model opened ``plain``). Closing the stream early trims the KV cache to what was yielded.

        ``cache_prompt`` (None: the model's default, False unless set): as llama-server's option of that name,
        True reuses every cached token the prompt starts with and evaluates the rest in full batches, the
        fastest; but a cached cell computed in another batch shape differs in its last bits, so a T=0 answer can
        then depend on what was asked before. False reuses only cells a fresh evaluation would reproduce bit for
        bit (on a one-thread CPU build: all of them) and evaluates the rest in small aligned batches: the same
        request always gets the same answer, at some cost in prompt time (NOTES.md#lossless).

        ``grammar``: GBNF text (or a :class:`~eagle2_local.decoding.grammar.Grammar`, e.g. from a JSON schema) the answer
        must follow; drafted trees then carry grammar states and tokens the grammar forces are drafted for free,
        with or without a draft (see :meth:`Generator.generate`).

        ``cancelled``: asked between the prompt's batches (a server's "has the client gone?"); a yes stops the
        prompt's evaluation and the first ``next()`` raises :class:`~eagle2_local.errors.PrefillCancelled`."""
        if max_tokens is None:
            max_tokens = self.target.n_ctx - len(tokens)
        if speculative is None and self.plain:
            speculative = False
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        chunks = self.generator.generate(list(tokens), max_tokens, sampling or SamplingParams(temperature=0.0),
                                         stop=stops, seed=self.seed if seed is None else seed, speculative=speculative,
                                         cache_prompt=self.cache_prompt if cache_prompt is None else cache_prompt,
                                         grammar=Grammar(grammar) if isinstance(grammar, str) else grammar,
                                         cancelled=cancelled)
        return chunks if self.history is None or speculative is False else recorded(chunks, self.history, tokens)

    def next_token_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """The target's logits for the token after ``tokens`` (a fresh evaluation: the KV cache is emptied
        before and after)."""
        self.reset()
        try:
            return self.target.prefill(list(tokens), aligned=True).logits[0].copy()
        finally:
            self.reset()

    # ------------------------------------------------------------------ completion
    def create_completion(self, prompt: str | list[int], max_tokens: int | None = COMPLETION_MAX_TOKENS,
                          temperature: float = DEFAULTS.temperature, top_p: float = DEFAULTS.top_p,
                          top_k: int = DEFAULTS.top_k, min_p: float = DEFAULTS.min_p,
                          repeat_penalty: float = DEFAULTS.repeat_penalty, stop: str | list[str] | None = None,
                          seed: int | None = None, stream: bool = False, speculative: bool | None = None,
                          cache_prompt: bool | None = None, grammar: str | Grammar | None = None,
                          response_format: dict | None = None):
        """Complete ``prompt``. Returns an OpenAI ``text_completion`` dict, or an iterator of chunks.
        ``grammar`` (GBNF) or ``response_format`` (``{"type": "json_object"}``, ``{"type": "json_schema",
        "json_schema": {"schema": {...}}}``) constrain the answer, as in llama-cpp-python."""
        tokens = prompt if isinstance(prompt, list) else prompt_tokens(self.model, prompt)
        constraint = response_grammar(grammar=grammar, response_format=response_format)
        chunks = self._run(tokens, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, stop, seed,
                           speculative, cache_prompt, constraint)
        return self._respond(chunks, stream, chat=False)

    def create_chat_completion(self, messages: list[dict], max_tokens: int | None = None,
                               temperature: float = CHAT_TEMPERATURE, top_p: float = DEFAULTS.top_p,
                               top_k: int = DEFAULTS.top_k, min_p: float = DEFAULTS.min_p,
                               repeat_penalty: float = DEFAULTS.repeat_penalty, stop: str | list[str] | None = None,
                               seed: int | None = None, stream: bool = False, speculative: bool | None = None,
                               cache_prompt: bool | None = None, grammar: str | Grammar | None = None,
                               response_format: dict | None = None, tools: list[dict] | None = None,
                               tool_choice: str | dict | None = None, parallel_tool_calls: bool | None = None):
        """Answer a conversation rendered with the model's chat template; OpenAI ``chat.completion`` shapes.
        ``grammar`` / ``response_format`` constrain the answer (see :meth:`create_completion`).

        ``tools`` (OpenAI's function entries) and ``tool_choice`` ("auto" by default with tools, "none",
        "required", ``{"type": "function", "function": {"name": ...}}``): calls come back as
        ``message.tool_calls`` with ``finish_reason`` "tool_calls"; "required" and a named function constrain the
        answer to a call (several with ``parallel_tool_calls``, where the template's format allows) whose
        arguments follow the function's ``parameters`` (:mod:`eagle2_local.chat.tool_calls`)."""
        plan = self.tool_plan(tools, tool_choice, parallel_tool_calls)
        constraint = response_grammar(grammar=grammar, response_format=response_format)
        if plan is not None:
            constraint = plan.constrain(constraint)
        tokens = self.chat_tokens(messages, tools=plan.tools if plan is not None else None)
        chunks = self._run(tokens, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, stop, seed,
                           speculative, cache_prompt, constraint)
        return self._respond(chunks, stream, chat=True, tools=plan)

    def tool_plan(self, tools: list[dict] | None, tool_choice: str | dict | None = None,
                  parallel_tool_calls: bool | None = None) -> ToolPlan | None:
        """What ``tools`` and ``tool_choice`` mean with this model's chat template (None: no tools); refused
        here in one line (:class:`~eagle2_local.chat.tool_calls.ToolError`) when they cannot be used."""
        return plan_tools(self.chat_template, tools, tool_choice, parallel_tool_calls)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text the chat template makes of ``messages`` (with the generation prompt), offering
        ``tools`` when given."""
        return render_for_model(self.model, messages, self.chat_template, tools)

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Prompt tokens for ``messages``: the rendered template, with BOS unless the template wrote one."""
        return prompt_tokens(self.model, self.render_chat(messages, tools))

    def stats(self) -> dict:
        """Statistics of the last generation (the ``eagle`` field of results)."""
        return self.last_stats.as_dict()

    @property
    def last_stats(self) -> GenerationStats:
        """The last generation's statistics (as numbers; :meth:`stats` gives them as a dict)."""
        return self.generator.last_stats

    # ------------------------------------------------------------------ internals
    def _run(self, tokens, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, stop, seed, speculative,
             cache_prompt, grammar=None):
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                  repeat_penalty=repeat_penalty)
        if max_tokens is not None and max_tokens <= 0:
            max_tokens = None  # llama-cpp-python's convention: no limit but the context
        return self.stream(tokens, max_tokens, sampling, stop=stop, seed=seed, speculative=speculative,
                           cache_prompt=cache_prompt, grammar=grammar)

    def _respond(self, chunks: Iterator[Chunk], stream: bool, chat: bool, tools: ToolPlan | None = None):
        """The OpenAI-shaped answer of a completion (``chat``: a chat completion, whose calls are read as
        ``tools`` says): one dict, or a chunk stream."""
        model = str(self.model_path)
        response = ChatResponse(model, tools) if chat else CompletionResponse(model)
        if stream:
            return _stream_chat(chunks, response) if chat else _stream_completion(chunks, response)
        text, reason = _collect(chunks)
        stats = self.stats()
        return response.whole(text, reason, usage=usage(stats), eagle=stats)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, additional_files: Sequence[str] | None = None,
                        local_dir: str | os.PathLike | None = None, local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | os.PathLike | None = None, *, head_repo_id: str | None = None,
                        **kwargs) -> "Eagle2":
        """The model by Hugging Face repository name, with ``Llama.from_pretrained``'s arguments: ``filename`` a
        name or glob (None: llama.cpp's ``-hf`` choice, Q4_K_M first). ``head_repo_id``: an EAGLE head repository,
        converted once for the model. ``local_dir_use_symlinks`` is accepted for the same signature (huggingface_hub
        1.0 dropped it). The rest as :class:`Eagle2`. Needs ``huggingface_hub`` (the ``hub`` extra)."""
        from .hub import head_from_hub, pretrained_file
        model = pretrained_file(repo_id, filename, additional_files, cache_dir, local_dir)
        if head_repo_id is not None:
            kwargs["head_path"] = head_from_hub(head_repo_id, model, cache_dir)
        return cls(model, **kwargs)

    def close(self) -> None:
        """Free the llama.cpp contexts and models (a draft engine closes what it loaded); write the history file."""
        close_history(self.history)
        if self.generator.engine is not None:
            self.generator.engine.close()
        self.target.close()
        self.model.close()

    def __enter__(self) -> "Eagle2":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _draft_of(model_path, head_path, draft_model_path, draft: DraftSpec | str | None) -> DraftSpec | None:
    """The one draft the arguments name; the default model's shipped head when none is named."""
    spec = draft_spec(head_path, draft_model_path)
    if draft is not None:
        if spec is not None:
            raise Eagle2Error("give the draft once: draft, head_path or draft_model_path")
        spec = DraftSpec.parse(draft) if isinstance(draft, str) else draft
    if spec is None and model_path is None:
        head = default_head_path()  # the default model comes with its trained head
        spec = draft_spec(head=head) if head is not None else None
    return spec


def _stream_completion(chunks: Iterator[Chunk], response: CompletionResponse) -> Iterator[dict]:
    """llama-cpp-python's completion stream: the text as it comes, the last chunk with the finish reason."""
    for ch in chunks:
        if ch.text or ch.finish_reason is not None:
            yield response.chunk(response.deltas(ch.text, ch.finish_reason))


def _stream_chat(chunks: Iterator[Chunk], response: ChatResponse) -> Iterator[dict]:
    """llama-cpp-python's chat stream: the role alone, the deltas, then an empty delta with the finish reason."""
    yield response.chunk([response.first(empty_content=False)])
    reason = None
    for ch in chunks:
        for choice in response.deltas(ch.text):
            yield response.chunk([choice])
        reason = ch.finish_reason or reason
    for choice in response.finish(reason or "stop"):
        yield response.chunk([choice])


def _collect(chunks) -> tuple[str, str | None]:
    """Run a chunk stream to the end: the whole text and the finish reason."""
    text, reason = "", None
    for ch in chunks:
        text += ch.text
        reason = ch.finish_reason or reason
    return text, reason
