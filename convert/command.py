"""The ``convert`` click command, shared by ``eagle2-local convert`` and ``python -m convert``."""

from __future__ import annotations

import click

from eagle2_local.errors import Eagle2Error

from .checkpoint import OUTTYPES, read_config
from .eagle1 import convert_head
from .eagle3 import convert_eagle3, is_eagle3_config


@click.command("convert", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("head_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Where to write the head GGUF.")
@click.option("--target", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The target GGUF the head will run with: refuse the conversion if they do not fit.")
@click.option("--outtype", type=click.Choice(OUTTYPES), default="f16", show_default=True,
              help="Storage type of the matrices (norms and biases always stay f32).")
def convert_command(head_dir: str, out: str, target: str | None, outtype: str) -> None:
    """Convert an EAGLE head folder (config.json + model.safetensors or pytorch_model.bin) to GGUF.

    EAGLE-1/2 heads become eagle2-local's ``eagle1`` GGUF (run in numpy). EAGLE-3 heads (config with
    ``draft_vocab_size``) become llama.cpp's native ``eagle3`` GGUF; they need --target, whose tokenizer the
    head file carries.
    """
    bar = None

    def progress(name: str, done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = click.progressbar(length=total, label="converting", file=click.get_text_stream("stderr"))
            bar.__enter__()
        bar.update(1, name)

    try:
        if is_eagle3_config(read_config(head_dir)):
            if target is None:
                raise click.ClickException("EAGLE-3 heads need --target TARGET.gguf (the head file carries its "
                                           "tokenizer, and layer ids / sizes are checked against it)")
            path = convert_eagle3(head_dir, out, target, outtype=outtype, progress=progress)
        else:
            path = convert_head(head_dir, out, target=target, outtype=outtype, progress=progress)
    except Eagle2Error as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    click.echo(f"wrote {path}")
