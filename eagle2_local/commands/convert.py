"""The commands that write draft files: ``convert`` (published heads to GGUF; the converter package's own
command) and ``layer-draft`` (a model cut to its first blocks)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import fail, friendly_errors


@click.command("layer-draft")
@click.argument("model", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Where to write the draft GGUF.")
@click.option("--layers", type=int, required=True, help="How many of the model's first blocks to keep.")
@friendly_errors
def layer_draft(model, out, layers):
    """Make a same-vocabulary draft model from MODEL by keeping its first N blocks (early exit)."""
    from ..formats.layer_draft import write_truncated
    from ..formats.models import read_gguf_info

    read_gguf_info(model)  # clear errors for non-GGUF or truncated input
    if Path(out).exists():
        fail(f"{out} exists; not overwriting")
    click.echo(f"wrote {write_truncated(model, out, layers)}")


def _convert_command() -> click.Command:
    """``eagle2-local convert``: the converter package's own click command (also ``python -m convert`` from a
    checkout, ``python -m eagle2_local.convert`` once installed: setup.py maps convert/ under the package; a
    checkout used without installing has only the top-level ``convert``)."""
    try:
        from ..convert.command import convert_command
    except ModuleNotFoundError as exc:
        if exc.name != "eagle2_local.convert":
            raise
        from convert.command import convert_command
    return convert_command


convert = _convert_command()
