"""EAGLE-2 dynamic draft trees as numpy arrays (no llama.cpp here).

The tree is grown the way SafeAILab/EAGLE's ``topK_genrate`` grows it:

* level 1: the top-k tokens of the draft's log-softmax at the root;
* every deeper level feeds exactly ``top_k`` frontier nodes to the draft; each yields its top-k children, whose
  score is the *cumulative* log-probability of the path; the next frontier is the global top-k of those k*k
  children; every child is recorded as a candidate;
* finally the ``total_tokens - 1`` best-scoring candidates (plus the root) form the tree. A child's score never
  exceeds its parent's, so the kept set is closed under "parent of" (ties are broken towards earlier
  candidates, which are always parents before children).

``depth`` here counts draft levels below the root (the number of draft forward passes); EAGLE's own ``depth``
argument is one less (its first pass is outside the loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection

import numpy as np

from ..errors import TreeError
from .proposals import MODEL, Proposals

MAX_TREE_NODES = 256  # llama.cpp can address at most 256 sequences (llama.MAX_SEQ); our trees stay well below
# EAGLE-2's tree (its total_token, depth and top_k): the fixed tree's shape, the auto budget's limits, every default
EAGLE2_TOTAL_TOKENS, EAGLE2_DEPTH, EAGLE2_TOP_K = 60, 6, 10
LOOKUP_DEPTH = 16  # a lookup draft alone: its levels cost nothing and copied spans run long (NOTES.md#lookup-drafts)


@dataclass(frozen=True)
class TreeParams:
    """Shape limits of one draft tree. Defaults follow EAGLE-2 (total 60 nodes, top-k 10, 6 levels)."""

    total_tokens: int = EAGLE2_TOTAL_TOKENS
    depth: int = EAGLE2_DEPTH
    top_k: int = EAGLE2_TOP_K

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= 64:
            raise TreeError(f"tree top_k must be in 1..64, got {self.top_k}")
        if not 1 <= self.depth <= 32:
            raise TreeError(f"tree depth must be in 1..32, got {self.depth}")
        if not 2 <= self.total_tokens <= MAX_TREE_NODES:
            raise TreeError(f"total_tokens must be in 2..{MAX_TREE_NODES}, got {self.total_tokens}")




@dataclass
class DraftTree:
    """A verified-in-one-pass tree. Node 0 is the root (the last sampled token, not yet in the KV cache).

    ``parents[i] < i`` for every non-root node, so node order is a valid decode order.
    ``cand_ids`` maps nodes back to the candidate ids the draft engine saw (-1 for the root); ``sources`` says
    which drafter proposed each node (:data:`SOURCE_NAMES`; the root's entry means nothing).
    """

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    cand_ids: np.ndarray
    sources: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int32)
        self.parents = np.asarray(self.parents, dtype=np.int32)
        self.scores = np.asarray(self.scores, dtype=np.float64)
        self.cand_ids = np.asarray(self.cand_ids, dtype=np.int64)
        self.sources = (np.full(len(self.tokens), MODEL, dtype=np.int8) if self.sources is None
                        else np.asarray(self.sources, dtype=np.int8))
        validate_parents(self.parents)
        if len(self.tokens) != len(self.parents):
            raise TreeError("tree tokens and parents differ in length")

    @classmethod
    def from_parents(cls, tokens, parents) -> "DraftTree":
        """A tree without draft scores (tests, external drafts): later siblings rank lower."""
        n = len(tokens)
        return cls(tokens, parents, -np.arange(n, dtype=np.float64), -np.ones(n, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> np.ndarray:
        return node_depths(self.parents)

    def children(self, node: int) -> np.ndarray:
        """Children of ``node``, best draft score first."""
        kids = np.flatnonzero(self.parents == node)
        return kids[np.argsort(-self.scores[kids], kind="stable")]


def is_chain(parents: np.ndarray) -> bool:
    """Whether every node's parent is the node before it (one path, no branches)."""
    parents = np.asarray(parents)
    return bool(np.array_equal(parents, np.arange(-1, len(parents) - 1)))


def main_chain(tree: DraftTree, max_nodes: int | None = None) -> DraftTree:
    """The tree's best path from the root: at every node its best-scoring child, at most ``max_nodes`` nodes.
    What a model whose memory holds one state per sequence (recurrent and hybrid models) can verify in one pass."""
    limit = len(tree) if max_nodes is None else max_nodes
    path = [0]
    has_child = np.zeros(len(tree), dtype=bool)
    has_child[tree.parents[1:]] = True
    while len(path) < limit and has_child[path[-1]]:
        path.append(int(tree.children(path[-1])[0]))
    keep = np.asarray(path)
    return DraftTree(tree.tokens[keep], np.arange(-1, len(keep) - 1), tree.scores[keep], tree.cand_ids[keep],
                     tree.sources[keep])


def validate_parents(parents: np.ndarray) -> None:
    """A tree in decode order: node 0 is the only root and every parent precedes its child."""
    n = len(parents)
    if n == 0:
        raise TreeError("a tree needs at least the root node")
    if n > MAX_TREE_NODES:
        raise TreeError(f"tree has {n} nodes; at most {MAX_TREE_NODES} are supported")
    if parents[0] != -1:
        raise TreeError("node 0 must be the root (parent -1)")
    rest = parents[1:]
    bad = np.flatnonzero((rest < 0) | (rest >= np.arange(1, n)))
    if bad.size:
        i = int(bad[0]) + 1
        raise TreeError(f"node {i} has parent {int(parents[i])}, which is not an earlier node")


def node_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of each node (root = 0): every node climbs one level at a time, all nodes at once, until it reaches
    the root (as many numpy steps as the tree is deep, instead of a Python step per node)."""
    parents = np.asarray(parents)
    depths = np.zeros(len(parents), dtype=np.int32)
    up = np.arange(len(parents))
    while True:
        climbing = up > 0
        if not climbing.any():
            return depths
        depths += climbing
        up = np.where(climbing, parents[up], 0)


def tree_leaves(parents: np.ndarray) -> np.ndarray:
    """Nodes without children, in node order."""
    has_child = np.zeros(len(parents), dtype=bool)
    has_child[parents[1:]] = True
    return np.flatnonzero(~has_child)


def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """``mask[i, j]`` is True when j is i or an ancestor of i (what node i may attend to inside the tree).

    Pointer doubling, all nodes together: after step s each row holds the ancestors less than 2**s levels up
    and ``up`` the ancestor 2**s levels up (the root where there is none), so a tree d levels deep takes
    ~log2(d) + 1 steps of three numpy calls; a lookup's chains run 8-12 levels deep, where climbing one level
    per step cost ~5 calls a level."""
    parents = np.asarray(parents)
    n = len(parents)
    mask = np.eye(n, dtype=bool)
    up = np.maximum(parents, 0)  # the root is its own ancestor here: it adds nothing new
    while up.any():
        mask |= mask[up]
        up = up[up]
    mask[:, :1] = True  # the last step can leave out the root, exactly 2**s levels up; it is everyone's ancestor
    return mask


def verify_layout(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a verify pass needs of a tree, from one climb: each node's depth (its ancestors, the root
    included, are its depth), the leaves, and a (n_nodes, n_leaves) mask, True where the leaf lies in the node's
    subtree: giving each node the KV sequence ids of its subtree's leaves makes llama.cpp's mask let every node see
    exactly its ancestors and itself."""
    anc = ancestor_mask(parents)
    leaves = tree_leaves(parents)
    return anc.sum(axis=1) - 1, leaves, anc[leaves].T


@dataclass
class Candidates:
    """Every draft candidate of one round (ids = positions here), before re-ranking into a tree."""

    tokens: np.ndarray
    scores: np.ndarray  # cumulative log-probabilities of the paths (EAGLE-2's ranking score)
    parents: np.ndarray  # candidate id of the parent, -1 = the root
    levels: int  # draft levels grown (1 = only the root's children)
    sources: np.ndarray | None = None  # which drafter proposed each candidate (MODEL when not given)


# should_expand(all candidate scores so far, frontier scores, levels grown, the candidates' sources, the frontier's
# sources) -> grow another level?
ShouldExpandFn = Callable[[np.ndarray, np.ndarray, int, np.ndarray, np.ndarray], bool]
# level_done(levels grown so far): called once after every drafted level (a clock for the caller)
LevelDoneFn = Callable[[int], None]
# expand(frontier candidate ids, their tokens, their parent candidate ids (-1 = the root), level) -> a row each
ExpandFn = Callable[[list[int], list[int], list[int], int], "Proposals"]


def grow_candidates(root: Proposals, expand: ExpandFn, params: TreeParams,
                    should_expand: ShouldExpandFn | None = None, level_done: LevelDoneFn | None = None,
                    final_tokens: Collection[int] = frozenset()) -> Candidates:
    """Grow EAGLE-2's candidate levels from the root's proposals, at most ``params.depth``. ``should_expand`` may
    stop earlier (the tree budget stops levels that cannot pay for their draft and verify time); ``level_done``
    hears of every level grown, the last one included (the budget times the draft with it). ``final_tokens``
    (end-of-generation tokens) are never expanded: the answer ends there, so a child of one could only be verified
    for nothing (a lookup copying the prompt would follow the chat template past the end).

    Plain Python over lists: a level is about ten rows of about ten entries, where each numpy call costs more than
    the rows' own work on the cold caches right after a draft's decode. Each level's next frontier is its ``top_k``
    best candidates (a stable sort: ties keep candidate order) that may have children."""
    k = params.top_k
    first = root.best(k)
    tok, score, src = list(first.tokens[0]), list(first.log_probs[0]), list(first.sources[0])
    parent = [-1] * len(tok)
    frontier = [i for i, t in enumerate(tok) if t not in final_tokens]
    levels = 1
    for level in range(2, params.depth + 1):
        if level_done is not None:
            level_done(levels)
        if not frontier:  # the draft proposed nothing more
            break
        if should_expand is not None and not should_expand(
                np.array(score), np.array([score[i] for i in frontier]), levels, np.array(src, dtype=np.int8),
                np.array([src[i] for i in frontier], dtype=np.int8)):
            break
        rows = expand(frontier, [tok[i] for i in frontier], [parent[i] for i in frontier], level - 1).best(k)
        n_before = len(tok)
        for cand, toks, lps, srcs in zip(frontier, rows.tokens, rows.log_probs, rows.sources):
            tok += toks
            score += map(score[cand].__add__, lps)  # the path's score plus each child's (no Python frame a row)
            src += srcs
            parent += [cand] * len(toks)
        best = sorted(range(n_before, len(tok)), key=score.__getitem__, reverse=True)  # stable: ties keep order
        frontier = [i for i in best if tok[i] not in final_tokens][:k]
        levels = level
    if level_done is not None and levels == params.depth:
        level_done(levels)
    return Candidates(np.array(tok, dtype=np.int64), np.array(score, dtype=np.float64),
                      np.array(parent, dtype=np.int64), levels, np.array(src, dtype=np.int8))


def select_tree(root_token: int, cand_tok: np.ndarray, cand_score: np.ndarray, cand_parent: np.ndarray,
                total_tokens: int, cand_sources: np.ndarray | None = None) -> DraftTree:
    """Keep the best ``total_tokens - 1`` candidates plus the root, in candidate (= decode) order."""
    n_keep = min(total_tokens - 1, len(cand_tok))
    order = np.lexsort((np.arange(len(cand_tok)), -cand_score))
    kept = np.sort(order[:n_keep])
    node_of = np.full(len(cand_tok), -1, dtype=np.int64)
    node_of[kept] = np.arange(1, n_keep + 1)
    parent_cand = cand_parent[kept]
    parents = np.where(parent_cand < 0, 0, node_of[np.maximum(parent_cand, 0)])
    if np.any(parents[parent_cand >= 0] < 0):  # cannot happen with cumulative log-probs; guard anyway
        raise TreeError("re-ranked tree lost a parent")
    return DraftTree(
        tokens=np.concatenate([[root_token], cand_tok[kept]]),
        parents=np.concatenate([[-1], parents]),
        scores=np.concatenate([[0.0], cand_score[kept]]),
        cand_ids=np.concatenate([[-1], kept]),
        sources=None if cand_sources is None else np.concatenate([[MODEL], cand_sources[kept]]),
    )
