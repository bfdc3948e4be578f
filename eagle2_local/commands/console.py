"""Terminal presentation for the command line: the interactive chat loop, the statistics line after an answer,
the tables of ``bench`` and ``verify-cost``, and the self-updating progress line of long jobs (training).

The click layer (the repository's cli.py) declares the commands; what they show on the terminal lives here, in
the package, so it can be tested and reused without click's command machinery.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from typing import Iterator

import click

from ..bench.results import PROJECTION_STEPS_MS, PromptResult, projected_speedup
from ..chat.conversation import Conversation
from ..errors import ContextFullError
from ..measure.machine_load import describe
from .chat_input import piped_messages, terminal_messages

# what chat and generate print when a model runs without a draft
NO_DRAFT_NOTE = "no draft for this model (--draft lookup, --head HEAD.gguf or --draft-model DRAFT.gguf)"


def stats_line(stats: dict) -> str:
    """The one line after an answer: tokens/s, and for speculation tau, passes, the budget's tree size and the
    host's own time per round (outside llama.cpp)."""
    line = f"{stats['n_tokens']} tokens, {stats['tokens_per_s']:.1f} tok/s"
    if stats["engine"] != "plain":
        line += f", tau {stats['tau']:.2f} ({stats['target_passes']} target passes)"
        by_source = stats.get("accepted_by_source") or {}
        if set(by_source) - {"model"}:
            line += f", {by_source.get('lookup', 0) + by_source.get('both', 0)} draft tokens from lookups"
        if stats.get("budget"):
            line += f", tree {stats['mean_tree_size']:.1f} nodes, {stats['plain_steps']} plain steps"
        if stats.get("rounds"):
            line += f", host {stats['host_ms_per_round']:.2f} ms/round"
    return line


@contextlib.contextmanager
def ctrl_c_stops() -> Iterator[threading.Event]:
    """While answering, Ctrl-C only raises a flag that the loop checks between chunks.

    A KeyboardInterrupt raised at an arbitrary bytecode could land between a llama.cpp call and the Python
    bookkeeping of the KV cache; stopping at chunk boundaries keeps target and draft consistent.
    """
    flag = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def stats_table(stats: dict) -> list[str]:
    """``/stats`` for a person: the last answer's speed, tau, tree sizes, accepted draft tokens by source, host
    time per round and the share of plain steps (``/stats json`` prints the raw figures)."""
    rows = [("tokens", f"{stats['n_tokens']} in {stats['total_s']:.2f} s ({stats['tokens_per_s']:.1f} tok/s)"),
            ("prompt", f"{stats['prompt_tokens']} tokens, {stats['prompt_tokens_reused']} reused from the cache, "
                       f"prefill {stats['prefill_s']:.2f} s"),
            ("draft", stats["engine"])]
    if stats["engine"] != "plain":
        rounds = stats["target_passes"]
        plain_share = stats["plain_steps"] / rounds if rounds else 0.0
        by_source = stats.get("accepted_by_source") or {}
        rows += [("tau", f"{stats['tau']:.2f} tokens per target pass ({rounds} passes)"),
                 ("tree", f"{stats['mean_tree_size']:.1f} nodes on average, plain steps {stats['plain_steps']} "
                          f"({plain_share:.0%} of passes)"),
                 ("accepted", ", ".join(f"{k} {v}" for k, v in sorted(by_source.items())) or "none"),
                 ("host", f"{stats.get('host_ms_per_round', 0.0):.2f} ms a round outside llama.cpp")]
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {value}" for name, value in rows]


def run_chat(llm, system_prompt, max_tokens, sampling, seed, context_shift: bool = True) -> None:
    """The read-answer loop. The KV cache is kept between turns: only the new turn is prefilled; when the next
    prompt would not fit, the oldest turns are dropped (``context_shift``) and a dim line says so."""
    interactive = sys.stdin.isatty()
    dim = (lambda s: click.style(s, dim=True)) if sys.stdout.isatty() else (lambda s: s)
    chat = Conversation(llm, system_prompt, context_shift)
    if interactive:
        click.echo(f"eagle2-local chat: {llm.model_path.name}, draft: {llm.engine_name}")
        click.echo("/reset forgets the conversation, /stats shows the last answer's figures (/stats json: raw), "
                   "/exit or Ctrl-D quits, Ctrl-C stops an answer.")
        click.echo('Paste a block and press Enter to send it whole; or type """ to begin and end a message of '
                   "several lines, or end a line with \\ to go on.")
    if not llm.speculative:
        sys.stdout.flush()
        click.echo(dim(f"note: {NO_DRAFT_NOTE}; chatting with plain decoding"), err=True)
    messages = terminal_messages() if interactive else piped_messages(sys.stdin)
    with contextlib.closing(messages):  # the terminal's history is saved however the chat ends
        for line in messages:
            if line in ("/exit", "/quit"):
                break
            _turn(chat, llm, line, max_tokens, sampling, seed, dim)


