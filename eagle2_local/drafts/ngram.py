"""The n-gram index a lookup draft reads the text with, and the rates it learns for its matches.

The :class:`NgramIndex` remembers, for every n-gram of the text (n = 1..``max_n``), the positions right after its
occurrences; it grows by one entry per n for each committed token and shrinks the same way on rollback, so it
never rescans the text. For the current suffix the longest n-gram that occurred before names the continuations
that followed it. A continuation's probability is the :class:`MatchConfidence` of its match length and kind
(learned online from this text: how often the most frequent continuation of such a match was the token that
really came next), scaled by how often that token followed the match relative to the most frequent one.
"""

from __future__ import annotations

from array import array

import numpy as np

from .renames import Divergence

# What a match is evidence of: a token of the prompt predicted from the prompt (its own repetitiveness), a token
# of the answer predicted from the prompt (copying it: a code edit re-emitting a function) or from the answer so
# far (repeating itself)
PROMPT, COPY, REPEAT = 0, 1, 2
LONG_COPY = 3  # a copy matched on at least this many tokens that misses is a divergence (renames.py)
NO_ANSWER = 1 << 62  # answer_from before an answer begins (all text is prompt)
# An answer's own record at sure matches (MatchConfidence.answer_factor): which learned rates count as sure (the
# ones a lookup round may start on), and how many expected hits its prior of "as learned" weighs
SURE_RATE = 0.8
ANSWER_WEIGHT = 8.0


def _priors(max_n: int) -> np.ndarray:
    """Prior hit rates per kind of match (rows PROMPT, COPY, REPEAT) and match length n (columns 0..max_n).

    What models' own answers do, not what reference answers do: over every match in plain greedy answers of the
    default model and of Qwen2.5-Coder-1.5B to tune records of twelve prompt sets (nine for Qwen; prose, code,
    extraction, edits), a match of the prompt went on 0.22 of the time at n = 1, 0.51 at n = 2, 0.72 at n = 3,
    0.80-0.86 at n = 4-7 and 0.94 at n = 8, prose lowest (NOTES.md#lookup-drafts). Priors taken from reference
    answers (0.81 at n = 2, 0.91 at n = 3) sent every answer's first short matches into chains that a paraphrasing
    answer missed. The answer repeating itself, or a prompt repeating itself, says less at short n (those priors
    err low, which costs at most a few of an answer's first chains; a REPEAT row fitted to the same answers lost
    in frozen replays, NOTES.md#lookup-drafts)."""
    n = np.arange(max_n + 1, dtype=np.float64)
    rise = np.clip((n - 1) / max(max_n - 1, 1), 0.0, 1.0)
    steps = np.maximum(n - 1, 0)
    return np.stack([0.15 + 0.75 * rise, 0.95 - 0.75 * 0.55 ** steps, 0.95 - 0.75 * 0.75 ** steps])


