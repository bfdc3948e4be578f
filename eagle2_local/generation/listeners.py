"""What the generation loop tells those who listen: the draft's times (:class:`DraftTimer`, ``drafting_profile``) and
each round, tree and batch of tokens as it happens (:class:`RoundListener`, a replay's recorder). The loop asks
nothing back, and with no listener it pays nothing for them.
"""

from __future__ import annotations

from typing import Protocol

from ..tree.draft_tree import Candidates
from ..tree_policy import RoundResult


class DraftTimer(Protocol):
    """Hears how long the draft took in each drafted round (``drafting_profile``'s measurements), read from the
    round's :class:`RoundTimes`."""

    def catch_up(self, seconds: float) -> None:
        """The draft ingesting new text, up to the root's output (level 1 of the tree)."""

    def level(self, level: int, seconds: float) -> None:
        """One deeper level grown from the frontier at depth ``level`` (one ``expand`` and its top-k)."""


class RoundListener(Protocol):
    """Hears a generation as it runs (``Generator(listener=...)``; ``benchmarks/budget_replay.py`` records answers'
    rounds and trees with one). Called in the loop: keep it quick, and copy what you keep."""

    def tokens(self, tokens: list[int]) -> None:
        """A batch of tokens handed to the output (the first token; then each round's accepted tokens and the
        target's own), as the loop chose them: a stop string or the token limit may keep some out of the text."""

    def tree(self, root: int, candidates: Candidates) -> None:
        """A drafted round's candidates below ``root``, grown, before its tree is selected from them."""

    def round(self, result: RoundResult) -> None:
        """A round of the speculative loop (a plain step included) done, as the policy and statistics hear it."""
