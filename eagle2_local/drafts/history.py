"""Drafts from earlier answers: an index of the answers an :class:`~eagle2_local.api.Eagle2` object gave before
(each with the last tokens of its prompt), that a lookup draft consults as a third source beside the text and
the renamed text (:class:`~.lookup.LookupDraft`).

A batch job, an agent loop, "regenerate" and a server answering the same kind of request all day write what was
written before. For the current suffix of the text (the prompt's end, the answer so far, a node's path) the
longest n-gram (3 <= n <= ``max_n``) that occurred among the earlier records names the tokens that followed it,
with counts; the most frequent one's probability is the rate learned for history matches of that length
(:class:`~.ngram.MatchConfidence`, its ``PROMPT`` row: low priors at short n; every committed answer token
scores the history's prediction for it), the others' scaled by their counts, as the text's own lookups do.

The index (:class:`HistoryIndex`): the records' tokens in one array, each followed by a separator; per position
the previous position that followed the same 3-gram (a chain, as :class:`~.ngram.NgramIndex` keeps per n), and
per 3-gram the most recent one. A query walks the most recent ``max_positions`` occurrences of its last 3
tokens and measures how far back each one matches, up to ``max_n``. Memory is bounded: at most ``max_tokens``
tokens and ``max_answers`` records; the oldest are evicted (their positions fall below :attr:`HistoryIndex.base`,
the arrays are compacted when half of them is dead).

Memory, measured (``benchmarks/history_cost.py``, tracemalloc, 10,000 answers of 200 Zipf-distributed tokens
plus 32 prompt tokens each, 2.33 M tokens, 1.03 M distinct 3-grams): 128.5 MB, 55 bytes a token; the two arrays
take 8 bytes a token, the 3-gram dictionary the rest (~107 bytes per distinct 3-gram). The default caps
(2.5 M tokens, 10,000 records) hold about that much. One tree level of 8 nodes over that index: 0.26 ms of host
time (33 us a node, half of them matching).

A history file (:func:`save` / :func:`load`) keeps the index across runs: versioned, tied to the model's
vocabulary (:func:`vocab_fingerprint`), with a checksum, written atomically (the old file stays whole if the
writer is killed); a file that is not one, damaged, of another version or of another vocabulary is refused in
one logged line and the run goes on with an empty index.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
from array import array
from collections import deque
from typing import Iterator

from ..formats.atomic_write import atomic_path
from .ngram import PROMPT, MatchConfidence

log = logging.getLogger(__name__)

ANCHOR = 3  # the shortest match the history proposes from (a shorter one says little across answers)
SEP = -1  # between records: no n-gram spans two of them
PROMPT_TAIL = 32  # prompt tokens kept before each answer: "the same request again" matches from the answer's start
CACHE_LIMIT = 8192  # searches remembered (the same contexts recur across a round's levels and the next round)
MAGIC = b"eagle2-local history\n"
VERSION = 1


def _key(a: int, b: int, c: int) -> int:
    """A 3-gram as one int (token ids below 2**21; a larger id only shares its key with others, which the
    match check in :meth:`HistoryIndex.continuations` tells apart)."""
    return ((a & 0x1FFFFF) << 42) | ((b & 0x1FFFFF) << 21) | (c & 0x1FFFFF)


class HistoryIndex:
    """Earlier answers, each after the last :data:`PROMPT_TAIL` tokens of its prompt, bounded to
    ``max_tokens`` tokens and ``max_answers`` records (the oldest evicted). :attr:`drafted` and :attr:`accepted`
    count the tokens the history proposed in drafted trees' rows and those accepted (what tests and benchmarks
    read)."""

    def __init__(self, max_tokens: int = 2_500_000, max_answers: int = 10_000, max_n: int = 16,
                 max_positions: int = 32) -> None:
        self.max_tokens, self.max_answers = max_tokens, max_answers
        self.max_n, self.max_positions = max_n, max_positions
        self.confidence = MatchConfidence(max_n)
        self.drafted = self.accepted = 0
        self.path: str | os.PathLike | None = None  # its history file (open_history)
        self.vocab = ""  # the fingerprint of the model's vocabulary (vocab_fingerprint)
        self.last_match = 0
        self._reset_arrays()

    def _reset_arrays(self) -> None:
        self.text = array("i")  # every record's tokens, each record followed by SEP
        self._prev = array("i")  # per position: the previous position that followed the same 3-gram (-1: none)
        self._last: dict[int, int] = {}  # 3-gram -> the most recent position that followed it
        self.records: deque[tuple[int, int]] = deque()  # (start, answer_from) per record, oldest first
        self.base = 0  # positions below it belong to evicted records
        self._cache: dict[tuple[int, ...], tuple[list[int], list[float], int]] = {}

    def __len__(self) -> int:
        """Records held."""
        return len(self.records)

    @property
    def n_tokens(self) -> int:
        """Tokens held (separators included)."""
        return len(self.text) - self.base

    def clear(self) -> None:
        self._reset_arrays()

    # ------------------------------------------------------------------ adding and evicting
    def add(self, answer, prompt=()) -> None:
        """Remember ``answer`` (token ids), after the last :data:`PROMPT_TAIL` tokens of ``prompt``."""
        answer = [int(t) for t in answer]
        if not answer:
            return
        tail = [int(t) for t in list(prompt)[-PROMPT_TAIL:]]
        start = len(self.text)
        self._append(tail + answer)
        self.records.append((start, start + len(tail)))
        self._evict()

    def _append(self, tokens: list[int]) -> None:
        text, prev, last = self.text, self._prev, self._last
        j0 = len(text)
        text.extend(tokens)
        text.append(SEP)
        for j in range(j0, len(text)):
            if j - j0 < ANCHOR:
                prev.append(-1)
                continue
            key = _key(text[j - 3], text[j - 2], text[j - 1])
            prev.append(last.get(key, -1))
            last[key] = j
        self._cache.clear()

    def _evict(self) -> None:
        while len(self.records) > 1 and (len(self.records) > self.max_answers
                                         or len(self.text) - self.records[0][0] > self.max_tokens):
            self.records.popleft()
            self.base = self.records[0][0]
        if len(self.records) == 1 and len(self.text) - self.base > self.max_tokens:  # one record over the cap
            self.clear()
            return
        if self.base and self.base * 2 >= len(self.text):
            self._compact()
        self._cache.clear()

    def _compact(self) -> None:
        """Rebuild the arrays from the records kept (positions start at 0 again)."""
        kept = self.answers()
        self._reset_arrays()
        for tail, answer in kept:
            start = len(self.text)
            self._append(tail + answer)
            self.records.append((start, start + len(tail)))

    def answers(self) -> list[tuple[list[int], list[int]]]:
        """Every record held, oldest first: (prompt tail, answer)."""
        ends = [r[0] for r in list(self.records)[1:]] + [len(self.text)]
        return [(self.text[s:a].tolist(), self.text[a:e - 1].tolist()) for (s, a), e in zip(self.records, ends)]

    # ------------------------------------------------------------------ proposing
    def continuations(self, context: list[int], width: int) -> tuple[list[int], list[float]]:
        """The tokens that followed the longest match of ``context``'s end among the records, most frequent
        first (ties: the most recent), with their probabilities; the match length is :attr:`last_match`
        (0: none of at least :data:`ANCHOR` tokens)."""
        suffix = tuple(context[-self.max_n:])
        hit = self._cache.get(suffix)
        if hit is None:
            if len(self._cache) >= CACHE_LIMIT:  # a long answer's contexts: kept to a bound
                self._cache.clear()
            hit = self._cache[suffix] = self._search(suffix)
        toks, counts, n = hit
        self.last_match = n
        if not toks:
            return [], []
        rate = self.confidence.rate(n, PROMPT)
        top = counts[0]
        probs = [rate * c / top for c in counts[:width]]
        total = sum(probs)
        if total > 1.0:
            probs = [p / total for p in probs]
        return toks[:width], probs

    def _search(self, suffix: tuple[int, ...]) -> tuple[list[int], list[int], int]:
        """Followers of the longest match of ``suffix``'s end, their counts (best first) and its length."""
        m = len(suffix)
        if m < ANCHOR:
            return [], [], 0
        p = self._last.get(_key(suffix[-3], suffix[-2], suffix[-1]), -1)
        text, prev, base = self.text, self._prev, self.base
        best, counts = 0, {}
        for _ in range(self.max_positions):
            if p < base:
                break
            n = 0
            while n < m and p - 1 - n >= base and text[p - 1 - n] == suffix[m - 1 - n]:
                n += 1
            tok = text[p]
            if n >= ANCHOR and tok != SEP:
                if n > best:
                    best, counts = n, {tok: 1}
                elif n == best:
                    counts[tok] = counts.get(tok, 0) + 1
            p = prev[p]
        if not best:
            return [], [], 0
        ranked = sorted(counts.items(), key=lambda item: -item[1])  # stable: the most recent first on ties
        return [t for t, _ in ranked], [c for _, c in ranked], best

    def observe(self, context: list[int], token: int) -> None:
        """``token`` came after ``context``: score the history's top continuation for it (its learned rates)."""
        toks, _ = self.continuations(context, 1)
        if toks:
            self.confidence.observe(self.last_match, toks[0] == token, PROMPT)

    # ------------------------------------------------------------------ benchmarks' holds
    @contextlib.contextmanager
    def held(self, keep: int) -> Iterator[None]:
        """Answers added inside the block are held back; at its end the first ``keep`` of them are added (a
        benchmark record run ``repeat`` times adds its first eagle run's answers once, after every run: no run
        drafts from the same record's own earlier run)."""
        pending: list[tuple[list[int], list[int]]] = []
        add = self.add
        self.add = lambda answer, prompt=(): pending.append((list(answer), list(prompt)))  # type: ignore
        try:
            yield
        finally:
            del self.add
            for answer, prompt in pending[:keep]:
                add(answer, prompt)


