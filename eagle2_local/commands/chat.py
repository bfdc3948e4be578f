"""``eagle2-local chat``: a conversation in the terminal (the loop itself is ``console.run_chat``)."""

from __future__ import annotations

import click

from ..console import run_chat
from .common import (chat_template_option, friendly_errors, load, runtime_options, sampling_options,
                     sampling_params)


@click.command("chat")
@runtime_options
@sampling_options
@click.option("--system", "system_prompt", default=None, help="System message that starts the conversation.")
@chat_template_option()
@friendly_errors
def chat(system_prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, **rt):
    """Talk to the model in the terminal.

    Answers stream as they are accepted; after each, a dim line shows tokens/s and tau. Commands: /reset
    (forget the conversation), /stats (last answer's statistics), /exit. Ctrl-C stops the current answer,
    Ctrl-D exits. Works with piped input too (one message per line).
    """
    llm = load(**rt, seed=seed)
    sampling = sampling_params(temperature, top_k, top_p, min_p, repeat_penalty)
    run_chat(llm, system_prompt, max_tokens or None, sampling, seed)
