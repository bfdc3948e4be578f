"""The GGUF schema of EAGLE-1/2 draft heads (architecture ``eagle1``): one place that both ``convert/`` (writer)
and the runtime (reader) use. EAGLE-3 heads use llama.cpp's own ``eagle3`` architecture (``convert/eagle3.py``).

EAGLE-2 reuses EAGLE-1's heads (docs/design.md §3): ``x = fc(concat(E[token_{t+1}], f_t))``, one Llama decoder layer
without input norm, no final norm, the target's LM head on the raw output. llama.cpp has no such architecture, so
the file carries our own architecture name and keys; llama.cpp never loads it (the numpy engine does).

Keys (prefix ``eagle1.``): ``embedding_length``, ``feed_forward_length``, ``vocab_size``,
``attention.head_count``, ``attention.head_count_kv``, ``attention.key_length`` (head dim),
``attention.layer_norm_rms_epsilon``, ``rope.freq_base``, ``fc_bias``, ``qkv_bias``; provenance:
``source.checkpoint`` (folder name), ``source.format`` (safetensors / pytorch, with the shard count), ``source.config``
(config.json verbatim), ``target.name`` and ``target.architecture`` (what the head was trained for, from its
config), ``source.choices`` (JSON: what the converter decided on the user's behalf, e.g. where the RoPE base
came from).

Tensors keep the checkpoint's (Hugging Face) layout; in particular q/k are NOT permuted the way llama.cpp's
converter permutes llama attention: RoPE is applied in the "rotate half" convention the head was trained with.
``token_embd.weight`` is the head's own copy of the embedding (EAGLE checkpoints ship one); when absent the
runtime borrows the target's. The LM head is always the target's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import IncompatibleDraftError, ModelError

ARCH = "eagle1"

# hyper-parameter field -> GGUF key (without the arch prefix)
PARAM_KEYS = {
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "vocab_size": "vocab_size",
    "n_head": "attention.head_count",
    "n_head_kv": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rms_eps": "attention.layer_norm_rms_epsilon",
    "rope_base": "rope.freq_base",
    "fc_bias": "fc_bias",
    "qkv_bias": "qkv_bias",
}
PROVENANCE_KEYS = ("source.checkpoint", "source.format", "source.config", "target.name", "target.architecture",
                   "source.choices")

# checkpoint (Hugging Face) tensor name -> GGUF tensor name
TENSOR_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "fc.weight": "fc.weight",
    "fc.bias": "fc.bias",
    "layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "layers.0.self_attn.q_proj.bias": "blk.0.attn_q.bias",
    "layers.0.self_attn.k_proj.bias": "blk.0.attn_k.bias",
    "layers.0.self_attn.v_proj.bias": "blk.0.attn_v.bias",
    "layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}
OPTIONAL_TENSORS = frozenset({"token_embd.weight", "fc.bias", "blk.0.attn_q.bias", "blk.0.attn_k.bias",
                              "blk.0.attn_v.bias"})


@dataclass(frozen=True)
class HeadParams:
    """Everything needed to run the head, besides its tensors."""

    hidden_size: int
    intermediate_size: int
    vocab_size: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    fc_bias: bool
    qkv_bias: bool

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF tensor name -> numpy shape, for exactly the tensors these parameters call for (embedding aside)."""
        h, q, kv, ff = self.hidden_size, self.n_head * self.head_dim, self.n_head_kv * self.head_dim, \
            self.intermediate_size
        shapes = {"fc.weight": (h, 2 * h), "blk.0.attn_q.weight": (q, h), "blk.0.attn_k.weight": (kv, h),
                  "blk.0.attn_v.weight": (kv, h), "blk.0.attn_output.weight": (h, q), "blk.0.ffn_norm.weight": (h,),
                  "blk.0.ffn_gate.weight": (ff, h), "blk.0.ffn_up.weight": (ff, h), "blk.0.ffn_down.weight": (h, ff)}
        if self.fc_bias:
            shapes["fc.bias"] = (h,)
        if self.qkv_bias:
            shapes.update({"blk.0.attn_q.bias": (q,), "blk.0.attn_k.bias": (kv,), "blk.0.attn_v.bias": (kv,)})
        return shapes


