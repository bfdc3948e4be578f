"""The target model: prefill, plain next-token decode, one-pass tree verification, commit and rollback.

KV layout (one unified KV buffer, see docs/design.md §1). The invariant after every public call: cells
``0 .. n_past-1`` hold the committed text in position order, all in sequence 0, every other cell is free, and
llama.cpp's search head sits at ``n_past``. That is exactly the layout plain decoding produces, which matters:
llama.cpp sums attention over cells in cell-index order (and splits the KV range by size on CPU), so any other
layout changes the float summation order and later logits drift from plain decoding.

* While a tree is verified, sequences ``1..n_leaves`` hold one leaf each (a copy of the committed text, then the
  leaf's path): each node carries the ids of the leaves in its subtree and position ``n_past + depth``, so every
  node attends to exactly its ancestors. The tree's cells follow the committed cells in node order.
* ``commit`` must keep only the accepted cells, and they must end up contiguous right after the committed text.
  When the accepted nodes are the tree's first nodes they already are; otherwise their K/V rows are saved
  (through a scratch sequence, only those cells), all tree cells are freed, and the rows are restored into the
  first free cells. Only the accepted rows are copied, never the prefix.

Recurrent and hybrid models (``Target.chain_only``; docs/design.md "Recurrent and hybrid models"). Their memory
holds one recurrent state per sequence, which cannot keep a tree's branches apart, and a token is taken back only
through llama.cpp's per-token snapshots (``n_rs_seq``): once before the next decode, and at most one token fewer
than the last decode wrote (llama.cpp does not check the second rule: it would take back a wrong state). So they
verify *chains*: the nodes go straight into sequence 0 at consecutive positions, and ``commit`` takes the rejected
tail back with one ``seq_rm``. ``_rewindable`` counts what may be taken back now; any other cut empties the memory
(:meth:`Target.rollback` says how much it kept: nothing). Where llama.cpp grants no snapshots (Mamba, Jamba,
Qwen3-Next, ...: ``checkpoints``), a chain is verified after saving the recurrent state alone (llama.cpp's partial
state, as llama-server does), and a rejection puts that state back and decodes the accepted tokens again.

Reproducible prompts. A cell's K/V, and so every later logit, depends on the shape of the batch that computed it
(this CPU build switches flash-attention kernels at 64 tokens; multi-threaded single-token decodes split long KV
ranges; GPU kernels vary more). A cached prefix is therefore reused only as far as it is *exact*: bit for bit
what a fresh evaluation of the same text would hold. ``prefill(aligned=True)`` evaluates a prompt in batches of
``PROMPT_CHUNK`` tokens that start at multiples of ``PROMPT_CHUNK``, so a full chunk always has the same shape
whatever was cached before it; ``n_exact`` counts the committed cells that are exact (full aligned chunks, and
any cell at all where the build is batch-invariant, see :meth:`Target.batch_invariant`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable

import llama_cpp
import numpy as np

from ..errors import ContextFullError, Eagle2Error, EmptyPromptError, PrefillCancelled, TreeError, UnsupportedModelError
from ..llamacpp.llama import LlamaContext, LlamaModel
from ..llamacpp.settings import ContextSettings
from ..tree.draft_tree import DraftTree, is_chain, verify_layout

log = logging.getLogger(__name__)

# Tokens per batch of a reproducible prompt evaluation (batches start at multiples of it). Below 64, where this
# CPU build's flash attention switches to its tiled kernel, so one-thread results equal single-token decoding.
PROMPT_CHUNK = 32
INVARIANT_BATCH = 64  # batches of fewer tokens compute a token alike on an invariant build (NOTES.md#lossless)
# Weight types whose one-thread CPU kernels gave bit-identical logits for every batch of 1..63 tokens (measured:
# SmolLM2 Q4_1, synthetic Q8_0; NOTES.md#lossless). F32 differs at any batch size; K-quants were not measured.
INVARIANT_FTYPES = frozenset({llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0})


@dataclass
class Pass:
    """What one decode onto the target returns: logits, and the features of every token evaluated when the
    context has features on (None otherwise). A prefill or plain step gives the last token's logits as one row
    (1, V); a tree verification gives one row per node, in node order."""

    logits: np.ndarray
    features: np.ndarray | None


class Target:
    """Owns the target's llama.cpp context and the committed KV sequence."""

    def __init__(self, model: LlamaModel, settings: ContextSettings, checkpoints: bool = False) -> None:
        """``checkpoints``: a recurrent / hybrid model verifies chains from saved states even where llama.cpp would
        grant snapshots (to compare the two ways; they are used anyway where it grants none)."""
        model.check_generative()
        self.chain_only = model.recurrent or model.hybrid
        if settings.n_seq_max < 3 and not self.chain_only:
            raise TreeError("the target needs n_seq_max >= 3 (committed, leaves, scratch)")
        self.model = model
        self.ctx = LlamaContext(model, replace(settings, n_rs_seq=0) if checkpoints and self.chain_only else settings)
        if not self.ctx.mem:
            self.ctx.close()
            raise UnsupportedModelError(f"{model.path.name}: architecture '{model.architecture}' keeps no memory of "
                                        "earlier tokens (an embedding model); llama.cpp cannot generate with it")
        if self.chain_only and 0 < self.ctx.n_rs_seq and self.ctx.n_batch < self.ctx.n_rs_seq + 2:
            self.ctx.close()  # llama.cpp would abort the process at the first decode (split_equal's n_keep_tail)
            raise TreeError(f"n_batch {self.ctx.n_batch} is too small for n_rs_seq {self.ctx.n_rs_seq}: llama.cpp "
                            f"needs n_batch >= n_rs_seq + 2 = {self.ctx.n_rs_seq + 2}")
        self.scratch = self.ctx.n_seq_max - 1  # used only inside commit()
        self.max_leaves = 1 if self.chain_only else self.ctx.n_seq_max - 2
        self.n_past = 0  # committed tokens in sequence 0 (= used KV cells outside a pending tree)
        self.n_exact = 0  # leading committed cells equal to a fresh aligned evaluation of their text (<= n_past)
        self.batch_invariant = self._batch_invariant(settings)
        self._pending: tuple[int, int] | None = None  # (n_nodes, n_leaves) of the tree awaiting commit
        self._rewindable = 0  # chain_only: last tokens of sequence 0 its recurrent state can take back now
        # chain_only without snapshots (llama.cpp granted n_rs_seq 0 of the settings' ask): chains verified from a
        # saved recurrent state, as long as the snapshots asked for would have allowed
        self.checkpoints = self.chain_only and self.ctx.n_rs_seq == 0 and settings.n_rs_seq > 0
        self._chain_limit = (settings.n_rs_seq if self.checkpoints else self.ctx.n_rs_seq) + 1
        self._checkpoint: tuple[bytes, np.ndarray] | None = None  # the saved state and the chain's tokens
        self._tree_leaf_of = np.zeros(0, dtype=np.int64)  # per node of the pending tree: index of a leaf below it
        self._verified = 0  # nodes of the tree verified last (rows of llama.cpp's feature buffers)

    # ------------------------------------------------------------ sizes
    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def max_tree_nodes(self) -> int:
        """Nodes one verification may hold: a batch, or on a recurrent / hybrid model the tokens its state can take
        back (1 where llama.cpp grants no rollback: no speculation)."""
        if self.chain_only:
            return min(self.ctx.n_batch, self._chain_limit)  # all but the root may be taken back
        return self.ctx.n_batch

    @property
    def has_features(self) -> bool:
        """Whether decodes return draft features: layer inputs (EAGLE-3), final hidden states (EAGLE-1/2) or the
        nextn hidden states an MTP draft reads."""
        return bool(self.ctx.layer_ids) or self.ctx.embeddings or self.ctx.nextn_features

    def _features(self, n_tokens: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Features of every token of the last decode (all tokens are outputs whenever embeddings are on; layer
        inputs and nextn rows exist for every token anyway), or of ``rows`` of them."""
        if self.ctx.layer_ids:
            return self.ctx.layer_inputs(n_tokens, rows)
        if self.ctx.nextn_features:
            return self.ctx.nextn_rows(n_tokens, rows)
        return self.ctx.features(n_tokens, rows)

    def _batch_invariant(self, settings: ContextSettings) -> bool:
        """Whether any batch of fewer than 64 tokens computes a token exactly as decoding it alone would, so that
        decoded and tree-verified cells are as reusable as prompt cells. Measured only for a CPU-only build at one
        thread with Q4_1 / Q8_0 weights (more threads split long KV ranges differently for a single token)."""
        return (settings.threads() == 1 and not self.chain_only and not llama_cpp.llama_supports_gpu_offload() and not self.model.rpc_servers
                and int(llama_cpp.llama_model_ftype(self.model.ptr)) in INVARIANT_FTYPES)

    def _mark_written(self, start: int, n: int, full_chunk: bool, batch_tokens: int) -> None:
        """Cells ``start .. start+n-1`` now hold committed text, computed in a batch of ``batch_tokens``; they
        extend the exact prefix when they follow it and that batch's shape depends only on the text (a full
        aligned chunk) or the build computes every batch under INVARIANT_BATCH tokens alike."""
        invariant = self.batch_invariant and batch_tokens < INVARIANT_BATCH
        if self.n_exact == start and (full_chunk or invariant):
            self.n_exact = start + n

    def _ensure_room(self, n_new_cells: int) -> None:
        if self.n_past + n_new_cells > self.n_ctx:
            raise ContextFullError(f"context full: {self.n_past} tokens used, {n_new_cells} more do not fit "
                                   f"n_ctx={self.n_ctx}")

    # ------------------------------------------------------------ plain path
    def prefill(self, tokens, want_features: bool | None = None, *, aligned: bool = False,
                cancelled: Callable[[], bool] | None = None) -> Pass:
        """Evaluate ``tokens`` after the committed text in chunks of n_batch, or with ``aligned`` in the
        reproducible schedule (chunks of ``PROMPT_CHUNK`` starting at its multiples; a little slower).

        Returns the logits of the last token and, when the context has embeddings on, the features of every
        token (EAGLE heads need the whole prompt's hidden states).

        ``cancelled`` is asked before every batch (as llama-server checks between its prompt batches): a long
        prompt whose client has gone stops within one batch, raising :class:`PrefillCancelled`, with the
        batches already evaluated committed (valid text: the caller rolls back what it does not want).
        """
        toks = np.asarray(tokens, dtype=np.int32)
        if toks.size == 0:
            raise EmptyPromptError("the prompt is empty: there is no token to evaluate")
        self._check_no_pending()
        self._ensure_room(len(toks))
        with_features = self.has_features if want_features is None else want_features
        feats = []
        last_logits = None
        for start, end in _chunks(self.n_past, len(toks), min(PROMPT_CHUNK, self.ctx.n_batch) if aligned
                                  else self.ctx.n_batch, aligned):
            if cancelled is not None and cancelled():
                raise PrefillCancelled(f"the prompt's evaluation was cancelled after {start} of {len(toks)} tokens")
            chunk = toks[start:end]
            n = len(chunk)
            pos = np.arange(self.n_past, self.n_past + n, dtype=np.int32)
            outputs = np.zeros(n, dtype=np.int8)
            outputs[-1] = 1
            if self.ctx.embeddings:
                outputs[:] = 1  # llama.cpp outputs every token when embeddings are on
            self.ctx.decode(chunk, pos, outputs, seq=0)
            self._decoded(n)
            self._mark_written(self.n_past, n, aligned and n == PROMPT_CHUNK and self.n_past % PROMPT_CHUNK == 0, n)
            self.n_past += n
            n_out = int(outputs.sum())
            if with_features and self.has_features:
                feats.append(self._features(n))
            if start + n == len(toks):
                last_logits = self.ctx.logits(n_out, copy=False)[-1].copy()  # only the row we return
        features = np.concatenate(feats) if feats else None
        return Pass(logits=last_logits[None, :], features=features)

    def _decoded(self, n: int) -> None:
        """Sequence 0 has just been extended by one decode of ``n`` tokens: a recurrent state can now take back
        up to ``n - 1`` of them (the snapshots that decode wrote), within ``n_rs_seq``."""
        self._rewindable = min(n - 1, self.ctx.n_rs_seq)

    def decode_one(self, token: int) -> Pass:
        """Plain decoding step: append one token to sequence 0 and return its logits (and feature)."""
        return self.prefill([token])

    # ------------------------------------------------------------ tree path
    def verify(self, tree: DraftTree, copy: bool = True, features: bool = True) -> Pass:
        """Write the whole tree into the KV cache in ONE decode and return logits (and features) per node.

        Node 0 of ``tree`` is the root, i.e. the last sampled token that is not in the cache yet. With
        ``copy=False`` the logits are a view of llama.cpp's buffer, valid until the next call on this target (the
        generation loop reads them right away). With ``features=False`` no features are copied:
        :meth:`verified_features` reads the accepted nodes' alone.
        """
        tokens, parents = tree.tokens, tree.parents  # a DraftTree's parents were validated when it was made
        n = len(tokens)
        self._check_no_pending()
        if self.chain_only:
            return self._verify_chain(tree, copy, features)
        if n > self.ctx.n_batch:
            raise TreeError(f"tree of {n} nodes exceeds the batch size {self.ctx.n_batch}")
        if np.any((tokens < 0) | (tokens >= self.model.n_vocab)):
            raise TreeError(f"tree holds a token id outside the vocabulary 0..{self.model.n_vocab - 1}")
        depths, leaves, member = verify_layout(parents)
        if len(leaves) > self.max_leaves:
            raise TreeError(f"tree has {len(leaves)} leaves; this context allows {self.max_leaves} "
                            f"(n_seq_max={self.ctx.n_seq_max} minus 2)")
        self._ensure_room(n)
        leaf_seqs = np.arange(1, len(leaves) + 1, dtype=np.int32)
        self.ctx.seq_keep(0)  # no other sequence holds a cell now (one call, not one per leaf)
        self.ctx.seq_cp_many([0] * len(leaves), leaf_seqs.tolist())  # each leaf starts as the committed text
        pos = (self.n_past + depths).astype(np.int32)
        self._pending = (n, len(leaves))
        self._tree_leaf_of = np.argmax(member, axis=1)  # per node, one leaf below it: its sequence holds the path
        try:
            self.ctx.decode(tokens, pos, np.ones(n, dtype=np.int8), seq_mask=member, seq_ids=leaf_seqs)
        except Exception:
            self._drop_tree_cells()
            raise
        logits = self.ctx.logits(n, copy=copy)
        feats = self._features(n) if self.has_features and features else None
        self._verified = n
        return Pass(logits=logits, features=feats)

    def _verify_chain(self, tree: DraftTree, copy: bool, features: bool) -> Pass:
        """:meth:`verify` on a recurrent / hybrid model: the chain's nodes go into sequence 0, one state."""
        n = len(tree)
        if not is_chain(tree.parents):
            raise TreeError(f"a {self.model.memory_kind} model verifies chains only (one recurrent state a sequence)")
        if n > self.max_tree_nodes:
            raise TreeError(f"a chain of {n} nodes exceeds the {self.max_tree_nodes} tokens this "
                            f"{self.model.memory_kind} model's state can take back (n_rs_seq)")
        if np.any((tree.tokens < 0) | (tree.tokens >= self.model.n_vocab)):
            raise TreeError(f"tree holds a token id outside the vocabulary 0..{self.model.n_vocab - 1}")
        self._ensure_room(n)
        self._tree_leaf_of = np.zeros(n, dtype=np.int64)
        if self.checkpoints:
            self._checkpoint = (self.ctx.save_seq(0, partial=True), tree.tokens.copy())
        try:
            self.ctx.decode(tree.tokens, np.arange(self.n_past, self.n_past + n, dtype=np.int32),
                            np.ones(n, dtype=np.int8), seq=0)
        except Exception:
            self.reset()  # what a failed decode left of the state is unknown
            raise
        self._decoded(n)
        self._pending = (n, 1)
        self._verified = n
        logits = self.ctx.logits(n, copy=copy)
        feats = self._features(n) if self.has_features and features else None
        return Pass(logits=logits, features=feats)

    def _take_back(self, n: int) -> bool:
        """Take the last ``n`` tokens of sequence 0 out of a recurrent state, where its snapshots allow it."""
        if n == 0:
            return True
        if n > self._rewindable or not self.ctx.seq_rm(0, self.n_past - n, -1):
            return False
        self._rewindable = 0  # one take-back before the next decode
        self.n_past -= n
        return True

    def _replay(self, base: int, keep: int) -> None:
        """Keep the pending chain's first ``keep`` nodes from its checkpoint: the recurrent state saved before the
        chain is put back, the attention cells past it dropped, and the kept tokens decoded again."""
        state, tokens = self._checkpoint
        self._checkpoint = None
        if keep == len(tokens):
            return
        self.ctx.load_seq(state, 0, partial=True)  # the recurrent state at position base - 1
        self.ctx.seq_rm(0, base, -1)  # a hybrid's attention cells of the chain (its recurrent part is at base - 1)
        self.n_past = base
        try:
            self.ctx.decode(tokens[:keep], np.arange(base, base + keep, dtype=np.int32), 0, seq=0)
        except Exception:
            self.reset()
            raise
        self._decoded(keep)
        self.n_past = base + keep

    def verified_features(self, nodes: np.ndarray) -> np.ndarray | None:
        """Features of ``nodes`` of the tree verified last (None without features): a copy of those rows only,
        read from llama.cpp's buffers, so before the next decode on this target (a commit does not decode)."""
        return self._features(self._verified, np.asarray(nodes)) if self.has_features else None

    def commit(self, path) -> None:
        """Keep the root and the accepted nodes (``path``, root first) in sequence 0; free every other tree cell."""
        if self._pending is None:
            raise TreeError("commit() without a verified tree")
        path = np.asarray(path, dtype=np.int64)
        if len(path) == 0 or path[0] != 0:
            raise TreeError("an accepted path starts at the root (node 0)")
        k1 = len(path)
        base = self.n_past
        n_nodes, _ = self._pending
        if self.chain_only:
            if not np.array_equal(path, np.arange(k1)):
                raise TreeError("an accepted path of a chain is its first nodes")
            self._pending = None
            self.n_past = base + n_nodes
            if self.checkpoints:
                self._replay(base, k1)
            elif not self._take_back(n_nodes - k1):  # cannot happen: a chain is at most n_rs_seq + 1 nodes
                self.reset()
                raise TreeError(f"llama.cpp could not take back {n_nodes - k1} tokens of this "
                                f"{self.model.memory_kind} model's state (n_rs_seq={self.ctx.n_rs_seq})")
            self._mark_written(base, k1, False, n_nodes)
            return
        leaf_seq = int(self._tree_leaf_of[path[-1]]) + 1
        if np.array_equal(path, np.arange(k1)):
            # the accepted nodes are the tree's first cells: already contiguous after the committed text
            self.ctx.seq_cp(leaf_seq, 0, base, base + k1)
            self._drop_tree_cells()
        else:
            self.ctx.seq_rm(self.scratch)
            self.ctx.seq_cp(leaf_seq, self.scratch, base, base + k1)
            rows = self.ctx.save_seq(self.scratch)
            self.ctx.seq_rm(self.scratch)
            self._drop_tree_cells()  # frees every tree cell; llama.cpp's head moves back to the first of them
            self.ctx.load_seq(rows, self.scratch)  # the accepted rows land in cells base .. base+k
            self.ctx.seq_cp(self.scratch, 0)
            self.ctx.seq_rm(self.scratch)
        self._mark_written(base, k1, False, n_nodes)
        self.n_past = base + k1

    def _drop_tree_cells(self) -> None:
        """Remove the leaf sequences: tree cells not also in sequence 0 become free. One ``seq_keep(0)`` leaves
        exactly what a ``seq_rm`` per leaf leaves (the scratch sequence is empty whenever this runs), with the
        same first free cell for llama.cpp's search head."""
        self.ctx.seq_keep(0)
        self._pending = None

    def abort_tree(self) -> None:
        """Drop a verified but uncommitted tree (e.g. after an interrupt); nothing is accepted."""
        if self._pending is not None:
            if self.chain_only:  # the root stays: a decode's first token is never taken back
                self.commit([0])
            else:
                self._drop_tree_cells()

    def _check_no_pending(self) -> None:
        if self._pending is not None:
            raise TreeError("the previous tree was verified but not committed")

    # ------------------------------------------------------------ housekeeping
    def rollback(self, n_past: int) -> int:
        """Forget committed tokens from position ``n_past`` on (their cells are the last ones, so no hole), and
        return how many stay committed: ``n_past``, or 0 where a recurrent state cannot be cut there (the
        memory is then emptied, and the caller evaluates its text again)."""
        if not 0 <= n_past <= self.n_past:
            raise Eagle2Error(f"cannot roll back to {n_past}: {self.n_past} tokens are committed")
        self._check_no_pending()
        if self.chain_only:
            if not self._take_back(self.n_past - n_past):
                log.debug("the %s state cannot be cut at %d of %d tokens: emptied", self.model.memory_kind,
                          n_past, self.n_past)
                self.reset()
                return 0
        else:
            # unconditional: also clears rows a commit interrupted by Ctrl-C may have left past n_past
            self.ctx.seq_rm(0, n_past, -1)
            self.ctx.seq_rm(self.scratch)
        self.n_past = n_past
        self.n_exact = min(self.n_exact, n_past)
        return n_past

    def snapshot(self) -> TargetSnapshot:
        """The committed text's KV cells and bookkeeping, to be put back by :meth:`restore` (no tree pending)."""
        self._check_no_pending()
        return TargetSnapshot(cells=self.ctx.save_seq(0), n_past=self.n_past, n_exact=self.n_exact)

    def restore(self, snap: TargetSnapshot) -> None:
        """Empty the KV cache, then hold exactly the cells of ``snap`` again: loaded into an empty cache they take
        cells ``0 .. n_past-1``, where the evaluation that made them had put them, so what is computed after
        them is computed as it was after that evaluation."""
        self.reset()
        self.ctx.load_seq(snap.cells, 0)
        self.n_past, self.n_exact = snap.n_past, snap.n_exact

    def reset(self) -> None:
        """Empty the KV cache."""
        self.ctx.clear()
        self._rewindable = 0
        self.n_past = 0
        self.n_exact = 0
        self._pending = None

    def close(self) -> None:
        self.ctx.close()


@dataclass(frozen=True)
class TargetSnapshot:
    """Sequence 0's KV cells as llama.cpp serialises them, with the target's count of committed and exact cells."""

    cells: bytes
    n_past: int
    n_exact: int


def _chunks(n_past: int, n: int, size: int, aligned: bool) -> list[tuple[int, int]]:
    """``(start, end)`` offsets into ``n`` new tokens at position ``n_past``: batches of ``size``, cut at multiples
    of ``size`` in absolute position when ``aligned``."""
    first = (size - n_past % size) if aligned and n_past % size else size
    cuts = list(range(min(first, n), n, size))
    return list(zip([0] + cuts, cuts + [n]))
