"""The ``eagle2-local`` command line: one module per command group, joined here into one click group.

``common.py`` holds what the commands share (options, loading, one-line errors); ``generate.py``, ``chat.py``,
``serve.py`` (``serve``, ``rpc-server``), ``bench.py`` (``bench``, ``verify-cost``, ``draft-cost``),
``convert.py`` (``convert``, ``layer-draft``) and ``train.py`` (``train``, ``eval-head``) hold the commands. The
installed ``eagle2-local`` script runs :func:`main`; a checkout's top-level ``cli.py`` (``python -m cli``) too.
"""

from __future__ import annotations

import click

from . import bench, chat, convert, generate, serve, train


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="eagle2-local")
def main() -> None:
    """EAGLE-2 speculative decoding for local GGUF models on llama.cpp.

    A draft proposes a dynamic tree of continuations; the target verifies the whole tree in one llama.cpp
    pass and keeps the longest correct path. Output is lossless: identical to plain decoding at temperature 0,
    and distributed exactly like it when sampling.
    """


for command in (generate.generate, chat.chat, bench.bench, bench.verify_cost_cmd, bench.draft_cost_cmd,
                convert.convert, convert.layer_draft, train.train_cmd, train.eval_head, serve.serve,
                serve.rpc_server_cmd):
    main.add_command(command)
