"""Writing synthetic head checkpoints the way training code publishes them (safetensors + config.json).

It lives with the benchmarks because ``synthetic_head.py`` makes its random-weight head with it, and benchmarks
import only the package and each other; the tests use it too (as ``benchmarks.head_checkpoints``): tests may
import anything in the repository, nothing imports the tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from eagle2_local.convert.safetensors_file import DTYPES


def eagle3_tensors(*, hidden: int, target_hidden: int, n_head: int, n_head_kv: int, ffn: int, vocab: int,
                   draft_vocab: int, seed: int = 0, scale: float = 0.05, norm_before_fc: bool = False,
                   head_dim: int | None = None) -> dict[str, np.ndarray]:
    """Random EAGLE-3 tensors under SafeAILab's names (``midlayer.*``, rotate-half RoPE, d2t offsets, t2d mask)."""
    rng = np.random.default_rng(seed)
    hd = head_dim or hidden // n_head

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    ids = np.sort(rng.choice(vocab, size=draft_vocab, replace=False)).astype(np.int64)
    t = {
        "fc.weight": mat(hidden, 3 * target_hidden),
        "midlayer.input_layernorm.weight": norm(hidden),
        "midlayer.hidden_norm.weight": norm(hidden),
        "midlayer.self_attn.q_proj.weight": mat(n_head * hd, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": mat(n_head_kv * hd, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": mat(n_head_kv * hd, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": mat(hidden, n_head * hd),
        "midlayer.post_attention_layernorm.weight": norm(hidden),
        "midlayer.mlp.gate_proj.weight": mat(ffn, hidden),
        "midlayer.mlp.up_proj.weight": mat(ffn, hidden),
        "midlayer.mlp.down_proj.weight": mat(hidden, ffn),
        "norm.weight": norm(hidden),
        "lm_head.weight": mat(draft_vocab, hidden) * 4,
        "d2t": ids - np.arange(draft_vocab, dtype=np.int64),
        "t2d": np.isin(np.arange(vocab), ids),
    }
    if norm_before_fc:
        t["input_norm.weight"] = norm(3 * target_hidden)
    return t


def random_eagle3(out_dir: Path, *, hidden: int, target_hidden: int, n_head: int, n_head_kv: int, ffn: int,
                  vocab: int, draft_vocab: int, layers: list[int], rope_theta: float = 10000.0, seed: int = 0,
                  scale: float = 0.05, norm_before_fc: bool = False,
                  feature_source: str = "layer_inputs") -> tuple[Path, dict, dict]:
    """An EAGLE-3 checkpoint folder with random weights (HF names, rotate-half RoPE) for a given target.

    Returns ``(folder, tensors, config)`` so tests can compute with the weights without reading them back."""
    hd = hidden // n_head
    t = eagle3_tensors(hidden=hidden, target_hidden=target_hidden, n_head=n_head, n_head_kv=n_head_kv, ffn=ffn,
                       vocab=vocab, draft_vocab=draft_vocab, seed=seed, scale=scale, norm_before_fc=norm_before_fc)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(out_dir / "model.safetensors", t)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": ffn, "num_attention_heads": n_head, "num_key_value_heads": n_head_kv,
              "head_dim": hd, "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": rope_theta,
              "max_position_embeddings": 8192, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
              "target_hidden_size": target_hidden, "eagle_aux_hidden_state_layer_ids": layers,
              "norm_before_fc": norm_before_fc, "eagle2_local": {"feature_source": feature_source}}
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    return out_dir, t, config

def save_safetensors(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    """Write arrays as safetensors, as a publisher's checkpoint has them."""
    names = {dt.newbyteorder("="): name for name, dt in DTYPES.items() if dt is not None}
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(head)) + head + b"".join(chunks))
