"""The measuring commands: ``bench`` (plain decoding vs speculation, side by side), ``verify-cost`` (what
verifying an n-node tree costs) and ``draft-cost`` (what a draft level costs against a target token)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .common import (at_least_one, draft_model_option, fail, friendly_errors, head_option, history_options, json_flag_option, load,
                     model_option, n_gpu_layers_option, not_negative, prompt_sets_option, rpc_option, runtime_options,
                     threads_option, tree_top_k_option)
from .console import bench_prompt_line, bench_table, draft_cost_line, verify_cost_table


@click.command("bench")
@runtime_options
@history_options
@prompt_sets_option(help="A .jsonl prompt set or a folder of them (e.g. the six EAGLE sets); repeatable.")
@click.option("--n", "n_prompts", type=int, default=None, help="Use the first N prompts of each set.")
@click.option("--split", type=click.Choice(["all", "tune", "heldout"]), default="all", show_default=True,
              help="Only records whose 'split' field says so (records without one count as tune).")
@click.option("--first-turn", is_flag=True,
              help="Send only each record's first user turn (as bench did before chats ran turn by turn).")
@click.option("--max-tokens", "-n", type=int, default=128, show_default=True, callback=not_negative,
              help="Tokens generated per prompt (per turn in a chat).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy (outputs compared).")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--repeat", type=int, default=1, show_default=True, callback=at_least_one,
              help="Runs per prompt and mode (median kept).")
@click.option("--tie-tolerance", type=float, default=1.0, show_default=True,
              help="Top-2 logit gap below which a T=0 divergence counts as a near-tie, not a mismatch.")
@click.option("--no-chat", is_flag=True, help="Do not wrap prompts in the model's chat template.")
@click.option("--prefill-once", is_flag=True,
              help="Evaluate each record's first prompt once and restore its KV cells before every run (for long "
                   "prompts: decoding is timed as before, but prefill and end-to-end figures cover only the last "
                   "chunk each run re-evaluates).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the full report here.")
@click.option("--llama-cpp-bin", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder with llama.cpp's llama-completion and llama-speculative-simple: time them too.")
@click.option("--spec-draft-n-max", type=int, default=4, show_default=True,
              help="Draft length for llama.cpp's draft-simple (with --llama-cpp-bin).")
@click.option("--llama-cpp-ngram", "ngram_modes", multiple=True,
              type=click.Choice(["all", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]),
              help="llama.cpp's n-gram drafting modes to time too (with --llama-cpp-bin; repeatable; 'all'), each "
                   "at the settings llama.cpp's docs show.")
@click.option("--note", default=None, help="A remark stored in the JSON report (e.g. what else loaded the machine).")
@friendly_errors
def bench(prompt_specs, n_prompts, split, first_turn, max_tokens, temperature, top_p, top_k, seed, repeat, tie_tolerance, no_chat,
          prefill_once, json_out, llama_cpp_bin, spec_draft_n_max, ngram_modes, note, **rt):
    """Plain decoding vs eagle2-local, side by side in one run, alternating per prompt.

    Records with several turns run as chats: each turn follows the mode's own earlier answers, and the
    record's tokens/s, tau and identical-output check cover every turn. A record's "schema" (JSON schema) or
    "grammar" (GBNF) constrains its answers in both modes.

    Both use the same llama.cpp context (build, model, threads, settings). Reports per set: tokens/s of each,
    speedup (median of per-prompt ratios), tau, acceptance per depth, draft/verify/other time, tree size,
    and at temperature 0 whether outputs were identical (divergences at near-ties are counted apart).
    """
    from ..bench.harness import Bench
    from ..bench.llamacpp_bench import LlamaCppBinaries
    from ..bench.prompt_sets import load_prompt_sets
    from ..formats.models import file_sha256
    from ..llamacpp.binaries import NGRAM_MODES
    from ..tree.sampling import SamplingParams

    sets = load_prompt_sets(list(prompt_specs), n_prompts, split)
    if rt["plain"]:
        fail("bench runs plain decoding beside speculation by itself: drop --plain")
    if llama_cpp_bin and prefill_once:
        fail("--prefill-once skips the prompt's evaluation that llama.cpp's tools are compared with end to end: "
             "drop one of --prefill-once and --llama-cpp-bin")
    llm = load(**rt, seed=seed)
    if not llm.speculative and not any(ps.grammar(i) is not None for ps in sets for i in range(len(ps.prompts))):
        fail("bench compares against a draft: give --head, --draft-model or --draft lookup (the default model "
             "uses its shipped head when there is one), or prompts with a schema or grammar (forced tokens)")
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    b = Bench(llm, sampling=sampling, max_tokens=max_tokens, repeat=repeat, tie_tolerance=tie_tolerance,
              seed=seed, chat=not no_chat, prefill_once=prefill_once)
    ngram = tuple(NGRAM_MODES) if "all" in ngram_modes else tuple(dict.fromkeys(ngram_modes))
    if ngram and not llama_cpp_bin:
        fail("--llama-cpp-ngram runs llama.cpp's own binaries: give --llama-cpp-bin too")
    if llama_cpp_bin:
        if llm.draft_model is None and not ngram:
            fail("--llama-cpp-bin compares against llama.cpp's draft-simple (needs --draft-model) or its n-gram "
                 "drafting (give --llama-cpp-ngram)")
        b.binaries = LlamaCppBinaries(Path(llama_cpp_bin), llm.model_path,
                                llm.draft_model.path if llm.draft_model is not None else None,
                                llm.settings.threads(), rt["n_ctx"], spec_draft_n_max, ngram)
    total = sum(len(s.prompts) for s in sets)
    done = 0
    for ps in sets:
        for i, text in enumerate(ps.prompts):
            r = b.run_prompt(ps.name, i, text if first_turn else ps.turns(i), split=ps.split(i),
                             grammar=ps.grammar(i))
            done += 1
            click.echo(bench_prompt_line(done, total, ps.name, i, r, tie_tolerance), err=True)
    settings = {"command": "eagle2-local " + " ".join(sys.argv[1:]), "model": str(llm.model_path),
                "model_sha256": file_sha256(llm.model_path), "engine": llm.engine_name,
                "draft_sha256": _draft_sha256(llm),
                "n_ctx": rt["n_ctx"], "threads": llm.settings.threads(), "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "top_k": top_k, "repeat": repeat,
                "split": split, "turns": "first" if first_turn else "all",
                "tree": {"total_tokens": llm.tree_params.total_tokens, "depth": llm.tree_params.depth,
                         "top_k": rt["tree_top_k"], "budget": llm.budget_mode, "engine": llm.engine_name},
                "tie_tolerance": tie_tolerance, "chat_template": not no_chat, "prefill_once": prefill_once,
                "llama_cpp_bin": llama_cpp_bin, "spec_draft_n_max": spec_draft_n_max if llama_cpp_bin else None,
                "llama_cpp_ngram": {m: NGRAM_MODES[m] for m in ngram},
                "history": None if llm.history is None else {
                    "records": len(llm.history), "tokens": llm.history.n_tokens,
                    "drafted": llm.history.drafted, "accepted": llm.history.accepted}}
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


def _draft_sha256(llm) -> str | None:
    """Hash of the draft's weights file (draft model or head), so reports name exactly what drafted."""
    from ..formats.models import file_sha256
    path = llm.draft_weights
    return file_sha256(path) if path is not None else None


