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
entry may claim more than the model's row leaves to it (``MergedDraft._weigh_lookup``): where a confident model
proposes other tokens, a lookup branch must not push its sure chain out of a small tree.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..decoding.tree import BOTH, LOOKUP, DraftOutput, ListRows, Proposals, Rows, top_children
from .base import DraftEngine, as_list
from .lookup import ROOT, LookupDraft

MIN_ODDS = 0.05  # the odds of a lookup-only child never fall below this (they can come back)
MIN_PROB = 1e-6  # a lookup-only child the model's row leaves no room for stays a (last) candidate


def merge_proposals(model: Proposals, lookup: Proposals) -> Proposals:
    """Row-wise union of two drafts' candidates; a token in both keeps the higher log-probability, marked BOTH.

    Each row lists the model's finite candidates, then the lookup's not already listed, in their order (padding
    after them); a token met twice keeps its first place. This runs on every tree level, where a model row is
    usually a top-k (distinct, finite tokens) and the lookup proposes a token or two per row: then only the
    lookup's entries are visited (:func:`_merge_into_top_k`); any other input takes the general merge."""
    if not _is_top_k(model):
        return _merge_general(model, lookup)
    finite = lookup.log_probs != -np.inf
    rows, cols = np.nonzero(finite)  # row by row, in each row's order
    entries: dict[int, list[tuple[int, float, int]]] = {}
    for r, tok, lp, src in zip(rows.tolist(), lookup.tokens[finite].tolist(), lookup.log_probs[finite].tolist(),
                               lookup.sources[finite].tolist()):
        entries.setdefault(r, []).append((tok, lp, src))
    return _merge_into_top_k(model, entries)


def merge_lookup_rows(model: Proposals, lookup: LookupDraft, rows: Rows) -> Proposals:
    """:func:`merge_proposals` of ``model`` and the lookup's rows as it returns them (Python lists), without
    building the lookup's arrays first: each probability's ``math.log``, the value the lookup's own proposals
    hold (a probability of 0 is their padding, never an entry)."""
    tokens, probs = rows
    if not _is_top_k(model):
        return _merge_general(model, lookup.proposals(tokens, probs))
    entries = {r: [(tok, math.log(p), LOOKUP) for tok, p in zip(row, row_probs) if p > 0.0]
               for r, (row, row_probs) in enumerate(zip(tokens, probs)) if row}
    return _merge_into_top_k(model, entries)


def weigh_into_top_k(model: Proposals, rows: Rows, odds: list[float], band: Callable[[float], int]
                     ) -> tuple[Proposals, dict[int, tuple[list[int], list[float]]]] | None:
    """:meth:`MergedDraft._weigh_lookup` then :func:`merge_lookup_rows`, in one pass over the rows the lookup
    proposes in, where every model row is a top-k (None otherwise: the caller takes the two steps). Also returns,
    per row, its lookup-only children (tokens and unweighed probabilities).

    The two steps each turned the model's arrays into lists and built a token map per row, on every tree level;
    here each array becomes a list once and each row has one map. ``odds``: :meth:`LookupOnlyOdds.factors`,
    ``band``: :meth:`LookupOnlyOdds.band`."""
    weighed = weigh_into_lists(model, rows, odds, band)
    if weighed is None:
        return None
    (tokens, log_probs, sources), at, only = weighed
    if not at:
        return model, only
    return _padded(tokens, log_probs, sources, at, model.tokens.shape[1], model.ranked), only


