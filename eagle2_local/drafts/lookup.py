"""Draft engine: lookup drafts from the text itself (prompt plus everything generated), no model at all.

Summaries, answers over a document, code edits and long chats repeat spans of their own context. For the text's
current suffix the longest n-gram that occurred before (:class:`~.ngram.NgramIndex`) names the continuations that
followed it, and each distinct next token becomes a branch of the draft tree, with the learned confidence of its
match (:class:`~.ngram.MatchConfidence`). Deeper tree levels simply look the suffix up again with the node's path
appended, so a copied span is followed token by token, and the match grows longer (and more confident) as it goes.

Drafting costs a few dictionary lookups per node: the tree budget measures it like any draft and sees ~0.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np

from ..tree.proposals import LOOKUP, Proposals
from .base import DraftEngine, as_list
from .history import HistoryIndex, HistoryRounds
from .ngram import COPY, NgramIndex
from .renames import RenameLearner
from .text_copy import TextCopy

log = logging.getLogger(__name__)


ROOT = -1  # the candidate id of a round's root
# renames are learned while copies matched on FAITHFUL_MATCH tokens go on at least at FAITHFUL_RATE (the
# answer's own learned rate): code edits 0.93-0.99 where they learned renames, summaries 0.60-0.73
# (NOTES.md#lookup-drafts)
FAITHFUL_MATCH, FAITHFUL_RATE = 4, 0.85
TEXT_BELOW = 2  # a node whose token match is shorter takes a text copy's continuations (text_copy.py), if any
# A lookup's own rows: per node, the continuations' tokens and their probabilities, best first (a row may be empty)
Rows = tuple[list[list[int]], list[list[float]]]


class LookupDraft(DraftEngine):
    """A draft engine over an :class:`NgramIndex` of the text: proposals, never dense logits.

    ``renames`` (a :class:`~.renames.RenameLearner`): once the answer has renamed an identifier of the prompt, a
    second index holds the prompt with the rename applied, followed by the answer; each node takes the
    continuations of whichever index matches its context on more tokens (the renamed one on a tie).

    ``text`` (a :class:`~.text_copy.TextCopy`): inside a quoted string of the answer, a node that neither index
    matches on :data:`TEXT_BELOW` tokens takes the continuations of the string's text in the prompt's text,
    where they are surer.

    ``history`` (:meth:`use_history`, a :class:`~.history.HistoryIndex` of earlier answers): a third source,
    whose rows replace a node's where its top continuation is surer (:class:`~.history.HistoryRounds`)."""

    name = "lookup"
    needs_features = False
    model_draft = False

    def __init__(self, max_branches: int = 10, max_n: int = 8, renames: RenameLearner | None = None,
                 text: TextCopy | None = None) -> None:
        self.max_branches = max_branches
        # a row of n LOOKUP sources per width, shared by the rows (no reader changes a draft's rows in place)
        self._sources = [[LOOKUP] * n for n in range(max(max_branches, 1) + 1)]
        self.index = NgramIndex(max_n)
        self.renames = renames
        self.text = text
        self.edited: NgramIndex | None = None  # the prompt with the answer's renames, then the answer
        self._path: dict[int, list[int]] = {}  # candidate id -> tokens from the root's child down to it
        # per index: candidate id (ROOT: the root) -> length of its context's longest match (0: none)
        self._match: dict[int, int] = {}
        self._edited_match: dict[int, int] = {}
        self.history: HistoryRounds | None = None

    def use_history(self, index: HistoryIndex | None) -> None:
        """Draft from ``index``'s earlier answers too (None: no more)."""
        self.history = HistoryRounds(index) if index is not None else None

    @property
    def n_read(self) -> int:
        return len(self.index)

    @property
    def lookup(self) -> "LookupDraft":
        return self

    def reset(self) -> None:
        self.index.clear()
        self._forget_renames()
        self._clear_round()
        if self.text is not None:
            self.text.clear()

    def rollback(self, n_tokens: int) -> None:
        self._clear_round()
        n_tokens = min(n_tokens, len(self.index))
        if self.edited is not None:
            if n_tokens < self.index.answer_from:
                self._forget_renames()
            else:
                self.edited.truncate(self.edited.answer_from + n_tokens - self.index.answer_from)
        if self.text is not None and self.text.started:
            if n_tokens < self.index.answer_from:
                self.text.stop()
            else:
                self.text.truncate(n_tokens - self.index.answer_from)
        self.index.truncate(n_tokens)

    def begin_answer(self, prompt_tokens: int) -> None:
        """An answer starts after ``prompt_tokens`` tokens: matches from there on lie in the answer."""
        self.index.answer_from = prompt_tokens
        self.index.confidence.begin_answer()
        self._forget_renames()
        if self.text is not None:
            self.text.stop()  # it starts when the index has read the prompt

    def _clear_round(self) -> None:
        self._path.clear()
        self._match.clear()
        self._edited_match.clear()
        if self.history is not None:
            self.history.clear()

    def _forget_renames(self) -> None:
        self.edited = None
        self.index.copy_misses = []
        if self.renames is not None:
            self.renames.reset()

    def _extend(self, tokens: list[int]) -> None:
        """Index committed tokens in both texts (the text's own scores the predictions: the renamed one shares
        its confidence); a long copy's miss may reveal a rename (renames.py)."""
        if not tokens:
            return
        if self.history is not None:
            self.history.observe(self.index.text, self.index.answer_from, tokens)
        if self.text is None:
            self.index.extend(tokens)
        else:
            self._extend_text(tokens)
        if self.edited is not None:
            self.edited.extend(tokens, score=False)
        misses, self.index.copy_misses = self.index.copy_misses, []
        if self.renames is None:
            return
        if misses and self._copies_faithfully():
            self.renames.diverged(misses)
        if self.renames.learn(self.index.text, self.index.answer_from):
            self._index_renamed()

    def _copies_faithfully(self) -> bool:
        """Does the answer re-emit its prompt (a code edit), so that a word it changed is a rename? An answer
        that paraphrases (a summary) goes on with a copy of a few tokens far less often, and the words it swaps
        recur nowhere it copies: rebuilding the renamed text for them only costs time between rounds."""
        return self.index.confidence.learned_rate(min(FAITHFUL_MATCH, self.index.max_n), COPY) >= FAITHFUL_RATE

    def _extend_text(self, tokens: list[int]) -> None:
        """Index ``tokens`` and follow the answer's text: each answer token first scores the text copy's
        proposal for it, where a node would have taken one (its token match short, a string open)."""
        index, text = self.index, self.text
        prompt_part = min(len(tokens), max(index.answer_from - len(index), 0))
        if prompt_part:
            index.extend(tokens[:prompt_part])
        if not text.started and len(index) >= index.answer_from:
            text.start(index.text[:index.answer_from])
            for token in index.text[index.answer_from:]:
                text.extend(token)
        for token in tokens[prompt_part:]:
            if text.started:
                value = text.value([])
                if value is not None and self._tail_length(index) < TEXT_BELOW:
                    text.observe(value, token)
                text.extend(token)
            index.extend([token])

    @staticmethod
    def _tail_length(index: NgramIndex) -> int:
        match = index.tail_match()
        return match[0] if match is not None else 0

    def _index_renamed(self) -> None:
        """(Re)build the second index: the prompt with every rename learned so far, then the answer."""
        text, start = self.index.text, self.index.answer_from
        edited = NgramIndex(self.index.max_n, self.index.max_positions)
        edited.confidence = self.index.confidence  # the same text's kind: its rates are learned once
        edited.extend(self.renames.edited(text[:start]), score=False)
        edited.answer_from = len(edited)
        edited.extend(text[start:], score=False)
        self.edited = edited
        log.debug("lookup: renames %s", self.renames.renames)

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None = None, features_from: int = 0) -> Proposals:
        """Index the unseen tail of ``tokens`` (root included); propose the root's children."""
        return self.proposals(*self.catch_up_rows(tokens))

    def next_rate(self, tokens: list[int], allowed: Callable[[int], bool] | None = None) -> float:
        """How sure the text is of the token after ``tokens`` (root included): the rate of its longest
        match's kind and length (:meth:`MatchConfidence.rate`: learned, scaled by the answer's record), 0.0
        without a match. A round's evidence before any tree is drafted, at the price of indexing the tail that the
        round's own catch-up would index anyway. ``allowed`` (a grammar's check): a token it forbids is no
        evidence, as the round would drop it."""
        self._extend(tokens[len(self.index):])
        toks, probs = self._continue([[]], [None], [ROOT], width=1)
        if not toks[0] or (allowed is not None and not allowed(toks[0][0])):
            return 0.0
        return probs[0][0]

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        return self.proposals(*self.expand_rows(cand_ids, tokens, parent_ids, level))

    def catch_up_rows(self, tokens: np.ndarray) -> Rows:
        """:meth:`catch_up` as the lookup's own rows, probabilities (what :class:`~.merged.MergedDraft` weighs)."""
        self._clear_round()
        self._extend(np.asarray(tokens)[len(self.index):].tolist())
        return self._continue([[]], [None], [ROOT])

    def expand_rows(self, cand_ids: np.ndarray | list[int], tokens: np.ndarray | list[int],
                    parent_ids: np.ndarray | list[int], level: int) -> Rows:
        """:meth:`expand` as the lookup's own rows, probabilities (arrays or lists in)."""
        paths = []
        cand_ids, parents = as_list(cand_ids), as_list(parent_ids)
        for cand, tok, parent in zip(cand_ids, as_list(tokens), parents):
            path = (self._path[parent] if parent >= 0 else []) + [int(tok)]
            self._path[cand] = path
            paths.append(path)
        if self.history is not None:
            self.history.expanded(cand_ids, as_list(tokens), parents)
        return self._continue(paths, parents, cand_ids)

    def _continue(self, paths: list[list[int]], parents: list[int | None], cand_ids: list[int],
                  width: int | None = None) -> Rows:
        """Each node's continuations (``paths``: its tokens below the root; ``parents`` None: no bound on its
        match), at most ``width`` (default ``max_branches``), from the index that matches it on more tokens
        (:meth:`_best_of`)."""
        width = max(self.max_branches, 1) if width is None else width
        tokens, probs, found = self._search(self.index, paths, parents, cand_ids, self._match, width)
        if self.edited is not None:
            self._best_of(tokens, probs, found,
                          *self._search(self.edited, paths, parents, cand_ids, self._edited_match, width))
        if self.text is not None and self.text.started:
            self._text_rows(tokens, probs, found, paths, width)
        if self.history is not None:
            self.history.rows(self.index.text[-self.history.index.max_n:], paths, cand_ids, tokens, probs, width)
        return tokens, probs

    def _text_rows(self, tokens: list[list[int]], probs: list[list[float]], found: list[int],
                   paths: list[list[int]], width: int) -> None:
        """Rows of nodes with a short token match replaced by the text copy's, where its top continuation is
        the surer one."""
        for i, n in enumerate(found):
            if n < TEXT_BELOW:
                value = self.text.value(paths[i])
                if value is not None:
                    toks, p = self.text.continuations(value, width)
                    if toks and (not probs[i] or p[0] > probs[i][0]):
                        tokens[i], probs[i] = toks, p

    @staticmethod
    def _search(index: NgramIndex, paths: list[list[int]], parents: list[int | None], cand_ids: list[int],
                matches: dict[int, int], width: int) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """Continuations of the text's tail plus each path in ``index``, and the length of each one's match
        (kept in ``matches`` by candidate id: a node's context is its parent's plus one token, so its match is
        at most one token longer)."""
        tail = index.text[-index.max_n:]
        tokens, probs, found = [], [], []
        for path, parent, cand in zip(paths, parents, cand_ids):
            if parent is None and not path:  # the text's own end
                toks, p = index.proposed(index.tail_match(), width)
            else:
                bound = None if parent is None else matches.get(ROOT if parent < 0 else parent, index.max_n) + 1
                toks, p = index.continuations(tail + path, width, bound)
            tokens.append(toks)
            probs.append(p)
            found.append(index.last_match)
            matches[cand] = index.last_match
        return tokens, probs, found

    @staticmethod
    def _best_of(tokens: list[list[int]], probs: list[list[float]], found: list[int], edited_tokens,
                 edited_probs, edited_found) -> None:
        """Per node, the rows of the index whose match is longer (in place, ``found`` included); the renamed
        text's on a tie (the context just before a renamed identifier reads the same in both texts, and the
        answer renames)."""
        for i, n in enumerate(edited_found):
            if n and n >= found[i]:
                tokens[i], probs[i], found[i] = edited_tokens[i], edited_probs[i], n

    def proposals(self, tokens: list[list[int]], probs: list[list[float]]) -> Proposals:
        """Rows of continuations as :class:`Proposals`: each probability's ``math.log`` (a probability of 0 is no
        entry); continuations rank by count, so each row is best first already. This runs on every level of every
        tree, mostly on one row of one entry, where each Python call counts: the sources are shared rows."""
        log, sources = math.log, self._sources
        try:
            log_probs = [[log(p) for p in row] for row in probs]
        except ValueError:  # the log of a probability of 0: drop those entries
            tokens = [[t for t, p in zip(row, row_probs) if p > 0.0] for row, row_probs in zip(tokens, probs)]
            log_probs = [[log(p) for p in row_probs if p > 0.0] for row_probs in probs]
        return Proposals(tokens, log_probs, [sources[len(row)] for row in tokens])

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Accepted tokens are indexed at the next ``catch_up``, with the rest of the committed text."""
        if self.history is not None:
            self.history.commit(accepted_cand_ids)
        self._clear_round()

    def close(self) -> None:
        self.reset()
