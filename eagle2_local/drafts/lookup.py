"""Draft engine: lookup drafts from the text itself (prompt plus everything generated), no model at all.

Summaries, answers over a document, code edits and long chats repeat spans of their own context. The
:class:`NgramIndex` remembers, for every n-gram of the text (n = 1..``max_n``), the positions right after its
occurrences; it grows by one entry per n for each committed token and shrinks the same way on rollback, so it
never rescans the text. For the current suffix the longest n-gram that occurred before names the continuations
that followed it, and each distinct next token becomes a branch of the draft tree.

A branch's probability is the :class:`MatchConfidence` of its match length (learned online from this text:
how often the most frequent continuation of a match of that length was the token that really came next),
scaled by how often that token followed the match relative to the most frequent one. Deeper tree levels
simply look the suffix up again with the node's path appended, so a copied span is followed token by token,
and the match grows longer (and more confident) as it goes.

Drafting costs a few dictionary lookups per node: the tree budget measures it like any draft and sees ~0.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np

from ..decoding.tree import LOOKUP, Proposals, Rows
from .base import as_list
from .renames import Divergence, RenameLearner
from .text_copy import TextCopy

log = logging.getLogger(__name__)


# What a match is evidence of: a token of the prompt predicted from the prompt (its own repetitiveness), a token
# of the answer predicted from the prompt (copying it: a code edit re-emitting a function) or from the answer so
# far (repeating itself)
PROMPT, COPY, REPEAT = 0, 1, 2
ROOT = -1  # the candidate id of a round's root
LONG_COPY = 3  # a copy matched on at least this many tokens that misses is a divergence (renames.py)
# renames are learned while copies matched on FAITHFUL_MATCH tokens go on at least at FAITHFUL_RATE (the
# answer's own learned rate): code edits 0.93-0.99 where they learned renames, summaries 0.60-0.73
# (NOTES.md#lookup-drafts)
FAITHFUL_MATCH, FAITHFUL_RATE = 4, 0.85
NO_ANSWER = 1 << 62  # answer_from before an answer begins (all text is prompt)
TEXT_BELOW = 2  # a node whose token match is shorter takes a text copy's continuations (text_copy.py), if any


def _priors(max_n: int) -> np.ndarray:
    """Prior hit rates per kind of match (rows PROMPT, COPY, REPEAT) and match length n (columns 0..max_n).

    Copying is the surest: an answer that re-emits a span of its prompt keeps doing so once two or three tokens
    matched (on the code-edit and extraction prompts' tune split, with their reference answers: 0.89 at n = 2,
    0.9-0.97 from n = 3). An answer repeating itself, or a prompt repeating itself, says less at short n."""
    n = np.arange(max_n + 1, dtype=np.float64)
    rise = np.clip((n - 1) / max(max_n - 1, 1), 0.0, 1.0)
    steps = np.maximum(n - 1, 0)
    return np.stack([0.15 + 0.75 * rise, 0.95 - 0.45 * 0.3 ** steps, 0.95 - 0.75 * 0.75 ** steps])


class MatchConfidence:
    """Per kind of match (:data:`PROMPT`, :data:`COPY`, :data:`REPEAT`) and match length n: the rate at which
    the top continuation of such a match was the next token.

    Each kind learns its own rates from the text, starting from :func:`_priors`, which weigh more for long
    matches: a long exact match is strong evidence before the text has said anything (a new answer can draft a
    sure chain in its first rounds). Counts are capped, so recent text weighs most."""

    def __init__(self, max_n: int, prior_weight: float = 2.0, max_count: float = 48.0) -> None:
        n = np.arange(max_n + 1, dtype=np.float64)
        rise = np.clip((n - 1) / max(max_n - 1, 1), 0.0, 1.0)
        weight = prior_weight * (1.0 + 3.0 * rise)  # a long match's prior takes 4x the evidence to move
        self.trials = np.tile(weight, (3, 1))
        self.hits = weight * _priors(max_n)
        self.max_count = max_count
        self._rates = (self.hits / self.trials).tolist()  # read per drafted node: Python floats, no numpy call

    def rate(self, n: int, kind: int = PROMPT) -> float:
        return self._rates[kind][n]

    def observe(self, n: int, hit: bool, kind: int = PROMPT) -> None:
        self.trials[kind, n] += 1.0
        self.hits[kind, n] += float(hit)
        if self.trials[kind, n] > self.max_count:
            scale = self.max_count / self.trials[kind, n]
            self.trials[kind, n] *= scale
            self.hits[kind, n] *= scale
        self._rates[kind][n] = float(self.hits[kind, n] / self.trials[kind, n])


class NgramIndex:
    """Every n-gram of the text (1 <= n <= ``max_n``) -> the positions that followed its occurrences, in order.

    ``extend`` and ``truncate`` cost O(max_n) per token; ``continuations`` looks at the most recent
    ``max_positions`` occurrences of the longest matching n-gram."""

    def __init__(self, max_n: int = 8, max_positions: int = 64) -> None:
        self.max_n = max_n
        self.max_positions = max_positions
        self.text: list[int] = []
        self._next: dict[tuple[int, ...], list[int]] = {}
        self.confidence = MatchConfidence(max_n)
        self.answer_from = NO_ANSWER  # the first position of the answer (all text is prompt until one begins)
        self._ranked_of: dict[int, list[tuple[int, int]]] = {}  # id of a followers list -> its ranking
        self.last_match = 0  # match length of the last continuations() call
        self.copy_misses: list[Divergence] = []  # long copies of the prompt that missed, since last read
        self._forget_tail()

    def __len__(self) -> int:
        return len(self.text)

    def clear(self) -> None:
        self.text = []
        self._next = {}
        self._ranked_of = {}
        self.confidence = MatchConfidence(self.max_n)
        self.answer_from = NO_ANSWER
        self.copy_misses = []
        self._forget_tail()

    def _forget_tail(self, bound: int | None = None) -> None:
        """The text's end changed: its longest match is unknown (``bound``: at most this long)."""
        self._tail: tuple[int, list[int]] | None = None
        self._tail_known = False
        self._tail_bound = bound

    def tail_match(self) -> tuple[int, list[int]] | None:
        """:meth:`longest_match` of the whole text, what predicts its next token: found once per text (the
        round's evidence, its root and the next token's score all ask for it), starting at the previous
        text's match length + 1."""
        if not self._tail_known:
            self._tail, self._tail_known = self.longest_match(self.text, self._tail_bound), True
        return self._tail

    def kind(self, at: int, positions: list[int]) -> int:
        """What a match predicting position ``at`` is evidence of: :data:`PROMPT` inside the prompt, else
        :data:`COPY` or :data:`REPEAT` by where its most recent occurrence lies."""
        if at < self.answer_from:
            return PROMPT
        return REPEAT if positions[-1] >= self.answer_from else COPY

    def extend(self, tokens, score: bool = True) -> None:
        """Append committed tokens; each one first scores the prediction the index would have made for it
        (``score`` False: not, for an index that shares another's :attr:`confidence`).

        Only the followers lists a token joins change their ranking: the others' cached rankings stay (a
        position's token never changes while it is listed; :meth:`truncate` forgets every ranking)."""
        tokens = [int(t) for t in tokens]
        unscored = len(tokens) if not score else (
            0 if self.answer_from == NO_ANSWER else min(len(tokens), max(self.answer_from - len(self.text), 0)))
        if unscored >= 2:  # a prompt: indexed n by n, the same lists in a fraction of the time (NOTES.md#lookup-drafts)
            self._index_unscored(tokens[:unscored])
            self._forget_tail()
            tokens = tokens[unscored:]
        for tok in tokens:
            # a prompt position read once an answer has begun is not scored: drafts predict answer positions,
            # whose rates are the COPY and REPEAT kinds'
            scored = score and (len(self.text) >= self.answer_from or self.answer_from == NO_ANSWER)
            match = self.tail_match() if scored else self._tail  # None while unknown (then no bound below)
            if scored and match is not None:
                n, positions = match
                kind, hit = self.kind(len(self.text), positions), self.ranked(positions)[0][0] == tok
                self.confidence.observe(n, hit, kind)
                if not hit and kind == COPY and n >= LONG_COPY:
                    self.copy_misses.append(Divergence(positions[-1], len(self.text)))
            bound = (match[0] + 1 if match is not None else 1) if self._tail_known else None
            j = len(self.text)
            self.text.append(tok)
            for n in range(1, min(self.max_n, j) + 1):
                positions = self._next.setdefault(tuple(self.text[j - n:j]), [])
                positions.append(j)
                self._ranked_of.pop(id(positions), None)
            self._forget_tail(bound)

    def _index_unscored(self, tokens: list[int]) -> None:
        """Append ``tokens`` and list their positions, one n at a time (what :meth:`extend` does token by token
        when it scores nothing), and forget every ranking (new lists, and lists that grew)."""
        j0 = len(self.text)
        self.text.extend(tokens)
        text, follow, end = self.text, self._next, len(self.text)
        for n in range(1, self.max_n + 1):
            first = max(j0, n)
            if first >= end:
                break
            grams = zip(*(text[first - n + k:end - n + k] for k in range(n)))
            for j, key in zip(range(first, end), grams):
                follow.setdefault(key, []).append(j)
        self._ranked_of.clear()

    def truncate(self, n_tokens: int) -> None:
        """Forget every token from ``n_tokens`` on (the learned confidences stay: they describe the text's kind).
        Keeping less than half the text (a new prompt after the last answer) re-indexes what is kept instead."""
        self._ranked_of.clear()
        self._forget_tail()
        if n_tokens < len(self.text) // 2:
            kept = self.text[:max(n_tokens, 0)]
            self.text, self._next = [], {}
            self._index_unscored(kept)
            return
        while len(self.text) > n_tokens:
            j = len(self.text) - 1
            for n in range(1, min(self.max_n, j) + 1):
                key = tuple(self.text[j - n:j])
                positions = self._next[key]
                positions.pop()
                if not positions:
                    del self._next[key]
            self.text.pop()

    def longest_match(self, context: list[int], at_most: int | None = None) -> tuple[int, list[int]] | None:
        """The longest n whose last-n-token suffix of ``context`` occurred before with a follower, and the
        positions of those followers (None: not even the last token did). ``at_most``: a known bound on n
        (a context one token longer than one whose longest match was m matches at most m + 1 tokens)."""
        top = min(self.max_n, len(context)) if at_most is None else min(self.max_n, len(context), at_most)
        for n in range(top, 0, -1):
            positions = self._next.get(tuple(context[-n:]))
            if positions:
                return n, positions
        return None

    def ranked(self, positions: list[int]) -> list[tuple[int, int]]:
        """:meth:`_ranked`, cached per followers list until the list changes (the same n-grams recur across a
        tree's nodes and across rounds)."""
        ranked = self._ranked_of.get(id(positions))
        if ranked is None:
            ranked = self._ranked_of[id(positions)] = self._ranked(positions)
        return ranked

    def _ranked(self, positions: list[int]) -> list[tuple[int, int]]:
        """Distinct follower tokens of the recent occurrences with their counts, most frequent first (ties:
        the most recent first)."""
        counts: dict[int, int] = {}
        for p in reversed(positions[-self.max_positions:]):
            tok = self.text[p]
            counts[tok] = counts.get(tok, 0) + 1
        return sorted(counts.items(), key=lambda item: -item[1])  # stable: recency breaks ties

    def continuations(self, context: list[int], max_branches: int,
                      at_most: int | None = None) -> tuple[list[int], list[float]]:
        """The next tokens the text suggests after ``context`` and their probabilities (best first), as Python
        lists: this runs for every node of every tree level, where a few small numpy arrays per node cost more
        than the lookup itself. ``at_most``: a bound on the match length (:meth:`longest_match`); the length
        found is :attr:`last_match` (0: none)."""
        return self.proposed(self.longest_match(context, at_most), max_branches)

    def proposed(self, match: tuple[int, list[int]] | None, max_branches: int) -> tuple[list[int], list[float]]:
        """:meth:`continuations` of a match found already (:meth:`longest_match`, :meth:`tail_match`)."""
        self.last_match = match[0] if match is not None else 0
        if match is None:
            return [], []
        n, positions = match
        ranked = self.ranked(positions)[:max_branches]
        # a draft predicts past the committed text, so the kind is the one of the text's next position
        top, rate = ranked[0][1], self.confidence.rate(n, self.kind(len(self.text), positions))
        probs = [rate * c / top for _, c in ranked]
        total = sum(probs)
        if total > 1.0:
            probs = [p / total for p in probs]
        return [t for t, _ in ranked], probs


