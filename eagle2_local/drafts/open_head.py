"""Opening a draft-head GGUF: dispatch on its architecture, check it fits the target, say which target features
it needs, and build its engine.

* ``eagle1`` (EAGLE-1/2 heads, :mod:`eagle2_local.formats.eagle1_format`): exact numpy engine; features are the target's
  post-final-norm hidden states; embedding / LM head dequantized from the target GGUF.
* ``eagle3`` (llama.cpp's native architecture): llama.cpp engine; features are three layers' residual inputs
  (or the final-norm fallback, see :func:`eagle3_llama.feature_source`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..decoding.target import Target
from ..errors import ModelError
from ..formats import gguf_keys as keys
from ..formats.atomic_write import atomic_path
from ..formats.cache_root import cache_root
from ..formats.eagle1_format import ARCH as EAGLE1_ARCH, check_eagle1_fits, params_from_info, read_head
from ..formats.gguf_fields import copy_gguf
from ..formats.gguf_tensors import load_tensor, tensor_index
from ..formats.models import GGUFInfo, read_gguf_info
from ..llamacpp.llama import LlamaModel
from ..llamacpp.settings import ContextSettings
from ..tree.draft_tree import TreeParams
from .base import DraftEngine
from .eagle1_numpy import Eagle1NumpyEngine
from .eagle3_llama import (ARCH as EAGLE3_ARCH, Eagle3Engine, check_eagle3_fits, feature_source, foreign_layer_key,
                           head_target_layers)

log = logging.getLogger(__name__)

HEAD_ARCHS = (EAGLE1_ARCH, EAGLE3_ARCH)


def read_head_info(path: str | os.PathLike) -> GGUFInfo:
    """Parse and check a head file (magic, truncation, known architecture) before anything is loaded."""
    info = read_gguf_info(path)
    if info.architecture not in HEAD_ARCHS:
        raise ModelError(f"{path}: architecture '{info.architecture}' is not a draft head (expected "
                         f"{' or '.join(HEAD_ARCHS)}; convert a head folder with `eagle2-local convert`)")
    if info.architecture == EAGLE3_ARCH and foreign_layer_key(info):
        return read_gguf_info(translated_head(info))
    return info


def translated_head(info: GGUFInfo) -> Path:
    """A copy of an eagle3 head from a newer llama.cpp with its layer key renamed, made once into a cache.

    llama.cpp opens the file by path and reads ``eagle3.target_layers`` itself, so the key cannot be renamed in
    memory; the copy keeps every other key and tensor byte (what ``eagle2-local convert head.gguf`` writes)."""
    key = foreign_layer_key(info)
    stat = info.path.stat()
    cache = cache_root() / "translated-heads"
    out = cache / f"{info.path.stem}-{stat.st_size}-{stat.st_mtime_ns}.gguf"
    if not out.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            copy_gguf(info.path, tmp, {key: keys.EAGLE3_TARGET_LAYERS}, EAGLE3_ARCH)
        log.info("%s stores %s (a newer llama.cpp's name): translated once into %s", info.path.name, key, out)
    return out


def check_head_fits(info: GGUFInfo, target_model: LlamaModel) -> None:
    """IncompatibleDraftError if the head was trained for another model (checked before any context exists)."""
    if info.architecture == EAGLE3_ARCH:
        check_eagle3_fits(info, target_model)
    else:
        check_eagle1_fits(params_from_info(info), target_model.n_embd, target_model.n_vocab, target_model.path.name)


def target_settings_for(info: GGUFInfo, settings: ContextSettings) -> ContextSettings:
    """The target context must expose the features this head reads."""
    if info.architecture == EAGLE3_ARCH and feature_source(info) == "layer_inputs":
        return dataclasses.replace(settings, layer_inputs=head_target_layers(info))
    return dataclasses.replace(settings, embeddings=True)


def open_head(info: GGUFInfo, target: Target, tree_params: TreeParams, *, n_gpu_layers: int | None = None,
              verbose: bool = False, rpc_servers: Sequence[str] = (), **engine_options) -> DraftEngine:
    """The engine for the head, next to ``target`` (whose context was made with :func:`target_settings_for`)."""
    if info.architecture == EAGLE3_ARCH:
        head = LlamaModel(info.path, n_gpu_layers=n_gpu_layers, verbose=verbose, info=info, rpc_servers=rpc_servers)
        try:
            return Eagle3Engine(head, target.ctx, tree_params.top_k, tree_params.depth)
        except Exception:
            head.close()
            raise
    head = read_head(info.path)
    embedding, lm_head = target_matrices(target.model.path, need_embedding=head.own_embedding is None)
    log.info("EAGLE-1/2 head %s on %s (%s embedding)", info.path.name, target.model.path.name,
             "own" if embedding is None else "target's")
    return Eagle1NumpyEngine(head, embedding, lm_head, **engine_options)


def target_matrices(target_path: Path, need_embedding: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """The target's token embedding (if needed) and LM head as float32, dequantized from its GGUF.

    Tied models (SmolLM2) have no ``output.weight``: the embedding is the LM head.
    """
    index = tensor_index(target_path)

    def load(name: str) -> np.ndarray:
        return load_tensor(target_path, index[name])

    if "token_embd.weight" not in index:
        raise ModelError(f"{target_path.name} has no token_embd.weight")
    lm_name = "output.weight" if "output.weight" in index else "token_embd.weight"
    lm_head = load(lm_name)
    embedding = None
    if need_embedding:
        embedding = lm_head if lm_name == "token_embd.weight" else load("token_embd.weight")
    return embedding, lm_head
