"""Draft engine: a neural draft (EAGLE head or draft model) and a lookup draft proposing into one tree.

Other runtimes *switch* between a lookup draft and a model draft. Here both propose children for every node
the tree builder expands, and EAGLE-2's global re-rank by path confidence picks the nodes to verify among all
of them: the model draft still leads where it is confident, a span the text repeats joins as a branch. A token
both propose is one child, with the higher of the two probabilities (each draft's own estimate of its chance).

The model runs every expanded node, lookup children included, so it always holds the state of a frontier
node's parent (its KV sequences stay a tree), and its ``commit`` sees the accepted nodes it ran, a prefix of
the accepted path, as it would without the lookup.

A lookup continuation the model did not propose (a lookup-only child) is the lookup's word against the model's.
The lookup's rates are learned over all the text, where the model often proposes the same token; where the
model disagrees the lookup is right less often, the more so the weaker its match. So a lookup-only child's
probability p is weighed as p * p times odds learned from the rounds (:class:`LookupOnlyOdds`). And no lookup
entry may claim more than the model's row leaves to it (:func:`_weighed`): where a confident model
proposes other tokens, a lookup branch must not push its sure chain out of a small tree.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..tree.proposals import LOOKUP, Proposals, merge_row
from .base import DraftEngine
from .lookup import ROOT, LookupDraft, Rows

MIN_ODDS = 0.05  # the odds of a lookup-only child never fall below this (they can come back)
MIN_PROB = 1e-6  # a lookup-only child the model's row leaves no room for stays a (last) candidate


def weigh_into(model: Proposals, rows: Rows, odds: list[float], band: Callable[[float], int]
               ) -> dict[int, tuple[list[int], list[float]]]:
    """Merge the lookup's ``rows`` into the model's rows (changed in place, :func:`merge_row`), each entry weighed
    beside the model's row (:func:`_weighed`); returns, per row, its lookup-only children (tokens and unweighed
    probabilities). ``odds``: :meth:`LookupOnlyOdds.factors`, ``band``: :meth:`LookupOnlyOdds.band`."""
    left = None
    only: dict[int, tuple[list[int], list[float]]] = {}
    for r, (row, row_probs) in enumerate(zip(*rows)):
        if not row:
            continue
        if left is None:  # what each row's model leaves to others
            left = [1.0 - mass for mass in model.row_mass()]
        tokens, log_probs = model.tokens[r], model.log_probs[r]
        column = dict(zip(tokens, range(len(tokens))))
        room = max(left[r], 0.0)
        entries = []
        for tok, p in zip(row, row_probs):
            j = column.get(tok)
            if j is None:
                only.setdefault(r, ([], []))
                only[r][0].append(tok)
                only[r][1].append(p)
            p = _weighed(p, None if j is None else log_probs[j], room, odds, band)
            if p > 0.0:
                entries.append((tok, math.log(p), LOOKUP))
        merge_row(tokens, log_probs, model.sources[r], entries, column)
    return only


def _weighed(p: float, model_log_prob: float | None, room: float, odds: list[float],
             band: Callable[[float], int]) -> float:
    """A lookup entry's probability beside the model's row: a lookup-only child's (``model_log_prob`` None) p
    becomes ``min(p, p * p * odds)`` (:class:`LookupOnlyOdds`) within the row's ``room``; a token the model proposes
    too is worth at most its own probability plus the room (the merge keeps the higher of this and the model's).
    A row's probabilities sum to at most 1, so where the model gives its other tokens mass M, a token is worth at
    most 1 - M: a confident draft model rules out the continuations it did not propose, and a lookup match the
    answer does not follow must not outrank its sure chain."""
    if model_log_prob is None:
        return max(min(p * min(1.0, p * odds[band(p)]), room), MIN_PROB)
    return min(p, room + math.exp(model_log_prob))


class LookupOnlyOdds:
    """What a lookup-only child (a continuation the model did not propose) is worth: its lookup probability p
    becomes p * p * odds, at most p.

    The lookup's rates are learned over all the text, mostly where the model proposes the same token; where the
    model disagrees, a weak match is rarely right and a long one nearly as often as the lookup says: measured, such
    children came next about p * p of the time at every p (NOTES.md#lookup-drafts). The odds are that rule's hits
    over its expected hits, learned from the rounds apart for each band of p (``edges``: a prose answer's weak
    matches miss where its copied spans hit), starting at 1 with ``prior`` expected hits; counts are capped at
    ``max_expected``, so recent rounds weigh most."""

    def __init__(self, prior: float = 1.0, max_expected: float = 32.0, edges: tuple[float, ...] = (0.3, 0.7)) -> None:
        self.edges = edges
        self.hits = [prior] * (len(edges) + 1)
        self.expected = [prior] * (len(edges) + 1)
        self.max_expected = max_expected

    def band(self, p: float) -> int:
        return sum(p >= edge for edge in self.edges)

    def odds(self, band: int) -> float:
        return max(self.hits[band] / self.expected[band], MIN_ODDS)

    def factors(self) -> list[float]:
        """Per band, the odds (read once per tree level: a child's factor is then ``min(1, p * odds)``)."""
        return [self.odds(b) for b in range(len(self.expected))]

    def observe(self, tokens: list[int], probs: list[float], next_token: int) -> None:
        """One row's lookup-only children (tokens, lookup probabilities) and the token that came next."""
        for tok, p in zip(tokens, probs):
            b = self.band(p)
            self.expected[b] += p * p
            self.hits[b] += float(tok == next_token)
            if self.expected[b] > self.max_expected:
                shrink = self.max_expected / self.expected[b]
                self.expected[b] *= shrink
                self.hits[b] *= shrink


class MergedDraft(DraftEngine):
    """``neural`` (a model draft) and a :class:`LookupDraft` behind one engine interface."""

    def __init__(self, neural: DraftEngine, top_k: int, lookup: LookupDraft | None = None) -> None:
        self.neural = neural
        self.lookup = lookup if lookup is not None else LookupDraft(max_branches=top_k)
        self.top_k = top_k
        self.name = f"{neural.name}+lookup"
        self.needs_features = neural.needs_features
        self.weights_path = neural.weights_path
        self.draft_model = neural.draft_model
        self.free_part = self.lookup  # costs ~nothing: runs alone in rounds the model draft cannot pay for
        self.odds = LookupOnlyOdds()
        self._only: dict[int, tuple[list[int], list[float]]] = {}  # candidate id -> its lookup-only children
        self._root_at = 0  # the text position of this round's root
        self._pending: list[tuple[tuple[list[int], list[float]], int]] = []  # rows whose next token comes later

    @property
    def n_read(self) -> int:
        """What the model has read: the lookup is always at least as far (rounds may run it alone)."""
        return self.neural.n_read

    @property
    def n_features(self) -> int:
        return self.neural.n_features

    def next_rate(self, tokens: list[int], allowed: Callable[[int], bool] | None = None) -> float:
        return self.lookup.next_rate(tokens, allowed)

    def _merge(self, model_out: Proposals, lookup_rows: Rows, cand_ids: list[int]) -> Proposals:
        """The model's rows (its ``top_k`` best) with the lookup's weighed in; the lookup-only children are kept per
        candidate (unweighed), to be scored once the token after the candidate is known."""
        merged = model_out.best(self.top_k)
        if any(lookup_rows[0]):
            for r, children in weigh_into(merged, lookup_rows, self.odds.factors(), self.odds.band).items():
                self._only[cand_ids[r]] = children
        return merged

    def _score(self, tokens: np.ndarray) -> None:
        """The rows whose next token the text now holds: which of their lookup-only children was that token?"""
        waiting = []
        for (only_tokens, only_probs), at in self._pending:
            if at < len(tokens):
                self.odds.observe(only_tokens, only_probs, int(tokens[at]))
            else:
                waiting.append(((only_tokens, only_probs), at))
        self._pending = waiting

    def reset(self) -> None:
        self.neural.reset()
        self.lookup.reset()
        self._pending = []

    def rollback(self, n_tokens: int) -> None:
        self.neural.rollback(n_tokens)
        self.lookup.rollback(n_tokens)
        self._pending = [(row, at) for row, at in self._pending if at < n_tokens]

    def begin_answer(self, prompt_tokens: int) -> None:
        self.neural.begin_answer(prompt_tokens)
        self.lookup.begin_answer(prompt_tokens)

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        self._score(tokens)
        self._only.clear()
        self._root_at = len(tokens) - 1
        return self._merge(self.neural.catch_up(tokens, features, features_from), self.lookup.catch_up_rows(tokens),
                           [ROOT])

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        return self._merge(self.neural.expand(cand_ids, tokens, parent_ids, level),
                           self.lookup.expand_rows(cand_ids, tokens, parent_ids, level), cand_ids)

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Also keeps, for the root and each accepted node, its lookup-only children and the text position of
        the token that follows it (the next accepted node's, or the target's own next token)."""
        self.neural.commit(accepted_cand_ids)
        self.lookup.commit(accepted_cand_ids)
        path = [ROOT] + np.asarray(accepted_cand_ids).tolist()
        self._pending += [(self._only[c], self._root_at + 1 + i) for i, c in enumerate(path) if c in self._only]
        self._only.clear()

    def close(self) -> None:
        self.neural.close()
        self.lookup.close()