class LookupDraft:
    """A draft engine over an :class:`NgramIndex` of the text: proposals, never dense logits.

    ``renames`` (a :class:`~.renames.RenameLearner`): once the answer has renamed an identifier of the prompt, a
    second index holds the prompt with the rename applied, followed by the answer; each node takes the
    continuations of whichever index matches its context on more tokens (the renamed one on a tie).

    ``text`` (a :class:`~.text_copy.TextCopy`): inside a quoted string of the answer, a node that neither index
    matches on :data:`TEXT_BELOW` tokens takes the continuations of the string's text in the prompt's text,
    where they are surer."""

    name = "lookup"
    needs_features = False
    free_part = None
    weights_path = None

    def __init__(self, max_branches: int = 10, max_n: int = 8, renames: RenameLearner | None = None,
                 text: TextCopy | None = None) -> None:
        self.max_branches = max_branches
        self.index = NgramIndex(max_n)
        self.renames = renames
        self.text = text
        self.edited: NgramIndex | None = None  # the prompt with the answer's renames, then the answer
        self._path: dict[int, list[int]] = {}  # candidate id -> tokens from the root's child down to it
        # per index: candidate id (ROOT: the root) -> length of its context's longest match (0: none)
        self._match: dict[int, int] = {}
        self._edited_match: dict[int, int] = {}

    @property
    def n_read(self) -> int:
        return len(self.index)

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
        self._forget_renames()
        if self.text is not None:
            self.text.stop()  # it starts when the index has read the prompt

    def _clear_round(self) -> None:
        self._path.clear()
        self._match.clear()
        self._edited_match.clear()

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
        return self.index.confidence.rate(min(FAITHFUL_MATCH, self.index.max_n), COPY) >= FAITHFUL_RATE

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
        """How sure the text is of the token after ``tokens`` (root included): the learned rate of its longest
        match's kind and length, 0.0 without a match. A round's evidence before any tree is drafted, at the
        price of indexing the tail that the round's own catch-up would index anyway. ``allowed`` (a grammar's
        check): a token it forbids is no evidence, as the round would drop it."""
        self._extend(tokens[len(self.index):])
        toks, probs = self._continue([[]], [None], [ROOT], width=1)
        if not toks[0] or (allowed is not None and not allowed(toks[0][0])):
            return 0.0
        return probs[0][0]

    def expand(self, cand_ids: np.ndarray, tokens: np.ndarray, parent_ids: np.ndarray, level: int) -> Proposals:
        return self.proposals(*self.expand_rows(cand_ids, tokens, parent_ids, level))

    def catch_up_rows(self, tokens: np.ndarray) -> Rows:
        """:meth:`catch_up` as Python lists (what :class:`~.merged.MergedDraft` merges without numpy)."""
        self._clear_round()
        self._extend(np.asarray(tokens)[len(self.index):].tolist())
        return self._continue([[]], [None], [ROOT])

    def expand_rows(self, cand_ids: np.ndarray | list[int], tokens: np.ndarray | list[int],
                    parent_ids: np.ndarray | list[int], level: int) -> Rows:
        """:meth:`expand` as Python lists (arrays or lists in)."""
        paths = []
        cand_ids, parents = as_list(cand_ids), as_list(parent_ids)
        for cand, tok, parent in zip(cand_ids, as_list(tokens), parents):
            path = (self._path[parent] if parent >= 0 else []) + [int(tok)]
            self._path[cand] = path
            paths.append(path)
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
        """Rows of continuations as :class:`Proposals`, as wide as the longest row (padding: log-probability
        -inf; the tree drops padding, so the width changes no candidate). Built as flat lists with one array per
        field: this runs for every level of every tree, mostly on one-token rows, where a numpy call per row cost
        more than the lookup."""
        width = max(1, max(map(len, tokens), default=0))
        flat_tokens: list[int] = []
        flat_probs: list[float] = []
        for toks, p in zip(tokens, probs):
            pad = width - len(toks)
            flat_tokens += toks
            flat_probs += p
            if pad:
                flat_tokens += [0] * pad
                flat_probs += [0.0] * pad  # 0 pads: its log, -inf, is a proposal's padding
        shape = (len(tokens), width)
        # math.log, as tree.grow_row_candidates takes it: the same scores on either path
        log_probs = np.array([math.log(p) if p > 0.0 else -math.inf for p in flat_probs],
                             dtype=np.float64).reshape(shape)
        return Proposals.trusted(np.array(flat_tokens, dtype=np.int64).reshape(shape), log_probs,
                                 np.full(shape, LOOKUP, dtype=np.int8), ranked=True)  # continuations rank by count

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Accepted tokens are indexed at the next ``catch_up``, with the rest of the committed text."""
        self._clear_round()

    def close(self) -> None:
        self.reset()