def _turn(chat: Conversation, llm, line: str, max_tokens, sampling, seed, dim) -> None:
    """One message: a chat command, or a question answered with its stats line after it."""
    if line == "/reset":
        chat.reset()
        click.echo(dim("conversation reset"))
    elif line in ("/stats", "/stats json"):
        stats = llm.stats()
        click.echo(json.dumps(stats, indent=2) if line.endswith("json") else "\n".join(stats_table(stats)))
    elif _answer(chat, line, max_tokens, sampling, seed, dim):
        click.echo()
        click.echo(dim(stats_line(llm.stats())))


def _answer(chat: Conversation, line: str, max_tokens, sampling, seed, dim) -> bool:
    """Stream one answer to the terminal; False when it could not start (the question is taken back)."""
    answer = ""
    try:
        with ctrl_c_stops() as interrupted:
            stream = chat.ask(line, max_tokens, sampling, seed)
            if chat.dropped:
                click.echo(dim(f"[context full: the {chat.dropped} oldest messages were dropped; "
                               f"--no-context-shift keeps them]"))
            for chunk in stream:
                click.echo(chunk.text, nl=False)
                sys.stdout.flush()
                answer += chunk.text
                if interrupted.is_set():
                    stream.close()  # runs the generator's cleanup: KV cache trimmed to what was shown
                    click.echo(dim(" [stopped]"), nl=False)
                    break
    except ContextFullError as exc:
        chat.take_back()
        hint = "Type /reset to start a new conversation." if not chat.context_shift else ""
        click.echo(f"\nerror: {exc}. {hint}".rstrip(), err=True)
        return False
    chat.answered(answer)
    return True


def bench_prompt_line(done: int, total: int, set_name: str, index: int, result: PromptResult,
                      tie_tolerance: float) -> str:
    """Progress of ``bench`` after one prompt; the mark says = identical, ~ near-tie divergence, ! mismatch."""
    r = result
    mark = "=" if r.identical else ("~" if (r.divergence_gap or 0) < tie_tolerance else "!")
    turns = f" ({r.turns} turns)" if r.turns > 1 else ""
    return (f"[{done}/{total}] {set_name}#{index}{turns}: plain {r.plain.tokens_per_s:.1f} tok/s, "
            f"eagle {r.eagle.tokens_per_s:.1f} tok/s (x{r.speedup:.2f}, tau {r.eagle.tau:.2f}) {mark}")


def bench_table(report: dict) -> list[str]:
    """The per-set summary table of a ``bench`` report (and llama.cpp's tools' figures when timed)."""
    lines = [f"{'set':<12} {'plain tok/s':>11} {'eagle tok/s':>11} {'speedup':>8} {'tau':>6} {'same':>6} "
             f"{'ties':>5} {'tree':>5} {'host ms/round':>13}"]
    for name, s in report["sets"].items():
        same = "-" if s["identical_outputs"] is None else f"{s['identical_outputs']}/{s['n_prompts']}"
        ties = "-" if s["near_tie_divergences"] is None else str(s["near_tie_divergences"])
        lines.append(f"{name:<12} {s['tokens_per_s_plain']:>11.1f} {s['tokens_per_s_eagle']:>11.1f} "
                     f"{s['speedup']:>8.2f} {s['tau']:>6.2f} {same:>6} {ties:>5} {s['mean_tree_size']:>5.1f} "
                     f"{_host_cell(s.get('host_eagle')):>13}")
        by_source = s.get("accepted_by_source") or {}
        if set(by_source) - {"model"}:
            lines.append(f"{'':<12} accepted draft tokens by source: "
                         + ", ".join(f"{k} {v}" for k, v in sorted(by_source.items())))
        if "llama_cpp" in s:
            lines += _binaries_lines(s)
    return lines + machine_load_lines(report) + projection_lines(report)


def machine_load_lines(report: dict) -> list[str]:
    """How busy the machine was (a busy machine moves both modes' timings): the load average against the run's
    own threads, and the CPU time a VM's host took; empty for reports without these readings."""
    machine = report.get("machine", {})
    text = describe(machine.get("load_1min_median"), machine.get("steal_median"), report["settings"].get("threads"))
    return [f"machine: {text}"] if text else []