@dataclass
class HeadFile:
    """A head read from GGUF: parameters, provenance and float32 tensors keyed by GGUF name."""

    path: Path
    params: HeadParams
    provenance: dict[str, str]
    tensors: dict[str, np.ndarray] = field(repr=False)

    @property
    def own_embedding(self) -> np.ndarray | None:
        return self.tensors.get("token_embd.weight")


def check_tensors(params: HeadParams, tensors: dict[str, np.ndarray], where: str) -> None:
    """Raise ModelError naming the first missing, unexpected or misshapen tensor."""
    expected = params.expected_shapes()
    for name, shape in expected.items():
        if name not in tensors:
            raise ModelError(f"{where}: tensor {name} is missing")
        if tuple(tensors[name].shape) != shape:
            raise ModelError(f"{where}: tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
    emb = tensors.get("token_embd.weight")
    if emb is not None and tuple(emb.shape) != (params.vocab_size, params.hidden_size):
        raise ModelError(f"{where}: token_embd.weight has shape {tuple(emb.shape)}, "
                         f"expected {(params.vocab_size, params.hidden_size)}")
    extra = set(tensors) - set(expected) - {"token_embd.weight"}
    if extra:
        raise ModelError(f"{where}: unexpected tensors {sorted(extra)} (bias flags and tensors disagree?)")


def check_eagle1_fits(params: HeadParams, target_hidden: int, target_vocab: int, target_name: str) -> None:
    """Refuse a head trained for another model: its features and token ids would mean something else."""
    if params.hidden_size != target_hidden:
        raise IncompatibleDraftError(f"the head's hidden size is {params.hidden_size} but {target_name} has "
                                     f"{target_hidden}: the head was trained for another model")
    if params.vocab_size != target_vocab:
        raise IncompatibleDraftError(f"the head's vocabulary has {params.vocab_size} tokens but {target_name} has "
                                     f"{target_vocab}: the head was trained for another model")


def params_from_info(info) -> HeadParams:
    """Hyper-parameters from a head GGUF's parsed metadata (``models.GGUFInfo``); ModelError if any is missing."""
    if info.architecture != ARCH:
        raise ModelError(f"{info.path} has architecture '{info.architecture}', not an EAGLE-1/2 head ('{ARCH}')")
    values = {}
    for fld, key in PARAM_KEYS.items():
        value = info.arch_get("{arch}." + key)
        if value is None:
            raise ModelError(f"{info.path}: key {ARCH}.{key} is missing")
        values[fld] = value
    return HeadParams(hidden_size=int(values["hidden_size"]), intermediate_size=int(values["intermediate_size"]),
                      vocab_size=int(values["vocab_size"]), n_head=int(values["n_head"]),
                      n_head_kv=int(values["n_head_kv"]), head_dim=int(values["head_dim"]),
                      rms_eps=float(values["rms_eps"]), rope_base=float(values["rope_base"]),
                      fc_bias=bool(values["fc_bias"]), qkv_bias=bool(values["qkv_bias"]))


def read_head(path: str | os.PathLike) -> HeadFile:
    """Read and check an EAGLE-1/2 head GGUF; every failure is a ModelError that names the problem."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from .models import read_gguf_info  # magic, truncation and architecture-key checks

    info = read_gguf_info(path)
    params = params_from_info(info)
    reader = GGUFReader(info.path, "r")
    tensors = {t.name: np.asarray(dequantize(np.array(t.data), t.tensor_type), dtype=np.float32).reshape(
        tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors}
    check_tensors(params, tensors, str(info.path))
    provenance = {k: str(info.arch_get("{arch}." + k, "")) for k in PROVENANCE_KEYS}
    return HeadFile(path=info.path, params=params, provenance=provenance, tensors=tensors)
