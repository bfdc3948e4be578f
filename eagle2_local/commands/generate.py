"""``eagle2-local generate``: one continuation of a prompt, streamed or as JSON."""

from __future__ import annotations

import json
import sys

import click

from ..decoding.grammar import Grammar, GrammarError, response_grammar
from ..decoding.grammar_check import MAX_GRAMMAR_BYTES
from ..decoding.grammar_screen import screen_gbnf
from .common import (chat_template_option, fail, friendly_errors, history_options, load, resolve_hub,
                     runtime_options, sampling_options, sampling_params)
from .console import NO_DRAFT_NOTE, stats_line


def read_constraint(grammar_file: str | None, json_schema: str | None) -> Grammar | None:
    """The grammar named by --grammar-file / --json-schema (one at most), checked before anything loads: the
    screens (:mod:`eagle2_local.decoding.grammar_screen`) refuse in one line what would hang or crash llama.cpp."""
    if grammar_file is not None and json_schema is not None:
        fail("give one of --grammar-file and --json-schema")
    grammar = None
    if grammar_file is not None:
        grammar = response_grammar(grammar=read_grammar_file(grammar_file))
    elif json_schema is not None:
        text = json_schema
        if json_schema.startswith("@"):
            with open(json_schema[1:], encoding="utf-8") as f:
                text = f.read()
        grammar = Grammar.from_json_schema(text)
    if grammar is not None:
        screen_gbnf(grammar.gbnf, grammar.root)
    return grammar


def read_grammar_file(path: str) -> str:
    """A GBNF file's text: read no further than the grammar size limit, and UTF-8 (else one line, not a
    traceback)."""
    with open(path, "rb") as f:
        data = f.read(MAX_GRAMMAR_BYTES + 1)
    if len(data) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"{path}: the grammar is larger than the limit of {MAX_GRAMMAR_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GrammarError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


@click.command("generate")
@runtime_options
@history_options
@sampling_options
@click.option("--prompt", "-p", required=True, help="Prompt text (special tokens such as <|im_start|> are parsed).")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap the prompt as one user message in the chat template.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: text, tokens, n_tokens, finish_reason and stats.")
@click.option("--grammar-file", type=click.Path(dir_okay=False), default=None,
              help="Constrain the answer to a GBNF grammar (llama.cpp's format) read from this file.")
@click.option("--json-schema", default=None, metavar="SCHEMA",
              help="Constrain the answer to JSON that follows this JSON schema (inline JSON, or @FILE).")
@chat_template_option(help="With --chat: a Jinja chat template to use instead of the GGUF's (as llama-server's "
                           "option).")
@friendly_errors
def generate(prompt, as_chat, as_json, grammar_file, json_schema, max_tokens, temperature, top_k, top_p, min_p,
             repeat_penalty, seed, **rt):
    """Generate a continuation of PROMPT and print it (streamed) or as JSON."""
    constraint = read_constraint(grammar_file, json_schema)  # refused before the model loads
    if rt["chat_template_file"] is not None and not as_chat:
        fail("--chat-template-file applies to --chat prompts (give --chat)")
    resolve_hub(rt)  # models by name are on disk before anything reads their path
    if constraint is not None:
        check_constraint(constraint, rt["model"], rt["verbose"])
    llm = load(**rt, seed=seed)
    if constraint is None and not llm.speculative and not rt["plain"] and not as_json:
        click.echo(f"note: {NO_DRAFT_NOTE}; running plain decoding", err=True)
    from ..chat.templates import prompt_tokens
    tokens = llm.chat_tokens([{"role": "user", "content": prompt}]) if as_chat else prompt_tokens(llm.model, prompt)
    sampling = sampling_params(temperature, top_k, top_p, min_p, repeat_penalty)
    out_tokens: list[int] = []
    pieces: list[str] = []
    reason = None
    for chunk in llm.stream(tokens, max_tokens or None, sampling, seed=seed, grammar=constraint):
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


def check_constraint(constraint, model: str | None, verbose: bool) -> None:
    """Compile the grammar for the model's vocabulary before anything else loads (a draft, a calibration), so an
    invalid one is one error line and nothing else."""
    from ..formats.models import resolve_model
    from ..llamacpp.llama import LlamaModel

    probe = LlamaModel(resolve_model(model), n_gpu_layers=0, verbose=verbose)
    try:
        constraint.check(probe)
    finally:
        probe.close()
