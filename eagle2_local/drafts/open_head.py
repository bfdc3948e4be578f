"""Opening a draft head GGUF: which target features it needs, and which engine runs it (by GGUF architecture)."""

from __future__ import annotations

import dataclasses
import os

from ..errors import UnsupportedModelError
from ..llama import ContextSettings, LlamaModel
from ..models import GGUFInfo, read_gguf_info
from ..target import Target
from ..tree import TreeParams
from .base import DraftEngine
from .eagle3_llama import ARCH as EAGLE3_ARCH, Eagle3Engine, feature_source, head_target_layers


def read_head_info(path: str | os.PathLike) -> GGUFInfo:
    """Parse and check a head file (magic, truncation, known architecture) before anything is loaded."""
    info = read_gguf_info(path)
    if info.architecture != EAGLE3_ARCH:
        raise UnsupportedModelError(f"{info.path.name} has architecture {info.architecture!r}; "
                                    f"draft heads must be {EAGLE3_ARCH!r} GGUFs (see `eagle2-local convert`)")
    return info


def target_settings_for(info: GGUFInfo, settings: ContextSettings) -> ContextSettings:
    """The target context must expose the features this head reads."""
    if feature_source(info) == "final_norm":
        return dataclasses.replace(settings, embeddings=True)
    return dataclasses.replace(settings, layer_inputs=head_target_layers(info))


def open_head(info: GGUFInfo, target: Target, tree_params: TreeParams, *, n_gpu_layers: int = 0,
              verbose: bool = False) -> DraftEngine:
    """Load the head next to ``target`` (whose context was created with :func:`target_settings_for`)."""
    head = LlamaModel(info.path, n_gpu_layers=n_gpu_layers, verbose=verbose, info=info)
    try:
        return Eagle3Engine(head, target.ctx, tree_params.top_k, tree_params.depth)
    except Exception:
        head.close()
        raise
