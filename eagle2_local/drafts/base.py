"""The one interface every draft engine implements (draft model, EAGLE heads in numpy or llama.cpp, ...).

A round of speculation looks like this from the engine's side:

1. ``catch_up(tokens, features, features_from)``: the whole text so far, ending with the new root (the last
   sampled token); the engine ingests what it has not seen yet. Engines that need target features (EAGLE heads)
   get the target's hidden states of the newly committed positions, the first row being position
   ``features_from``. Returns the draft's :class:`Proposals` at the root (one row).
2. ``expand(cand_ids, tokens, parent_ids, level)`` once per deeper tree level: the k frontier candidates to run
   (Python lists; ids assigned by the tree builder, parents given by id, -1 = the root). Returns one row each.
3. ``commit(accepted_cand_ids)``: which candidates the target accepted, in path order; the engine keeps what it
   can reuse and forgets the rest of the tree.

Every draft returns :class:`~eagle2_local.tree.proposals.Proposals`: a neural draft its whole logit rows
(``Proposals.from_logits``, ranked when the tree reads them) or the top-k llama.cpp's graph took; a drafter that
already *has* its candidates (an n-gram lookup, forced tokens) lists them with their log-probabilities, and must
not fabricate one-hot dense rows. A lookup that knows several continuations proposes them all: the root's row
carries each continuation's first token, and ``expand`` of a node carries the next tokens of the continuations
through that node (the node's path, given by ``parent_ids``, says which), so every continuation becomes a branch of
the tree, ranked against the others by its log-probability.

The target verifies every drafted token, so the output is lossless whatever the draft; its probabilities only
decide which tokens are worth verifying.

A draft may wrap others (a model draft with lookup branches, :mod:`.merged`; any draft under a grammar,
:mod:`.constrained`); the generation loop sees only this interface, and asks about a draft's parts through its
attributes (``free_part``, ``lookup``, ``model_draft``), never its class.

A new drafter is one module with its engine and an opener, plus one line in :data:`.registry.DRAFTERS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from ..errors import TreeError
from ..llamacpp.llama import LlamaModel
from ..tree.proposals import Proposals

__all__ = ["DraftEngine", "Proposals", "TreeSequences", "as_list"]


def as_list(values: np.ndarray | list[int]) -> list[int]:
    """Ids or tokens as a Python list (callers outside the tree may pass arrays)."""
    return values.tolist() if isinstance(values, np.ndarray) else values


class DraftEngine(Protocol):
    """What the generation loop needs from a draft. Engines subclass it for the defaults below (a draft that is
    one model: no free part, no lookup, no free rounds)."""

    name: str
    needs_features: bool
    # Tokens of the committed text the draft has read: its next ``catch_up`` ingests ``tokens[n_read:]`` (the
    # catch-up a tree round would cost, what the tree policy charges for). The one count of it: the generator
    # keeps no copy. None: a draft that reads no text (forced tokens alone), always caught up.
    n_read: int | None
    # Feature-fed engines (``needs_features``) only: the first position whose target feature the draft lacks.
    n_features: int = 0
    weights_path: Path | None = None  # the file the draft's weights came from (keys cached costs, named in reports)
    # A part of this draft that costs ~nothing to run (a merged draft's lookup branches), which a round may run
    # alone when the rest could not pay; None for a draft that is one piece (most of them). A draft that is all
    # free (forced tokens alone) is its own free part: every round of it is a free one.
    free_part: "DraftEngine | None" = None
    # The draft's lookup in the text (a lookup itself, a merged draft's branches): what a free-only round runs
    # (with forced tokens under a grammar); None for a model draft alone.
    lookup: "DraftEngine | None" = None
    model_draft: bool = True  # False: no model runs (a lookup): every round of it is a lookup round
    draft_model: LlamaModel | None = None  # the same-vocabulary GGUF that drafts, if the draft is (or holds) one

    def reset(self) -> None:
        """Forget all text (new conversation)."""

    def rollback(self, n_tokens: int) -> None:
        """Forget everything after the first ``n_tokens`` committed tokens."""

    def begin_answer(self, prompt_tokens: int) -> None:
        """A speculative answer starts after a prompt of ``prompt_tokens`` tokens (a lookup tells matches in the
        prompt from matches in the answer by it; drafts that do not care ignore it)."""

    def next_rate(self, tokens: list[int], allowed: Callable[[int], bool] | None = None) -> float:
        """How sure the draft's lookup is of the token after ``tokens`` (root included), before any tree is drafted
        (the tree policy weighs it); 0.0 for a draft without one. ``allowed``: a grammar's check."""
        return 0.0

    def has_free_round(self) -> bool:
        """Where the policy planned a plain step: would a round of this draft's free proposals (forced tokens under
        a grammar) pay anyway? The target's pick after the plain step is then told to :meth:`target_chose`."""
        return False

    def target_chose(self, token: int) -> None:
        """The target's own token after a plain step at the root :meth:`has_free_round` looked at."""

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        """Ingest the unseen tail of ``tokens`` (the last one is the tree root); return the root's row."""
        raise NotImplementedError

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        """Run the given frontier candidates; return one row each."""
        raise NotImplementedError

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Keep the accepted candidates' state, drop the rest of the tree."""

    def close(self) -> None:
        """Free native resources."""


