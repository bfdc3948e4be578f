"""Draft engine: a Gemma 4 *assistant* (llama.cpp's ``gemma4-assistant`` architecture), drafting EAGLE-2 trees.

Google ships a small drafter beside each Gemma 4 model (``google/gemma-4-*-it-assistant``); llama.cpp converts it to
a GGUF of its own and runs it in a context whose ``ctx_other`` is the target's (``src/llama-context.cpp:146-154``).
Its ``common/speculative.cpp`` drafts a chain with it; this engine drives the same graph
(``src/models/gemma4-assistant.cpp``) to grow trees.

What one assistant step reads and writes:

* inputs: a token x (embedded with the *target's* ``tok_embd``, scaled by sqrt of the target's width) and a hidden
  row h of the target's width; ``pre_projection`` maps [x, h] to the assistant's width;
* attention: queries only. Its KV cache mirrors the target's: the target's cells (the same cell list, shared), and
  the K/V of the target's last sliding-window layer and last full layer (``src/llama-model.cpp:2809-2837``,
  ``src/llama-kv-cache.cpp:85-96,176-180``). It writes no K/V and changes no cell (``apply_ubatch``, ``seq_rm``,
  ``seq_cp``, ``seq_keep`` are no-ops on it: ``src/llama-kv-cache.cpp:384,453,545,1099``): a step attends to the
  cells of its sequence in the *target* whose position is at most its own;
* outputs: logits (the LM head tied to the assistant's own ``token_embd``) and ``t_h_nextn`` = ``post_projection``
  of its final norm, the h of the next step (its nextn embedding, read masked: one row per output).

Positions, and the order of operations. llama.cpp's driver drafts with the target holding the committed text
*without* the sampled root (the server decodes the root only with the draft, in the verify batch), feeds the root
with the target's post-norm hidden state of the last committed token (``pending_h``: the verify row of the last
accepted token), and puts every draft step at the root's position ``pos0`` (``common/speculative.cpp:1604-1605,
1696-1702``): each step sees exactly the committed text. The generator calls ``catch_up`` (text and root) before
``Target.verify``, when the target holds exactly the text before the root (``decoding/target.py``'s invariant), so
the same holds here: every node of the tree is decoded in sequence 0 at the root's position R, reading
target cells 0..R-1. llama.cpp also insists on it: a batch's first position in a sequence must be one past the
memory's last (``src/llama-batch.cpp:327-345``), and this memory's last is the target's. (A caller that already
decoded the root into the target, as the budget's backlog timing does, gets its rows at the next free position:
the same cost, the root's own cell then in view.)

A tree, then: level 1 is the root (x_R, h_{R-1}); a node at level d+1 is (its token, its parent's h output), at
position R, in sequence 0. As nothing is written, branches cannot see each other: a level is one batch of
independent rows, nodes need no sequences of their own, and ``commit`` has nothing to keep. The engine holds no
state between rounds but the count of text it has read: the next root's h comes with the next catch-up (the
generator's feature backlog: the target's nextn rows of newly committed positions, ``ContextSettings(
nextn_features=True)``), and the accepted nodes' drafted h never leaks into a later round.

Two llama.cpp facts the engine respects: creating the assistant's context resets the shared cell list
(``llama_kv_cells::resize``, called by its KV cache's constructor: ``src/llama-kv-cache.cpp:86,141-145``), so it
is created while the target is empty; and its KV views read the target's tensors with the layout its own settings
give (V transposed unless flash attention may run, streams per sequence unless unified), so it takes the
target's ``flash_attn`` and ``kv_unified``.

Rows come back dense (no in-graph top-k: llama.cpp's backend samplers are per sequence, and every node here is in
sequence 0).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..errors import IncompatibleDraftError, TreeError
from ..formats.models import GGUFInfo
from ..llamacpp import llama_ext
from ..llamacpp.llama import LlamaContext, LlamaModel
from ..llamacpp.runtime import charge_llama
from ..llamacpp.settings import ContextSettings
from ..tree.proposals import Proposals
from .base import DraftEngine, as_list

log = logging.getLogger(__name__)

ARCH = "gemma4-assistant"  # llama.cpp's LLM_ARCH_GEMMA4_ASSISTANT (src/llama-arch.cpp:60)
TARGET_ARCH = "gemma4"
# llama.cpp's GGUF keys (src/llama-arch.cpp), under an architecture's prefix
EMBEDDING_LENGTH = "{arch}.embedding_length"
EMBEDDING_LENGTH_OUT = "{arch}.embedding_length_out"  # the assistant's: the target's width (n_embd_backbone)
VOCAB_SIZE = "{arch}.vocab_size"
HEAD_COUNT = "{arch}.attention.head_count"
HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
KEY_LENGTH = "{arch}.attention.key_length"
KEY_LENGTH_SWA = "{arch}.attention.key_length_swa"
SWA_PATTERN = "{arch}.attention.sliding_window_pattern"
BLOCK_COUNT = "{arch}.block_count"
NEXTN_LAYERS = "{arch}.nextn_predict_layers"
# Past target features the engine needs: none (see :attr:`AssistantEngine.n_features`)
NO_PAST_FEATURES = 1 << 62


def _per_layer(info: GGUFInfo, key: str, n_layer: int, default=None) -> list:
    """A key that is one value for every layer or an array of one per layer (llama.cpp's get_key_or_arr)."""
    value = info.arch_get(key, default)
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value] * n_layer


