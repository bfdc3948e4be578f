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

import numpy as np

from ..tree import LOOKUP, Proposals

log = logging.getLogger(__name__)


# What a match is evidence of: a token of the prompt predicted from the prompt (its own repetitiveness), a token
# of the answer predicted from the prompt (copying it: a code edit re-emitting a function) or from the answer so
# far (repeating itself)
PROMPT, COPY, REPEAT = 0, 1, 2


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

    def rate(self, n: int, kind: int = PROMPT) -> float:
        return float(self.hits[kind, n] / self.trials[kind, n])

    def observe(self, n: int, hit: bool, kind: int = PROMPT) -> None:
        self.trials[kind, n] += 1.0
        self.hits[kind, n] += float(hit)
        if self.trials[kind, n] > self.max_count:
            scale = self.max_count / self.trials[kind, n]
            self.trials[kind, n] *= scale
            self.hits[kind, n] *= scale


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
        self.answer_from = 1 << 62  # the first position of the answer (all text is prompt until one begins)

    def __len__(self) -> int:
        return len(self.text)

    def clear(self) -> None:
        self.text = []
        self._next = {}
        self.confidence = MatchConfidence(self.max_n)
        self.answer_from = 1 << 62

    def kind(self, at: int, positions: list[int]) -> int:
        """What a match predicting position ``at`` is evidence of: :data:`PROMPT` inside the prompt, else
        :data:`COPY` or :data:`REPEAT` by where its most recent occurrence lies."""
        if at < self.answer_from:
            return PROMPT
        return REPEAT if positions[-1] >= self.answer_from else COPY

    def extend(self, tokens) -> None:
        """Append committed tokens; each one first scores the prediction the index would have made for it."""
        for tok in (int(t) for t in tokens):
            match = self.longest_match(self.text)
            if match is not None:
                n, positions = match
                self.confidence.observe(n, self._ranked(positions)[0][0] == tok, self.kind(len(self.text), positions))
            j = len(self.text)
            self.text.append(tok)
            for n in range(1, min(self.max_n, j) + 1):
                self._next.setdefault(tuple(self.text[j - n:j]), []).append(j)

    def truncate(self, n_tokens: int) -> None:
        """Forget every token from ``n_tokens`` on (the learned confidences stay: they describe the text's kind)."""
        while len(self.text) > n_tokens:
            j = len(self.text) - 1
            for n in range(1, min(self.max_n, j) + 1):
                key = tuple(self.text[j - n:j])
                positions = self._next[key]
                positions.pop()
                if not positions:
                    del self._next[key]
            self.text.pop()

    def longest_match(self, context: list[int]) -> tuple[int, list[int]] | None:
        """The longest n whose last-n-token suffix of ``context`` occurred before with a follower, and the
        positions of those followers (None: not even the last token did)."""
        for n in range(min(self.max_n, len(context)), 0, -1):
            positions = self._next.get(tuple(context[-n:]))
            if positions:
                return n, positions
        return None

    def _ranked(self, positions: list[int]) -> list[tuple[int, int]]:
        """Distinct follower tokens of the recent occurrences with their counts, most frequent first (ties:
        the most recent first)."""
        counts: dict[int, int] = {}
        for p in reversed(positions[-self.max_positions:]):
            tok = self.text[p]
            counts[tok] = counts.get(tok, 0) + 1
        return sorted(counts.items(), key=lambda item: -item[1])  # stable: recency breaks ties

    def continuations(self, context: list[int], max_branches: int) -> tuple[list[int], list[float]]:
        """The next tokens the text suggests after ``context`` and their probabilities (best first), as Python
        lists: this runs for every node of every tree level, where a few small numpy arrays per node cost more
        than the lookup itself."""
        match = self.longest_match(context)
        if match is None:
            return [], []
        n, positions = match
        ranked = self._ranked(positions)[:max_branches]
        # a draft predicts past the committed text, so the kind is the one of the text's next position
        top, rate = ranked[0][1], self.confidence.rate(n, self.kind(len(self.text), positions))
        probs = [rate * c / top for _, c in ranked]
        total = sum(probs)
        if total > 1.0:
            probs = [p / total for p in probs]
        return [t for t, _ in ranked], probs


class LookupDraft:
    """A draft engine over an :class:`NgramIndex` of the text: proposals, never dense logits."""

    name = "lookup"
    needs_features = False
    free_part = None
    weights_path = None

    def __init__(self, max_branches: int = 10, max_n: int = 8) -> None:
        self.max_branches = max_branches
        self.index = NgramIndex(max_n)
        self._path: dict[int, list[int]] = {}  # candidate id -> tokens from the root's child down to it

    @property
    def n_read(self) -> int:
        return len(self.index)

    def reset(self) -> None:
        self.index.clear()
        self._path.clear()

    def rollback(self, n_tokens: int) -> None:
        self._path.clear()
        self.index.truncate(min(n_tokens, len(self.index)))

    def begin_answer(self, prompt_tokens: int) -> None:
        """An answer starts after ``prompt_tokens`` tokens: matches from there on lie in the answer."""
        self.index.answer_from = prompt_tokens

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None = None, features_from: int = 0) -> Proposals:
        """Index the unseen tail of ``tokens`` (root included); propose the root's children."""
        self._path.clear()
        self.index.extend(np.asarray(tokens)[len(self.index):].tolist())
        return self._propose([self.index.text])

    def next_rate(self, tokens: list[int]) -> float:
        """How sure the text is of the token after ``tokens`` (root included): the learned rate of its longest
        match's kind and length, 0.0 without a match. A round's evidence before any tree is drafted, at the
        price of indexing the tail that the round's own catch-up would index anyway."""
        self.index.extend(tokens[len(self.index):])
        _, probs = self.index.continuations(self.index.text, 1)
        return probs[0] if probs else 0.0

    def expand(self, cand_ids: np.ndarray, tokens: np.ndarray, parent_ids: np.ndarray, level: int) -> Proposals:
        contexts = []
        tail = self.index.text[-self.index.max_n:]
        for cand, tok, parent in zip(np.asarray(cand_ids).tolist(), np.asarray(tokens).tolist(),
                                     np.asarray(parent_ids).tolist()):
            path = (self._path[parent] if parent >= 0 else []) + [int(tok)]
            self._path[cand] = path
            contexts.append(tail + path)
        return self._propose(contexts)

    def _propose(self, contexts: list[list[int]]) -> Proposals:
        width = max(self.max_branches, 1)
        tokens = np.zeros((len(contexts), width), dtype=np.int64)
        probs = np.zeros((len(contexts), width))  # 0 pads: its log, -inf, is a proposal's padding
        for row, context in enumerate(contexts):
            toks, p = self.index.continuations(context, width)
            if toks:
                tokens[row, :len(toks)] = toks
                probs[row, :len(toks)] = p
        with np.errstate(divide="ignore"):  # one log for all rows: this runs for every node of every level
            log_probs = np.log(probs)
        return Proposals.trusted(tokens, log_probs, np.full(tokens.shape, LOOKUP, dtype=np.int8))

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Accepted tokens are indexed at the next ``catch_up``, with the rest of the committed text."""
        self._path.clear()

    def close(self) -> None:
        self.reset()
