"""Which draft runs next to a target: a :class:`DraftSpec` names it, :func:`prepare_draft` checks it against the
target model and says what the target context must provide, and :meth:`PreparedDraft.open` builds its engine on
that context (what ``Eagle2`` does); :func:`open_draft` does both for a target made by hand (scripts, tests).

Opening a draft has two steps because some drafts shape the target's own context: an EAGLE head needs the
target to expose its hidden states, so the head is checked against the target *model* and says which
features it needs before the target context exists (:func:`prepare_draft`); the engine is built once the
target is there. Each kind of draft is one :class:`DraftKind` in :data:`DRAFTERS`: a new drafter is its
module (engine plus a ``prepare`` function) and one line there.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..decoding.target import Target
from ..errors import Eagle2Error
from ..formats.models import read_gguf_info, resolve_model
from ..llamacpp.llama import LlamaModel
from ..llamacpp.settings import ContextSettings
from ..tree.draft_tree import TreeParams
from .assistant import AssistantEngine, check_assistant_fits
from .base import DraftEngine
from .draft_model import DraftModelEngine, check_same_vocab
from .lookup import LookupDraft
from .merged import MergedDraft
from .mtp import MtpEngine, check_mtp
from .open_head import check_head_fits, open_head, read_head_info, target_settings_for
from .renames import RenameLearner
from .text_copy import TextCopy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftSpec:
    """A draft to run: its kind (a key of :data:`DRAFTERS`) and the file its weights are in, if any."""

    kind: str
    path: Path | None = None

    @classmethod
    def parse(cls, text: str) -> "DraftSpec":
        """``KIND:PATH`` (``head:h.gguf``, ``draft-model:d.gguf``, ``assistant:a.gguf``) or ``KIND`` alone
        (``lookup``)."""
        kind, _, path = text.partition(":")
        return cls(kind, Path(path).expanduser() if path else None)

    def __str__(self) -> str:
        return f"{self.kind}:{self.path}" if self.path is not None else self.kind


def draft_spec(head: str | os.PathLike | None = None,
               draft_model: str | os.PathLike | None = None) -> DraftSpec | None:
    """The spec for the runtime's two draft options (an EAGLE head file, a same-vocabulary draft GGUF)."""
    if head is not None and draft_model is not None:
        raise Eagle2Error("give either a head or a draft model, not both")
    if head is not None:
        return DraftSpec("head", Path(head).expanduser())
    if draft_model is not None:
        return DraftSpec("draft-model", Path(draft_model).expanduser())
    return None


# builds the engine once the target exists: open(target, tree_params) -> engine
Opener = Callable[[Target, TreeParams], DraftEngine]


@dataclass(frozen=True)
class PreparedDraft:
    """A draft checked against the target model: the target context settings it needs, and its opener."""

    settings: ContextSettings
    open: Opener


@dataclass(frozen=True)
class DraftKind:
    """One kind of draft. ``prepare(spec, target_model, settings, offload)`` checks that the draft fits the
    target (refusing with a one-line error if not), adjusts the target's context settings to what the draft
    reads, and returns the opener. ``offload``: how to load weights (``LlamaModel``'s ``n_gpu_layers``,
    ``verbose``, ``rpc_servers``), the same as the target's."""

    prepare: Callable[[DraftSpec, LlamaModel, ContextSettings, dict[str, Any]], PreparedDraft]
    needs_file: bool = True  # False: the draft has no weights (a lookup in the text)


def _prepare_head(spec: DraftSpec, model: LlamaModel, settings: ContextSettings,
                  offload: dict[str, Any]) -> PreparedDraft:
    info = read_head_info(spec.path)
    check_head_fits(info, model)  # before any context exists
    return PreparedDraft(target_settings_for(info, settings),
                         lambda target, params: open_head(info, target, params, **offload))


def _prepare_draft_model(spec: DraftSpec, model: LlamaModel, settings: ContextSettings,
                         offload: dict[str, Any]) -> PreparedDraft:
    path = resolve_model(spec.path)
    own = path.resolve() != model.path.resolve()  # the target drafting for itself shares its weights
    draft = LlamaModel(path, **offload) if own else model
    try:
        check_same_vocab(model, draft)
        if draft.recurrent or draft.hybrid:  # its context holds a tree's branches as sequences, one state each
            raise Eagle2Error(f"{path.name} is a {draft.memory_kind} model ('{draft.architecture}'): a draft model "
                              "grows trees in its own context, which needs attention layers only; use --draft lookup")
    except Exception:
        if own:
            draft.close()
        raise

    def open_engine(target: Target, params: TreeParams) -> DraftEngine:
        try:
            return DraftModelEngine(draft, target.ctx.settings, params.top_k, params.depth, owns_model=own)
        except Exception:
            if own:
                draft.close()
            raise
    return PreparedDraft(settings, open_engine)