class HistoryRounds:
    """A lookup draft's use of a :class:`HistoryIndex`, round by round: each node's row is the history's when
    the history's top continuation is surer than the text's (or the text has none); answer tokens score the
    history's predictions; :attr:`HistoryIndex.accepted` counts the accepted nodes whose token the history
    proposed at their parent (nodes that were expanded: a round's last accepted node, a leaf, is not counted)."""

    def __init__(self, index: HistoryIndex) -> None:
        self.index = index
        self._rows: dict[int, list[int]] = {}  # candidate id (-1: the root) -> the tokens its history row holds
        self._proposed: set[int] = set()  # candidate ids whose token their parent's history row proposed

    def clear(self) -> None:
        self._rows.clear()
        self._proposed.clear()

    def observe(self, text: list[int], answer_from: int, tokens: list[int]) -> None:
        """``tokens`` are committed after ``text``: each answer token scores the history's prediction for it."""
        n = self.index.max_n
        context = text[-n:]
        for i, tok in enumerate(tokens):
            if len(text) + i >= answer_from:
                self.index.observe(context, tok)
            context = (context + [tok])[-n:]

    def rows(self, tail: list[int], paths: list[list[int]], cand_ids: list[int], tokens: list[list[int]],
             probs: list[list[float]], width: int) -> None:
        """Each node's row replaced by the history's where that is surer (in place)."""
        index = self.index
        for i, path in enumerate(paths):
            toks, p = index.continuations(tail + path, width)
            if toks and (not probs[i] or p[0] > probs[i][0]):
                tokens[i], probs[i] = toks, p
                self._rows[cand_ids[i]] = toks
                index.drafted += len(toks)

    def expanded(self, cand_ids: list[int], tokens: list[int], parents: list[int]) -> None:
        for cand, tok, parent in zip(cand_ids, tokens, parents):
            if int(tok) in self._rows.get(-1 if parent < 0 else parent, ()):
                self._proposed.add(cand)

    def commit(self, accepted_cand_ids) -> None:
        self.index.accepted += sum(1 for c in accepted_cand_ids if int(c) in self._proposed)
        self.clear()


