"""Exact numpy engine for EAGLE-1/2 heads (docs/design.md §3): the reference the faster engines are checked against.

The head, per position t: ``x = fc(concat(E[token_{t+1}], f_t))``, then one Llama decoder layer *without* input
norm (``h = x + Attn(x)``, ``y = h + MLP(RMSNorm(h))``), then the target's LM head on ``y`` (no final norm).
``f_t`` is the target's post-final-norm hidden state at t, so the pair (f_t, token_{t+1}) sits at position t and
predicts token_{t+2}.

State between rounds: the target features of every committed position (rollback can cut anywhere, and the pair
at the cut needs the feature *before* it), and the head's own K/V for positions ``0 .. n_pairs-1``. A round's
tree lives in separate K/V rows: a node at tree level L sits at position ``n_pairs - 1 + L`` with its parent's
*predicted* output ``y`` as feature, and attends to the committed rows plus its ancestors. ``commit`` drops the
tree: the accepted tokens are recomputed in the next ``catch_up`` with the target's *real* features, which is
what EAGLE does and what keeps the engine exact.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import TreeError
from ..formats.eagle1_format import HeadFile
from ..llamacpp.blas_threads import single_blas_thread
from ..tree.proposals import Proposals
from .base import DraftEngine

log = logging.getLogger(__name__)

CHUNK = 256  # catch-up rows per pass: bounds the (heads, rows, keys) score tensor on long prompts


class _GrowingBuffer:
    """A growable (rows, ...) float32 buffer: K/V caches and stored features."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.data = np.zeros((64,) + shape, dtype=np.float32)
        self.n = 0

    def write(self, start: int, rows: np.ndarray) -> None:
        end = start + len(rows)
        if end > len(self.data):
            grown = np.zeros((max(end, 2 * len(self.data)),) + self.data.shape[1:], dtype=np.float32)
            grown[:self.n] = self.data[:self.n]
            self.data = grown
        self.data[start:end] = rows
        self.n = end

    def view(self) -> np.ndarray:
        return self.data[:self.n]


