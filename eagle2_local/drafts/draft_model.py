"""Draft engine: a smaller GGUF model with the target's vocabulary, drafting trees in its own llama.cpp context.

KV layout of the draft context: sequence 0 holds the text the draft has seen (committed tokens up to and
including the current root). While a tree grows, each decoded frontier candidate gets its own sequence, copied
from its parent's, so it attends to exactly its ancestors; all of a round's sequences live until ``commit``,
which copies the deepest accepted *decoded* candidate's path into sequence 0. Accepted tokens the draft never
decoded (a leaf, or a node outside the frontier) are fed at the start of the next round's ``catch_up``.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import IncompatibleDraftError, TreeError
from ..llamacpp import backend_topk
from ..llamacpp.backend_topk import BackendTopK
from ..llamacpp.llama import MAX_SEQ, LlamaContext, LlamaModel
from ..llamacpp.settings import ContextSettings
from ..tree.proposals import Proposals
from .base import DraftEngine, TreeSequences, as_list

log = logging.getLogger(__name__)


def check_same_vocab(target: LlamaModel, draft: LlamaModel) -> None:
    """Refuse a draft whose token ids mean something else than the target's; name the first difference."""
    if target.n_vocab != draft.n_vocab:
        raise IncompatibleDraftError(
            f"vocabulary sizes differ: target {target.path.name} has {target.n_vocab} tokens, "
            f"draft {draft.path.name} has {draft.n_vocab}")
    for name in ("bos", "eos", "eot"):
        a, b = getattr(target, name), getattr(draft, name)
        if a != b:
            raise IncompatibleDraftError(f"special token {name} differs: target {a}, draft {b}")
    for tok in range(target.n_vocab):
        a, b = target.token_text(tok), draft.token_text(tok)
        if a != b:
            raise IncompatibleDraftError(f"token {tok} differs: target {a!r}, draft {b!r}")


class DraftModelEngine(DraftEngine):
    """Tree drafting with any same-vocabulary GGUF (including the target itself)."""

    needs_features = False

    def __init__(self, model: LlamaModel, settings: ContextSettings, max_width: int, max_depth: int,
                 owns_model: bool = False, in_graph_top_k: bool | None = None) -> None:
        """``settings``: the target's context settings (the draft context follows them); ``owns_model``: close
        the model with the engine (False when the target drafts for itself and the weights are shared);
        ``in_graph_top_k``: each row's top-k and log-normalizer inside llama.cpp's graph instead of dense rows
        in numpy (default: :func:`backend_topk.in_graph_for` the draft's model)."""
        n_seq = 1 + max_width * max(1, max_depth - 1)
        if n_seq > MAX_SEQ:
            raise TreeError(f"a draft tree of width {max_width} and depth {max_depth} needs {n_seq} sequences; "
                            f"llama.cpp allows {MAX_SEQ}")
        self.model = model
        self.draft_model = model
        self.owns_model = owns_model
        self.name = f"draft-model:{model.path.name}"
        self.weights_path = model.path
        # beyond the text, a round's tree holds up to max_width cells per expanded level
        self.ctx = LlamaContext(model, ContextSettings(
            n_ctx=settings.n_ctx + max_width * max(1, max_depth - 1), n_batch=max(settings.n_batch, max_width),
            n_seq_max=max(n_seq, 2),
            n_threads=settings.n_threads, embeddings=False))
        self.n_read = 0  # tokens in sequence 0
        self.seqs = TreeSequences(self.ctx)  # not reused by level: commit reads an accepted node's sequence
        in_graph = backend_topk.in_graph_for(model) if in_graph_top_k is None else in_graph_top_k
        self.backend_top_k = BackendTopK(self.ctx.ptr, model.n_vocab, max_width, range(self.ctx.n_seq_max)) \
            if in_graph else None

    def reset(self) -> None:
        self.rollback(0)

    def begin_answer(self, prompt_tokens: int) -> None:
        pass  # the same draft for every answer

    def rollback(self, n_tokens: int) -> None:
        self._forget_tree()
        n_tokens = min(n_tokens, self.n_read)
        self.ctx.seq_rm(0, n_tokens, -1)  # unconditional: also drops rows of an interrupted catch-up
        self.n_read = n_tokens

    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None = None, features_from: int = 0) -> Proposals:
        toks = np.asarray(tokens, dtype=np.int32)[self.n_read:]
        if len(toks) == 0:
            raise TreeError("catch_up needs at least the new root token")
        for start in range(0, len(toks), self.ctx.n_batch):
            chunk = toks[start:start + self.ctx.n_batch]
            out = np.zeros(len(chunk), dtype=np.int8)
            out[-1] = 1
            pos = np.arange(self.n_read, self.n_read + len(chunk), dtype=np.int32)
            if self.backend_top_k is not None:
                self.backend_top_k.activate((0,), 1)
            self.ctx.decode(chunk, pos, out, seq=0)
            self.n_read += len(chunk)
        return self._rows(1)

    def _rows(self, n: int) -> Proposals:
        """The last decode's n output rows: in-graph candidates, or dense logits (a view, read at once)."""
        if self.backend_top_k is not None:
            return Proposals.from_arrays(*self.backend_top_k.read(n))  # a top-k, best first
        logits = self.ctx.logits(n, copy=n == 1)
        return Proposals.from_logits(logits[0] if n == 1 else logits)

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        k = len(cand_ids)
        seqs = self.seqs.assign(as_list(cand_ids), as_list(parent_ids))
        if self.backend_top_k is not None:
            self.backend_top_k.activate(seqs, k)
        self.ctx.decode(tokens, self.n_read - 1 + level, 1, seq_ids=seqs)
        return self._rows(k)

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        decoded = [c for c in np.asarray(accepted_cand_ids).tolist() if c in self.seqs.seq_of]
        if decoded:
            seq = self.seqs.seq_of[decoded[-1]]
            self.ctx.seq_cp(seq, 0, self.n_read, self.n_read + len(decoded))
            self.n_read += len(decoded)
        self._forget_tree()

    def _forget_tree(self) -> None:
        self.seqs.forget()

    def close(self) -> None:
        self.ctx.close()
        if self.owns_model:
            self.model.close()
