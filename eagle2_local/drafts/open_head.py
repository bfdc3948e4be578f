"""Open a draft-head GGUF for a target: dispatch on the head's architecture, check that it fits the target."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from ..errors import Eagle2Error, ModelError
from ..gguf_tensors import load_tensor, tensor_index
from ..head_format import ARCH as EAGLE1_ARCH, check_head_fits, head_architecture, read_head
from ..llama import LlamaModel
from .base import DraftEngine
from .eagle1_numpy import Eagle1NumpyEngine

log = logging.getLogger(__name__)


def open_head(path: str | os.PathLike, target_model: LlamaModel, **engine_options) -> DraftEngine:
    """The draft engine for the head at ``path``; IncompatibleDraftError if it was trained for another model."""
    arch = head_architecture(path)
    if arch == "eagle3":
        raise Eagle2Error("eagle3 heads are not supported yet")
    if arch != EAGLE1_ARCH:
        raise ModelError(f"{path}: architecture '{arch}' is not a draft head (expected '{EAGLE1_ARCH}' or 'eagle3'; "
                         "convert a head folder with `eagle2-local convert`)")
    head = read_head(path)
    check_head_fits(head.params, target_model.n_embd, target_model.n_vocab, target_model.path.name)
    embedding, lm_head = target_matrices(target_model.path, need_embedding=head.own_embedding is None)
    log.info("EAGLE-1/2 head %s on %s (%s embedding)", Path(path).name, target_model.path.name,
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