class Eagle1NumpyEngine(DraftEngine):
    """DraftEngine for an EAGLE-1/2 head, computed in float32 numpy."""

    needs_features = True

    def __init__(self, head: HeadFile, embedding: np.ndarray, lm_head: np.ndarray, name: str | None = None,
                 candidate_ids: np.ndarray | None = None) -> None:
        """``embedding`` / ``lm_head``: the target's (V, H) matrices; the head's own embedding wins if it has one.

        ``candidate_ids`` restricts the draft's LM head to a (frequency-ranked) subset of the vocabulary: other
        tokens get -inf draft logits, i.e. are never proposed. Cheaper drafts; the target still verifies every
        token exactly, so output does not change.
        """
        p = self.params = head.params
        t = head.tensors
        self.name = name or f"eagle1-numpy:{head.path.name}"
        self.weights_path = head.path
        h = p.hidden_size
        own = head.own_embedding
        self._emb = np.asarray(own if own is not None else embedding, dtype=np.float32)
        self._lm = np.asarray(lm_head, dtype=np.float32)
        self._cand = None if candidate_ids is None else np.asarray(candidate_ids, dtype=np.int64)
        if self._cand is not None:
            self._lm = np.ascontiguousarray(self._lm[self._cand])
        fc = t["fc.weight"]
        self._w_emb, self._w_feat = np.ascontiguousarray(fc[:, :h].T), np.ascontiguousarray(fc[:, h:].T)
        self._b_fc = t.get("fc.bias")
        self._wq, self._wk, self._wv = (np.ascontiguousarray(t[f"blk.0.attn_{x}.weight"].T) for x in "qkv")
        self._bq, self._bk, self._bv = (t.get(f"blk.0.attn_{x}.bias") for x in "qkv")
        self._wo = np.ascontiguousarray(t["blk.0.attn_output.weight"].T)
        self._norm = t["blk.0.ffn_norm.weight"]
        self._wg, self._wu, self._wd = (np.ascontiguousarray(t[f"blk.0.ffn_{x}.weight"].T)
                                        for x in ("gate", "up", "down"))
        hd = p.head_dim
        self._inv_freq = 1.0 / (p.rope_base ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        self.reset()

    # ------------------------------------------------------------------ DraftEngine
    def reset(self) -> None:
        p = self.params
        self._feats = _GrowingBuffer((p.hidden_size,))
        self._k = _GrowingBuffer((p.n_head_kv, p.head_dim))
        self._v = _GrowingBuffer((p.n_head_kv, p.head_dim))
        self.n_pairs = 0  # head positions in the committed K/V cache
        self._forget_tree()

    @property
    def n_features(self) -> int:
        """The first position whose target feature this engine lacks (what the generator must supply)."""
        return self._feats.n

    @property
    def n_read(self) -> int:
        """The pair at t holds token t+1, so the pairs hold the text up to the root (none: nothing read)."""
        return self.n_pairs + 1 if self.n_pairs else 0

    def begin_answer(self, prompt_tokens: int) -> None:
        pass  # the same draft for every answer

    def rollback(self, n_tokens: int) -> None:
        """Keep features of positions < n_tokens and head K/V of pairs whose token is still committed."""
        self._forget_tree()
        self._feats.n = min(self._feats.n, max(0, n_tokens))
        self.n_pairs = min(self.n_pairs, max(0, n_tokens - 1))
        self._k.n = self._v.n = self.n_pairs

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        self._forget_tree()
        self._store_features(features, features_from)
        tokens = np.asarray(tokens, dtype=np.int64)
        need = len(tokens) - 1  # pairs (f_t, token_{t+1}) for t = 0 .. len-2
        if need < 1:
            raise TreeError("an EAGLE head needs at least one committed token before the root")
        if self._feats.n < need:
            raise TreeError(f"the head has target features for {self._feats.n} positions but needs {need}")
        start = min(self.n_pairs, need - 1)  # always recompute the last pair: its token is the new root
        self._k.n = self._v.n = start
        y = None
        with single_blas_thread():
            for s in range(start, need, CHUNK):
                e = min(need, s + CHUNK)
                y = self._run_committed(tokens[s + 1:e + 1], self._feats.view()[s:e], s)
            self.n_pairs = need
            self._root_y = y[-1]
            return Proposals.from_logits(self._logits(y[-1:])[0])

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        if self._root_y is None:
            raise TreeError("expand before catch_up")
        parent_rows = [-1 if int(pid) < 0 else self._row_of[int(pid)] for pid in parent_ids]
        feats = np.stack([self._root_y if r < 0 else self._tree_y[r] for r in parent_rows])
        first = len(self._tree_parent)
        n_keys = self.n_pairs + first + len(cand_ids)
        mask = np.zeros((len(cand_ids), n_keys), dtype=bool)
        mask[:, :self.n_pairs] = True
        for i, r in enumerate(parent_rows):
            while r >= 0:
                mask[i, self.n_pairs + r] = True
                r = self._tree_parent[r]
            mask[i, self.n_pairs + first + i] = True
        pos = np.full(len(cand_ids), self.n_pairs - 1 + level, dtype=np.int64)
        with single_blas_thread():
            y, k, v = self._layer(np.asarray(tokens, dtype=np.int64), feats, pos, self._tree_keys(), mask)
            logits = self._logits(y)
        for i, (cid, r) in enumerate(zip(np.asarray(cand_ids).tolist(), parent_rows)):
            self._row_of[cid] = first + i
            self._tree_parent.append(r)
        self._tree_k.append(k)
        self._tree_v.append(v)
        self._tree_y = np.concatenate([self._tree_y, y]) if len(self._tree_y) else y
        return Proposals.from_logits(logits)

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Drop the tree: accepted tokens are recomputed next round with the target's real features."""
        self._forget_tree()

    def close(self) -> None:
        self._emb = self._lm = None

    # ------------------------------------------------------------------ internals
    def _forget_tree(self) -> None:
        self._root_y = None
        self._row_of: dict[int, int] = {}
        self._tree_parent: list[int] = []
        self._tree_k: list[np.ndarray] = []
        self._tree_v: list[np.ndarray] = []
        self._tree_y = np.zeros((0, self.params.hidden_size), dtype=np.float32)

    def _store_features(self, features: np.ndarray | None, features_from: int) -> None:
        if features is None:
            raise TreeError("an EAGLE head needs the target's features: create the target context with "
                            "embeddings=True")
        features = np.asarray(features, dtype=np.float32)
        if features.ndim != 2 or features.shape[1] != self.params.hidden_size:
            raise TreeError(f"target features have shape {features.shape}, expected (n, {self.params.hidden_size})")
        if features_from > self._feats.n:
            raise TreeError(f"target features start at position {features_from} but the head holds only "
                            f"{self._feats.n}: positions in between are missing")
        self._feats.write(features_from, features)

    def _tree_keys(self) -> tuple[np.ndarray, np.ndarray]:
        k, v = self._k.view(), self._v.view()
        if self._tree_k:
            k = np.concatenate([k] + self._tree_k)
            v = np.concatenate([v] + self._tree_v)
        return k, v

    def _run_committed(self, tokens: np.ndarray, feats: np.ndarray, start: int) -> np.ndarray:
        """Head outputs for pairs at positions start.. (causal), appending their K/V to the committed cache."""
        n = len(tokens)
        mask = np.ones((n, start + n), dtype=bool)
        mask[:, start:] = np.tri(n, dtype=bool)
        pos = np.arange(start, start + n, dtype=np.int64)
        y, k, v = self._layer(tokens, feats, pos, (self._k.view(), self._v.view()), mask)
        self._k.write(start, k)
        self._v.write(start, v)
        return y

    def _layer(self, tokens: np.ndarray, feats: np.ndarray, pos: np.ndarray,
               past: tuple[np.ndarray, np.ndarray], mask: np.ndarray) -> tuple[np.ndarray, ...]:
        """fc + the decoder layer for new rows; keys = past rows then the new rows; returns (y, k_new, v_new)."""
        p = self.params
        n = len(tokens)
        x = self._emb[tokens] @ self._w_emb + feats @ self._w_feat
        if self._b_fc is not None:
            x = x + self._b_fc
        q, k, v = (_affine(x, w, b) for w, b in ((self._wq, self._bq), (self._wk, self._bk), (self._wv, self._bv)))
        cos, sin = self._rope(pos)
        q = _rotate(q.reshape(n, p.n_head, p.head_dim), cos, sin)
        k = _rotate(k.reshape(n, p.n_head_kv, p.head_dim), cos, sin)
        v = v.reshape(n, p.n_head_kv, p.head_dim)
        keys, values = np.concatenate([past[0], k]), np.concatenate([past[1], v])
        h = x + _attention(q, keys, values, mask) @ self._wo
        hn = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + p.rms_eps) * self._norm
        g = hn @ self._wg
        y = h + ((g / (1.0 + np.exp(-g))) * (hn @ self._wu)) @ self._wd
        return y.astype(np.float32), k, v

    def _rope(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ang = pos[:, None].astype(np.float64) * self._inv_freq[None, :]
        ang = np.concatenate([ang, ang], axis=-1)[:, None, :]  # rotate-half layout: (n, 1, head_dim)
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def _logits(self, y: np.ndarray) -> np.ndarray:
        logits = y @ self._lm.T
        if self._cand is None:
            return logits
        full = np.full((len(y), self.params.vocab_size), -np.inf, dtype=np.float32)
        full[:, self._cand] = logits
        return full


def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    return x @ w if b is None else x @ w + b


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """RoPE in the rotate-half convention (pairs i and i + head_dim/2), as the heads were trained."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Grouped-query attention of q (n, H, d) over k/v (m, Hkv, d) where mask (n, m) allows; returns (n, H*d)."""
    n, n_head, d = q.shape
    n_kv = k.shape[1]
    qg = q.reshape(n, n_kv, n_head // n_kv, d).transpose(1, 2, 0, 3)  # (Hkv, G, n, d)
    scores = qg @ k.transpose(1, 2, 0)[:, None] / np.float32(np.sqrt(d))  # (Hkv, G, n, m)
    scores = np.where(mask, scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    out = scores @ v.transpose(1, 0, 2)[:, None]  # (Hkv, G, n, d)
    return out.transpose(2, 0, 1, 3).reshape(n, n_head * d)
