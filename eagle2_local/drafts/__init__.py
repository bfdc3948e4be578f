"""Draft engines: whatever proposes the tree's tokens. The generator only sees :class:`DraftEngine`;
:func:`prepare_draft` checks one named by a :class:`DraftSpec` against the target, and its `open` builds the engine."""

from .assistant import AssistantEngine
from .base import DraftEngine, Proposals
from .draft_model import DraftModelEngine, check_same_vocab
from .eagle1_numpy import Eagle1NumpyEngine
from .lookup import LookupDraft
from .merged import MergedDraft
from .mtp import MtpEngine
from .ngram import NgramIndex
from .open_head import open_head
from .registry import DRAFTERS, DraftKind, DraftSpec, PreparedDraft, draft_spec, open_draft, prepare_draft, with_lookup

__all__ = ["AssistantEngine", "DRAFTERS", "DraftEngine", "DraftKind", "DraftModelEngine", "DraftSpec",
           "Eagle1NumpyEngine", "LookupDraft", "MergedDraft", "MtpEngine", "NgramIndex", "PreparedDraft",
           "Proposals", "check_same_vocab", "draft_spec", "open_draft", "open_head", "prepare_draft", "with_lookup"]
