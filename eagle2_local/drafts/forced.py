"""Forced tokens as a free draft source: under a grammar, the tokens the grammar leaves no (or little) choice
about are drafted without any model, and a run of them costs one verify batch instead of a decode each.

Which tokens a state allows is found without a whole-vocabulary mask (milliseconds,
NOTES.md#structured-output-and-tools): the vocabulary is
a forest in which each token hangs under its longest proper prefix that is also a token (``"na`` under ``"n``
under ``"``). A grammar refuses a token whenever it refuses a prefix of it, so the allowed set is found level by
level from the roots (single characters and the like, a few hundred tokens), checking only the children of
allowed tokens. Where more than :data:`MAX_FIRST` roots are allowed (inside a free string, a number) the grammar
forces nothing and the search stops after that first call.

A single allowed token is proposed with probability 1. Several (tokenizers merge text: inside a key the grammar
allows ``n``, ``na``, ``nam``, ``name``; after it ``"``, ``":``, ``":"``) are proposed with the rates at which
the target chose among the same allowed set before, in this generation or an earlier one (a JSON answer meets
the same sets at every key, and the choice is the model's habit). A set not met before is proposed only when it
is a chain (each token a prefix of the longest), as its longest token with :data:`CHAIN_PRIOR`: the canonical
tokenization of forced text, which the target picks inside keys and keywords; a guess among branching sets
(optional whitespace) would cost verify nodes on a CPU where nodes are not free (the measurements:
NOTES.md#structured-output-and-tools).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..decoding.grammar import GrammarState
from ..llamacpp.llama import LlamaModel
from ..tree.proposals import FORCED, Proposals

MAX_FIRST = 6  # more allowed roots than this: nothing is forced here
FIRST_LOOK = 32  # roots checked first: more than MAX_FIRST of them allowed settles it (the rest go unchecked)
MAX_CHECKED = 4096  # a search that would check more tokens than this gives up (not a forced spot)
CHAIN_PRIOR = 0.6  # the probability given to the longest token of a chain of allowed tokens not met before
# a tenth of an unseen choice's worth of doubt beside the target's earlier picks among the same allowed set: the picks
# are a habit (107 of 107 accepted: NOTES.md#structured-output-and-tools), and with a whole choice's doubt a set met
# once was drafted at 0.5, so a key's forced run (four learned picks, ~0.06 at its end) never paid for its verify
# nodes
LEARNED_DOUBT = 0.1


class VocabForest:
    """The vocabulary as a prefix forest: ``roots`` (tokens without a shorter token as a prefix, and the
    end-of-generation tokens) and each token's children, in CSR form."""

    def __init__(self, model: LlamaModel) -> None:
        pieces = [model.token_bytes(t) for t in range(model.n_vocab)]
        first: dict[bytes, int] = {}
        for tok, piece in enumerate(pieces):
            if piece:
                first.setdefault(piece, tok)
        parent = np.full(model.n_vocab, -2, dtype=np.int64)  # -2: not in the forest (no text)
        for tok, piece in enumerate(pieces):
            if piece:
                parent[tok] = _prefix_parent(piece, tok, first)
        self.parent = parent
        roots = np.flatnonzero(parent == -1)
        self.roots = np.unique(np.concatenate([roots, sorted(model.eog_tokens)])).astype(np.int64)
        inner = np.flatnonzero(parent >= 0)
        order = inner[np.argsort(parent[inner], kind="stable")]
        self.children = order
        self.starts = np.searchsorted(parent[order], np.arange(model.n_vocab + 1))

    def kids(self, tokens: np.ndarray) -> np.ndarray:
        """All children of ``tokens``."""
        if len(tokens) == 0:
            return tokens
        return np.concatenate([self.children[self.starts[t]:self.starts[t + 1]] for t in tokens.tolist()])

    def is_chain(self, allowed: np.ndarray, deepest: int) -> bool:
        """Whether every token of ``allowed`` is a prefix of ``deepest`` (or is it): walking up the forest from
        it meets them all (a duplicate's parent is its twin, a prefix all the same)."""
        members = set(allowed.tolist())
        up = deepest
        while up >= 0 and up in members:
            members.discard(up)
            up = int(self.parent[up])
        return not members

    def allowed_set(self, state: GrammarState) -> tuple[np.ndarray | None, int]:
        """Every token ``state`` allows, if few (None: more than :data:`MAX_FIRST` first steps or
        :data:`MAX_CHECKED` checks, i.e. the grammar forces nothing here), and the last one found at the deepest
        level of the search (a longest allowed token)."""
        head = self.roots[:FIRST_LOOK]  # free text allows most of any few roots: one small call tells it
        allowed = head[state.allowed(head)]
        if len(allowed) > MAX_FIRST:
            return None, -1
        rest = self.roots[FIRST_LOOK:]
        level = np.concatenate([allowed, rest[state.allowed(rest)]]) if len(rest) else allowed
        if len(level) > MAX_FIRST:
            return None, -1
        found, checked = [level], len(self.roots)
        deepest = int(level[-1]) if len(level) else -1
        while len(level):
            kids = self.kids(level)
            checked += len(kids)
            if checked > MAX_CHECKED:
                return None, -1
            level = kids[state.allowed(kids)] if len(kids) else kids
            if len(level):
                deepest = int(level[-1])
            found.append(level)
        return np.sort(np.concatenate(found)), deepest


