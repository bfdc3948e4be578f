"""EAGLE-3 checkpoint folder (``config.json`` + weights) → ``eagle3`` GGUF that llama.cpp loads natively.

What llama.cpp's ``eagle3`` architecture expects (src/models/eagle3.cpp) and how a checkpoint maps onto it:

=========================================  ====================================  =================================
checkpoint tensor (``midlayer.`` or         GGUF tensor                           note
``layers.0.`` prefix)
=========================================  ====================================  =================================
``fc.weight`` (H, 3·Ht)                     ``fc.weight``                          fuses three target layers
``input_norm.weight`` (3·Ht)                ``enc.output_norm.weight``             only with ``norm_before_fc``
``*.input_layernorm.weight``                ``blk.0.attn_norm.weight``             norm of the token embedding
``*.hidden_norm.weight``                    ``blk.0.attn_norm_2.weight``           norm of the fused feature g
``*.self_attn.{q,k}_proj.weight``           ``blk.0.attn_{q,k}.weight``            rows permuted: HF rotate-half
                                                                                  RoPE → llama.cpp's NORM RoPE
``*.self_attn.{v,o}_proj.weight``           ``blk.0.attn_{v,output}.weight``
``*.post_attention_layernorm.weight``       ``blk.0.ffn_norm.weight``
``*.mlp.{gate,up,down}_proj.weight``        ``blk.0.ffn_{gate,up,down}.weight``
``norm.weight``                             ``output_norm.weight``
``lm_head.weight`` (Vd, H)                  ``output.weight``                      optional: else the target's
``embed_tokens.weight``                     ``token_embd.weight``                  optional: else the target's
``d2t`` (Vd,) offsets                       ``d2t`` (I64) absolute target ids      ``id = i + d2t[i]``
(config ``rope_scaling``, llama3 / linear)  ``rope_freqs.weight`` (head_dim/2)     frequency divisors
=========================================  ====================================  =================================

Feature layers and RoPE are read by :mod:`convert.head_config` (publishers disagree on both); tensors the graph
has no place for (q/k norms, projection biases, a norm after fc) are refused by name.

The tokenizer is copied from the target GGUF (llama.cpp builds the head's vocabulary from it), which is why a
target is required. Provenance (source folder, target name and sha256, training metadata) goes under
``eagle2_local.*`` keys.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from eagle2_local.errors import ModelError
from eagle2_local.formats import gguf_keys as keys
from eagle2_local.formats.atomic_write import atomic_path
from eagle2_local.formats.gguf_fields import copy_fields_from
from eagle2_local.formats.models import file_sha256, read_gguf_info

from .checkpoint import OUTTYPES, Progress, add_tensor, load_checkpoint
from .head_config import feature_layers, rope_settings

log = logging.getLogger(__name__)

ARCH = keys.EAGLE3_ARCH

# checkpoint suffix (after the layer prefix) -> GGUF name
_LAYER_MAP = {
    "input_layernorm.weight": "blk.0.attn_norm.weight",
    "hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "mlp.down_proj.weight": "blk.0.ffn_down.weight",
}
_TOP_MAP = {
    "fc.weight": "fc.weight",
    "input_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "embed_tokens.weight": "token_embd.weight",
}
_REQUIRED = ["fc.weight", "blk.0.attn_norm.weight", "blk.0.attn_norm_2.weight", "blk.0.attn_q.weight",
             "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
             "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "output_norm.weight"]


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder q/k projection rows from HF's rotate-half RoPE layout to llama.cpp's pairwise (NORM) layout."""
    rows, cols = w.shape
    half = rows // n_head // 2
    return w.reshape(n_head, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)


def flat_config(config: dict) -> dict:
    """The config with speculators' nested ``transformer_layer_config`` lifted to the top level."""
    return {**config, **(config.get("transformer_layer_config") or {})}


def is_eagle3_config(config: dict) -> bool:
    """EAGLE-3 checkpoints declare a draft vocabulary (SafeAILab, SpecForge, ModelOpt) or say so (speculators)."""
    cfg = flat_config(config)
    archs = " ".join(str(a) for a in cfg.get("architectures") or []).lower()
    return "draft_vocab_size" in cfg or "eagle3" in archs or cfg.get("speculators_model_type") == "eagle3"