def held(history: HistoryIndex | None, keep: int):
    """:meth:`HistoryIndex.held`, or nothing to hold without a history."""
    return contextlib.nullcontext() if history is None else history.held(keep)


def recorded(chunks, history: HistoryIndex, prompt: list[int]):
    """Yield ``chunks`` (a generation's :class:`~eagle2_local.generation.generator.Chunk` stream) and add the
    answer's tokens to ``history`` when the stream ends, is closed early (a stop, a cancelled request) or fails:
    what was emitted is what was answered."""
    tokens: list[int] = []
    try:
        for chunk in chunks:
            tokens.extend(chunk.tokens)
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        history.add(tokens, prompt)


def open_history(engine, history, path: str | os.PathLike | None, model) -> HistoryIndex | None:
    """The history an :class:`~eagle2_local.api.Eagle2` keeps (None: none): ``history`` True (a new index),
    an index, or False/None (none, unless ``path`` names a file: then on); used only by a draft with a lookup
    part (``engine.lookup``), which gets it. ``path``: a history file, loaded now (:func:`load`) and written by
    :func:`close_history`. ``model``: the target, whose vocabulary a file must match."""
    if history is False or (history is None and path is None) or engine is None or engine.lookup is None:
        return None
    index = history if isinstance(history, HistoryIndex) else HistoryIndex()
    index.path, index.vocab = path, vocab_fingerprint(model)
    if path is not None:
        load(index, path, index.vocab)
    engine.lookup.use_history(index)
    return index