def _prepare_mtp(spec: DraftSpec, model: LlamaModel, settings: ContextSettings,
                 offload: dict[str, Any]) -> PreparedDraft:
    check_mtp(model)  # before any context exists: the target context must expose its hidden states
    return PreparedDraft(replace(settings, nextn_features=True),
                         lambda target, params: MtpEngine(target.model, target.ctx, params.top_k, params.depth))


def _prepare_assistant(spec: DraftSpec, model: LlamaModel, settings: ContextSettings,
                       offload: dict[str, Any]) -> PreparedDraft:
    path = resolve_model(spec.path)
    info = read_gguf_info(path)
    check_assistant_fits(info, model)  # before its weights load: the target must be Gemma 4, the shapes its own
    assistant = LlamaModel(path, info=info, **offload)

    def open_engine(target: Target, params: TreeParams) -> DraftEngine:
        try:
            return AssistantEngine(assistant, target.ctx, params.top_k, params.depth)
        except Exception:
            assistant.close()
            raise
    # the target context exposes its post-norm hidden states, which the assistant reads beside each root
    return PreparedDraft(replace(settings, nextn_features=True), open_engine)


def _prepare_lookup(spec: DraftSpec, model: LlamaModel, settings: ContextSettings,
                    offload: dict[str, Any]) -> PreparedDraft:
    return PreparedDraft(settings, lambda target, params: lookup_draft(target.model, params))


def lookup_draft(model: LlamaModel, tree_params: TreeParams) -> LookupDraft:
    """Lookups in the text, learning the answer's renames and copying quoted text with ``model``'s tokenizer."""
    return LookupDraft(max_branches=tree_params.top_k, renames=RenameLearner.for_model(model),
                       text=TextCopy.for_model(model))


DRAFTERS: dict[str, DraftKind] = {
    "head": DraftKind(_prepare_head),  # an EAGLE-1/2 or EAGLE-3 head GGUF (eagle2-local convert / train)
    "draft-model": DraftKind(_prepare_draft_model),  # a smaller GGUF with the target's vocabulary
    "lookup": DraftKind(_prepare_lookup, needs_file=False),  # n-gram lookups in the prompt and the answer so far
    "mtp": DraftKind(_prepare_mtp, needs_file=False),  # the target's own MTP (NextN) layers (load_mtp)
    "assistant": DraftKind(_prepare_assistant),  # a Gemma 4 target's own drafter GGUF (gemma4-assistant)
}


def with_lookup(engine: DraftEngine, tree_params: TreeParams, model: LlamaModel) -> DraftEngine:
    """``engine`` with lookup branches merged into its trees (a lookup draft stays as it is); ``model``: the
    target, whose tokenizer the lookup's renames need."""
    if engine.lookup is not None:
        return engine
    return MergedDraft(engine, tree_params.top_k, lookup_draft(model, tree_params))


def prepare_draft(spec: DraftSpec, model: LlamaModel, settings: ContextSettings, **offload: Any) -> PreparedDraft:
    """Check ``spec`` against the target model; the target settings it needs and its opener. ``offload``:
    ``LlamaModel``'s weight-loading options (``n_gpu_layers``, ``verbose``, ``rpc_servers``)."""
    kind = DRAFTERS.get(spec.kind)
    if kind is None:
        raise Eagle2Error(f"unknown draft kind {spec.kind!r}; known: {', '.join(DRAFTERS)}")
    if spec.path is None and kind.needs_file:
        raise Eagle2Error(f"a {spec.kind} draft needs a file ({spec.kind}:PATH)")
    if spec.path is not None and not kind.needs_file:
        raise Eagle2Error(f"a {spec.kind} draft reads no file; give just {spec.kind!r}")
    return kind.prepare(spec, model, settings, offload)


def open_draft(spec: DraftSpec, target: Target, tree_params: TreeParams, **offload: Any) -> DraftEngine:
    """The engine for ``spec`` next to ``target``, whose context must provide what the draft reads (make it
    with :func:`prepare_draft`'s settings; a feature-fed head on a context without them is refused)."""
    prepared = prepare_draft(spec, target.model, target.ctx.settings, **offload)
    if prepared.settings != target.ctx.settings:
        raise Eagle2Error(f"the target context lacks what {spec} reads: create it with prepare_draft's settings")
    return prepared.open(target, tree_params)
