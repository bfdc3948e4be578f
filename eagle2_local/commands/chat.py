"""``eagle2-local chat``: a conversation in the terminal (the loop itself is ``console.run_chat``)."""

from __future__ import annotations

import click

from .common import (chat_template_option, friendly_errors, history_options, load, runtime_options, sampling_options,
                     sampling_params)
from .console import run_chat


@click.command("chat")
@runtime_options
@history_options
@sampling_options
@click.option("--system", "system_prompt", default=None, help="System message that starts the conversation.")
@click.option("--no-context-shift", is_flag=True,
              help="When the conversation outgrows --n-ctx, stop with an error instead of dropping the oldest "
                   "turns (the system message is always kept).")
@chat_template_option()
@friendly_errors
def chat(system_prompt, no_context_shift, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed,
         **rt):
    """Talk to the model in the terminal.

    Answers stream as they are accepted; after each, a dim line shows tokens/s and tau. When the conversation
    outgrows the context, the oldest turns are dropped (a dim line says so) and the chat goes on. Commands:
    /reset (forget the conversation), /stats (last answer's figures; /stats json: raw), /exit. Ctrl-C stops the
    current answer, Ctrl-D exits. A pasted block is one message (Enter sends it); \"\"\" begins and ends a message
    of several lines, as does a trailing \\. Line editing and history (kept in the cache folder). Piped input is
    one message; a line holding only /send (or a command) ends a message and starts the next.
    """
    llm = load(**rt, seed=seed)
    sampling = sampling_params(temperature, top_k, top_p, min_p, repeat_penalty)
    run_chat(llm, system_prompt, max_tokens or None, sampling, seed, context_shift=not no_context_shift)