def close_history(index: HistoryIndex | None) -> None:
    """Write ``index`` to its file, if it has one; a failed write is one logged warning (the old file stays)."""
    path = getattr(index, "path", None)
    if path is None:
        return
    try:
        save(index, path, index.vocab)
    except OSError as exc:
        log.warning("history file %s not written (%s)", path, exc.strerror or exc)


# ---------------------------------------------------------------------- files
def vocab_fingerprint(model) -> str:
    """The model's vocabulary in a few hex digits: its size and the texts of 64 tokens spread over it
    (``model``: anything with ``n_vocab`` and ``token_text(id) -> bytes``)."""
    n = int(model.n_vocab)
    h = hashlib.sha256(str(n).encode())
    for t in range(0, n, max(n // 64, 1)):
        h.update(bytes(model.token_text(t)) + b"\0")
    return h.hexdigest()[:24]


def save(history: HistoryIndex, path: str | os.PathLike, vocab: str) -> None:
    """Write ``history`` to ``path`` atomically: a header line (magic), a JSON line (version, vocabulary,
    record lengths, checksum), then the tokens as little-endian int32."""
    tails, answers = [], array("i")
    lengths = []
    for tail, answer in history.answers():
        tails.append(len(tail))
        lengths.append(len(answer))
        answers.extend(tail)
        answers.extend(answer)
    if array("i").itemsize != 4:
        raise OSError("int32 arrays needed")
    payload = answers.tobytes() if sys.byteorder == "little" else _swapped(answers)
    head = {"version": VERSION, "vocab": vocab, "tails": tails, "answers": lengths,
            "sha256": hashlib.sha256(payload).hexdigest()}
    with atomic_path(path) as part:
        with open(part, "wb") as f:
            f.write(MAGIC)
            f.write(json.dumps(head).encode() + b"\n")
            f.write(payload)


def _swapped(values: array) -> bytes:
    copy = array("i", values)
    copy.byteswap()
    return copy.tobytes()


def load(history: HistoryIndex, path: str | os.PathLike, vocab: str) -> bool:
    """Add the records of the history file at ``path`` to ``history``. A missing file is an empty history
    (False, nothing said); one that is not a history file, damaged, of another version or of another
    vocabulary is refused in one logged warning (False): the run goes on without it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("history file %s not read (%s); starting with no history", path, exc.strerror or exc)
        return False
    why = _check(data, vocab)
    if isinstance(why, str):
        log.warning("history file %s refused: %s; starting with no history", path, why)
        return False
    head, tokens = why
    at = 0
    for tail, n in zip(head["tails"], head["answers"]):
        history.add(tokens[at + tail:at + tail + n], tokens[at:at + tail])
        at += tail + n
    return True


def _check(data: bytes, vocab: str):
    """(header, tokens) of a history file's bytes, or why they are refused."""
    if not data.startswith(MAGIC):
        return "not a history file"
    line_end = data.find(b"\n", len(MAGIC))
    try:
        head = json.loads(data[len(MAGIC):line_end])
        version, its_vocab = head["version"], head["vocab"]
        tails, lengths, digest = list(head["tails"]), list(head["answers"]), head["sha256"]
    except (ValueError, KeyError, TypeError):
        return "damaged header"
    if version != VERSION:
        return f"version {version}, this program reads {VERSION}"
    if its_vocab != vocab:
        return "written for another model's vocabulary"
    payload = data[line_end + 1:]
    if hashlib.sha256(payload).hexdigest() != digest or len(payload) != 4 * (sum(tails) + sum(lengths)) \
            or len(tails) != len(lengths):
        return "damaged (checksum or length)"
    tokens = array("i")
    tokens.frombytes(payload)
    if sys.byteorder != "little":
        tokens.byteswap()
    return head, tokens.tolist()
