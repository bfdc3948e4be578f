"""References for the tree code: the full log-softmax, each node's leaves by brute force, and draft rows written as
padded arrays (how a test states them compactly) turned into :class:`Proposals`."""

from __future__ import annotations

import numpy as np

from eagle2_local.tree.draft_tree import ancestor_mask, tree_leaves
from eagle2_local.tree.proposals import MODEL, Proposals


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (the tree itself only needs each row's top-k)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def leaf_membership(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Leaves and a (n_nodes, n_leaves) mask: True where the leaf lies in the node's subtree."""
    leaves = tree_leaves(parents)
    return leaves, ancestor_mask(parents)[leaves].T


def rows(tokens, log_probs, sources=None) -> Proposals:
    """Rows given as (n, m) arrays padded with -inf, as :class:`Proposals`: the padding dropped and each row put
    best first (a stable sort: ties keep their columns' order)."""
    tokens = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    log_probs = np.atleast_2d(np.asarray(log_probs, dtype=np.float64))
    sources = (np.full(tokens.shape, MODEL, dtype=np.int8) if sources is None
               else np.atleast_2d(np.asarray(sources, dtype=np.int8)))
    out_tok, out_lp, out_src = [], [], []
    for tok, lp, src in zip(tokens, log_probs, sources):
        keep = [j for j in np.argsort(-lp, kind="stable").tolist() if np.isfinite(lp[j])]
        out_tok.append([int(tok[j]) for j in keep])
        out_lp.append([float(lp[j]) for j in keep])
        out_src.append([int(src[j]) for j in keep])
    return Proposals(out_tok, out_lp, out_src)
