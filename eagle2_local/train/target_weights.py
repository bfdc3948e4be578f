"""What a head borrows from its target GGUF: shapes, RoPE/norm constants, token embedding and LM head.

The runtime head reads the target's token embedding (quantized); training uses its dequantized copy, frozen,
so the head learns against the vectors it will actually get. The target's LM head (or its tied embedding) and
final norm initialise the head's own reduced LM head: the head then starts out mapping "a hidden state like the
target's last one" to the target's vocabulary and only has to learn to produce such states.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..formats import gguf_keys as keys


@dataclass
class TargetWeights:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    rope_theta: float
    rms_eps: float
    n_ctx_train: int
    embedding: np.ndarray  # (V, H) float32
    lm_head: np.ndarray  # (V, H) float32: output.weight, or the tied embedding
    output_norm: np.ndarray  # (H,)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _dequantize(tensor) -> np.ndarray:
    from gguf.quants import dequantize

    data = dequantize(tensor.data, tensor.tensor_type)
    return np.array(data, dtype=np.float32).reshape(int(tensor.shape[1]), int(tensor.shape[0]))


def read_target_weights(path: Path) -> TargetWeights:
    """Read what training needs from a target GGUF (without llama.cpp)."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith(keys.TOKENIZER_PREFIX) and len(f.data) <= 64}
    arch = meta.get(keys.ARCHITECTURE)

    def key(template: str, default=None):
        name = template.format(arch=arch)
        value = meta.get(name, default)
        if value is None:
            raise ModelError(f"{path.name} lacks {name}; cannot size a head for it")
        return value

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors or "output_norm.weight" not in tensors:
        raise ModelError(f"{path.name} has no token_embd/output_norm tensors; not a decoder-only LLM?")
    embedding = _dequantize(tensors["token_embd.weight"])
    lm_head = _dequantize(tensors["output.weight"]) if "output.weight" in tensors else embedding
    n_embd = int(key(keys.EMBEDDING_LENGTH))
    n_head = int(key(keys.HEAD_COUNT))
    return TargetWeights(
        n_embd=n_embd, n_layer=int(key(keys.BLOCK_COUNT)), n_head=n_head,
        n_head_kv=int(key(keys.HEAD_COUNT_KV, n_head)), n_ff=int(key(keys.FEED_FORWARD_LENGTH)),
        n_vocab=embedding.shape[0], rope_theta=float(key(keys.ROPE_FREQ_BASE, 10000.0)),
        rms_eps=float(key(keys.LAYERNORM_RMS_EPS, 1e-5)),
        n_ctx_train=int(key(keys.CONTEXT_LENGTH, 2048)), embedding=embedding, lm_head=lm_head,
        output_norm=np.asarray(tensors["output_norm.weight"].data, dtype=np.float32).reshape(-1))


def draft_vocabulary(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent target ids (ties: lower id first), ascending; ``d2t`` = ids - arange.

    EAGLE-3 drafts over a reduced vocabulary: its LM head is the head's largest matrix, and rare tokens are
    almost never accepted anyway. Ids never seen fill up the set in id order when the data has fewer."""
    if not 1 <= size <= len(counts):
        raise ModelError(f"draft vocabulary must hold 1..{len(counts)} tokens, got {size}")
    order = np.lexsort((np.arange(len(counts)), -counts))
    return np.sort(order[:size]).astype(np.int64)


def widen_vocabulary(draft_ids: np.ndarray, counts: np.ndarray, size: int) -> np.ndarray:
    """``draft_ids`` plus the most frequent other ids, ``size`` in all, ascending.

    Why: the head's LM head rows are the target's own, frozen, so an exported head can draft over more tokens
    than it was trained over at no training cost; its trained states score the extra tokens through the
    target's rows (what that gains on SmolLM2 is measured in NOTES.md#heads)."""
    if size < len(draft_ids):
        raise ModelError(f"cannot widen a {len(draft_ids)}-token draft vocabulary to {size} tokens")
    boosted = counts.astype(np.int64).copy()
    boosted[draft_ids] = boosted.max() + 1  # the trained tokens come first whatever the counts say
    return draft_vocabulary(boosted, size)