def eagle3_hparams(config: dict, target_layers_n: int, layer_ids_mean: str | None = None,
                   rope_theta: float | None = None) -> dict:
    """Hyper-parameters from an EAGLE-3 ``config.json`` (nested ``transformer_layer_config`` flattened).

    ``hp["choices"]`` says, for the summary and the GGUF, what was decided on the user's behalf and why."""
    cfg = flat_config(config)
    if not is_eagle3_config(config):
        raise ModelError("config.json is not an EAGLE-3 head (needs draft_vocab_size)")
    n_layers = cfg.get("num_hidden_layers", 1)
    if n_layers != 1:
        raise ModelError(f"this head has {n_layers} decoder layers; the eagle3 graph runs 1")
    try:
        h = int(cfg["hidden_size"])
        n_head = int(cfg["num_attention_heads"])
        hp = {
            "hidden_size": h, "n_head": n_head,
            "n_head_kv": int(cfg.get("num_key_value_heads") or n_head),
            "head_dim": int(cfg.get("head_dim") or h // n_head),
            "intermediate_size": int(cfg["intermediate_size"]),
            "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
            "context_length": int(cfg.get("max_position_embeddings", 4096)),
            "draft_vocab_size": int(cfg["draft_vocab_size"]),
            "target_hidden_size": int(cfg.get("target_hidden_size") or h),
            "norm_before_fc": bool(cfg.get("norm_before_fc", False)),
            "norm_before_residual": bool(cfg.get("norm_before_residual", False)),
            "feature_source": str((cfg.get("eagle2_local") or {}).get("feature_source", "layer_inputs")),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"EAGLE-3 config.json lacks or mangles a field: {exc}") from exc
    if hp["feature_source"] not in ("layer_inputs", "final_norm"):
        raise ModelError(f"unknown eagle2_local.feature_source {hp['feature_source']!r}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelError(f"hidden_act {cfg['hidden_act']!r}: the eagle3 graph runs a SiLU-gated MLP only")
    rope = rope_settings(cfg, hp["head_dim"], theta=rope_theta)
    layers = feature_layers(config, target_layers_n, layer_ids_mean)
    hp.update(rope_theta=rope.theta, rope_freqs=rope.freq_factors, target_layers=layers.target_layers,
              layers=layers)
    hp["choices"] = {"feature layers": layers.describe(), "RoPE": rope.describe()}
    return hp


# tensors published heads carry that llama.cpp's eagle3 graph has no place for: refused by name, never dropped
_UNSUPPORTED = {
    "self_attn.q_norm.weight": "per-head RMSNorm of q (Qwen3-style heads)",
    "self_attn.k_norm.weight": "per-head RMSNorm of k (Qwen3-style heads)",
    "self_attn.q_proj.bias": "a q projection bias",
    "self_attn.k_proj.bias": "a k projection bias",
    "self_attn.v_proj.bias": "a v projection bias",
    "self_attn.o_proj.bias": "an output projection bias",
}
_DERIVED_SUFFIXES = (".rotary_emb.inv_freq",)  # a buffer older transformers saved; recomputed from the RoPE settings


def map_tensors(raw: dict[str, np.ndarray], hp: dict) -> dict[str, np.ndarray]:
    """Rename checkpoint tensors to GGUF names; permute q/k; turn ``d2t`` offsets into absolute ids.

    A tensor the eagle3 graph cannot use is refused with its name: a head missing part of its computation
    would draft something else, and that must never be written."""
    out: dict[str, np.ndarray] = {}
    for name, arr in raw.items():
        if name == "t2d" or name.endswith(_DERIVED_SUFFIXES):
            continue  # t2d: only draft -> target is used at runtime (checked against d2t below)
        if name == "d2t":
            offsets = np.asarray(arr).astype(np.int64).reshape(-1)
            out["d2t"] = offsets + np.arange(offsets.size, dtype=np.int64)
            continue
        gname = _gguf_name(name)
        arr = np.asarray(arr, dtype=np.float32)
        if gname == "blk.0.attn_q.weight":
            arr = permute_rope_rows(arr, hp["n_head"])
        elif gname == "blk.0.attn_k.weight":
            arr = permute_rope_rows(arr, hp["n_head_kv"])
        out[gname] = arr
    if hp.get("rope_freqs") is not None:
        out["rope_freqs.weight"] = np.asarray(hp["rope_freqs"], dtype=np.float32)
    _check_t2d(raw, out.get("d2t"))
    return out


def _gguf_name(name: str) -> str:
    """The GGUF name of a checkpoint tensor; ModelError naming any tensor the eagle3 graph has no use for."""
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    for prefix in ("midlayer.", "layers.0.", "model.layers.0."):
        if name.startswith(prefix):
            suffix = name[len(prefix):]
            if suffix in _LAYER_MAP:
                return _LAYER_MAP[suffix]
            if suffix in _UNSUPPORTED:
                raise ModelError(f"tensor {name} ({_UNSUPPORTED[suffix]}) has no place in llama.cpp's eagle3 "
                                 "graph; converting without it would draft with another function, so it is refused")
            break
    if name.startswith("fc_norm."):
        raise ModelError(f"tensor {name} (a norm after fc) has no place in llama.cpp's eagle3 graph; converting "
                         "without it would draft with another function, so it is refused")
    raise ModelError(f"unexpected tensor {name}: not part of an EAGLE-3 head llama.cpp can run; refusing rather "
                     "than dropping it")


def _check_t2d(raw: dict[str, np.ndarray], d2t: np.ndarray | None) -> None:
    """``t2d`` (target -> in draft vocabulary) must mark exactly the ids ``d2t`` maps to."""
    t2d = raw.get("t2d")
    if t2d is None or d2t is None:
        return
    mask = np.asarray(t2d).astype(bool).reshape(-1)
    if int(mask.sum()) != d2t.size or d2t.max(initial=0) >= mask.size or not mask[d2t].all():
        raise ModelError("t2d and d2t disagree about the draft vocabulary (a corrupt or mismatched checkpoint)")


def check_tensors(t: dict[str, np.ndarray], hp: dict, target_vocab: int, target_embd: int) -> None:
    """Refuse a head whose shapes do not fit its own config or its target, before writing anything."""
    missing = [n for n in _REQUIRED if n not in t]
    if hp["norm_before_fc"] and "enc.output_norm.weight" not in t:
        missing.append("input_norm.weight (norm_before_fc)")
    if missing:
        raise ModelError(f"EAGLE-3 checkpoint lacks tensors: {', '.join(missing)}")
    h, ht = hp["hidden_size"], hp["target_hidden_size"]
    if ht != target_embd:
        raise ModelError(f"the head was trained on hidden size {ht}, the target has {target_embd}")
    expect = {"fc.weight": (h, 3 * ht), "blk.0.attn_q.weight": (hp["n_head"] * hp["head_dim"], 2 * h),
              "blk.0.attn_k.weight": (hp["n_head_kv"] * hp["head_dim"], 2 * h),
              "blk.0.ffn_gate.weight": (hp["intermediate_size"], h), "output_norm.weight": (h,)}
    for name, shape in expect.items():
        if t[name].shape != shape:
            raise ModelError(f"{name} has shape {t[name].shape}, config says {shape}")
    if "output.weight" in t and t["output.weight"].shape != (hp["draft_vocab_size"], h):
        raise ModelError(f"lm_head has shape {t['output.weight'].shape}, expected ({hp['draft_vocab_size']}, {h})")
    d2t = t.get("d2t")
    if d2t is not None:
        if d2t.size != hp["draft_vocab_size"]:
            raise ModelError(f"d2t has {d2t.size} entries, draft_vocab_size is {hp['draft_vocab_size']}")
        if d2t.min() < 0 or d2t.max() >= target_vocab or np.unique(d2t).size != d2t.size:
            raise ModelError(f"d2t maps outside the target's {target_vocab} tokens or repeats an id")
    elif hp["draft_vocab_size"] != target_vocab:
        raise ModelError(f"draft vocabulary {hp['draft_vocab_size']} != target's {target_vocab} and no d2t map")


def convert_eagle3(head_dir: str | Path, out_path: str | Path, target_gguf: str | Path, outtype: str = "f16",
                   progress: Progress | None = None, provenance: dict | None = None,
                   layer_ids_mean: str | None = None, on_choices: Callable[[dict], None] | None = None,
                   rope_theta: float | None = None) -> Path:
    """Convert an EAGLE-3 checkpoint folder into an ``eagle3`` GGUF for ``target_gguf``; returns the path.

    ``progress(tensor_name, done, total)`` is called per tensor prepared; ``on_choices(choices)`` receives what
    was decided on the user's behalf (also stored under ``eagle2_local.choice.*``). Nothing is written unless
    every check passes, so a bad head never leaves a half-written file behind.
    """
    if outtype not in OUTTYPES:
        raise ModelError(f"--outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    head_dir, out_path, target_gguf = Path(head_dir), Path(out_path), Path(target_gguf)
    ckpt = load_checkpoint(head_dir)
    config, raw = ckpt.config, ckpt.tensors
    target = read_gguf_info(target_gguf)
    hp = eagle3_hparams(config, target.n_layer, layer_ids_mean, rope_theta)
    tensors = map_tensors(raw, hp)
    if int(flat_config(config).get("vocab_size", target.n_vocab)) != target.n_vocab:
        raise ModelError(f"the head was trained for a {flat_config(config)['vocab_size']}-token vocabulary, "
                         f"{target_gguf.name} has {target.n_vocab}")
    check_tensors(tensors, hp, target.n_vocab, target.n_embd)
    hp["choices"].update(_tensor_choices(tensors, hp, target.n_vocab, outtype, ckpt))
    if on_choices is not None:
        on_choices(hp["choices"])
    with atomic_path(out_path) as tmp:
        _write_gguf(tmp, tensors, hp, head_dir, target_gguf, provenance, outtype, progress)
    log.info("wrote %s (%d tensors, %s)", out_path, len(tensors), outtype)
    return out_path


def _tensor_choices(tensors: dict, hp: dict, n_vocab: int, outtype: str, ckpt) -> dict[str, str]:
    d2t = tensors.get("d2t")
    vocab = f"{d2t.size} of the target's {n_vocab} tokens (d2t)" if d2t is not None else \
        f"the target's {n_vocab} tokens (no d2t)"
    own = [what for name, what in (("output.weight", "lm_head"), ("token_embd.weight", "embedding"))
           if name in tensors]
    borrowed = [w for w in ("lm_head", "embedding") if w not in own]
    dtype = flat_config(ckpt.config).get("torch_dtype") or flat_config(ckpt.config).get("dtype") or "not stated"
    return {"draft vocabulary": vocab + (f"; own {', '.join(own)}" if own else "") +
            (f"; the target's {', '.join(borrowed)}" if borrowed else ""),
            "dtype": f"matrices {outtype}, norms f32 (checkpoint: {ckpt.weight_format}, config dtype {dtype})"}


def _write_gguf(path: Path, tensors: dict, hp: dict, head_dir: Path, target_gguf: Path, provenance: dict | None,
                outtype: str, progress: Progress | None) -> None:
    writer = gguf.GGUFWriter(str(path), ARCH)
    _write_hparams(writer, hp, head_dir, target_gguf, provenance)
    copy_fields_from(target_gguf, writer, keys.TOKENIZER_PREFIX)  # llama.cpp builds the head's vocabulary from it
    names = sorted(tensors)
    for i, name in enumerate(names):
        if name == "d2t":
            writer.add_tensor(name, tensors[name], raw_dtype=gguf.GGMLQuantizationType.I64)
        elif name == "rope_freqs.weight":
            writer.add_tensor(name, tensors[name])  # llama.cpp reads the factors as f32
        else:
            add_tensor(writer, name, tensors[name], outtype)
        if progress is not None:
            progress(name, i + 1, len(names))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_hparams(w: gguf.GGUFWriter, hp: dict, head_dir: Path, target: Path, provenance: dict | None) -> None:
    w.add_name(f"EAGLE-3 head for {target.stem}")
    w.add_uint32(keys.CONTEXT_LENGTH.format(arch=ARCH), hp["context_length"])
    w.add_uint32(keys.EMBEDDING_LENGTH.format(arch=ARCH), hp["hidden_size"])
    w.add_uint32(keys.BLOCK_COUNT.format(arch=ARCH), 1)
    w.add_uint32(keys.FEED_FORWARD_LENGTH.format(arch=ARCH), hp["intermediate_size"])
    w.add_uint32(keys.HEAD_COUNT.format(arch=ARCH), hp["n_head"])
    w.add_uint32(keys.HEAD_COUNT_KV.format(arch=ARCH), hp["n_head_kv"])
    w.add_uint32(keys.KEY_LENGTH.format(arch=ARCH), hp["head_dim"])
    w.add_uint32(keys.VALUE_LENGTH.format(arch=ARCH), hp["head_dim"])
    w.add_uint32(keys.ROPE_DIMENSION_COUNT.format(arch=ARCH), hp["head_dim"])
    w.add_float32(keys.ROPE_FREQ_BASE.format(arch=ARCH), hp["rope_theta"])
    w.add_float32(keys.LAYERNORM_RMS_EPS.format(arch=ARCH), hp["rms_eps"])
    w.add_array(keys.EAGLE3_TARGET_LAYERS, [int(x) for x in hp["target_layers"]])
    w.add_uint32(keys.EAGLE3_TARGET_HIDDEN_SIZE, hp["target_hidden_size"])
    w.add_bool(keys.EAGLE3_NORM_BEFORE_RESIDUAL, hp["norm_before_residual"])
    w.add_bool(keys.EAGLE3_NORM_BEFORE_FC, hp["norm_before_fc"])
    w.add_string(keys.FEATURE_SOURCE, hp["feature_source"])
    layers = hp["layers"]
    w.add_string(keys.FEATURE_LAYERS_SOURCE, layers.source)
    w.add_string(keys.FEATURE_LAYERS_MEANING, layers.meaning)
    if layers.config_ids is not None:
        w.add_array(keys.FEATURE_LAYERS_CONFIG_IDS, [int(x) for x in layers.config_ids])
    for what, text in hp["choices"].items():
        w.add_string(keys.CHOICE.format(what=what.replace(" ", "_").lower()), text)
    w.add_string(keys.SOURCE, str(head_dir.name))
    w.add_string(keys.TARGET, target.name)
    w.add_string(keys.TARGET_SHA256, file_sha256(target))
    if provenance:
        w.add_string(keys.PROVENANCE, json.dumps(provenance, sort_keys=True))