def _kv_shapes(info: GGUFInfo, n_layer: int) -> list[tuple[bool, int, int]]:
    """Per layer: (sliding-window, K/V heads, head size) as llama.cpp's loader reads them (head size: key_length,
    else n_embd / n_head; key_length_swa, else the full one)."""
    n_embd = int(info.arch_get(EMBEDDING_LENGTH, 0) or 0)
    heads = _per_layer(info, HEAD_COUNT, n_layer, 0)
    kv_heads = _per_layer(info, HEAD_COUNT_KV, n_layer, None)
    swa = _per_layer(info, SWA_PATTERN, n_layer, False)
    full = info.arch_get(KEY_LENGTH)
    if full is None:
        full = n_embd // max(int(heads[0] or 1), 1)
    swa_len = info.arch_get(KEY_LENGTH_SWA, full)
    shapes = []
    for il in range(n_layer):
        n_kv = kv_heads[il] if il < len(kv_heads) and kv_heads[il] is not None else heads[il]
        is_swa = bool(swa[il]) if il < len(swa) else False
        shapes.append((is_swa, int(n_kv), int(swa_len if is_swa else full)))
    return shapes


def check_assistant_fits(info: GGUFInfo, target: LlamaModel) -> None:
    """Refuse, in one line, an assistant that cannot run beside ``target``: not a gemma4-assistant, a target that is
    not Gemma 4, another vocabulary size or target width, or attention shapes that do not fit the target layers
    whose K/V it reads (llama.cpp would read past their tensors). Reads GGUF headers only."""
    name = info.path.name
    if info.architecture != ARCH:
        raise IncompatibleDraftError(f"{name} is a {info.architecture!r} model, not a Gemma 4 assistant "
                                     f"('{ARCH}'); --draft assistant:PATH takes the drafter GGUF of a Gemma 4 model")
    if target.architecture != TARGET_ARCH:
        raise IncompatibleDraftError(f"a Gemma 4 assistant drafts for Gemma 4 targets only; {target.path.name} is a "
                                     f"{target.architecture!r} model")
    n_vocab = info.n_vocab or int(info.arch_get(VOCAB_SIZE, 0) or 0)
    if n_vocab != target.n_vocab:
        raise IncompatibleDraftError(f"assistant {name} has a {n_vocab}-token vocabulary; {target.path.name} has "
                                     f"{target.n_vocab}")
    backbone = int(info.arch_get(EMBEDDING_LENGTH_OUT, 0) or 0)
    if backbone != target.n_embd:
        raise IncompatibleDraftError(f"assistant {name} was made for a target of width {backbone or 'unknown'}; "
                                     f"{target.path.name} has {target.n_embd}")
    n_layer = int(info.arch_get(BLOCK_COUNT, 0) or 0)
    if n_layer < 1 or int(info.arch_get(NEXTN_LAYERS, 0) or 0) != n_layer:
        raise IncompatibleDraftError(f"{name} is not a complete Gemma 4 assistant: its {n_layer} layers must all be "
                                     f"'{ARCH}.nextn_predict_layers'")
    n_target = target.n_layer
    theirs = _kv_shapes(target.info, target.info.n_layer)
    if n_target < 2 or not theirs[n_target - 2][0] or theirs[n_target - 1][0]:
        raise IncompatibleDraftError(f"{target.path.name}: llama.cpp's assistant reads the K/V of the target's "
                                     f"layers {n_target - 2} (sliding-window) and {n_target - 1} (full), which it "
                                     "does not have")
    for il, (swa, n_kv, head) in enumerate(_kv_shapes(info, n_layer)):
        source = n_target - 2 if swa else n_target - 1
        if (n_kv, head) != theirs[source][1:]:
            raise IncompatibleDraftError(
                f"assistant {name} layer {il} attends with {n_kv} K/V heads of size {head}; the target layer it "
                f"reads ({source}) has {theirs[source][1]} of size {theirs[source][2]}")


