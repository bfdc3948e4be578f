"""Deciding which drafted tokens the target accepts, without changing the target's output distribution.

Greedy: follow the child whose token equals the target's argmax, as deep as possible; the bonus token is the
target's argmax at the last accepted node. This is exactly plain greedy decoding, just several tokens per pass.

Sampling (EAGLE's tree rejection sampling with a deterministic draft): at the current node take the target's
warped distribution p; try its children in draft-score order, accepting child x with probability p(x); on
rejection set p(x) = 0 and renormalise. If a child is accepted, descend and repeat; if all are rejected, or the
node has no children, the bonus token is drawn from the remaining p. The output token at each step is then
distributed exactly as p (P[x_i] = prod_{j<i}(1 - p_j(x_j)) * p_i(x_i) = p(x_i)), so sampling is lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampling import SamplingParams, sample_from
from .tree import DraftTree


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
    node, path = 0, [0]
    while True:
        best = int(np.argmax(logits[node]))  # only the rows on the accepted path are read
        kids = np.flatnonzero((tree.parents == node) & (tree.tokens == best))
        if kids.size == 0:
            return Acceptance(np.asarray(path, dtype=np.int64), best)
        node = int(kids[0])
        path.append(node)


def accept_sampling(tree: DraftTree, logits: np.ndarray, params: SamplingParams, history: np.ndarray | None,
                    rng: np.random.Generator) -> Acceptance:
    """Lossless recursive rejection over siblings, with the same warpers as plain sampling."""
    return _walk(tree, logits, params, history, rng)


def accept(tree: DraftTree, logits: np.ndarray, params: SamplingParams, history: np.ndarray | None,
           rng: np.random.Generator) -> Acceptance:
    """Dispatch on the sampling mode."""
    if params.greedy:
        return accept_greedy(tree, logits, params, history)
    return accept_sampling(tree, logits, params, history, rng)


def _walk(tree: DraftTree, logits: np.ndarray, params: SamplingParams, history: np.ndarray | None,
          rng: np.random.Generator | None) -> Acceptance:
    """The general walk; with ``rng=None`` it is greedy under the (penalised) warpers."""
    hist = np.asarray(history if history is not None else [], dtype=np.int64)
    node, path = 0, [0]
    while True:
        context = np.concatenate([hist, tree.tokens[path].astype(np.int64)])
        if rng is None:
            target = params.choose(logits[node], context, np.random.default_rng(0))
            kids = np.flatnonzero((tree.parents == node) & (tree.tokens == target))
            if kids.size == 0:
                return Acceptance(np.asarray(path, dtype=np.int64), int(target))
            node = int(kids[0])
            path.append(node)
            continue
        p = params.probs(logits[node], context)
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
            return Acceptance(np.asarray(path, dtype=np.int64), sample_from(p, rng))
        node = chosen
        path.append(node)