class TreeSequences:
    """One KV sequence per decoded tree candidate in a draft context, copied from its parent's (metadata only).

    Sequence 0 holds the committed text; a candidate's sequence then holds exactly its ancestors and itself, so
    a tree level can be decoded as one batch with one sequence id per node. Shared by the llama.cpp engines.

    ``pool``: when given, the sequences of two levels back are reused (two pools of ``pool`` ids, alternating
    by level): a level's nodes only need their parents' sequences, which hold every older ancestor too. An
    engine that keeps no per-candidate state past the next level (EAGLE-3: its tree is dropped at commit) then
    needs ``1 + 2 * pool`` sequences instead of one per candidate, which matters where llama.cpp does per-sequence
    work on every decode (in-graph top-k samplers)."""

    def __init__(self, ctx, pool: int | None = None) -> None:
        self.ctx = ctx
        self.pool = pool
        self.seq_of: dict[int, int] = {}  # candidate id -> sequence holding its path
        self._next = 1
        self._level = 0

    @staticmethod
    def needed(width: int, depth: int, recycle: bool) -> int:
        """Sequences a tree of ``width`` frontier nodes and ``depth`` levels needs (sequence 0 included)."""
        return 1 + (2 * width if recycle else width * max(1, depth - 1))

    def assign(self, cand_ids: list[int], parent_ids: list[int]) -> list[int]:
        """Give each candidate a fresh sequence holding its parent's path (-1 = the root, sequence 0); returns
        the sequence ids. Lists: the engines have them as lists already, and take the ids as they are."""
        k = len(cand_ids)
        if self.pool is not None:
            if k > self.pool:
                raise TreeError(f"a tree level of {k} nodes is wider than the draft context's {self.pool}")
            first = 1 + (self._level % 2) * self.pool
            self._level += 1
            seqs = list(range(first, first + k))
            self.ctx.seq_rm_many(seqs)  # nodes two levels up: their children copied what they need
            self._next = max(self._next, first + k)
        else:
            seqs = list(range(self._next, self._next + k))
            if self._next + k > self.ctx.n_seq_max:
                raise TreeError("draft tree wider or deeper than the draft context was created for")
            self._next += k
        self.ctx.seq_cp_many([0 if parent < 0 else self.seq_of[parent] for parent in parent_ids], seqs)
        self.seq_of.update(zip(cand_ids, seqs))
        return seqs

    def forget(self) -> None:
        """Free every tree sequence (the committed text in sequence 0 stays): the context holds no other
        sequences, so one ``seq_keep(0)`` does what a ``seq_rm`` per tree sequence did."""
        if self._next > 1:
            self.ctx.seq_keep(0)
        self.seq_of.clear()
        self._next = 1
        self._level = 0