def _prefix_parent(piece: bytes, tok: int, first: dict[bytes, int]) -> int:
    """The token ``tok`` hangs under: the first token with the same text (a duplicate), else its longest proper
    prefix that is a token; -1 for a root."""
    if first[piece] != tok:
        return first[piece]
    for n in range(len(piece) - 1, 0, -1):
        up = first.get(piece[:n])
        if up is not None:
            return up
    return -1


class ForcedDraft:
    """Proposes the grammar's forced continuation at each tree node; learns which token the target picks among a
    small allowed set (one drafter per target model, kept across generations)."""

    def __init__(self, forest: VocabForest, max_branches: int = 4, chain_prior: float = CHAIN_PRIOR,
                 learn: bool = True) -> None:
        """``chain_prior`` 0 and ``learn`` False leave only single allowed tokens (benchmarks compare the rules)."""
        self.forest = forest
        self.max_branches = max_branches
        self.chain_prior = chain_prior
        self.learn = learn
        self.chosen: dict[bytes, Counter] = {}  # allowed set -> how often the target picked each of its tokens
        self._key_of: dict[int, bytes | None] = {}  # candidate id (-1: the root) -> its allowed set's key
        self._pending: tuple[list[bytes | None], int] | None = None  # the accepted nodes' keys, the text's length
        self._length = 0

    def reset(self) -> None:
        """A new generation: forget the last round, keep what the target chose. Which token a model writes
        among the same allowed set (``": "`` or ``":"`` after a key) is a habit of the model, not of one answer,
        so a script asking again with a schema drafts its keys from the first round on."""
        self._key_of.clear()
        self._pending = None

    def start_round(self, text: list[int], root: GrammarState) -> None:
        """``text`` ends with the new root. If it extends the last round's text by exactly that round's accepted
        tokens and the target's own, those tokens were the target's choices at the accepted nodes: learn them."""
        if self._pending is not None:
            keys, length = self._pending
            if len(text) == length + len(keys):
                for key, token in zip(keys, text[length:]):
                    self._observe(key, token)
        self._pending = None
        self._key_of.clear()
        self._length = len(text)

    def end_round(self, accepted_cand_ids: list[int]) -> None:
        """The accepted path (candidate ids): the next round's text will show what the target chose at the root
        and at each of them."""
        self._pending = ([self._key_of.get(-1)] + [self._key_of.get(c) for c in accepted_cand_ids], self._length)

    def propose(self, states: list[GrammarState], cands: list[int], search: list[bool] | None = None) -> Proposals:
        """One row per node: its forced token (log-probability 0), or its small allowed set's learned choices.
        ``search``: which rows to search at all (default all; a row where the grammar let all of a model's
        candidates through is free text, not worth a search)."""
        tokens: list[list[int]] = []
        log_probs: list[list[float]] = []
        for row, (state, cand) in enumerate(zip(states, cands)):
            toks, lps = [], []
            tokens.append(toks)
            log_probs.append(lps)
            if search is not None and not search[row]:
                self._key_of[cand] = None
                continue
            allowed, deepest = self.forest.allowed_set(state)
            key = allowed.tobytes() if allowed is not None and len(allowed) else None
            self._key_of[cand] = key
            if key is None:
                continue
            if len(allowed) == 1:
                toks.append(int(allowed[0]))
                lps.append(0.0)
                continue
            seen = self.chosen.get(key)
            if not seen:
                if self.chain_prior > 0 and self.forest.is_chain(allowed, deepest):
                    toks.append(deepest)
                    lps.append(float(np.log(self.chain_prior)))
                continue
            total = sum(seen.values()) + LEARNED_DOUBT
            for tok, n in seen.most_common(self.max_branches):
                toks.append(int(tok))
                lps.append(float(np.log(n / total)))
        return Proposals(tokens, log_probs, [[FORCED] * len(row) for row in tokens])

    def proposes_at(self, state: GrammarState) -> bool:
        """Whether :meth:`propose` has anything for a node in ``state`` (one search, ~0.1 ms)."""
        return bool(self.propose([state], [-1]).tokens[0])

    def chose(self, token: int) -> None:
        """The target picked ``token`` at the node :meth:`proposes_at` looked at last."""
        self._observe(self._key_of.get(-1), token)

    def _observe(self, key: bytes | None, token: int) -> None:
        if key is not None and self.learn:
            self.chosen.setdefault(key, Counter())[int(token)] += 1