def weigh_into_lists(model: Proposals, rows: Rows, odds: list[float], band: Callable[[float], int]
                     ) -> tuple[ListRows, list[int], dict[int, tuple[list[int], list[float]]]] | None:
    """:func:`weigh_into_top_k`'s rows as Python lists, unpadded (a row the lookup joined is longer than the
    model's k), with the rows it joined and the lookup-only children per row (None: a model row is not a top-k).
    Rows are best first where the model's are (``ranked``)."""
    log_probs = model.log_probs.tolist()
    if not (model.ranked and model.distinct and all(math.isfinite(row[-1]) for row in log_probs)) \
            and not _is_top_k(model):
        return None
    left = (1.0 - np.exp(model.log_probs).sum(axis=1)).tolist()  # what each row's model leaves to others
    tokens, sources = model.tokens.tolist(), model.sources.tolist()
    only: dict[int, tuple[list[int], list[float]]] = {}
    at = []
    for r, (row, row_probs) in enumerate(zip(*rows)):
        if row and _weigh_into_row(tokens[r], log_probs[r], sources[r], row, row_probs, max(left[r], 0.0), odds,
                                   band, only.setdefault(r, ([], []))):
            at.append(r)
            if model.ranked:
                tokens[r], log_probs[r], sources[r] = _best_first(tokens[r], log_probs[r], sources[r])
    return (tokens, log_probs, sources), at, {r: children for r, children in only.items() if children[0]}


def _weigh_into_row(tokens: list[int], log_probs: list[float], sources: list[int], row: list[int],
                    row_probs: list[float], room: float, odds: list[float], band: Callable[[float], int],
                    only: tuple[list[int], list[float]]) -> bool:
    """One model row (a top-k: distinct tokens) with the lookup's row for it, weighed as
    :meth:`MergedDraft._weigh_lookup` weighs it and merged as :func:`_merge_row` merges it (the lists are
    changed in place; ``only`` gets the lookup-only children). Whether any entry joined (a weighed probability
    of 0 is no entry)."""
    column = dict(zip(tokens, range(len(tokens))))
    entries = []
    for tok, p in zip(row, row_probs):
        j = column.get(tok)
        if j is None:
            only[0].append(tok)
            only[1].append(p)
        p = _weighed(p, None if j is None else log_probs[j], room, odds, band)
        if p > 0.0:
            entries.append((tok, math.log(p), LOOKUP))
    _merge_row(tokens, log_probs, sources, entries, column)
    return bool(entries)


def _weighed(p: float, model_log_prob: float | None, room: float, odds: list[float],
             band: Callable[[float], int]) -> float:
    """A lookup entry's probability beside the model's row (:meth:`MergedDraft._weigh_lookup`): a lookup-only
    child's (``model_log_prob`` None) p becomes ``min(p, p * p * odds)`` within the row's ``room``; a token the
    model proposes too is worth at most its own probability plus the room (the merge keeps the higher of this and
    the model's)."""
    if model_log_prob is None:
        return max(min(p * min(1.0, p * odds[band(p)]), room), MIN_PROB)
    return min(p, room + math.exp(model_log_prob))


def _is_top_k(model: Proposals) -> bool:
    """Whether every row is a top-k: finite log-probabilities and distinct tokens (checked on all rows at once,
    or taken from the producer's flags; the merge then visits only the rows the other draft proposes in)."""
    lp = model.log_probs
    if not np.isfinite(lp[:, -1] if model.ranked else lp).all():  # a ranked row's last entry is its least
        return False
    if model.distinct:
        return True
    ordered = np.sort(model.tokens, axis=1)
    return bool((ordered[:, 1:] != ordered[:, :-1]).all())


def _merge_into_top_k(model: Proposals, entries: dict[int, list[tuple[int, float, int]]]) -> Proposals:
    """:func:`merge_proposals` where every model row has distinct finite tokens (:func:`_is_top_k`) and the
    other draft's finite entries are listed per row, in order (row -> token, log-probability, source): the model's
    arrays are the result's first columns, new tokens are appended after them and shared ones raise the
    model's entry and mark it BOTH. The rows become Python lists (three conversions each way for all rows: the
    lookup proposes in most rows, and a numpy call per array and step costs more than the few entries). A
    ``ranked`` model gives ``ranked`` rows: each row the entries are in is then put best first (a stable sort:
    ties keep their columns' order), which is the order the tree's stable ranking would give it, so the tree
    takes every row as it is instead of ranking each level again."""
    at = [r for r, row in entries.items() if row]
    if not at:
        return model
    tokens, log_probs, sources = model.tokens.tolist(), model.log_probs.tolist(), model.sources.tolist()
    for r in at:
        row = _merge_row(tokens[r], log_probs[r], sources[r], entries[r])
        if model.ranked:
            tokens[r], log_probs[r], sources[r] = _best_first(*row)
    return _padded(tokens, log_probs, sources, at, model.tokens.shape[1], model.ranked)


