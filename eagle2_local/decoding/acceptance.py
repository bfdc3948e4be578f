"""Deciding which drafted tokens the target accepts, without changing the target's output distribution.

Greedy: follow the child whose token equals the target's argmax, as deep as possible; the bonus token is the
target's argmax at the last accepted node. This is exactly plain greedy decoding, just several tokens per pass.

Sampling (EAGLE's tree rejection sampling with a deterministic draft): at the current node take the target's
warped distribution p; try its children in draft-score order, accepting child x with probability p(x); on
rejection set p(x) = 0 and renormalise. If a child is accepted, descend and repeat; if all are rejected, or the
node has no children, the bonus token is drawn from the remaining p. The output token at each step is then
distributed exactly as p (P[x_i] = prod_{j<i}(1 - p_j(x_j)) * p_i(x_i) = p(x_i)), so sampling is lossless.

Under a grammar the target is the constrained one, as plain constrained decoding samples it: at each visited node
the logits are masked by the grammar's state there before the warpers (greedy checks the unconstrained argmax
first and masks only when the grammar refuses it). The walk advances the committed grammar state along the
accepted path and by the bonus token, so after a round it is the state at the next root. Tree nodes the grammar
forbids never reach verification (the draft side drops them), so every token the walk accepts is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tree.draft_tree import DraftTree
from ..tree.sampling import SamplingParams, sample_from
from .grammar import GrammarState, choose


@dataclass
class Acceptance:
    """Result of one verification: accepted node indices (root first) and the token the target adds."""

    path: np.ndarray
    bonus: int

    @property
    def n_accepted(self) -> int:
        """Draft tokens accepted (not counting the root, which was already emitted, nor the bonus)."""
        return len(self.path) - 1


def accept_greedy(tree: DraftTree, logits: np.ndarray, params: SamplingParams | None = None,
                  history: np.ndarray | None = None) -> Acceptance:
    """Longest root path whose tokens equal the target's (penalised) argmax at each parent."""
    if params is not None and params.repeat_penalty != 1.0:
        return _walk(tree, logits, params, history, None)
    child: dict[tuple[int, int], int] = {}  # (parent, token) -> its first child with that token
    for i, key in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist())):
        child.setdefault(key, i)
    node, path = 0, [0]
    while True:
        best = int(np.argmax(logits[node]))  # only the rows on the accepted path are read
        node = child.get((node, best))
        if node is None:
            return Acceptance(np.asarray(path, dtype=np.int64), best)
        path.append(node)


def accept_sampling(tree: DraftTree, logits: np.ndarray, params: SamplingParams, history: np.ndarray | None,
                    rng: np.random.Generator) -> Acceptance:
    """Lossless recursive rejection over siblings, with the same warpers as plain sampling."""
    return _walk(tree, logits, params, history, rng)


def accept(tree: DraftTree, logits: np.ndarray, params: SamplingParams, history: np.ndarray | None,
           rng: np.random.Generator, grammar: GrammarState | None = None) -> Acceptance:
    """Dispatch on the sampling mode; ``grammar``: the state at the root, advanced to the next root's."""
    if grammar is not None:
        return _walk(tree, logits, params, history, None if params.greedy else rng, grammar)
    if params.greedy:
        return accept_greedy(tree, logits, params, history)
    return accept_sampling(tree, logits, params, history, rng)


def _walk(tree: DraftTree, logits: np.ndarray, params: SamplingParams, history: np.ndarray | None,
          rng: np.random.Generator | None, grammar: GrammarState | None = None) -> Acceptance:
    """The general walk; with ``rng=None`` it is greedy under the (penalised) warpers. ``grammar`` (advanced in
    place by every accepted token and the bonus) constrains the target at each visited node."""
    recent = params.recent(history) if history is not None else None  # what the penalty reads of the text
    hist = np.asarray(recent if recent is not None else [], dtype=np.int64)
    node, path = 0, [0]
    while True:
        context = np.concatenate([hist, tree.tokens[path].astype(np.int64)])
        if rng is None:
            target = choose(params, grammar, logits[node], context, np.random.default_rng(0))
            kids = np.flatnonzero((tree.parents == node) & (tree.tokens == target))
            if grammar is not None:
                grammar.accept(target)
            if kids.size == 0:
                return Acceptance(np.asarray(path, dtype=np.int64), int(target))
            node = int(kids[0])
            path.append(node)
            continue
        row = logits[node] if grammar is None else grammar.constrain(logits[node])
        p = params.probs(row, context)
        chosen = -1
        for child in tree.children(node):
            x = int(tree.tokens[child])
            px = p[x]
            if px > 0.0 and rng.random() < px:
                chosen = int(child)
                break
            if px > 0.0:
                p = p.copy()
                p[x] = 0.0
                total = p.sum()
                if total <= 0.0:
                    break
                p /= total
        if chosen < 0:
            bonus = sample_from(p, rng)
            if grammar is not None:
                grammar.accept(bonus)
            return Acceptance(np.asarray(path, dtype=np.int64), bonus)
        if grammar is not None:
            grammar.accept(int(tree.tokens[chosen]))
        node = chosen
        path.append(node)
