"""Draft engine: a neural draft (EAGLE head or draft model) and a lookup draft proposing into one tree.

Other runtimes *switch* between a lookup draft and a model draft. Here both propose children for every node
the tree builder expands, and EAGLE-2's global re-rank by path confidence picks the nodes to verify among all
of them: the model draft still leads where it is confident, a span the text repeats joins as a branch. A token
both propose is one child, with the higher of the two probabilities (each draft's own estimate of its chance).

The model runs every expanded node, lookup children included, so it always holds the state of a frontier
node's parent (its KV sequences stay a tree), and its ``commit`` sees the accepted nodes it ran, a prefix of
the accepted path, as it would without the lookup.
"""

from __future__ import annotations

import numpy as np

from ..tree import BOTH, DraftOutput, Proposals
from .base import DraftEngine
from .lookup import LookupDraft


def merge_proposals(model: Proposals, lookup: Proposals) -> Proposals:
    """Row-wise union of two drafts' candidates; a token in both keeps the higher log-probability, marked BOTH."""
    rows = []
    for r in range(model.tokens.shape[0]):
        best: dict[int, tuple[float, int]] = {}
        for part in (model, lookup):
            finite = np.isfinite(part.log_probs[r])
            for tok, lp, src in zip(part.tokens[r][finite].tolist(), part.log_probs[r][finite].tolist(),
                                    part.sources[r][finite].tolist()):
                if tok in best:
                    best[tok] = (max(best[tok][0], lp), BOTH)
                else:
                    best[tok] = (lp, src)
        rows.append(best)
    width = max(1, max(len(b) for b in rows))
    tokens = np.zeros((len(rows), width), dtype=np.int64)
    log_probs = np.full((len(rows), width), -np.inf)
    sources = np.zeros((len(rows), width), dtype=np.int8)
    for r, best in enumerate(rows):
        for c, (tok, (lp, src)) in enumerate(best.items()):
            tokens[r, c], log_probs[r, c], sources[r, c] = tok, lp, src
    return Proposals(tokens, log_probs, sources)


class MergedDraft:
    """``model`` and a :class:`LookupDraft` behind one engine interface."""

    def __init__(self, model: DraftEngine, top_k: int, lookup: LookupDraft | None = None) -> None:
        self.model = model
        self.lookup = lookup if lookup is not None else LookupDraft(max_branches=top_k)
        self.top_k = top_k
        self.name = f"{model.name}+lookup"
        self.needs_features = model.needs_features
        self.weights_path = model.weights_path
        self.free_part = self.lookup  # costs ~nothing: runs alone in rounds the model draft cannot pay for

    @property
    def n_seen(self) -> int:
        """What the model has ingested: the lookup is always at least as far (it reads text, not features)."""
        return self.model.n_seen

    def _merge(self, model_out: DraftOutput, lookup_out: Proposals) -> Proposals:
        if not isinstance(model_out, Proposals):
            model_out = Proposals.from_logits(model_out, self.top_k)
        return merge_proposals(model_out, lookup_out)

    def reset(self) -> None:
        self.model.reset()
        self.lookup.reset()

    def rollback(self, n_tokens: int) -> None:
        self.model.rollback(n_tokens)
        self.lookup.rollback(n_tokens)

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        return self._merge(self.model.catch_up(tokens, features, features_from), self.lookup.catch_up(tokens))

    def expand(self, cand_ids: np.ndarray, tokens: np.ndarray, parent_ids: np.ndarray, level: int) -> Proposals:
        return self._merge(self.model.expand(cand_ids, tokens, parent_ids, level),
                           self.lookup.expand(cand_ids, tokens, parent_ids, level))

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        self.model.commit(accepted_cand_ids)
        self.lookup.commit(accepted_cand_ids)

    def close(self) -> None:
        self.model.close()
        self.lookup.close()
