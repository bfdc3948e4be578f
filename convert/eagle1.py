"""Convert an EAGLE-1/2 head folder (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``) to GGUF.

The schema (architecture, keys, tensor names) is :mod:`eagle2_local.formats.eagle1_format`; this module only maps a
Hugging Face checkpoint onto it. The three published head families differ only in biases and RoPE base:
Vicuna / LLaMA2-chat (fc bias), LLaMA3-Instruct (no bias, rope_theta 500000), Qwen2 (fc and q/k/v biases).
The flags are read from the config and cross-checked against the tensors actually present, so a config that lies
about its biases is refused instead of silently dropping weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import numpy as np

from eagle2_local.errors import IncompatibleDraftError, ModelError
from eagle2_local.formats import gguf_keys as keys
from eagle2_local.formats.eagle1_format import (ARCH, PARAM_KEYS, TENSOR_NAMES, HeadParams, check_eagle1_fits,
                                                check_tensors)

from .checkpoint import OUTTYPES, Progress, add_tensor, load_checkpoint
from .head_config import rope_settings

log = logging.getLogger(__name__)

KNOWN_MODEL_TYPES = {"llama": False, "mistral": False, "qwen2": True}  # model_type -> q/k/v biases by default
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # a buffer older transformers saved; recomputed from rope_theta


def params_from_config(config: dict, tensors: dict[str, np.ndarray], where: str) -> HeadParams:
    """Hyper-parameters of the head; refuses unknown model types and configs that disagree with the tensors."""
    model_type = config.get("model_type")
    if model_type not in KNOWN_MODEL_TYPES:
        raise ModelError(f"{where}: unknown head config (model_type {model_type!r}); supported EAGLE-1/2 heads "
                         f"have model_type {sorted(KNOWN_MODEL_TYPES)}")
    missing = [k for k in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size") if k not in config]
    if missing:
        raise ModelError(f"{where}: config.json lacks {', '.join(missing)}")
    hidden, n_head = int(config["hidden_size"]), int(config["num_attention_heads"])
    fc_bias = bool(config.get("bias", True))
    qkv_bias = _qkv_bias(config, model_type, where)
    _check_flag(where, "fc bias", fc_bias, "fc.bias" in tensors)
    _check_flag(where, "q/k/v bias", qkv_bias, "layers.0.self_attn.q_proj.bias" in tensors)
    rope = rope_settings(config, int(config.get("head_dim") or hidden // n_head), allow_scaling=False)
    return HeadParams(hidden_size=hidden, intermediate_size=int(config["intermediate_size"]),
                      vocab_size=int(config["vocab_size"]), n_head=n_head,
                      n_head_kv=int(config.get("num_key_value_heads") or n_head),
                      head_dim=int(config.get("head_dim") or hidden // n_head),
                      rms_eps=float(config.get("rms_norm_eps", 1e-6)),
                      rope_base=rope.theta, fc_bias=fc_bias, qkv_bias=qkv_bias)


def _qkv_bias(config: dict, model_type: str, where: str) -> bool:
    """q/k/v biases: ``attention_bias`` (transformers) or ``qkv_bias`` (SafeAILab's EAGLE code), else the model
    type's default (Qwen2 has them)."""
    flags = {k: bool(config[k]) for k in ("attention_bias", "qkv_bias") if config.get(k) is not None}
    if len(set(flags.values())) > 1:
        raise ModelError(f"{where}: config.json disagrees with itself about q/k/v biases: {flags}")
    return next(iter(flags.values()), KNOWN_MODEL_TYPES[model_type])


def _check_flag(where: str, what: str, configured: bool, present: bool) -> None:
    if configured != present:
        raise ModelError(f"{where}: config says {what} is {'on' if configured else 'off'} but the weights "
                         f"{'lack' if configured else 'contain'} it")


def to_gguf_names(tensors: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """Rename checkpoint tensors to the schema's names; unknown tensors are an error (not a head we know)."""
    out = {}
    for name, arr in tensors.items():
        if name.endswith(IGNORED_SUFFIXES):
            continue
        if name not in TENSOR_NAMES:
            raise ModelError(f"{where}: unexpected tensor {name!r}; is this an EAGLE-1/2 head "
                             "(EAGLE-3 heads are a different format)?")
        out[TENSOR_NAMES[name]] = arr
    return out


def check_target(target: str | Path, params: HeadParams, config: dict) -> None:
    """Refuse a target the head was not trained for: hidden size, vocabulary size, special tokens, token texts."""
    from gguf import GGUFReader

    from eagle2_local.formats.models import read_gguf_info

    info = read_gguf_info(target)
    name = info.path.name
    hidden = info.arch_get(keys.EMBEDDING_LENGTH)
    tokens = _token_list(GGUFReader(info.path, "r"))
    check_eagle1_fits(params, int(hidden or -1), len(tokens), name)
    # only BOS: instruct GGUFs often set EOS to the end-of-turn token while the HF config keeps the base EOS
    want, have = config.get("bos_token_id"), info.get(keys.BOS_ID)
    if isinstance(want, int) and have is not None and int(have) != want:
        raise IncompatibleDraftError(f"tokenizers differ: the head's BOS token is {want}, {name} has {int(have)}")
    tok_json = config.get("_tokenizer_json")
    if tok_json:
        _check_token_texts(tok_json, tokens, name)


def _token_list(reader) -> list[str]:
    fld = reader.fields.get(keys.TOKENS)
    if fld is None:
        raise ModelError("the target GGUF has no tokenizer.ggml.tokens")
    return [bytes(fld.parts[i]).decode("utf-8", errors="replace") for i in fld.data]


def _check_token_texts(tok_json: dict, tokens: list[str], name: str) -> None:
    """Compare the head folder's tokenizer.json vocabulary with the target's tokens, id by id."""
    vocab = dict(tok_json.get("model", {}).get("vocab", {}) or {})
    vocab.update({t["content"]: t["id"] for t in tok_json.get("added_tokens", [])})
    for text, tok in sorted(vocab.items(), key=lambda kv: kv[1]):
        if tok < len(tokens) and tokens[tok] != text:
            raise IncompatibleDraftError(f"tokenizers differ at token {tok}: head {text!r}, {name} {tokens[tok]!r}")


def write_head(out: str | Path, params: HeadParams, tensors: dict[str, np.ndarray], provenance: dict[str, str],
               outtype: str = "f16", progress: Progress | None = None) -> Path:
    """Write the head GGUF; 1-D tensors (norm, biases) stay f32 whatever ``outtype`` says."""
    import gguf

    if outtype not in OUTTYPES:
        raise ModelError(f"unknown outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    out = Path(out)
    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name(f"EAGLE-1/2 head {provenance.get('source.checkpoint', '')}".strip())
    for fld, key in PARAM_KEYS.items():
        value = getattr(params, fld)
        if isinstance(value, bool):
            w.add_bool(f"{ARCH}.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{ARCH}.{key}", value)
        else:
            w.add_float32(f"{ARCH}.{key}", value)
    for key, value in provenance.items():
        w.add_string(f"{ARCH}.{key}", value)
    total = len(tensors)
    for i, (name, arr) in enumerate(sorted(tensors.items())):
        add_tensor(w, name, arr, outtype)
        if progress is not None:
            progress(name, i + 1, total)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def convert_head(folder: str | Path, out: str | Path, *, target: str | Path | None = None, outtype: str = "f16",
                 progress: Progress | None = None, on_choices: Callable[[dict], None] | None = None) -> Path:
    """The whole conversion: read, check (against ``target`` when given), write. Returns the output path.

    ``on_choices(choices)`` receives what was decided on the user's behalf (stored as ``source.choices``)."""
    ckpt = load_checkpoint(folder)
    where = str(ckpt.folder)
    params = params_from_config(ckpt.config, ckpt.tensors, where)
    tensors = to_gguf_names(ckpt.tensors, where)
    check_tensors(params, tensors, where)
    if target is not None:
        config = dict(ckpt.config)
        tok_path = ckpt.folder / "tokenizer.json"
        if tok_path.is_file():
            config["_tokenizer_json"] = json.loads(tok_path.read_text())
        check_target(target, params, config)
    provenance = {
        "source.checkpoint": ckpt.folder.name, "source.format": ckpt.weight_format,
        "source.config": json.dumps(ckpt.config, sort_keys=True),
        "target.name": str(ckpt.config.get("_name_or_path") or ckpt.config.get("base_model") or ""),
        "target.architecture": str(ckpt.config.get("model_type")),
        "source.choices": json.dumps(_choices(ckpt, params, outtype)),
    }
    if on_choices is not None:
        on_choices(json.loads(provenance["source.choices"]))
    log.info("converting %s (%s, %d tensors) to %s as %s", where, ckpt.weight_format, len(tensors), out, outtype)
    return write_head(out, params, tensors, provenance, outtype, progress)


def _choices(ckpt, params: HeadParams, outtype: str) -> dict[str, str]:
    rope = rope_settings(ckpt.config, params.head_dim, allow_scaling=False)
    dtype = ckpt.config.get("torch_dtype") or ckpt.config.get("dtype") or "not stated"
    return {"RoPE": rope.describe(),
            "biases": f"fc {'yes' if params.fc_bias else 'no'}, q/k/v {'yes' if params.qkv_bias else 'no'}",
            "vocabulary": f"{params.vocab_size} tokens (the target's LM head)",
            "dtype": f"matrices {outtype}, norms and biases f32 (checkpoint: {ckpt.weight_format}, "
                     f"config dtype {dtype})"}
