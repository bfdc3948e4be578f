"""Reading what a head's ``config.json`` means, where publishers spell the same thing differently.

Two questions have more than one published answer:

* **RoPE.** transformers < 5 writes ``rope_theta`` (and ``rope_scaling`` for long-context targets); transformers
  >= 5 writes ``rope_parameters: {rope_theta, rope_type, ...}``. Scaling of type ``llama3`` (Llama 3.1 / 3.3
  heads) and ``linear`` become llama.cpp frequency factors (the ``rope_freqs.weight`` tensor its eagle3 graph
  reads); any other scaling is refused, because the head would see other positions than it was trained on.
* **Feature layers** (EAGLE-3). ``eagle_aux_hidden_state_layer_ids`` exists in two conventions:

  - at the top level (vllm-project/speculators; our own training export): id *i* is the residual stream
    *entering* layer *i*, as vLLM captures it;
  - nested in ``eagle_config`` (SpecForge / SGLang exports, NVIDIA ModelOpt): id *i* is the *output* of layer
    *i*, i.e. the input of layer *i + 1* (SGLang adds 1 when it reads them).

  Without ids, EAGLE-3's reference choice applies: inputs of layers 2, n/2 and n-3. llama.cpp's eagle3 head
  (``eagle3.target_layers``) reads layer *inputs*, so output ids are shifted by one; the output of the target's
  last layer is not exposed as any layer's input and is refused. ``--layer-ids-mean`` overrides the convention
  for a config that keeps its ids in the other place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from eagle2_local.errors import ModelError

LAYER_ID_MEANINGS = ("input", "output")
_IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class RopeSettings:
    """RoPE base and (optional) per-dimension frequency divisors, with where they came from."""

    theta: float
    theta_source: str
    scaling: dict | None
    freq_factors: np.ndarray | None  # llama.cpp divides each rotation frequency by its factor

    def describe(self) -> str:
        base = f"base {self.theta:g} ({self.theta_source})"
        if self.scaling is None:
            return f"{base}, no scaling"
        kind = self.scaling.get("rope_type") or self.scaling.get("type")
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.scaling.items()) if k not in ("rope_type", "type",
                                                                                         "rope_theta"))
        return f"{base}, {kind} scaling ({args}) stored as rope_freqs.weight"


def rope_settings(cfg: dict, head_dim: int, allow_scaling: bool = True, theta: float | None = None) -> RopeSettings:
    """The RoPE the head was trained with; ModelError for a scaling llama.cpp's graph cannot reproduce.

    ``theta`` (``--rope-theta``) overrides the config's base, for training code that ignored it."""
    if theta is not None:
        cfg = {k: v for k, v in cfg.items() if k != "rope_theta"}
        cfg["rope_parameters"] = {k: v for k, v in (cfg.get("rope_parameters") or {}).items() if k != "rope_theta"}
        cfg["rope_theta"], cfg["_rope_source"] = float(theta), "--rope-theta"
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ModelError(f"rope_parameters must be an object, got {params!r}")
    candidates = [(k, float(v)) for k, v in (("rope_theta", cfg.get("rope_theta")),
                                             ("rope_parameters.rope_theta", params.get("rope_theta")))
                  if v is not None]
    if len({v for _, v in candidates}) > 1:
        raise ModelError(f"config.json names two RoPE bases: {dict(candidates)}")
    source, theta = candidates[0] if candidates else ("default: the config names none", 10000.0)
    source = cfg.get("_rope_source", source)
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = params
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if scaling is None or kind == "default":
        return RopeSettings(theta, source, None, None)
    if not allow_scaling:
        raise ModelError(f"rope_scaling {scaling}: this head format runs plain RoPE; refusing rather than drafting "
                         "with positions the head was not trained on")
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    try:
        if kind == "llama3":
            factors = _llama3_factors(inv_freq, scaling)
        elif kind == "linear":
            factors = np.full(inv_freq.shape, float(scaling["factor"]))
        else:
            raise ModelError(f"rope_scaling type {kind!r}: llama.cpp's eagle3 graph here takes frequency factors "
                             "only (llama3, linear); refusing rather than drafting with other positions")
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelError(f"rope_scaling {scaling} lacks or mangles a field: {exc}") from None
    return RopeSettings(theta, source, dict(scaling), factors.astype(np.float32))


def _llama3_factors(inv_freq: np.ndarray, s: dict) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling as divisors: long wavelengths / factor, short ones kept, a
    smooth blend between."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, blended))


@dataclass(frozen=True)
class FeatureLayers:
    """Which target layers' residual inputs feed the head, and why."""

    target_layers: list[int]  # layer *inputs*, what llama.cpp's eagle3.target_layers means
    config_ids: list[int] | None  # as written in config.json (None: the default applied)
    source: str  # the config key, or "default"
    meaning: str  # "input" | "output": how config_ids were read

    def describe(self) -> str:
        if self.config_ids is None:
            return f"inputs of target layers {self.target_layers} (EAGLE-3's default 2, n/2, n-3; config names none)"
        how = ("read as layer inputs" if self.meaning == "input" else "read as layer outputs, so the inputs of "
               "the next layers")
        return f"inputs of target layers {self.target_layers} ({self.source} = {self.config_ids}, {how})"


def feature_layers(config: dict, n_target_layers: int, override: str | None = None) -> FeatureLayers:
    """The target layers an EAGLE-3 head reads, from whichever convention its config uses (module docstring)."""
    if override is not None and override not in LAYER_ID_MEANINGS:
        raise ModelError(f"layer ids mean {override!r}? choose one of {', '.join(LAYER_ID_MEANINGS)}")
    top = config.get(_IDS_KEY)
    if top is None:
        top = (config.get("transformer_layer_config") or {}).get(_IDS_KEY)
    eagle_config = config.get("eagle_config") or {}
    nested = eagle_config.get(_IDS_KEY) if isinstance(eagle_config, dict) else None
    found = [FeatureLayers(_shift(ids, override or default), list(ids), key, override or default)
             for ids, key, default in ((top, _IDS_KEY, "input"), (nested, f"eagle_config.{_IDS_KEY}", "output"))
             if ids is not None and _check_ids(ids, key)]
    if len(found) == 2 and found[0].target_layers != found[1].target_layers:
        raise ModelError(f"config.json names two different feature layer sets: {found[0].describe()} vs "
                         f"{found[1].describe()}")
    if found:
        choice = found[-1]
    else:
        n = n_target_layers
        choice = FeatureLayers([2, n // 2, n - 3], None, "default", "input")
    for layer, shown in zip(choice.target_layers, choice.config_ids or choice.target_layers):
        if layer == n_target_layers:
            raise ModelError(f"feature layer id {shown} ({choice.source}) means the output of the target's last "
                             f"layer; this llama.cpp exposes layer inputs only, so the head cannot be fed")
        if not 0 <= layer < n_target_layers:
            raise ModelError(f"the head reads target layers {choice.target_layers} ({choice.source}, read as layer "
                             f"{choice.meaning}s); the target has {n_target_layers}")
    return choice


def _check_ids(ids, key: str) -> bool:
    if not isinstance(ids, list) or len(ids) != 3 or not all(isinstance(i, int) for i in ids):
        raise ModelError(f"{key} must list 3 layer ids, got {ids!r}")
    return True


def _shift(ids: list[int], meaning: str) -> list[int]:
    return [i + 1 for i in ids] if meaning == "output" else list(ids)