class AssistantEngine(DraftEngine):
    """EAGLE-2 tree drafting with a Gemma 4 assistant, in a llama.cpp context that reads the target's KV cells."""

    needs_features = True

    def __init__(self, assistant: LlamaModel, target_ctx: LlamaContext, max_width: int, max_depth: int,
                 n_threads: int | None = None, owns_model: bool = True) -> None:
        """``assistant``: the drafter GGUF, loaded; ``target_ctx``: the target's context (with ``nextn_features``),
        still empty; ``max_width``: the most nodes a tree level has (one batch). ``owns_model``: close the
        assistant's weights with the engine."""
        check_assistant_fits(assistant.info, target_ctx.model)
        if assistant.n_vocab != target_ctx.model.n_vocab or assistant.n_embd_out != target_ctx.model.n_embd:
            raise IncompatibleDraftError(f"assistant {assistant.path.name} does not fit {target_ctx.model.path.name}:"
                                         f" vocabulary {assistant.n_vocab} vs {target_ctx.model.n_vocab}, width "
                                         f"{assistant.n_embd_out} vs {target_ctx.model.n_embd}")
        if not target_ctx.nextn_features:
            raise TreeError("the assistant reads the target's hidden states: create the target context with "
                            "nextn_features=True")
        if target_ctx.seq_pos_max(0) >= 0:  # llama.cpp resets the shared cell list when it creates the context
            raise TreeError("open the assistant before the target decodes anything: creating its llama.cpp context "
                            "resets the target's KV cells")
        self.model = assistant
        self.owns_model = owns_model
        self.target_ctx = target_ctx
        self.name = f"assistant:{assistant.path.name}"
        self.weights_path = assistant.path
        self.n_embd = assistant.n_embd_out  # its input and output rows: the target's width
        ts = target_ctx.settings
        # the same memory layout as the target's (its K/V views read the target's tensors); one stream when unified
        self.ctx = LlamaContext(assistant, ContextSettings(
            n_ctx=target_ctx.n_ctx, n_batch=max(max_width, 1), n_seq_max=1 if ts.kv_unified else ts.n_seq_max,
            n_threads=n_threads or ts.n_threads, flash_attn=ts.flash_attn, kv_unified=ts.kv_unified),
            ctx_other=target_ctx)
        llama_ext.set_nextn(self.ctx.ptr, True, masked=True)  # its h rows: one per output, as the logits
        self._n_read = 0  # tokens of the text read: the last catch-up's, root included
        self._pos = 0  # the position every node of the tree in flight is decoded at (the root's)
        self._out_row: dict[int, int] = {}  # candidate id (-1: the root) -> its row of the last decode's outputs
        self._n_last = 0  # outputs of the last decode

    @property
    def n_read(self) -> int:
        return self._n_read

    @property
    def n_features(self) -> int:
        """The engine keeps no target features: a round reads only the row of the position before its root, which
        the target computes afresh every time (a prefill evaluates at least the prompt's last token, a round
        hands its accepted path's rows). So reusing any cached text costs the draft nothing."""
        return NO_PAST_FEATURES

    # ------------------------------------------------------------ state
    def reset(self) -> None:
        self.rollback(0)

    def rollback(self, n_tokens: int) -> None:
        self._forget_tree()
        self._n_read = min(self._n_read, max(n_tokens, 0))

    # ------------------------------------------------------------ drafting
    def catch_up(self, tokens: np.ndarray, features: np.ndarray | None, features_from: int = 0) -> Proposals:
        """The root's row: (root token, the target's h at the position before it), at the root's position."""
        self._forget_tree()
        root = len(tokens) - 1
        if root < 1:
            raise TreeError("the assistant drafts after at least one committed token (it reads that token's hidden "
                            "state)")
        if features is None:
            raise TreeError("the assistant needs the target's hidden states: create the target context with "
                            "nextn_features=True")
        if features.ndim != 2 or features.shape[1] != self.n_embd:
            raise TreeError(f"target hidden states have shape {features.shape}, expected (n, {self.n_embd})")
        at = root - 1 - features_from
        if not 0 <= at < len(features):
            raise TreeError(f"hidden states cover positions {features_from}..{features_from + len(features) - 1}; "
                            f"the assistant needs {root - 1}")
        # one past the target's last committed cell: the root's position when the target holds the text before it
        self._pos = self.target_ctx.seq_pos_max(0) + 1
        if self._pos != root:
            log.debug("assistant: root at %d, the target holds %d tokens", root, self._pos)
        self.ctx.decode(np.asarray(tokens[root:], dtype=np.int32), self._pos, 1, seq=0,
                        embd=np.asarray(features[at:at + 1], dtype=np.float32))
        self._n_read = len(tokens)
        self._out_row = {-1: 0}
        self._n_last = 1
        return Proposals.from_logits(self.ctx.logits(1)[0])

    def expand(self, cand_ids: list[int], tokens: list[int], parent_ids: list[int], level: int) -> Proposals:
        """Decode one tree level: each node is (its token, its parent's h output), at the root's position."""
        k = len(cand_ids)
        cands = as_list(cand_ids)
        try:
            rows = [self._out_row[parent] for parent in as_list(parent_ids)]
        except KeyError:
            raise TreeError("a tree level's parents must be the nodes of the level before it (or the root)") from None
        # each node's h: its parent's row of the last decode's h outputs, gathered into the batch (one copy)
        self.ctx.decode(np.asarray(tokens, dtype=np.int32), self._pos, 1, seq=0, embd=self._h_rows(self._n_last),
                        embd_rows=rows)
        self._out_row = dict(zip(cands, range(k)))
        self._n_last = k
        return Proposals.from_logits(self.ctx.logits(k, copy=False))

    def _h_rows(self, n_out: int) -> np.ndarray:
        """A view of the last decode's ``n_out`` h outputs (valid until the next decode)."""
        t0 = time.perf_counter()
        ptr = llama_ext.nextn_ptr(self.ctx.ptr)  # waits for a GPU to finish
        charge_llama(t0)
        if not ptr:
            raise TreeError("llama.cpp returned no hidden-state output for the assistant")
        return llama_ext.buffer_view(ptr, (n_out, self.n_embd))

    def commit(self, accepted_cand_ids: np.ndarray) -> None:
        """Nothing to keep: the accepted tokens' real hidden states come with the next catch-up."""
        self._forget_tree()

    def _forget_tree(self) -> None:
        self._out_row = {}
        self._n_last = 0

    def close(self) -> None:
        self.ctx.close()  # before the target's context, whose memory it reads
        if self.owns_model:
            self.model.close()
