"""The target features a feature-fed draft engine (an EAGLE head) has not been handed yet.

An EAGLE head reads, for every committed position, the target's hidden state there. The target computes those
states while it verifies (or plainly decodes) the text; the head is handed them at its next ``catch_up``. In
between they wait here: the rows of the last round's accepted path, of plain decoding steps the draft sat
out, and, across calls, of text a later prompt reuses from the KV cache.
"""

from __future__ import annotations

import numpy as np


class FeatureBacklog:
    """Feature rows for consecutive positions ``start, start + 1, ...`` (how far the engine has read the text
    is the engine's own ``n_read``).

    Rows are gathered one decoding step at a time and concatenated only when handed over: appending to one
    array would copy the whole backlog (thousands of floats per token) at every plain step.
    """

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self.start = 0

    def restart(self, rows: np.ndarray | None, at: int) -> None:
        """The engine took everything before ``at``: the backlog is now ``rows`` from position ``at``."""
        self._chunks = [] if rows is None else [rows]
        self.start = at

    def extend(self, rows: np.ndarray | None) -> None:
        """Rows of the next positions (a plain decoding step); ignored when nothing is being gathered."""
        if rows is not None and self._chunks:
            self._chunks.append(rows)

    def take(self) -> tuple[np.ndarray | None, int]:
        """The rows (None: none held) and the position of the first, for the engine's ``catch_up``."""
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return (self._chunks[0] if self._chunks else None), self.start

    @property
    def end(self) -> int:
        """One past the last position with a row."""
        return self.start + sum(len(c) for c in self._chunks)

    def reusable(self, keep: int, engine_has: int) -> int:
        """How much cached text a new prompt may keep so the engine still gets every feature it lacks.

        The engine holds features up to ``engine_has``; this backlog covers ``start..end``. If the kept text
        ``keep`` ends inside the backlog, positions from ``start`` on are covered; otherwise only what the
        engine holds is, and the text after ``engine_has`` must be re-evaluated to recompute its features.
        """
        covered = self.start if self._chunks and self.start <= keep <= self.end else keep
        return min(keep, engine_has) if engine_has < covered else keep

    def trim(self, keep: int, new_rows: np.ndarray | None) -> None:
        """The text was cut back to ``keep`` tokens, then ``new_rows`` computed from position ``keep`` on.

        Rows of the previous call that the engine never got are kept when the reused text reaches into them
        (a chat turn after a call whose last round or plain steps it never saw)."""
        rows, start = self.take()
        if new_rows is not None and rows is not None and start < keep <= start + len(rows):
            self.restart(np.concatenate([rows[:keep - start], new_rows]), start)
        else:
            self.restart(new_rows, keep)
