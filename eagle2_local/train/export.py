"""Write a trained head as an HF-style EAGLE-3 checkpoint folder (``config.json`` + ``model.safetensors``).

That folder is the format SafeAILab/EAGLE, vLLM and llama.cpp's converters read, and the one
``convert/eagle3.py`` turns into an ``eagle3`` GGUF; provenance (target file and hash, data, steps, seed,
command) travels in ``config.json["eagle2_local"]`` and from there into the GGUF's metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .head import Eagle3Head


def hf_config(head: Eagle3Head, layers: tuple[int, ...], provenance: dict) -> dict:
    c = head.config
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
        "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size, "eagle_aux_hidden_state_layer_ids": list(layers),
        "norm_before_fc": c.norm_before_fc, "norm_before_residual": False,
        "eagle2_local": provenance,
    }


def export_folder(head: Eagle3Head, out_dir: Path, layers: tuple[int, ...], provenance: dict) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32; the GGUF converter picks the final type)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    tensors["t2d"] = tensors["t2d"].to(torch.bool)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_config(head, layers, provenance), indent=2))
    return out_dir


def convert_to_gguf(head_dir: Path, out_path: Path, target: Path, provenance: dict, outtype: str = "f16") -> bool:
    """Convert the folder to an ``eagle3`` GGUF with ``convert/eagle3.py`` when that converter is installed.

    Returns False (and writes nothing) when it is not: the folder alone is a complete result then."""
    try:
        from ..convert.eagle3 import convert_eagle3  # installed: pyproject maps convert/ to eagle2_local.convert
    except ImportError:
        try:
            from convert.eagle3 import convert_eagle3  # a checkout: convert/ at the top level
        except ImportError:
            return False
    convert_eagle3(head_dir, out_path, target, outtype=outtype, provenance=provenance)
    return True
