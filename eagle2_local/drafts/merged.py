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
    """Row-wise union of two drafts' candidates; a token in both keeps the higher log-probability, marked BOTH.

    Each row lists the model's finite candidates, then the lookup's not already listed, in their order (padding
    after them); a token met twice keeps its first place. All rows at once: this runs on every tree level."""
    if (not np.isfinite(lookup.log_probs).any() and np.isfinite(model.log_probs).all()
            and (np.diff(np.sort(model.tokens, axis=1), axis=1) != 0).all()):
        return model  # the lookup proposes nothing here: the union is the model's (distinct) candidates
    tokens = np.concatenate([model.tokens, lookup.tokens], axis=1)
    log_probs = np.concatenate([model.log_probs, lookup.log_probs], axis=1)
    sources = np.concatenate([model.sources, lookup.sources], axis=1)
    finite = np.isfinite(log_probs)
    same = (tokens[:, :, None] == tokens[:, None, :]) & finite[:, :, None] & finite[:, None, :]  # (n, m, m)
    first = same.argmax(axis=2)  # the first finite entry with the same token (itself for a finite entry)
    keep = finite & (first == np.arange(tokens.shape[1]))
    best = np.where(same, log_probs[:, None, :], -np.inf).max(axis=2)
    sources = np.where(same.sum(axis=2) > 1, np.int8(BOTH), sources)
    order = np.argsort(~keep, axis=1, kind="stable")  # kept entries first, in their order
    width = max(1, int(keep.sum(axis=1).max(initial=0)))
    order = order[:, :width]
    kept = np.take_along_axis(keep, order, axis=1)
    return Proposals.trusted(np.where(kept, np.take_along_axis(tokens, order, axis=1), 0),
                             np.where(kept, np.take_along_axis(best, order, axis=1), -np.inf),
                             np.where(kept, np.take_along_axis(sources, order, axis=1), 0).astype(np.int8))


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
    def n_read(self) -> int:
        """What the model has read: the lookup is always at least as far (rounds may run it alone)."""
        return self.model.n_read

    @property
    def n_features(self) -> int:
        return self.model.n_features

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

    def begin_answer(self, prompt_tokens: int) -> None:
        self.model.begin_answer(prompt_tokens)
        self.lookup.begin_answer(prompt_tokens)

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
