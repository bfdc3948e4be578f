"""Draft engine: an ``eagle3`` GGUF head run by llama.cpp itself, drafting EAGLE-2 trees.

llama.cpp runs the head natively (``src/models/eagle3.cpp``) but only drafts chains with it; this engine drives
the same graph with tree-shaped positions and sequence masks.

The head's inputs and state, in llama.cpp's convention: the *encoder* pass turns the target's features (the
residual inputs of three target layers, concatenated) into ``g`` rows; the *decoder* entry at position P is the
pair (token t[P+1], g[P]), so the entry at P predicts t[P+2]. The decoder's pre-norm output
(``llama_get_embeddings_nextn``) is the ``g`` a child node is fed.

KV layout of the head's context:

* sequence 0 holds one entry per committed position 0..n_entries-1, every one built from *real* target features;
  the last one pairs the current root token with the feature of the position before it;
* while a tree grows, each decoded frontier candidate gets its own sequence, copied from its parent's (cells are
  shared, metadata only), so it attends to the committed entries and its ancestors only;
* ``commit`` simply drops the tree: the accepted tokens are re-entered at the next ``catch_up`` with the real
  features the target computed while verifying them (EAGLE-3 does the same), so drafted ``g`` never leaks
  into the committed state.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from llama_cpp import llama_cpp_ext

from ..errors import IncompatibleDraftError, ModelError, TreeError
from ..formats import gguf_keys as keys
from ..formats.models import GGUFInfo
from ..llamacpp import backend_topk
from ..llamacpp.backend_topk import BackendTopK
from ..llamacpp.llama import MAX_SEQ, LlamaContext, LlamaModel
from ..llamacpp.llama_ext import LAYER_INPUT_ARCHS, buffer_view
from ..llamacpp.runtime import charge_llama
from ..llamacpp.settings import ContextSettings
from ..tree.proposals import Proposals
from .base import DraftEngine, TreeSequences, as_list

log = logging.getLogger(__name__)

ARCH = keys.EAGLE3_ARCH
UPSTREAM_LAYER_KEYS = keys.EAGLE3_UPSTREAM_LAYER_KEYS
REQUIRED_KEYS = (keys.EAGLE3_TARGET_LAYERS, keys.EAGLE3_TARGET_HIDDEN_SIZE, keys.EMBEDDING_LENGTH.format(arch=ARCH),
                 keys.BLOCK_COUNT.format(arch=ARCH))


FEATURE_SOURCES = ("layer_inputs", "final_norm")
ENCODE_CHUNK = 32  # rows per encoder pass when the in-graph top-k sizes llama.cpp's output buffers


def feature_source(info: GGUFInfo) -> str:
    """Which target features the head was trained on (``eagle2_local.feature_source``).

    ``layer_inputs`` (default, EAGLE-3's own convention): the residual inputs of ``eagle3.target_layers``.
    ``final_norm``: our fallback for architectures whose llama.cpp graph does not expose layer inputs (qwen2,
    gemma3, ...): the target's post-final-norm hidden state, repeated in each of the three slots ``fc`` reads.
    """
    source = info.get(keys.FEATURE_SOURCE, "layer_inputs")
    if source not in FEATURE_SOURCES:
        raise IncompatibleDraftError(f"{info.path.name}: unknown feature source {source!r}; "
                                     f"this version knows {', '.join(FEATURE_SOURCES)}")
    return source


def foreign_layer_key(info: GGUFInfo) -> str | None:
    """The key a head from another llama.cpp version stores its feature layers under, when it lacks ours."""
    if info.get(keys.EAGLE3_TARGET_LAYERS) is not None:
        return None
    return next((k for k in UPSTREAM_LAYER_KEYS if info.get(k) is not None), None)


def head_target_layers(info: GGUFInfo) -> tuple[int, ...]:
    """The three target layers whose residual inputs the head reads (``eagle3.target_layers``)."""
    layers = info.get(keys.EAGLE3_TARGET_LAYERS)
    if not isinstance(layers, (list, tuple)) or len(layers) != 3:
        raise IncompatibleDraftError(f"{info.path.name}: eagle3.target_layers must list 3 layers, got {layers!r}")
    return tuple(int(x) for x in layers)


def check_eagle3_fits(info: GGUFInfo, target: LlamaModel) -> None:
    """Refuse a head trained for another target: hidden size, vocabulary and layer ids must fit."""
    if info.architecture != ARCH:
        raise IncompatibleDraftError(f"{info.path.name} is a {info.architecture!r} model, not an eagle3 head")
    missing = [k for k in REQUIRED_KEYS if info.get(k) is None]
    foreign = foreign_layer_key(info)
    if foreign:  # open_head translates such files before they get here
        raise ModelError(f"{info.path.name} names its feature layers {foreign} (a newer llama.cpp converter); this "
                         "llama.cpp reads eagle3.target_layers. Translate it once: eagle2-local convert "
                         f"{info.path.name} -o {info.path.stem}-local.gguf")
    if missing or not info.n_vocab:
        raise ModelError(f"{info.path.name} is not a complete eagle3 head: missing "
                         f"{', '.join(missing) or 'tokenizer'} (convert heads with `eagle2-local convert`)")
    hidden = int(info.get(keys.EAGLE3_TARGET_HIDDEN_SIZE) or 0)
    if hidden != target.n_embd:
        raise IncompatibleDraftError(f"head {info.path.name} expects target hidden size {hidden}; "
                                     f"{target.path.name} has {target.n_embd}")
    if info.n_vocab != target.n_vocab:
        raise IncompatibleDraftError(f"head {info.path.name} has a {info.n_vocab}-token vocabulary; "
                                     f"{target.path.name} has {target.n_vocab}")
    if feature_source(info) == "layer_inputs" and target.architecture not in LAYER_INPUT_ARCHS:
        raise IncompatibleDraftError(
            f"head {info.path.name} reads target layer inputs, which llama.cpp does not expose for "
            f"{target.architecture!r} models; use a head trained on the final_norm feature convention "
            "(its config.json sets eagle2_local.feature_source = final_norm)")
    bad = [i for i in head_target_layers(info) if not 0 <= i < target.n_layer]
    if bad:
        raise IncompatibleDraftError(f"head {info.path.name} reads target layers {list(head_target_layers(info))}; "
                                     f"{target.path.name} has {target.n_layer} layers")


class Eagle3Engine(DraftEngine):
    """EAGLE-2 tree drafting with an eagle3 head in a llama.cpp context that borrows the target's weights."""

    needs_features = True

    def __init__(self, head: LlamaModel, target_ctx: LlamaContext, max_width: int, max_depth: int,
                 n_threads: int | None = None, in_graph_top_k: bool | None = None) -> None:
        check_eagle3_fits(head.info, target_ctx.model)
        in_graph_top_k = backend_topk.in_graph_for(head) if in_graph_top_k is None else in_graph_top_k
        n_seq = TreeSequences.needed(max_width, max_depth, recycle=in_graph_top_k)
        if n_seq > MAX_SEQ:
            raise TreeError(f"a draft tree of width {max_width} and depth {max_depth} needs {n_seq} sequences; "
                            f"llama.cpp allows {MAX_SEQ}")
        self.head = head
        self.name = f"eagle3:{head.path.name}"
        self.weights_path = head.path
        self.ctx = LlamaContext(head, ContextSettings(
            n_ctx=target_ctx.n_ctx + max_width * max(1, max_depth - 1), n_batch=max(target_ctx.n_batch, max_width),
            n_seq_max=max(n_seq, 2), n_threads=n_threads or target_ctx.settings.n_threads),
            ctx_other=target_ctx)
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)  # pre-norm rows of output entries
        self.n_embd = head.n_embd
        self.tile_features = feature_source(head.info) == "final_norm"
        self.feature_width = 3 * int(head.info.get(keys.EAGLE3_TARGET_HIDDEN_SIZE))  # fc's input: three layers
        self.n_entries = 0  # committed entries in sequence 0 (positions 0..n_entries-1)
        # A node's g is its parent's pre-norm output, and a level's parents are the previous decode's nodes (the
        # root: the catch-up's last entry): candidate id (-1: the root) -> its row among the last decode's outputs,
        # which the next level gathers from llama.cpp's buffer straight into its batch
        self._out_row: dict[int, int] = {}
        # In-graph top-k: llama.cpp calls a sampler per sequence at every decode, so the tree reuses sequences
        self.seqs = TreeSequences(self.ctx, pool=max_width if in_graph_top_k else None)
        self.backend_top_k = BackendTopK(self.ctx.ptr, head.n_vocab, max_width, range(self.ctx.n_seq_max)) \
            if in_graph_top_k else None

    @property
    def n_read(self) -> int:
        """Entry P holds token P+1, so the entries hold the text up to the root (none: nothing read)."""
        return self.n_entries + 1 if self.n_entries else 0

    @property
    def n_features(self) -> int:
        return self.n_entries

    # ------------------------------------------------------------ state
    def reset(self) -> None:
        self.rollback(0)

    def begin_answer(self, prompt_tokens: int) -> None:
        pass  # the same draft for every answer

    def rollback(self, n_tokens: int) -> None:
        """Keep entries whose token is among the first ``n_tokens`` (entry P holds token P+1)."""
        self._forget_tree()
        self.n_entries = min(self.n_entries, max(n_tokens - 1, 0))
        self.ctx.seq_rm(0, self.n_entries, -1)

    # ------------------------------------------------------------ drafting
    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        """Enter (t[P+1], g[P]) for every position P the head lacks; the last entry carries the root."""
        tokens = np.asarray(tokens, dtype=np.int32)
        n_text = len(tokens) - 1  # positions with target features; tokens[-1] is the root
        if features is None:
            raise TreeError("the eagle3 engine needs target features (layer inputs)")
        if features_from > self.n_entries or features_from + len(features) < n_text:
            raise TreeError(f"features cover positions {features_from}..{features_from + len(features) - 1}; "
                            f"the head needs {self.n_entries}..{n_text - 1}")
        if n_text <= self.n_entries:
            raise TreeError("catch_up needs at least the new root token")
        feats = np.asarray(features[self.n_entries - features_from: n_text - features_from], dtype=np.float32)
        if self.tile_features:
            feats = np.tile(feats, (1, 3))
        if feats.shape[1] != self.feature_width:  # llama.cpp would read rows of its own width
            raise TreeError(f"features of width {feats.shape[1]}; the head reads {self.feature_width}")
        g = self._encode(feats)
        # llama.cpp's eagle3 graph does not gather output rows: with outputs on only some entries it returns
        # the *first* rows' logits and pre-norm states. So the root entry goes alone in the last batch.
        last = len(g) - 1
        step = self.ctx.n_batch
        self._activate((), 0)
        for start in range(0, last, step):
            self._process_entries(tokens, g, start, min(start + step, last), output=False)
        self._activate((0,), 1)
        self._process_entries(tokens, g, last, last + 1, output=True)
        self.n_entries = n_text
        self._out_row = {-1: 0}
        return self._rows(1, copy=True)

    def _activate(self, seqs, n_rows: int) -> None:
        if self.backend_top_k is not None:
            self.backend_top_k.activate(seqs, n_rows)

    def _rows(self, n: int, copy: bool) -> Proposals:
        """The last decode's n output rows: in-graph candidates, or dense logits (a view unless ``copy``, read at
        once)."""
        if self.backend_top_k is not None:
            return Proposals.from_arrays(*self.backend_top_k.read(n))  # a top-k, best first
        logits = self.ctx.logits(n, copy=copy)
        return Proposals.from_logits(logits[0] if copy and n == 1 else logits)

    def _process_entries(self, tokens: np.ndarray, g: np.ndarray, start: int, stop: int, output: bool) -> None:
        """Decode entries ``start..stop-1`` of a catch-up: entry i is (token at n_entries + i + 1, g[i]) at
        position n_entries + i in sequence 0."""
        pos = np.arange(self.n_entries + start, self.n_entries + stop, dtype=np.int32)
        self.ctx.decode(tokens[pos + 1], pos, int(output), seq=0, embd=g[start:stop])

    def _encode(self, feats: np.ndarray) -> np.ndarray:
        """The head's ``fc`` (encoder graph) over target features: one g row per position."""
        out = []
        # Every encoded row is an output, and llama.cpp sizes its output buffers by the largest output count;
        # with the in-graph top-k those are four vocabulary-wide buffers per output (pinned memory on CUDA):
        # 32-row chunks keep them at ~25 MB for a 49k vocabulary instead of ~400 MB at n_batch 512.
        step = min(self.ctx.n_batch, ENCODE_CHUNK) if self.backend_top_k is not None else self.ctx.n_batch
        # The encoder ignores positions, but llama.cpp wants every batch to start right after the last position
        # in the KV cache, which encoding does not advance: so each chunk starts at pos0 again.
        pos0 = max(self.ctx.seq_pos_max(0), -1) + 1
        for start in range(0, len(feats), step):
            chunk = feats[start:start + step]
            n = len(chunk)
            self.ctx.decode(None, np.arange(pos0, pos0 + n, dtype=np.int32), 1, seq=0, embd=chunk, encode=True)
            out.append(self._prenorm(n).copy())
        return np.concatenate(out)

    def _prenorm(self, n_out: int) -> np.ndarray:
        """A view of the last decode's first ``n_out`` pre-norm rows (valid until the next decode), of a buffer
        sized by the largest output count a decode here can have."""
        t0 = time.perf_counter()
        ptr = llama_cpp_ext.llama_get_embeddings_nextn(self.ctx.ptr)  # waits for a GPU to finish
        charge_llama(t0)
        if not ptr:
            raise TreeError("llama.cpp returned no pre-norm output for the eagle3 head")
        return buffer_view(ptr, (self.ctx.n_batch, self.n_embd))[:n_out]

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        """Decode one tree level: each node is (its token, its parent's g) at position root + level."""
        k = len(cand_ids)
        cands, parents = as_list(cand_ids), as_list(parent_ids)
        try:
            rows = [self._out_row[parent] for parent in parents]
        except KeyError:
            raise TreeError("a tree level's parents must be the nodes of the level before it (or the root)") from None
        seqs = self.seqs.assign(cands, parents)
        self._activate(seqs, k)
        # each node's g: its parent's row of the last decode's pre-norm output, gathered into the batch (one copy)
        self.ctx.decode(tokens, self.n_entries - 1 + level, 1, seq_ids=seqs, embd=self._prenorm(max(rows) + 1),
                        embd_rows=rows)
        self._out_row = dict(zip(cands, range(k)))
        return self._rows(k, copy=False)

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Drop the tree; accepted tokens come back through ``catch_up`` with their real features."""
        self._forget_tree()

    def _forget_tree(self) -> None:
        self.seqs.forget()
        self._out_row = {}

    def close(self) -> None:
        self.ctx.close()
        self.head.close()
