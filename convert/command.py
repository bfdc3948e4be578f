"""The ``convert`` click command, shared by ``eagle2-local convert`` and ``python -m convert``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from eagle2_local.errors import Eagle2Error

from .checkpoint import OUTTYPES, read_config
from .eagle1 import convert_head
from .eagle3 import convert_eagle3, is_eagle3_config
from .head_config import LAYER_ID_MEANINGS
from .upstream_gguf import translate_upstream_gguf


@click.command("convert", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("head_dir", type=click.Path(exists=True))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Where to write the head GGUF.")
@click.option("--target", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The target GGUF the head will run with: refuse the conversion if they do not fit.")
@click.option("--outtype", type=click.Choice(OUTTYPES), default="f16", show_default=True,
              help="Storage type of the matrices (norms and biases always stay f32).")
@click.option("--layer-ids-mean", type=click.Choice(LAYER_ID_MEANINGS), default=None,
              help="EAGLE-3: read the config's eagle_aux_hidden_state_layer_ids as layer inputs or outputs. "
                   "Default: by where the config keeps them (top level: inputs, as vLLM/speculators; nested "
                   "eagle_config: outputs, as SGLang/SpecForge/ModelOpt).")
@click.option("--rope-theta", type=float, default=None,
              help="EAGLE-3: the RoPE base the head was trained with, when its training code ignored the config's "
                   "(the summary says where the base came from).")
def convert_command(head_dir: str, out: str, target: str | None, outtype: str, layer_ids_mean: str | None,
                    rope_theta: float | None) -> None:
    """Convert an EAGLE head folder (config.json + weights) to GGUF, or translate another llama.cpp's eagle3 GGUF.

    EAGLE-1/2 heads become eagle2-local's ``eagle1`` GGUF (run in numpy). EAGLE-3 heads (config with
    ``draft_vocab_size``) become llama.cpp's native ``eagle3`` GGUF; they need --target, whose tokenizer the
    head file carries. An ``eagle3`` .gguf from a newer llama.cpp converter is rewritten with the keys this
    llama.cpp reads. Weights: model.safetensors, pytorch_model.bin, or their shards with an index .json.
    """
    bar = None

    def progress(name: str, done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = click.progressbar(length=total, label="converting", file=sys.stderr)
            bar.__enter__()
        bar.update(1, name)

    try:
        path = _convert(Path(head_dir), out, target, outtype, progress, layer_ids_mean=layer_ids_mean,
                        rope_theta=rope_theta)
    except Eagle2Error as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    click.echo(f"wrote {path}")


def _convert(head: Path, out: str, target: str | None, outtype: str, progress, **eagle3_options):
    given = [f"--{k.replace('_', '-')}" for k, v in eagle3_options.items() if v is not None]
    eagle3 = head.is_dir() and is_eagle3_config(read_config(head))
    if given and not eagle3:
        raise click.ClickException(f"{', '.join(given)} apply to EAGLE-3 head folders only")
    if head.is_file():
        if head.suffix != ".gguf":
            raise click.ClickException(f"{head} is a file: give the head folder (config.json + weights), or an "
                                       "eagle3 .gguf to translate")
        return translate_upstream_gguf(head, out, on_choices=print_choices)
    if eagle3:
        if target is None:
            raise click.ClickException("EAGLE-3 heads need --target TARGET.gguf (the head file carries its "
                                       "tokenizer, and layer ids / sizes are checked against it)")
        return convert_eagle3(head, out, target, outtype=outtype, progress=progress, on_choices=print_choices,
                              **eagle3_options)
    return convert_head(head, out, target=target, outtype=outtype, progress=progress, on_choices=print_choices)


def print_choices(choices: dict[str, str]) -> None:
    """One summary of what the converter decided on the user's behalf (the GGUF stores the same)."""
    width = max(len(k) for k in choices)
    click.echo("choices made for you (stored in the GGUF):")
    for what, text in choices.items():
        click.echo(f"  {what:<{width}}  {text}")
