"""The serving commands: ``serve`` (the OpenAI-compatible HTTP API) and ``rpc-server`` (this machine's
backend for other processes' ``--rpc``)."""

from __future__ import annotations

import click

from ..tree.sampling import SamplingDefaults
from .common import (chat_template_option, fail, friendly_errors, load, read_chat_template, resolve_hub,
                     runtime_options, sampling_options)


@click.command("serve")
@runtime_options
@sampling_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The default answers only this machine; anything else exposes the model.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0 = any free port.")
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on the API routes (/health and the docs at "
              "/docs stay open); several keys comma-separated, one client each: a client reuses only its own "
              "cached prompt and sees only its own figures in /stats and /health.")
@click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A file of API keys, one a line, added to --api-key's (as llama-server's option; keys in a file "
              "stay out of the process list).")
@click.option("--admin-key", default=None, help="A key that also sees every client's figures in /stats and /health "
              "(and may use the API).")
@click.option("--share-prompt-cache", is_flag=True, help="Let every client reuse the prompt cache another client "
              "left (faster for one team's shared prompts, but a client can then time whether another sent a "
              "prompt). Default: each key, or each address on a server without keys, has its own.")
@click.option("--max-queue", type=click.IntRange(min=0), default=16, show_default=True,
              help="Requests that may wait while one is answered (counted once their body is complete); "
              "beyond that: 503 with Retry-After. 0: none waits, a request is refused while another is answered.")
@click.option("--expose-stats", is_flag=True, help="Give every response all its generation statistics (prompt "
              "tokens reused, prefill time, tau, timings, the tree budget) and /stats the last generation's: "
              "figures that depend on other clients' requests, for a single user. Default: token counts only.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=15.0, show_default=True,
              help="Seconds a connection may take to send a request head, then its body; a silent one is closed "
              "(a slow body gets 408), as is a kept-alive connection idle that long.")
@click.option("--alias", default=None, help="The model name clients see [default: the GGUF file name].")
@chat_template_option()
@friendly_errors
def serve(host, port, api_key, api_key_file, admin_key, share_prompt_cache, max_queue, expose_stats, idle_timeout, alias,
          max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, **rt):
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models;
    OpenAPI docs at /docs).

    One request is answered at a time, clients taking turns; consecutive requests of one client (an API key, or an
    address without keys) reuse their common KV prefix.
    The sampling options are the defaults for fields a request leaves out. Needs `pip install
    "eagle2-local[server]"`.
    """
    read_chat_template(rt["chat_template_file"])  # a bad template is an error before the port is bound
    resolve_hub(rt)  # models by name downloaded before the port is bound
    try:
        from ..server import serve as run_server
    except ImportError as exc:
        fail(f"the server needs its optional packages ({exc.name} is missing): pip install 'eagle2-local[server]'")
    keys = _api_keys(api_key, api_key_file)
    defaults = SamplingDefaults(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                min_p=min_p, repeat_penalty=repeat_penalty, seed=seed)
    run_server(lambda: load(**rt), host=host, port=port, api_key=keys, max_waiting=max_queue, model_name=alias,
               defaults=defaults, expose_stats=expose_stats, idle_timeout_s=idle_timeout, admin_key=admin_key,
               share_prompt_cache=share_prompt_cache,
               say=lambda msg: click.echo(msg, err=True))


def _api_keys(api_key: str | None, api_key_file: str | None) -> tuple[str, ...]:
    """--api-key's comma-separated keys and --api-key-file's lines (blank ones skipped)."""
    from ..server.clients import parse_keys

    keys = parse_keys(api_key)
    if api_key_file is not None:
        try:
            with open(api_key_file, encoding="utf-8") as f:
                keys += tuple(line.strip() for line in f if line.strip())
        except (OSError, UnicodeError) as exc:
            fail(f"--api-key-file: cannot read {api_key_file}: {exc}")
        if not keys:  # an empty file must not leave the server open
            fail(f"--api-key-file: {api_key_file} holds no key")
    return keys


@click.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes an unauthenticated protocol.")
@click.option("--port", type=int, default=50052, show_default=True)
@click.option("--threads", "-t", type=int, default=None, help="CPU threads for the served backend (default: half "
              "the cores).")
@friendly_errors
def rpc_server_cmd(host, port, threads):
    """Serve this machine's CPU backend to other eagle2-local processes (their --rpc HOST:PORT).

    Needs an RPC build of llama-cpp-python (docs/backends.md). Runs until Ctrl-C. One client at a time.
    """
    from ..llamacpp import rpc

    if not rpc.is_loopback(host):
        click.echo(rpc.UNTRUSTED_WARNING, err=True)
    rpc.serve(host, port, threads)
