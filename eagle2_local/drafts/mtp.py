"""Draft engine: the target model's own MTP (multi-token prediction, "NextN") layers, drafting EAGLE-2 trees.

Models such as Qwen3.5, Qwen3-Next, GLM-4.5 and DeepSeek-V3 ship one or more MTP layers after their trunk. llama.cpp
loads them with the model parameter ``load_mtp`` and runs them in a second context of the *same* model
(``LLAMA_CONTEXT_TYPE_MTP``); its ``common/speculative.cpp`` drafts a chain with them. This engine drives the same
graph with tree-shaped positions and sequences, the way :mod:`.eagle3_llama` drives an EAGLE-3 head.

The MTP layer's entry at position p is the pair (token x_p, h_{p-1}): h is the target's post-norm hidden state at
the position before (llama.cpp's *nextn embedding*; a zero row before position 0), and the entry predicts
x_{p+1}. Its own post-norm output at the entry (the MTP context's nextn embedding) is the h a child node reads:
a deeper level runs the MTP step on its own output.

KV layout of the MTP context (an attention KV cache holding the MTP layers only, also for hybrid targets):

* sequence 0 holds one entry per committed position 0..n_entries-1, every one built from *real* target hidden
  states; the last one is the current root (x_R, h_{R-1});
* while a tree grows, each decoded frontier candidate gets its own sequence, copied from its parent's (cells are
  shared, metadata only), so it attends to the committed entries and its ancestors only; sequences are reused two
  levels on (:class:`TreeSequences` pools), as nothing of the tree outlives the round;
* ``commit`` drops the tree: the accepted tokens come back at the next ``catch_up`` with the hidden states the
  target computed while verifying them, so a drafted h never leaks into the committed entries.

The target's hidden states reach the engine as features (``needs_features``): the target context has
``nextn_features`` on (one row per decoded token), and the generator hands the rows of newly committed positions
to ``catch_up`` like an EAGLE head's. Entry p reads h_{p-1}, so the engine's ``n_features`` is one less than the
entries it holds.

A model with several MTP layers (step35, hy_v3, mimo2) drafts with its first one at every level here (llama.cpp's
driver runs layer i at step i, re-entering the path under each): lossless as any draft, less accurate past the
first level.

On archs whose trunk crops its last layer to the output rows (deepseek2, glm4moe, glm-dsa, mimo2, nemotron_h_moe),
``nextn_features`` makes the target compute that layer for every token: the same logits up to float summation
order. Qwen3.5 / Qwen3-Next compute it for every token anyway.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import Eagle2Error, TreeError
from ..formats.models import GGUFInfo
from ..llamacpp import backend_topk
from ..llamacpp.backend_topk import BackendTopK
from ..llamacpp.llama import MAX_SEQ, LlamaContext, LlamaModel
from ..llamacpp.settings import ContextSettings
from ..tree.proposals import Proposals
from .base import DraftEngine, TreeSequences, as_list

log = logging.getLogger(__name__)

NEXTN_LAYERS_KEY = "{arch}.nextn_predict_layers"  # llama.cpp's LLM_KV_NEXTN_PREDICT_LAYERS
# Architectures with an MTP graph in llama.cpp (LLM_GRAPH_TYPE_DECODER_MTP, src/models/*.cpp) in the pinned build
# (glm5-next loads its NextN block but throws "not implemented yet" for the graph).
MTP_ARCHS = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe", "hy_v3", "mimo2",
    "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
})
# Those whose MTP graph takes several NextN layers (the others assert exactly one, aborting the process otherwise).
MULTI_LAYER_MTP_ARCHS = frozenset({"hy_v3", "mimo2", "step35"})


def nextn_layers(info: GGUFInfo) -> int:
    """The MTP (NextN) layers a GGUF carries (``{arch}.nextn_predict_layers``; 0 when absent), read before the
    model is loaded: llama.cpp loads their weights only when asked (``LlamaModel(load_mtp=True)``)."""
    try:
        return int(info.arch_get(NEXTN_LAYERS_KEY, 0) or 0)
    except (TypeError, ValueError):
        return 0


def has_mtp(info: GGUFInfo) -> bool:
    """Whether the GGUF carries MTP layers this llama.cpp can draft with."""
    return nextn_layers(info) > 0 and info.architecture in MTP_ARCHS


def check_mtp(model: LlamaModel) -> None:
    """Refuse, in one line, an MTP draft on a model that has no MTP layers llama.cpp can run."""
    name = model.path.name
    if nextn_layers(model.info) == 0 and model.n_layer_nextn == 0:
        raise Eagle2Error(f"{name} carries no MTP (NextN) layers ('{model.architecture}.nextn_predict_layers' "
                          "is absent); --draft mtp needs a model converted with its MTP layers")
    if model.architecture not in MTP_ARCHS:
        raise Eagle2Error(f"{name}: llama.cpp has no MTP graph for '{model.architecture}' models; "
                          f"MTP drafts run on {', '.join(sorted(MTP_ARCHS))}")
    if model.n_layer_nextn > 1 and model.architecture not in MULTI_LAYER_MTP_ARCHS:
        raise Eagle2Error(f"{name} carries {model.n_layer_nextn} MTP layers; llama.cpp's '{model.architecture}' MTP "
                          "graph runs exactly one")
    if not model.load_mtp:
        raise Eagle2Error(f"{name} was loaded without its MTP layers: load it with LlamaModel(load_mtp=True)")


class MtpEngine(DraftEngine):
    """EAGLE-2 tree drafting with the target's MTP layers, in an MTP context of the target's own model."""

    needs_features = True

    def __init__(self, model: LlamaModel, target_ctx: LlamaContext, max_width: int, max_depth: int,
                 in_graph_top_k: bool | None = None) -> None:
        """``model``: the target, loaded with ``load_mtp``; ``target_ctx``: its context (with ``nextn_features``),
        whose sizes and threads the MTP context follows; ``in_graph_top_k``: each row's top-k and log-normalizer
        inside llama.cpp's graph instead of dense rows in numpy (default: :func:`backend_topk.in_graph_for`)."""
        check_mtp(model)
        n_seq = TreeSequences.needed(max_width, max_depth, recycle=True)
        if n_seq > MAX_SEQ:
            raise TreeError(f"a draft tree of width {max_width} needs {n_seq} sequences; llama.cpp allows {MAX_SEQ}")
        self.model = model
        self.name = f"mtp:{model.path.name}"
        self.weights_path = model.path  # the target's file holds the MTP layers
        self.n_embd = model.n_embd_out
        self.ctx = LlamaContext(model, ContextSettings(
            n_ctx=target_ctx.n_ctx + max_width * max(1, max_depth), n_batch=max(target_ctx.n_batch, max_width),
            n_seq_max=max(n_seq, 2), n_threads=target_ctx.settings.n_threads, mtp=True))
        self.n_entries = 0  # committed entries in sequence 0: positions 0..n_entries-1, the last one the root
        # A node's h is its parent's row of the last decode's nextn output (every entry has one, batch order):
        # candidate id (-1: the root) -> that row; and how many entries the last decode had
        self._out_row: dict[int, int] = {}
        self._n_last = 0
        self.seqs = TreeSequences(self.ctx, pool=max_width)
        in_graph = backend_topk.in_graph_for(model) if in_graph_top_k is None else in_graph_top_k
        self.backend_top_k = BackendTopK(self.ctx.ptr, model.n_vocab, max_width, range(self.ctx.n_seq_max)) \
            if in_graph else None

    @property
    def n_read(self) -> int:
        """Entry p holds token p: the entries hold the text up to the root."""
        return self.n_entries

    @property
    def n_features(self) -> int:
        """Entry p reads the target's h at p - 1: the next entry needs h at ``n_entries - 1``."""
        return max(self.n_entries - 1, 0)

    # ------------------------------------------------------------ state
    def reset(self) -> None:
        self.rollback(0)

    def rollback(self, n_tokens: int) -> None:
        """Keep the entries of the first ``n_tokens`` tokens."""
        self._forget_tree()
        self.n_entries = min(self.n_entries, max(n_tokens, 0))
        self.ctx.seq_rm(0, self.n_entries, -1)  # unconditional: also drops rows of an interrupted catch-up

    # ------------------------------------------------------------ drafting
    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        """Enter (x_p, h_{p-1}) for every position p the MTP context lacks, up to the root (the last token)."""
        self._forget_tree()
        tokens = np.asarray(tokens, dtype=np.int32)
        root = len(tokens) - 1
        start = self.n_entries
        if root < start:
            raise TreeError("catch_up needs at least the new root token")
        first = start - 1  # the first hidden state the new entries read (-1: the zero row before position 0)
        if root > max(first, 0):  # some entry reads a real hidden state
            if features is None:
                raise TreeError("the MTP draft needs the target's hidden states: create the target context with "
                                "nextn_features=True")
            if features.ndim != 2 or features.shape[1] != self.n_embd:
                raise TreeError(f"target hidden states have shape {features.shape}, expected (n, {self.n_embd})")
            if features_from > max(first, 0) or features_from + len(features) < root:
                raise TreeError(f"hidden states cover positions {features_from}..{features_from + len(features) - 1};"
                                f" the MTP draft needs {max(first, 0)}..{root - 1}")
        step = self.ctx.n_batch
        for lo in range(start, root + 1, step):
            hi = min(lo + step, root + 1)  # entries lo..hi-1
            h = np.empty((hi - lo, self.n_embd), dtype=np.float32)
            zero = 1 if lo == 0 else 0  # position 0 reads the zero row (llama.cpp's driver does the same)
            h[:zero] = 0.0
            if hi - lo > zero:
                a = lo + zero - 1 - features_from
                h[zero:] = features[a:a + hi - lo - zero]
            outputs = np.zeros(hi - lo, dtype=np.int8)
            outputs[-1] = int(hi == root + 1)
            self._activate((0,) if outputs[-1] else (), int(outputs[-1]))
            self.ctx.decode(tokens[lo:hi], np.arange(lo, hi, dtype=np.int32), outputs, seq=0, embd=h)
            self.n_entries = hi
            self._n_last = hi - lo
        self._out_row = {-1: self._n_last - 1}
        return self._rows(1, root=True)

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        """Decode one tree level: each node is (its token, its parent's MTP output h) at position root + level."""
        k = len(cand_ids)
        cands, parents = as_list(cand_ids), as_list(parent_ids)
        try:
            rows = [self._out_row[parent] for parent in parents]
        except KeyError:
            raise TreeError("a tree level's parents must be the nodes of the level before it (or the root)") from None
        seqs = self.seqs.assign(cands, parents)
        self._activate(seqs, k)
        # each node's h: its parent's row of the last decode's nextn output, gathered into the batch (one copy)
        self.ctx.decode(np.asarray(tokens, dtype=np.int32), self.n_entries - 1 + level, 1, seq_ids=seqs,
                        embd=self.ctx.nextn_rows(self._n_last, copy=False), embd_rows=rows)
        self._out_row = dict(zip(cands, range(k)))
        self._n_last = k
        return self._rows(k)

    def _activate(self, seqs, n_rows: int) -> None:
        if self.backend_top_k is not None:
            self.backend_top_k.activate(seqs, n_rows)

    def _rows(self, n: int, root: bool = False) -> Proposals:
        """The last decode's n output rows: in-graph candidates, or dense logits (the root's row a copy, a
        level's a view of llama.cpp's buffer, read at once)."""
        if self.backend_top_k is not None:
            return Proposals.from_arrays(*self.backend_top_k.read(n))  # a top-k, best first
        return Proposals.from_logits(self.ctx.logits(1)[0] if root else self.ctx.logits(n, copy=False))

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Drop the tree; accepted tokens come back through ``catch_up`` with the target's hidden states."""
        self._forget_tree()

    def _forget_tree(self) -> None:
        self.seqs.forget()
        self._out_row = {}

    def close(self) -> None:
        self.ctx.close()  # the model is the target's
