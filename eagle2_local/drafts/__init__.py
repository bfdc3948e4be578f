"""Draft engines: whatever proposes the tree's tokens. The generator only sees :class:`DraftEngine`."""

from .base import DraftEngine
from .draft_model import DraftModelEngine, check_same_vocab

__all__ = ["DraftEngine", "DraftModelEngine", "check_same_vocab"]