def _binaries_lines(s: dict) -> list[str]:
    """A set's llama.cpp tool figures: plain, draft-simple, each n-gram mode (speed-ups over llama-completion,
    decode-only and end-to-end) and eagle2-local against the best of them."""
    t = s["llama_cpp"]
    line = (f"{'':<12} llama.cpp: completion {t['tokens_per_s_completion']:.1f} tok/s "
            f"(end to end {t['tokens_per_s_e2e_completion']:.1f})")
    if "tokens_per_s_draft_simple" in t:
        line += (f", draft-simple {t['tokens_per_s_draft_simple']:.1f} tok/s "
                 f"(accept {t['draft_simple_accept_rate']:.0%})")
    lines = [line]
    for mode, m in t.get("ngram", {}).items():
        lines.append(f"{'':<12}   {mode}: {m['tokens_per_s']:.1f} tok/s, x{m['speedup']:.2f} "
                     f"(end to end x{m['speedup_e2e']:.2f}), accept {m['accept_rate']:.0%}")
    if "best_ngram" in t:
        lines.append(f"{'':<12} eagle2-local x{t['speedup_eagle_vs_best_ngram']:.2f} against {t['best_ngram']}, "
                     f"x{s['speedup_e2e']:.2f} end to end against plain")
    return lines


def projection_lines(report: dict) -> list[str]:
    """A projection, not a measurement: the speed-up each set's tau and measured host time per round would
    allow on a device where a tree verify costs one target step and drafting is free (see
    :func:`~eagle2_local.bench.results.projected_speedup`), at a few step times. Shows what the host's own work costs
    where llama.cpp is fast; empty for reports without host figures."""
    rows = [(name, s) for name, s in report["sets"].items() if s.get("host_eagle") and s.get("host_plain")]
    if not rows:
        return []
    steps = "/".join(f"{t:g}" for t in PROJECTION_STEPS_MS)
    lines = [f"projection from the measured host time (upper bound: tree verify = one target step, drafting "
             f"free), speed-up at a target step of {steps} ms:"]
    for name, s in rows:
        host = s["host_eagle"]["host_draft_ms_per_round"] + s["host_eagle"]["host_verify_ms_per_round"]
        plain = s["host_plain"]["host_draft_ms_per_round"] + s["host_plain"]["host_verify_ms_per_round"]
        cells = "/".join(f"{projected_speedup(s['tau'], host, t, plain):.2f}" for t in PROJECTION_STEPS_MS)
        lines.append(f"{name:<12} tau {s['tau']:.2f}, host {host:.2f} ms/round: {cells}")
    return lines


def _host_cell(host: dict | None) -> str:
    """A set's host time per round (draft + verify side) for the bench table; "-" in reports made before it."""
    if not host:
        return "-"
    return f"{host['host_draft_ms_per_round']:.2f}+{host['host_verify_ms_per_round']:.2f}"


def verify_cost_table(model_name: str, threads: int, context_tokens: int, cost: dict[int, float]) -> list[str]:
    """``verify-cost``'s table: milliseconds per tree size and the multiple of one single-token decode."""
    one = cost.get(1) or next(iter(cost.values()))
    lines = [f"{model_name}, {threads} threads, {context_tokens} tokens of context",
             f"{'nodes':>6} {'ms':>9} {'x one token':>12}"]
    lines += [f"{n:>6} {c * 1e3:>9.2f} {c / one:>12.2f}" for n, c in cost.items()]
    return lines


def draft_cost_line(res: dict) -> str:
    """``draft-cost``'s summary: what one draft level costs next to one target token."""
    return (f"{res['engine']}: catch-up {res['catch_up_ms']:.2f} ms, one level of {res['width']} nodes "
            f"{res['level_ms']:.2f} ms; one target token {res['target_token_ms']:.2f} ms "
            f"(level = {res['level_over_target_token']:.3f} x target token)")


class ProgressLine:
    """One self-updating terminal line per phase: done/total, rate and ETA."""

    def __init__(self) -> None:
        self._clock = time.perf_counter
        self._phase, self._t0, self._n0 = None, 0.0, 0

    def say(self, message: str) -> None:
        self.done()
        click.echo(message, err=True)

    def count(self, phase: str, n: int, total: int) -> None:
        if phase != self._phase:
            self.done()
            self._phase, self._t0, self._n0 = phase, self._clock(), n
        rate = (n - self._n0) / max(self._clock() - self._t0, 1e-9)
        eta = (total - n) / rate if rate > 0 else float("inf")
        self._line(f"{phase}: {_bar(n / max(total, 1))} {n:,}/{total:,} tokens  {rate:,.0f} tok/s  ETA {_hms(eta)}")

    def train(self, p) -> None:
        if self._phase != "train":
            self.done()
            self._phase = "train"
        acc = "/".join(f"{a:.2f}" for a in p.acc)
        self._line(f"train: {_bar(p.step / max(p.total, 1))} step {p.step}/{p.total}  loss {p.loss:.3f}  "
                   f"top-1 {acc}  {p.tokens_per_s:,.0f} tok/s  ETA {_hms(p.eta_s)}")

    def _line(self, text: str) -> None:
        click.echo("\r" + text + "\033[K", nl=False, err=True)

    def done(self) -> None:
        if self._phase is not None:
            click.echo(err=True)
        self._phase = None


def _bar(frac: float, width: int = 24) -> str:
    filled = int(round(max(0.0, min(1.0, frac)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _hms(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "--:--"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