def _padded(tokens: list[list[int]], log_probs: list[list[float]], sources: list[list[int]], at: list[int], k: int,
            ranked: bool) -> Proposals:
    """Merged rows (the rows ``at`` grew past the model's ``k`` columns) as :class:`Proposals` of distinct tokens,
    every row padded to the widest."""
    width = max(len(tokens[r]) for r in at)
    if width > k:
        for tok_row, lp_row, src_row in zip(tokens, log_probs, sources):
            pad = width - len(tok_row)
            tok_row += [0] * pad
            lp_row += [-np.inf] * pad
            src_row += [0] * pad
    return Proposals.trusted(np.array(tokens, dtype=np.int64), np.array(log_probs), np.array(sources, dtype=np.int8),
                             ranked=ranked, distinct=True)


def _merge_row(tokens: list[int], log_probs: list[float], sources: list[int], entries: list[tuple[int, float, int]],
               column: dict[int, int] | None = None) -> tuple[list[int], list[float], list[int]]:
    """One model row (distinct tokens) with the other draft's entries for it: a new token is appended, a token
    already in the row keeps its place with the higher log-probability and becomes BOTH (the lists are changed
    in place and returned). ``column``: the row's token -> column map, if the caller has it."""
    if column is None:
        column = dict(zip(tokens, range(len(tokens))))
    for tok, lp, src in entries:
        j = column.get(tok)
        if j is None:
            column[tok] = len(tokens)
            tokens.append(tok)
            log_probs.append(lp)
            sources.append(src)
        else:
            log_probs[j] = max(log_probs[j], lp)
            sources[j] = BOTH
    return tokens, log_probs, sources


def _best_first(tokens: list[int], log_probs: list[float], sources: list[int]):
    """A row's entries by log-probability, best first; ties keep their order (numpy's stable argsort's order)."""
    order = sorted(range(len(tokens)), key=log_probs.__getitem__, reverse=True)
    return [tokens[j] for j in order], [log_probs[j] for j in order], [sources[j] for j in order]


def _merge_general(model: Proposals, lookup: Proposals) -> Proposals:
    """:func:`merge_proposals` for any input (padding anywhere, a token twice in a row): all rows at once."""
    tokens = np.concatenate([model.tokens, lookup.tokens], axis=1)
    log_probs = np.concatenate([model.log_probs, lookup.log_probs], axis=1)
    sources = np.concatenate([model.sources, lookup.sources], axis=1)
    finite = np.isfinite(log_probs)
    same = (tokens[:, :, None] == tokens[:, None, :]) & finite[:, :, None] & finite[:, None, :]  # (n, m, m)
    first = same.argmax(axis=2)  # the first finite entry with the same token (itself for a finite entry)
    keep = finite & (first == np.arange(tokens.shape[1]))
    best = np.where(same, log_probs[:, None, :], -np.inf).max(axis=2)
    sources = np.where(same.sum(axis=2) > 1, np.int8(BOTH), sources)
    order = np.argsort(~keep, axis=1, kind="stable")  # kept entries first, in their order
    width = max(1, int(keep.sum(axis=1).max(initial=0)))
    order = order[:, :width]
    kept = np.take_along_axis(keep, order, axis=1)
    return Proposals.trusted(np.where(kept, np.take_along_axis(tokens, order, axis=1), 0),
                             np.where(kept, np.take_along_axis(best, order, axis=1), -np.inf),
                             np.where(kept, np.take_along_axis(sources, order, axis=1), 0).astype(np.int8))


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


