"""Draft engines: whatever proposes the tree's tokens. The generator only sees :class:`DraftEngine`."""

from .base import DraftEngine
from .draft_model import DraftModelEngine, check_same_vocab
from .eagle1_numpy import Eagle1NumpyEngine
from .open_head import open_head

__all__ = ["DraftEngine", "DraftModelEngine", "Eagle1NumpyEngine", "check_same_vocab", "open_head"]
