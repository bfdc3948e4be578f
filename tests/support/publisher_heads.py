"""Synthetic EAGLE-3 head folders in the layouts real publishers ship (config keys, tensor names, files, dtypes).

Random weights at SmolLM2-135M sizes (hidden 576, 9 heads of 64, 3 KV heads, 49,152 tokens, 30 layers). What
differs between publishers, and what each writer reproduces:

* SafeAILab (yuhuili/EAGLE3-*): one ``pytorch_model.bin`` saved with ``torch.save`` (fp16 weights, int64 ``d2t``,
  bool ``t2d``), ``midlayer.*`` names, no feature-layer ids (EAGLE-3's default applies);
* SpecForge (lmsys/sglang exports): ``model.safetensors``, ``midlayer.*``, ids nested in ``eagle_config``
  (outputs of layers), transformers-5 ``rope_parameters``;
* NVIDIA ModelOpt: sharded safetensors with an index, ids nested in ``eagle_config`` (outputs of layers);
* vllm-project/speculators (RedHatAI): ``Eagle3Speculator`` with ``transformer_layer_config``, ``layers.0.*``
  names, top-level ids (inputs of layers), ``norm_before_residual``, llama3 ``rope_scaling``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np

from benchmarks.head_checkpoints import eagle3_tensors, save_safetensors

SMOL = {"hidden": 576, "target_hidden": 576, "n_head": 9, "n_head_kv": 3, "ffn": 256, "vocab": 49152,
        "draft_vocab": 1024}
SMOL_LAYERS = 30
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 256}


def llama_layer_config(rope: dict | None = None, **extra) -> dict:
    """The Llama-style keys every publisher writes for the one decoder layer."""
    cfg = {"model_type": "llama", "hidden_act": "silu", "hidden_size": SMOL["hidden"],
           "intermediate_size": SMOL["ffn"], "num_attention_heads": SMOL["n_head"],
           "num_key_value_heads": SMOL["n_head_kv"], "head_dim": 64, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 8192, "vocab_size": SMOL["vocab"], "tie_word_embeddings": False}
    cfg.update(rope if rope is not None else {"rope_theta": 100000.0})
    cfg.update(extra)
    return cfg


def tensors(seed: int = 0, prefix: str = "midlayer.", **kw) -> dict[str, np.ndarray]:
    t = eagle3_tensors(**SMOL, seed=seed, scale=0.05, **kw)
    return {(prefix + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in t.items()}


def _write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def safeailab_eagle3(folder: Path, t: dict | None = None, **config_extra) -> Path:
    """yuhuili/EAGLE3-*: a torch ``pytorch_model.bin`` (fp16, int64 d2t, bool t2d), no layer ids in config."""
    import torch

    t = tensors() if t is None else t
    state = OrderedDict()
    for name, arr in t.items():
        tensor = torch.from_numpy(np.ascontiguousarray(arr))
        state[name] = tensor.half() if tensor.is_floating_point() else tensor
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    _write_config(folder, {"architectures": ["LlamaForCausalLMEagle3"], **llama_layer_config(
        {"rope_theta": 500000.0}, bos_token_id=1, eos_token_id=2, torch_dtype="float16"),
        "draft_vocab_size": SMOL["draft_vocab"], **config_extra})
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def specforge_eagle3(folder: Path, ids: list[int], t: dict | None = None, **config_extra) -> Path:
    """SpecForge export: safetensors, ids nested in eagle_config (layer outputs), transformers-5 rope_parameters."""
    _write_config(folder, {"architectures": ["LlamaForCausalLMEagle3"], **llama_layer_config(
        {"rope_parameters": {"rope_theta": 250000.0, "rope_type": "default"}}, dtype="bfloat16"),
        "draft_vocab_size": SMOL["draft_vocab"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}, **config_extra})
    save_safetensors(folder / "model.safetensors", tensors(seed=1) if t is None else t)
    return folder


def modelopt_eagle3(folder: Path, ids: list[int], n_shards: int = 2) -> Path:
    """NVIDIA ModelOpt export: ids nested in eagle_config (layer outputs), weights split in shards + index."""
    _write_config(folder, {"architectures": ["LlamaForCausalLMEagle3"], **llama_layer_config(torch_dtype="float16"),
                           "draft_vocab_size": SMOL["draft_vocab"],
                           "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True,
                                            "use_last_layernorm": True}})
    t = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in tensors(seed=2).items()}
    names = sorted(t)
    weight_map = {}
    for i in range(n_shards):
        shard = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: t[n] for n in names[i::n_shards]}
        save_safetensors(folder / shard, part)
        weight_map.update({n: shard for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": int(sum(v.nbytes for v in t.values()))}, "weight_map": weight_map}))
    return folder


def speculators_eagle3(folder: Path, ids: list[int] | None, t: dict | None = None, layer: dict | None = None,
                       **config_extra) -> Path:
    """vllm-project/speculators ``Eagle3Speculator``: nested transformer_layer_config, ``layers.0.*`` names,
    top-level ids (layer inputs), norm_before_residual, llama3 rope_scaling."""
    layer_cfg = layer if layer is not None else llama_layer_config(
        {"rope_theta": 500000.0, "rope_scaling": LLAMA3_SCALING})
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "speculators_version": "0.2.0", "draft_vocab_size": SMOL["draft_vocab"], "norm_before_residual": True,
              "target_hidden_size": None, "transformer_layer_config": layer_cfg,
              "speculators_config": {"algorithm": "eagle3", "verifier": {
                  "name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "architectures": ["LlamaForCausalLM"]}},
              **config_extra}
    if ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = ids
    _write_config(folder, config)
    save_safetensors(folder / "model.safetensors", tensors(seed=3, prefix="layers.0.") if t is None else t)
    return folder