class MergedDraft:
    """``model`` and a :class:`LookupDraft` behind one engine interface."""

    def __init__(self, model: DraftEngine, top_k: int, lookup: LookupDraft | None = None) -> None:
        self.model = model
        self.lookup = lookup if lookup is not None else LookupDraft(max_branches=top_k)
        self.top_k = top_k
        self.name = f"{model.name}+lookup"
        self.needs_features = model.needs_features
        self.weights_path = model.weights_path
        self.free_part = self.lookup  # costs ~nothing: runs alone in rounds the model draft cannot pay for
        self.odds = LookupOnlyOdds()
        self._only: dict[int, tuple[list[int], list[float]]] = {}  # candidate id -> its lookup-only children
        self._root_at = 0  # the text position of this round's root
        self._pending: list[tuple[tuple[list[int], list[float]], int]] = []  # rows whose next token comes later

    @property
    def n_read(self) -> int:
        """What the model has read: the lookup is always at least as far (rounds may run it alone)."""
        return self.model.n_read

    @property
    def n_features(self) -> int:
        return self.model.n_features

    def _merge(self, model_out: DraftOutput, lookup_rows: Rows, cand_ids: list[int]) -> Proposals:
        model_out = self._top_k(model_out)
        if any(lookup_rows[0]):
            folded = weigh_into_top_k(model_out, lookup_rows, self.odds.factors(), self.odds.band)
            if folded is not None:
                merged, only = folded
                self._keep_only(only, cand_ids)
                return merged
        return merge_lookup_rows(model_out, self.lookup, self._weigh_lookup(model_out, lookup_rows, cand_ids))

    def _merge_lists(self, model_out: DraftOutput, lookup_rows: Rows, cand_ids: list[int]) -> ListRows:
        """:meth:`_merge`'s rows as Python lists, best first (what :func:`~..tree.grow_list_candidates` grows):
        where the model's rows are a ranked top-k (every llama.cpp engine's), the merged rows are never packed into
        arrays; other rows are merged as arrays and ranked as the tree ranks them (by this draft's top_k, the
        tree's)."""
        model_out = self._top_k(model_out)
        rows = self._ranked_lists(model_out, lookup_rows, cand_ids) if model_out.ranked else None
        if rows is not None:
            return rows
        tokens, log_probs, sources = top_children(self._merge(model_out, lookup_rows, cand_ids), self.top_k)
        return tokens.tolist(), log_probs.tolist(), sources.tolist()

    def _ranked_lists(self, model_out: Proposals, lookup_rows: Rows, cand_ids: list[int]) -> ListRows | None:
        """The merged rows of a ranked top-k as lists without arrays: the model's rows as they are where the
        lookup proposes nothing, else the lookup entries weighed into them; None where neither applies (rows
        that are not a top-k, or that the fold cannot take), which the array merge then handles."""
        if not any(lookup_rows[0]):
            if model_out.distinct or _is_top_k(model_out):
                return model_out.tokens.tolist(), model_out.log_probs.tolist(), model_out.sources.tolist()
            return None
        weighed = weigh_into_lists(model_out, lookup_rows, self.odds.factors(), self.odds.band)
        if weighed is None:
            return None
        self._keep_only(weighed[2], cand_ids)
        return weighed[0]

    def _top_k(self, model_out: DraftOutput) -> Proposals:
        return model_out if isinstance(model_out, Proposals) else Proposals.from_logits(model_out, self.top_k)

    def _keep_only(self, only: dict[int, tuple[list[int], list[float]]], cand_ids: list[int]) -> None:
        for r, children in only.items():
            self._only[cand_ids[r]] = children

    def _weigh_lookup(self, model_out: Proposals, rows: Rows, cand_ids: list[int]) -> Rows:
        """The lookup's rows as the merge should weigh them beside the model's: a lookup-only child's probability
        p becomes ``min(p, p * p * odds)`` (:class:`LookupOnlyOdds`), and no lookup entry claims more than the
        model leaves to it: a row's probabilities sum to at most 1, so where the model gives its other tokens
        mass M, a token is worth at most 1 - M (a confident draft model rules out the continuations it did not
        propose; a lookup match the answer does not follow must not outrank its sure chain). The lookup-only
        children are kept per candidate (unweighed), to be scored once the token after the candidate is known.
        One numpy call per tree level, none per node."""
        tokens, probs = rows
        if not any(tokens):
            return rows
        odds, band = self.odds.factors(), self.odds.band
        weighed = list(probs)
        model_tokens, model_log_probs = model_out.tokens.tolist(), model_out.log_probs.tolist()
        left = (1.0 - np.exp(model_out.log_probs).sum(axis=1)).tolist()  # what each row's model leaves to others
        for r, (row, row_probs) in enumerate(zip(tokens, probs)):
            if not row:
                continue
            model_probs = dict(zip(model_tokens[r], model_log_probs[r]))
            room = max(left[r], 0.0)
            only_tokens, only_probs, new_probs = [], [], []
            for tok, p in zip(row, row_probs):
                lp = model_probs.get(tok)
                if lp is None:
                    only_tokens.append(tok)
                    only_probs.append(p)
                new_probs.append(_weighed(p, lp, room, odds, band))
            if only_tokens:
                self._only[cand_ids[r]] = (only_tokens, only_probs)
            weighed[r] = new_probs
        return tokens, weighed

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
        self.model.reset()
        self.lookup.reset()
        self._pending = []

    def rollback(self, n_tokens: int) -> None:
        self.model.rollback(n_tokens)
        self.lookup.rollback(n_tokens)
        self._pending = [(row, at) for row, at in self._pending if at < n_tokens]

    def begin_answer(self, prompt_tokens: int) -> None:
        self.model.begin_answer(prompt_tokens)
        self.lookup.begin_answer(prompt_tokens)

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        return self._merge(*self._catch_up_parts(tokens, features, features_from))

    def catch_up_lists(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> ListRows:
        """:meth:`catch_up` as Python lists, best first."""
        return self._merge_lists(*self._catch_up_parts(tokens, features, features_from))

    def _catch_up_parts(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int):
        self._score(tokens)
        self._only.clear()
        self._root_at = len(tokens) - 1
        return self.model.catch_up(tokens, features, features_from), self.lookup.catch_up_rows(tokens), [ROOT]

    def expand(self, cand_ids: np.ndarray, tokens: np.ndarray, parent_ids: np.ndarray, level: int) -> Proposals:
        return self._merge(*self._expand_parts(as_list(cand_ids), as_list(tokens), as_list(parent_ids), level))

    def expand_lists(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> ListRows:
        """:meth:`expand` from lists, as Python lists, best first (the model draft takes the lists as they are)."""
        return self._merge_lists(*self._expand_parts(cand_ids, tokens, parent_ids, level))

    def _expand_parts(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int):
        return (self.model.expand(cand_ids, tokens, parent_ids, level),
                self.lookup.expand_rows(cand_ids, tokens, parent_ids, level), cand_ids)

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Also keeps, for the root and each accepted node, its lookup-only children and the text position of
        the token that follows it (the next accepted node's, or the target's own next token)."""
        self.model.commit(accepted_cand_ids)
        self.lookup.commit(accepted_cand_ids)
        path = [ROOT] + np.asarray(accepted_cand_ids).tolist()
        self._pending += [(self._only[c], self._root_at + 1 + i) for i, c in enumerate(path) if c in self._only]
        self._only.clear()

    def close(self) -> None:
        self.model.close()
        self.lookup.close()