class MatchConfidence:
    """Per kind of match (:data:`PROMPT`, :data:`COPY`, :data:`REPEAT`) and match length n: the rate at which
    the top continuation of such a match was the next token.

    Each kind learns its own rates from the text, starting from :func:`_priors`, which weigh more for long
    matches: a long exact match is strong evidence before the text has said anything (a new answer can draft a
    sure chain in its first rounds). Counts are capped, so recent text weighs most.

    One answer-wide check sits on top: at the matches the rates call sure, has this answer hit as often as they
    promised? Each cell learns alone and slowly (a few of the answer's tokens fall in each), while every sure match
    of the answer says the same thing about it: a summary quoting its passage for a few tokens at a time misses
    at rates a code edit's copies taught, and one pooled count finds that within a few misses. The answer kinds'
    rates (:data:`COPY`, :data:`REPEAT`) are scaled by :attr:`answer_factor`, its hits over the hits promised,
    shrunk towards 1 (``answer_weight`` promised hits of prior), never above 1; it is free evidence (every
    committed token is scored, plain steps' too), so a copy that resumes after an edit point wins it back."""

    def __init__(self, max_n: int, prior_weight: float = 2.0, max_count: float = 48.0,
                 answer_weight: float = ANSWER_WEIGHT) -> None:
        n = np.arange(max_n + 1, dtype=np.float64)
        rise = np.clip((n - 1) / max(max_n - 1, 1), 0.0, 1.0)
        self.weight = (prior_weight * (1.0 + 3.0 * rise)).tolist()  # a long match's prior takes 4x the evidence
        # per kind and n, as Python floats: observed at every scored token, where numpy's scalar indexing cost
        # several times the arithmetic (the same float64 operations either way)
        self._trials = [list(self.weight) for _ in range(3)]
        self._hits = (np.asarray(self.weight) * _priors(max_n)).tolist()
        self.max_count = max_count
        self._rates = [[h / t for h, t in zip(hits, trials)] for hits, trials in zip(self._hits, self._trials)]
        self.answer_weight = answer_weight
        self._new_answer_record()

    def begin_answer(self) -> None:
        """A new answer: the answer kinds' (:data:`COPY`, :data:`REPEAT`) learned rates are kept, but weigh
        no more than their priors did in the first answer. What an answer copies says little of the next one:
        a code edit's copies are exact for hundreds of tokens, a summary of the same kind of match paraphrases
        after a few, and at the full count the summary would run the code edit's chains until dozens of its
        own misses outvoted them. At the prior's weight a few of the new answer's own tokens decide. The
        answer's own record (:attr:`answer_factor`) starts again."""
        for kind in (COPY, REPEAT):
            trials, hits = self._trials[kind], self._hits[kind]
            for n, weight in enumerate(self.weight):
                scale = min(weight / trials[n], 1.0)
                trials[n] *= scale
                hits[n] *= scale
                self._rates[kind][n] = hits[n] / trials[n]
        self._new_answer_record()

    @property
    def trials(self) -> np.ndarray:
        """Observations per kind (rows) and match length (columns), the prior's weight included (a copy)."""
        return np.array(self._trials)

    @property
    def hits(self) -> np.ndarray:
        """Hits per kind and match length, the prior's included (a copy)."""
        return np.array(self._hits)

    def _new_answer_record(self) -> None:
        """No sure match of the answer scored yet: :attr:`answer_factor` (see the class docstring) is 1."""
        self._answer_hits = self._answer_expected = 0.0
        self.answer_factor = 1.0

    def rate(self, n: int, kind: int = PROMPT) -> float:
        """How sure a match of this length and kind is now: its learned rate, an answer's scaled by the
        answer's own record at sure matches (what drafts value their chains by)."""
        rate = self._rates[kind][n]
        return rate if kind == PROMPT else rate * self.answer_factor

    def learned_rate(self, n: int, kind: int = PROMPT) -> float:
        """The rate learned for matches of this length and kind, without the answer's record."""
        return self._rates[kind][n]

    def observe(self, n: int, hit: bool, kind: int = PROMPT) -> None:
        """The next token was (``hit``) or was not the top continuation of a match of length ``n``."""
        promised = self._rates[kind][n]
        if kind != PROMPT and promised >= SURE_RATE:
            self._answer_expected += promised
            self._answer_hits += float(hit)
            w = self.answer_weight
            self.answer_factor = min(1.0, (w + self._answer_hits) / (w + self._answer_expected))
        trials, hits = self._trials[kind], self._hits[kind]
        trials[n] += 1.0
        hits[n] += float(hit)
        if trials[n] > self.max_count:
            scale = self.max_count / trials[n]
            trials[n] *= scale
            hits[n] *= scale
        self._rates[kind][n] = hits[n] / trials[n]


# A match: the length n of the n-gram found and the most recent position that followed it (the rest are reached
# through NgramIndex's chains)
Match = tuple[int, int]


