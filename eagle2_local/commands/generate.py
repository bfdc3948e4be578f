"""``eagle2-local generate``: one continuation of a prompt, streamed or as JSON."""

from __future__ import annotations

import json
import sys

import click

from ..console import stats_line
from .common import friendly_errors, load, runtime_options, sampling_options, sampling_params


@click.command("generate")
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
    from ..chat import prompt_tokens
    tokens = llm.chat_tokens([{"role": "user", "content": prompt}]) if as_chat else prompt_tokens(llm.model, prompt)
    sampling = sampling_params(temperature, top_k, top_p, min_p, repeat_penalty)
    out_tokens: list[int] = []
    pieces: list[str] = []
    reason = None
    for chunk in llm.stream(tokens, max_tokens or None, sampling, seed=seed):
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
