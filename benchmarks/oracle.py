"""The best schedule in hindsight: the least cost at which an answer known in advance could have been decoded.

A tree policy decides each round without knowing what the target will accept. For a draft whose proposals are
fixed by the text (a lookup, forced tokens, a head, a draft model) and greedy decoding (T = 0), the answer is
plain decoding's, so what a round of n nodes from the draft's ranking would accept at each position is known
after the fact: ``a_i(n)`` tokens, emitting ``a_i(n) + 1`` for ``c(n)`` plain steps of verification (plus the
draft's cost), where a plain step emits 1 for 1. Dynamic programming over the positions of the answer then
gives the least total cost of any schedule of rounds, which bounds what any policy on the same draft and the same
cost curve could do: judging a policy's decisions against it says how much of the attainable speed it reached,
on a curve measured anywhere, without that machine.

The oracle knows which round will be accepted; a policy only sees the draft's confidence, and must pay to see it
(a model draft's root costs its catch-up even when the round then decodes plainly). :func:`confidence_schedule`
is the reference a policy can hope to reach: at each position, the size with the best expected rate, the
expectation read from the candidates' scores through acceptance maps fitted to the whole answer set in hindsight
(:func:`hindsight_acceptance`: the best an online map could have learned), the draft's root paid at every
position. Where the oracle's lead over it is large, the draft's confidence does not tell the rounds that will be
accepted from those that will not, and no rule that reads it can close that gap. :class:`HistoryAcceptance` asks
the same of a rule that also reads the draft's recent record (whether its first guess was right at the last few
positions, known once their tokens are): one map per record, fitted the same way.

Pure: numbers in, numbers out (the benchmark that extracts ``a_i(n)`` from real drafts is
benchmarks/budget_replay.py ``--oracle``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eagle2_local.tree.draft_tree import DraftTree, select_tree
from eagle2_local.tree.proposals import MODEL
from eagle2_local.tree_policy.sizing import SourceAcceptance


@dataclass(frozen=True)
class Schedule:
    """The best schedule found: its total cost in plain steps and the tree size of each round taken in order
    (1: a plain step)."""

    tokens: int
    cost: float
    sizes: tuple[int, ...]

    @property
    def speedup(self) -> float:
        """Tokens per plain step of cost: the speed over plain decoding (1.0 for an empty answer)."""
        return self.tokens / self.cost if self.cost > 0 else 1.0

    @property
    def drafted_rounds(self) -> int:
        return sum(n > 1 for n in self.sizes)


def best_schedule(accepted: np.ndarray, verify_cost: np.ndarray, draft_cost: np.ndarray | None = None) -> Schedule:
    """The least-cost way to emit ``len(accepted)`` tokens.

    ``accepted[i, n - 1]``: tokens a round of n nodes accepts at state i (i tokens emitted so far; column 0, the
    root alone, accepts nothing and is a plain step). ``verify_cost[n - 1]``: verifying n nodes, in plain steps
    (``verify_cost[0]`` is the plain step itself, normally 1). ``draft_cost[i, n - 1]``: what drafting that
    round costs, in plain steps (None: drafting is free; column 0 is ignored, a plain step drafts nothing). A
    round emits its accepted tokens and the target's own, never past the answer's end.
    """
    acc = np.asarray(accepted, dtype=np.int64)
    if acc.ndim != 2 or acc.shape[1] < 1:
        raise ValueError("accepted must be (positions, sizes) with at least the plain step's column")
    n_tok, n_sizes = acc.shape
    c = np.asarray(verify_cost, dtype=np.float64)
    if c.shape != (n_sizes,):
        raise ValueError(f"verify_cost needs one cost per size ({n_sizes}), got shape {c.shape}")
    if (acc < 0).any() or (acc[:, 0] != 0).any():
        raise ValueError("accepted counts must be >= 0, and the root alone accepts nothing")
    d = np.zeros(acc.shape) if draft_cost is None else np.array(draft_cost, dtype=np.float64)
    if d.shape != acc.shape:
        raise ValueError(f"draft_cost must have accepted's shape {acc.shape}, got {d.shape}")
    d[:, 0] = 0.0
    best = np.zeros(n_tok + 1)
    choice = np.ones(n_tok, dtype=np.int64)
    for i in range(n_tok - 1, -1, -1):
        nxt = i + np.minimum(acc[i] + 1, n_tok - i)
        total = c + d[i] + best[nxt]
        k = int(np.argmin(total))  # ties: the smaller tree (the plain step first)
        best[i], choice[i] = total[k], k + 1
    sizes, i = [], 0
    while i < n_tok:
        n = int(choice[i])
        sizes.append(n)
        i += min(int(acc[i, n - 1]) + 1, n_tok - i)
    return Schedule(n_tok, float(best[0]), tuple(sizes))


def accepted_length(tree: DraftTree, continuation: np.ndarray) -> int:
    """Draft tokens a greedy verification accepts when the target's next tokens are ``continuation``: the
    deepest root path whose tokens follow it (at T = 0 the target's choice after each accepted token is the
    answer's next token)."""
    follow = np.asarray(continuation)
    depth_of = np.zeros(len(tree), dtype=np.int64)
    on_path = np.zeros(len(tree), dtype=bool)
    on_path[0] = True
    best = 0
    for node in range(1, len(tree)):  # parents come before children
        parent = int(tree.parents[node])
        d = depth_of[parent] + 1
        depth_of[node] = d
        if on_path[parent] and d <= len(follow) and tree.tokens[node] == follow[d - 1]:
            on_path[node] = True
            best = max(best, int(d))
    return best


@dataclass(frozen=True)
class SizeTable:
    """What trees of 1..N nodes from one round's candidates would do: ``accepted[n - 1]`` tokens accepted,
    ``depth[n - 1]`` levels the draft must grow for them, ``model[n - 1]`` whether any node is the model
    draft's alone (else the round's nodes could come from the free drafters: lookups, forced tokens). The
    candidates in ranking order (best first, at most N - 1): their ``scores``, ``sources`` and whether each lies on
    the path the answer accepts (``on_path``), what a policy reads and what it would have learned from them."""

    accepted: np.ndarray
    depth: np.ndarray
    model: np.ndarray
    scores: np.ndarray
    sources: np.ndarray
    on_path: np.ndarray


def size_table(root: int, cand_tok: np.ndarray, cand_score: np.ndarray, cand_parent: np.ndarray,
               cand_sources: np.ndarray | None, continuation: np.ndarray, max_nodes: int) -> SizeTable:
    """:class:`SizeTable` of one round's candidates, each tree chosen by the runtime's own :func:`select_tree`
    (the draft's ranking), accepted against the known ``continuation``."""
    accepted = np.zeros(max_nodes, dtype=np.int64)
    depth = np.zeros(max_nodes, dtype=np.int64)
    model = np.zeros(max_nodes, dtype=bool)
    for n in range(2, max_nodes + 1):
        tree = select_tree(root, cand_tok, cand_score, cand_parent, n, cand_sources)
        accepted[n - 1] = accepted_length(tree, continuation)
        depth[n - 1] = int(tree.depths.max())
        model[n - 1] = bool((tree.sources[1:] == MODEL).any())
    ranked = np.lexsort((np.arange(len(cand_tok)), -cand_score))[:max_nodes - 1]  # select_tree's order
    sources = np.full(len(cand_tok), MODEL, dtype=np.int8) if cand_sources is None else np.asarray(cand_sources)
    on_path = on_accepted_path(cand_tok, cand_parent, continuation)
    return SizeTable(accepted, depth, model, np.asarray(cand_score)[ranked], sources[ranked], on_path[ranked])


def on_accepted_path(cand_tok: np.ndarray, cand_parent: np.ndarray, continuation: np.ndarray) -> np.ndarray:
    """Whether each candidate (parents before children) lies on the path a greedy verification accepts when the
    target's next tokens are ``continuation``."""
    follow = np.asarray(continuation)
    depth = np.zeros(len(cand_tok), dtype=np.int64)
    on = np.zeros(len(cand_tok), dtype=bool)
    for c in range(len(cand_tok)):
        parent = int(cand_parent[c])
        depth[c] = 1 if parent < 0 else depth[parent] + 1
        d = int(depth[c])
        on[c] = (parent < 0 or on[parent]) and d <= len(follow) and cand_tok[c] == follow[d - 1]
    return on


def hindsight_acceptance(tables: list[SizeTable | None]) -> SourceAcceptance:
    """Per-drafter acceptance maps fitted to every table's ranked candidates at once (no prior, no cap): the best
    path confidence -> acceptance map an online learner could have reached on these answers."""
    acceptance = SourceAcceptance(prior_weight=1e-9, lookup_prior_weight=1e-9, max_count=np.inf)
    for table in tables:
        if table is not None and len(table.scores):
            acceptance.observe(table.scores, table.sources, table.on_path)
    return acceptance


def recent_hits(tables: list[SizeTable | None], i: int, history: int) -> int:
    """How many of the ``history`` positions before ``i`` had the draft's first-ranked candidate on the accepted
    path (their tokens are known when position ``i`` is planned), counted back until a position without
    candidates; -1 when the one right before ``i`` has none."""
    hits = 0
    for j in range(i - 1, i - 1 - history, -1):
        table = tables[j] if j >= 0 else None
        if table is None or not len(table.scores):
            return -1 if j == i - 1 else hits
        hits += int(table.on_path[0])
    return hits


@dataclass(frozen=True)
class HistoryAcceptance:
    """Acceptance maps per recent record of the draft (:func:`recent_hits` over ``history`` positions), fitted in
    hindsight like :func:`hindsight_acceptance`; a record no table had reads the pooled map."""

    history: int
    by_hits: dict[int, SourceAcceptance]
    pooled: SourceAcceptance

    def at(self, tables: list[SizeTable | None], i: int) -> SourceAcceptance:
        """The map a rule reading the record before position ``i`` would use."""
        return self.by_hits.get(recent_hits(tables, i, self.history), self.pooled)


def hindsight_history_acceptance(answers: list[list[SizeTable | None]], history: int) -> HistoryAcceptance:
    """:class:`HistoryAcceptance` fitted to every position of every answer (each answer's tables in order)."""
    by_hits: dict[int, SourceAcceptance] = {}
    for tables in answers:
        for i, table in enumerate(tables):
            if table is not None and len(table.scores):
                hits = recent_hits(tables, i, history)
                acceptance = by_hits.setdefault(hits, hindsight_acceptance([]))
                acceptance.observe(table.scores, table.sources, table.on_path)
    return HistoryAcceptance(history, by_hits, hindsight_acceptance([t for tables in answers for t in tables]))


def confidence_schedule(tables: list[SizeTable | None], acceptance: SourceAcceptance | HistoryAcceptance,
                        verify_cost: np.ndarray, draft_cost: np.ndarray, peek_cost: float = 0.0) -> Schedule:
    """The schedule of a rule that reads the draft's confidence: at each position the size with the best expected
    tokens per cost, ``1 + sum of the kept candidates' acceptance probabilities`` over ``verify_cost[n - 1] +
    draft_cost[i, n - 1]``; a plain step costs ``verify_cost[0] + peek_cost`` (what reading the draft cost:
    a model draft's root). Then the round emits what it really accepts (``tables[i].accepted``). A position
    without a table is a plain step, as is every position when drafting never pays. With a
    :class:`HistoryAcceptance` each position reads the map of the draft's record before it."""
    c = np.asarray(verify_cost, dtype=np.float64)
    n_tok = len(tables)
    sizes, cost, i = [], 0.0, 0
    while i < n_tok:
        table = tables[i]
        n = 1
        if table is not None and len(table.scores):
            reader = acceptance.at(tables, i) if isinstance(acceptance, HistoryAcceptance) else acceptance
            p = reader.prob(table.scores, table.sources)
            expected = 1.0 + np.concatenate([[0.0], np.cumsum(p)])
            m = min(len(expected), len(c))
            total = c[:m] + draft_cost[i, :m]
            total[0] = c[0] + peek_cost
            n = int(np.argmax(expected[:m] / total)) + 1
        if n == 1:
            cost += c[0] + (peek_cost if table is not None else 0.0)
            i += 1
        else:
            cost += c[n - 1] + draft_cost[i, n - 1]
            i += min(int(table.accepted[n - 1]) + 1, n_tok - i)
        sizes.append(n)
    plain = n_tok * float(c[0])
    if cost > plain:  # the rule would learn that drafting loses on these answers: plain steps only
        return Schedule(n_tok, plain, (1,) * n_tok)
    return Schedule(n_tok, cost, tuple(sizes))
