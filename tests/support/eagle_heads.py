"""Synthetic EAGLE-1/2 head checkpoints (config.json + weights) of the three published variants, for tests.

The weights are random; the shapes, names, biases and config keys are those of the real heads (docs/design.md §3).
Torch-format files are written with ``torch.save`` or, without torch, by :func:`write_torch_zip_by_hand`.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np

from benchmarks.head_checkpoints import save_safetensors

VARIANTS = {
    # Vicuna / LLaMA2-chat heads: fc bias, no q/k/v bias, RoPE base 10000
    "vicuna": {"model_type": "llama", "bias": True, "rope_theta": 10000.0, "kv_div": 1},
    # LLaMA3-Instruct heads: no biases, RoPE base 500000, grouped-query attention
    "llama3": {"model_type": "llama", "bias": False, "rope_theta": 500000.0, "kv_div": 2},
    # Qwen2 heads: fc and q/k/v biases
    "qwen2": {"model_type": "qwen2", "bias": True, "rope_theta": 1000000.0, "kv_div": 2},
}


def head_config(variant: str, hidden: int = 64, vocab: int = 300, n_head: int = 4, ff: int = 96) -> dict:
    v = VARIANTS[variant]
    return {"architectures": ["LlamaForCausalLM" if v["model_type"] == "llama" else "Qwen2ForCausalLM"],
            "model_type": v["model_type"], "bias": v["bias"], "hidden_size": hidden, "intermediate_size": ff,
            "num_attention_heads": n_head, "num_key_value_heads": n_head // v["kv_div"], "vocab_size": vocab,
            "rms_norm_eps": 1e-5, "rope_theta": v["rope_theta"], "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "float16", "_name_or_path": f"synthetic-{variant}-target"}


def head_tensors(config: dict, seed: int = 0, scale: float = 1.0, with_embedding: bool = True,
                 dtype=np.float32) -> dict[str, np.ndarray]:
    """Random tensors under checkpoint names; ``scale`` shrinks the layer (0 = identity-like, tiny head)."""
    rng = np.random.default_rng(seed)
    h, ff, nh = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    hd = h // nh
    kv = config["num_key_value_heads"] * hd
    qkv_bias = config["model_type"] == "qwen2"

    def w(*shape, std=None):
        return (rng.standard_normal(shape) * (std if std is not None else shape[-1] ** -0.5) * scale).astype(dtype)

    t = {"fc.weight": w(h, 2 * h),
         "layers.0.self_attn.q_proj.weight": w(nh * hd, h), "layers.0.self_attn.k_proj.weight": w(kv, h),
         "layers.0.self_attn.v_proj.weight": w(kv, h), "layers.0.self_attn.o_proj.weight": w(h, nh * hd),
         "layers.0.post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(h)).astype(dtype),
         "layers.0.mlp.gate_proj.weight": w(ff, h), "layers.0.mlp.up_proj.weight": w(ff, h),
         "layers.0.mlp.down_proj.weight": w(h, ff)}
    if config["bias"]:
        t["fc.bias"] = w(h, std=0.1)
    if qkv_bias:
        for x, n in (("q", nh * hd), ("k", kv), ("v", kv)):
            t[f"layers.0.self_attn.{x}_proj.bias"] = w(n, std=0.1)
    if with_embedding:
        t["embed_tokens.weight"] = rng.standard_normal((config["vocab_size"], h)).astype(dtype)
    return t


def write_head_dir(folder: Path, config: dict, tensors: dict[str, np.ndarray], fmt: str = "safetensors") -> Path:
    """``fmt``: safetensors | torch (torch.save) | handmade (zip-pickle written without torch)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        save_safetensors(folder / "model.safetensors", tensors)
    elif fmt == "torch":
        from collections import OrderedDict

        import torch
        torch.save(OrderedDict((k, torch.from_numpy(np.ascontiguousarray(v))) for k, v in tensors.items()),
                   folder / "pytorch_model.bin")
    elif fmt == "handmade":
        write_torch_zip_by_hand(folder / "pytorch_model.bin", tensors)
    else:
        raise ValueError(fmt)
    return folder


def write_torch_zip_by_hand(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A torch zip checkpoint written opcode by opcode (protocol 2), as torch.save lays it out.

    Each tensor is stored transposed-in-memory (a non-contiguous view: stride (1, rows)) on a storage shared
    with an offset, so the reader's offset/stride handling is exercised too.
    """
    storage_names = {np.dtype("float32"): b"FloatStorage", np.dtype("float16"): b"HalfStorage"}
    out = io.BytesIO()
    pk = bytearray(b"\x80\x02")

    def uni(s: str) -> None:
        b = s.encode()
        pk.extend(b"X" + struct.pack("<I", len(b)) + b)

    def integer(i: int) -> None:
        pk.extend(b"J" + struct.pack("<i", i))

    def ints(values) -> None:
        pk.extend(b"(")
        for i in values:
            integer(int(i))
        pk.extend(b"t")

    pk.extend(b"ccollections\nOrderedDict\n)R(")
    storages = {}
    for key, (name, arr) in enumerate(tensors.items()):
        arr = np.asarray(arr)
        pad = 3  # the tensor starts 3 elements into its storage
        if arr.ndim == 2:  # store the transpose, describe it with swapped strides
            body = np.ascontiguousarray(arr.T).ravel()
            stride = (1, arr.shape[0])
        else:
            body = arr.ravel()
            stride = (1,)
        storage = np.concatenate([np.zeros(pad, dtype=arr.dtype), body])
        storages[str(key)] = storage.astype(storage.dtype.newbyteorder("<")).tobytes()
        uni(name)
        pk.extend(b"ctorch._utils\n_rebuild_tensor_v2\n(")
        pk.extend(b"(")
        uni("storage")
        pk.extend(b"ctorch\n" + storage_names[arr.dtype] + b"\n")
        uni(str(key))
        uni("cpu")
        integer(storage.size)
        pk.extend(b"tQ")
        integer(pad)
        ints(arr.shape)
        ints(stride)
        pk.extend(b"\x89ccollections\nOrderedDict\n)Rt" + b"R")
    pk.extend(b"u.")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", bytes(pk))
        z.writestr("archive/byteorder", "little")
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)
        z.writestr("archive/version", "3\n")
    path.write_bytes(out.getvalue())


def chat_turn_outputs(model, head, inspect=None, **kw) -> dict[str, list[list[int]]]:
    """Greedy outputs of chat-like calls that extend the previous text (KV reused), alternating plain and
    speculative calls, for a plain-only run ("plain") and a run with ``head`` ("eagle").

    ``inspect(llm)`` sees the head's run before it is closed (to check what the engine holds)."""
    from eagle2_local.api import Eagle2
    from eagle2_local.tree.sampling import SamplingParams

    greedy = SamplingParams(temperature=0)
    outputs = {}
    for mode in ("plain", "eagle"):
        extra = {"head_path": head} if mode == "eagle" else {}
        with Eagle2(model, n_ctx=512, n_threads=1, **kw, **extra) as llm:
            prompt, outs = llm.tokenize("the cat sat"), []
            for speculative in (True, False, True, True):
                out = [t for ch in llm.stream(prompt, 12, greedy, speculative=speculative and mode == "eagle")
                       for t in ch.tokens]
                outs.append(out)
                prompt = prompt + out + llm.tokenize(" and the", add_bos=False)
            assert llm.stats()["prompt_tokens_reused"] > 20
            outputs[mode] = outs
            if mode == "eagle" and inspect is not None:
                inspect(llm)
    return outputs