class NgramIndex:
    """Every n-gram of the text (1 <= n <= ``max_n``) -> the positions that followed its occurrences, in order.

    Kept as chains, not lists: per n-gram its most recent follower, and per n and position the previous follower
    of the same n-gram (-1: none). A list per n-gram (~``max_n`` new ones a token) is a container Python's garbage
    collector tracks, so a long prompt's index was scanned at every full collection and brought them sooner; the
    chains are numbers in ``max_n`` arrays and one dictionary. ``extend`` and ``truncate`` cost O(max_n) per
    token; ``continuations`` looks at the most recent ``max_positions`` occurrences of the longest matching
    n-gram."""

    def __init__(self, max_n: int = 8, max_positions: int = 64) -> None:
        self.max_n = max_n
        self.max_positions = max_positions
        self.confidence = MatchConfidence(max_n)
        self.last_match = 0  # match length of the last continuations() call
        self._start_text([])
        self.answer_from = NO_ANSWER  # the first position of the answer (all text is prompt until one begins)
        self.copy_misses: list[Divergence] = []  # long copies of the prompt that missed, since last read

    def _start_text(self, text: list[int]) -> None:
        """No text indexed (``text``: the tokens about to be, unscored)."""
        self.text: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> the most recent position that followed it
        self._prev = [array("q") for _ in range(self.max_n)]  # [n - 1][position] -> the previous one, or -1
        self._ranked_of: dict[Match, list[tuple[int, int]]] = {}  # a match -> its followers ranked
        self._forget_tail()
        if text:
            self._index_unscored(text)

    def __len__(self) -> int:
        return len(self.text)

    def clear(self) -> None:
        self.confidence = MatchConfidence(self.max_n)
        self.answer_from = NO_ANSWER
        self.copy_misses = []
        self._start_text([])

    def _forget_tail(self, bound: int | None = None) -> None:
        """The text's end changed: its longest match is unknown (``bound``: at most this long)."""
        self._tail: Match | None = None
        self._tail_known = False
        self._tail_bound = bound

    def tail_match(self) -> Match | None:
        """:meth:`longest_match` of the whole text, what predicts its next token: found once per text (the
        round's evidence, its root and the next token's score all ask for it), starting at the previous
        text's match length + 1."""
        if not self._tail_known:
            self._tail, self._tail_known = self.longest_match(self.text, self._tail_bound), True
        return self._tail

    def kind(self, at: int, match: Match) -> int:
        """What a match predicting position ``at`` is evidence of: :data:`PROMPT` inside the prompt, else
        :data:`COPY` or :data:`REPEAT` by where its most recent occurrence lies."""
        if at < self.answer_from:
            return PROMPT
        return REPEAT if match[1] >= self.answer_from else COPY

    def followers(self, match: Match) -> list[int]:
        """Every position that followed the match's n-gram, oldest first (what tests and readers compare)."""
        n, p = match
        prev, out = self._prev[n - 1], []
        while p >= 0:
            out.append(p)
            p = prev[p]
        return out[::-1]

    def table(self) -> dict[tuple[int, ...], list[int]]:
        """Every n-gram -> :meth:`followers` (an index's whole content, for comparing two)."""
        return {key: self.followers((len(key), last)) for key, last in self._last.items()}

    def extend(self, tokens, score: bool = True) -> None:
        """Append committed tokens; each one first scores the prediction the index would have made for it
        (``score`` False: not, for an index that shares another's :attr:`confidence`).

        Only the n-grams a token follows change their ranking: the others' cached rankings stay (a position's
        token never changes while it is indexed; :meth:`truncate` forgets every ranking)."""
        tokens = [int(t) for t in tokens]
        unscored = len(tokens) if not score else (
            0 if self.answer_from == NO_ANSWER else min(len(tokens), max(self.answer_from - len(self.text), 0)))
        if unscored >= 2:  # a prompt: indexed n by n, the same in a fraction of the time (NOTES.md#lookup-drafts)
            self._index_unscored(tokens[:unscored])
            self._forget_tail()
            tokens = tokens[unscored:]
        text, last, prev, ranked_of = self.text, self._last, self._prev, self._ranked_of
        for tok in tokens:
            # a prompt position read once an answer has begun is not scored: drafts predict answer positions,
            # whose rates are the COPY and REPEAT kinds'
            scored = score and (len(text) >= self.answer_from or self.answer_from == NO_ANSWER)
            match = self.tail_match() if scored else self._tail  # None while unknown (then no bound below)
            if scored and match is not None:
                kind, hit = self.kind(len(text), match), self.ranked(match)[0][0] == tok
                self.confidence.observe(match[0], hit, kind)
                if not hit and kind == COPY and match[0] >= LONG_COPY:
                    self.copy_misses.append(Divergence(match[1], len(text)))
            bound = (match[0] + 1 if match is not None else 1) if self._tail_known else None
            j = len(text)
            text.append(tok)
            for n in range(1, self.max_n + 1):
                if n > j:
                    prev[n - 1].append(-1)
                    continue
                key = tuple(text[j - n:j])
                before = last.get(key, -1)
                prev[n - 1].append(before)
                last[key] = j
                if before >= 0:
                    ranked_of.pop((n, before), None)
            self._forget_tail(bound)

    def _index_unscored(self, tokens: list[int]) -> None:
        """Append ``tokens`` and chain their positions, one n at a time (what :meth:`extend` does token by token
        when it scores nothing), and forget every ranking (n-grams that gained a follower)."""
        j0 = len(self.text)
        self.text.extend(tokens)
        text, last, end = self.text, self._last, len(self.text)
        for n in range(1, self.max_n + 1):
            prev = self._prev[n - 1]
            first = min(max(j0, n), end)
            prev.extend([-1] * (first - j0))  # positions with fewer than n tokens before them
            grams = zip(*(text[first - n + k:end - n + k] for k in range(n)))
            for j, key in zip(range(first, end), grams):
                prev.append(last.get(key, -1))
                last[key] = j
        self._ranked_of.clear()

    def truncate(self, n_tokens: int) -> None:
        """Forget every token from ``n_tokens`` on (the learned confidences stay: they describe the text's kind).
        Keeping less than half the text (a new prompt after the last answer) re-indexes what is kept instead."""
        self._ranked_of.clear()
        self._forget_tail()
        if n_tokens < len(self.text) // 2:
            self._start_text(self.text[:max(n_tokens, 0)])
            return
        text, last, prev = self.text, self._last, self._prev
        while len(text) > n_tokens:
            j = len(text) - 1
            for n in range(1, min(self.max_n, j) + 1):
                key = tuple(text[j - n:j])
                before = prev[n - 1][j]
                if before < 0:
                    del last[key]
                else:
                    last[key] = before
            for chain in prev:
                chain.pop()
            text.pop()

    def longest_match(self, context: list[int], at_most: int | None = None) -> Match | None:
        """The longest n whose last-n-token suffix of ``context`` occurred before with a follower, and the most
        recent of those followers (None: not even the last token did). ``at_most``: a known bound on n (a context
        one token longer than one whose longest match was m matches at most m + 1 tokens)."""
        top = min(self.max_n, len(context)) if at_most is None else min(self.max_n, len(context), at_most)
        last = self._last
        for n in range(top, 0, -1):
            at = last.get(tuple(context[-n:]))
            if at is not None:
                return n, at
        return None

    def ranked(self, match: Match) -> list[tuple[int, int]]:
        """:meth:`_ranked`, cached per match until its n-gram gains a follower (the same n-grams recur across a
        tree's nodes and across rounds)."""
        ranked = self._ranked_of.get(match)
        if ranked is None:
            ranked = self._ranked_of[match] = self._ranked(match)
        return ranked

    def _ranked(self, match: Match) -> list[tuple[int, int]]:
        """Distinct follower tokens of the recent occurrences with their counts, most frequent first (ties:
        the most recent first)."""
        n, p = match
        prev, text = self._prev[n - 1], self.text
        counts: dict[int, int] = {}
        for _ in range(self.max_positions):
            if p < 0:
                break
            tok = text[p]
            counts[tok] = counts.get(tok, 0) + 1
            p = prev[p]
        return sorted(counts.items(), key=lambda item: -item[1])  # stable: recency breaks ties

    def continuations(self, context: list[int], max_branches: int,
                      at_most: int | None = None) -> tuple[list[int], list[float]]:
        """The next tokens the text suggests after ``context`` and their probabilities (best first), as Python
        lists: this runs for every node of every tree level, where a few small numpy arrays per node cost more
        than the lookup itself. ``at_most``: a bound on the match length (:meth:`longest_match`); the length
        found is :attr:`last_match` (0: none)."""
        return self.proposed(self.longest_match(context, at_most), max_branches)

    def proposed(self, match: Match | None, max_branches: int) -> tuple[list[int], list[float]]:
        """:meth:`continuations` of a match found already (:meth:`longest_match`, :meth:`tail_match`)."""
        self.last_match = match[0] if match is not None else 0
        if match is None:
            return [], []
        ranked = self.ranked(match)[:max_branches]
        # a draft predicts past the committed text, so the kind is the one of the text's next position
        top, rate = ranked[0][1], self.confidence.rate(match[0], self.kind(len(self.text), match))
        probs = [rate * c / top for _, c in ranked]
        total = sum(probs)
        if total > 1.0:
            probs = [p / total for p in probs]
        return [t for t, _ in ranked], probs
