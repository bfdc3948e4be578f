"""Held-out evaluation of a trained head per prompt category, without the runtime: a quick τ estimate.

For each prompt the target answers greedily (through llama.cpp, recording its features); the head then drafts
a greedy *chain* at every answer position, teacher-forced, and we count how many drafted tokens the target
would accept (:func:`loop.chain_acceptance`). That is a lower bound on what a tree of the same depth gets
(a tree also tries the head's runner-up tokens), measured on the target's own text as at inference. The
runtime's ``bench`` measures the real τ; this one needs only the HF folder and torch, e.g. during training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..chat.templates import prompt_tokens, render_for_model
from ..llamacpp.llama import LlamaModel
from .features import N_BATCH, FeatureExtractor, FeatureSet
from .head import Eagle3Head, HeadConfig
from .loop import chain_acceptance
from .target_weights import read_target_weights


def load_head(folder: Path, target: Path) -> tuple[Eagle3Head, tuple[int, ...]]:
    """A head from an HF EAGLE-3 folder written by :func:`export.export_folder` (embedding from the target)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    fields = HeadConfig.__dataclass_fields__
    head_cfg = HeadConfig(**{k: cfg[k] for k in fields if k in cfg})
    tw = read_target_weights(target)
    head = Eagle3Head(head_cfg, torch.from_numpy(tw.embedding), tensors["d2t"])
    head.load_state_dict(tensors)
    return head, tuple(cfg["eagle_aux_hidden_state_layer_ids"])


def prompt_set(path: Path) -> list[str]:
    """First turns of a prompt file (EAGLE's ``turns`` / ``prompt`` / ``instruction`` JSONL records)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.append(rec["turns"][0] if "turns" in rec else rec.get("prompt") or rec.get("instruction") or
                       rec.get("text"))
    return out


def answer_rows(model: LlamaModel, layers: tuple[int, ...], prompts: list[str], max_new: int,
                n_threads: int | None, n_parallel: int = 16) -> tuple[FeatureSet, np.ndarray]:
    """The target's greedy answers to ``prompts`` as feature rows, and each answer's root row (last prompt row).

    Up to ``n_parallel`` prompts are answered at once (one KV sequence each): ~1.3x faster on 2 CPU cores,
    with the same answers as one at a time."""
    prompts_ids = [prompt_tokens(model, render_for_model(model, [{"role": "user", "content": p}])) for p in prompts]
    max_len = max(len(t) for t in prompts_ids) + max_new + 1
    ex = FeatureExtractor(model, layers, top_k=1, max_len=max_len, n_batch=N_BATCH, n_threads=n_threads,
                          n_parallel=max(1, min(n_parallel, len(prompts))))
    try:
        docs = list(ex.generate_many(prompts_ids, max_new))
    finally:
        ex.close()
    rows = FeatureSet(np.concatenate([d.tokens for d in docs]), np.concatenate([d.feats for d in docs]),
                      np.concatenate([d.top_ids for d in docs]), np.concatenate([d.top_logp for d in docs]),
                      np.array([len(d.tokens) for d in docs], np.int32))
    return rows, np.array([len(t) - 1 for t in prompts_ids])


def evaluate_sets(target: Path, folder: Path, prompt_files: list[Path], n_prompts: int, max_new: int = 128,
                  depth: int = 6, n_threads: int | None = None, n_parallel: int = 16,
                  rpc_servers: tuple[str, ...] = ()) -> dict[str, float]:
    """Chain-τ estimate (depth ``depth``) on the greedy answers to each prompt file, keyed by the file's stem.
    ``rpc_servers``: llama.cpp RPC servers that hold the target's layers."""
    head, layers = load_head(folder, target)
    model = LlamaModel(target, rpc_servers=rpc_servers)
    result = {}
    try:
        for path in prompt_files:
            rows, roots = answer_rows(model, layers, prompt_set(path)[:n_prompts], max_new, n_threads,
                                       n_parallel)
            result[path.stem] = round(chain_acceptance(head, rows, depth, count_from=roots), 3)
    finally:
        model.close()
    return result