@click.command("verify-cost")
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
    from ..decoding.target import Target
    from ..formats.models import resolve_model
    from ..llamacpp.llama import MAX_SEQ, LlamaModel
    from ..llamacpp.rpc import parse_servers
    from ..llamacpp.settings import ContextSettings
    from ..measure.microbench import verify_cost

    ns = _tree_sizes(sizes)
    path = resolve_model(model)
    loaded = LlamaModel(path, n_gpu_layers=n_gpu_layers, rpc_servers=parse_servers(rpc))
    chain = loaded.recurrent or loaded.hybrid  # verifies chains, each taken back to its root by n_rs_seq
    grows = len(ns) * (repeats + 1) if chain else 0  # a chain's root stays: the context grows a token a timing
    target = Target(loaded, ContextSettings(n_ctx=max(512, context_tokens + max(ns) + 8 + grows),
                                            n_batch=max(64, max(ns)), n_seq_max=1 if chain else min(MAX_SEQ, max(ns) + 2),
                                            n_threads=threads, n_rs_seq=max(ns) - 1 if chain else 0))
    if chain and target.max_tree_nodes < max(ns):
        fail(f"llama.cpp cannot take back a '{loaded.architecture}' model's state (n_rs_seq "
             f"{target.ctx.n_rs_seq}): it decodes plain only, no chain to time")
    cost = verify_cost(target, ns, context_tokens, repeats)
    one = cost.get(1) or next(iter(cost.values()))
    if as_json:
        click.echo(json.dumps({"command": "eagle2-local " + " ".join(sys.argv[1:]), "model": str(path),
                               "threads": target.ctx.settings.threads(), "memory": loaded.memory_kind,
                               "shape": "chain" if chain else "tree",
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


@click.command("draft-cost")
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
    from ..api import Eagle2
    from ..bench.prompt_sets import load_prompt_sets
    from ..measure.microbench import DraftTimes, drafting_profile

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
