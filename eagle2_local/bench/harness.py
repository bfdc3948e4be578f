"""Side-by-side benchmark: plain decoding and eagle2-local on the same target context, alternating per prompt.

Both modes run on one :class:`~eagle2_local.api.Eagle2` (same llama.cpp build, model, context settings and
threads; plain decoding is its ``speculative=False`` path), reset before every run, so neither profits from the
other's KV cache. Speed is tokens per second of decoding (the prompt's prefill is the same for both and excluded);
the speedup of a set is the median of per-prompt ratios. A record with several user turns runs as a chat, each
turn after the mode's own earlier answers; its speed, τ and comparison cover every turn (their stats added up).
At temperature 0 the outputs are compared token for token; a divergence is reported as a near-tie when the
target's top-2 logits at that position differ by less than ``tie_tolerance`` (multi-threaded CPU runs are not
batch-invariant, see NOTES.md#lossless), and as a mismatch otherwise.
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..chat.templates import prompt_tokens, render_for_model
from ..decoding.grammar import Grammar
from ..decoding.stats import GenerationStats
from ..drafts.history import held
from ..errors import Eagle2Error
from ..llamacpp.llama import LlamaModel
from ..llamacpp.runtime import system_info
from ..measure.machine_load import CpuTicks, load_1min, pooled_steal
from ..tree.sampling import SamplingParams
from .llamacpp_bench import binaries_summary
from .results import PromptResult

if TYPE_CHECKING:
    from ..api import Eagle2
    from ..generation.generator import PromptSnapshot
    from .llamacpp_bench import LlamaCppBinaries

log = logging.getLogger(__name__)


def machine_info() -> dict:
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    import llama_cpp
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__, "llama_cpp_system_info": system_info().strip()}


@dataclass
class Bench:
    """Runs the comparison on ``llm`` (an :class:`~eagle2_local.api.Eagle2` with a draft)."""

    llm: "Eagle2"
    sampling: SamplingParams
    max_tokens: int
    repeat: int = 1
    tie_tolerance: float = 1.0
    seed: int = 0
    chat: bool = True
    binaries: "LlamaCppBinaries | None" = None
    prefill_once: bool = False
    results: list[PromptResult] = field(default_factory=list)
    _snapshot: "PromptSnapshot | None" = field(default=None, init=False, repr=False)  # this record's prompt

    def __post_init__(self) -> None:
        if self.repeat < 1:  # the median of no runs does not exist
            raise Eagle2Error(f"repeat must be 1 or more, got {self.repeat}")

    @property
    def model(self) -> LlamaModel:
        return self.llm.model

    def render(self, messages: list[dict]) -> str:
        """The text the model is given for a conversation ending in a user turn: the chat template when the model
        has one, else the messages' contents joined by blank lines (for one turn: the raw text)."""
        if self.chat and self.model.info.chat_template:
            return render_for_model(self.model, messages)
        return "\n\n".join(m["content"] for m in messages)

    def _chat(self, mode: str, turns: list[str], grammar: Grammar | None = None) -> "ChatRun":
        """One record in one mode. Each user turn follows this mode's own earlier answers (at T=0 both modes'
        answers are the same, and a divergence is reported, not hidden by sharing one). The KV cache is dropped
        before the first turn only: later turns reuse the conversation so far, as a chat client's would.
        ``grammar`` constrains every answer, in both modes. With ``prefill_once`` the first turn's prompt is
        restored instead of evaluated again (:meth:`_restore_prompt`)."""
        self.llm.reset()
        run = ChatRun()
        messages: list[dict] = []
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            rendered = self.render(messages)
            prompt = prompt_tokens(self.model, rendered)  # the one way prompt text becomes tokens
            if self.prefill_once and not run.prompts:
                self._restore_prompt(prompt)
            tokens: list[int] = []
            text: list[str] = []
            for ch in self.llm.stream(prompt, self.max_tokens, self.sampling, seed=self.seed,
                                      speculative=mode == "eagle", grammar=grammar):
                tokens += ch.tokens
                text.append(ch.text)
            run.rendered.append(rendered)
            run.prompts.append(prompt)
            run.answers.append(tokens)
            run.stats += self.llm.last_stats
            messages.append({"role": "assistant", "content": "".join(text)})
        return run

    def _restore_prompt(self, prompt: list[int]) -> None:
        """Put the KV cells and draft features of ``prompt``, evaluated once from an empty cache in the schedule
        a fresh call uses, back in place: every run of a record then starts from the same cells a fresh
        evaluation gives (the draft engine empty, as in a fresh call) and re-evaluates only the last aligned
        chunk. Decoding is timed as before; prefill and end-to-end figures then cover that chunk alone."""
        gen = self.llm.generator
        if self._snapshot is None or self._snapshot.tokens != tuple(prompt):
            self._snapshot = gen.prompt_snapshot(prompt, exact=not self.llm.cache_prompt)
        gen.restore(self._snapshot)

    def run_prompt(self, set_name: str, index: int, text: str | list[str], split: str = "tune",
                   grammar: Grammar | None = None) -> PromptResult:
        """Run one record (one user turn, or a chat's turns in order) in both modes, ``repeat`` times each,
        its answers constrained by ``grammar`` if given.

        A chat's tokens/s and τ cover all its turns (their sums: tokens over decode time, accepted over passes),
        and its outputs count as identical only if every turn's answer is."""
        turns = [text] if isinstance(text, str) else list(text)
        runs: dict[str, list[ChatRun]] = {"plain": [], "eagle": []}
        ticks: dict[str, list[tuple[CpuTicks | None, CpuTicks | None]]] = {"plain": [], "eagle": []}
        order = ("plain", "eagle") if index % 2 == 0 else ("eagle", "plain")  # alternate who goes first
        # with a history (drafts from earlier answers): this record's answers join it after all its runs, the
        # first eagle run's only (plain runs add nothing), so no run drafts from its own record's earlier run
        with held(getattr(self.llm, "history", None), len(turns)):
            for _ in range(self.repeat):
                for mode in order:
                    before = CpuTicks.now()
                    runs[mode].append(self._chat(mode, turns, grammar))
                    ticks[mode].append((before, CpuTicks.now()))
        self._snapshot = None  # a record's prompt is not asked again
        plain, eagle = runs["plain"][0], runs["eagle"][0]
        res = PromptResult(set_name, index, _median(runs["plain"]), _median(runs["eagle"]),
                           identical=plain.answers == eagle.answers, turns=len(turns), split=split,
                           constrained=grammar is not None,
                           machine_load={"load_1min": load_1min(), "steal_plain": pooled_steal(ticks["plain"]),
                                         "steal_eagle": pooled_steal(ticks["eagle"])})
        if not res.identical and self.sampling.greedy:
            t = next(i for i, (a, b) in enumerate(zip(plain.answers, eagle.answers)) if a != b)
            pa, ea = plain.answers[t], eagle.answers[t]
            at = next((i for i, (a, b) in enumerate(zip(pa, ea)) if a != b), min(len(pa), len(ea)))
            res.divergence_turn = t
            res.divergence_at = at
            res.divergence_gap = self._top2_gap(plain.prompts[t], pa[:at], grammar)
        if self.binaries is not None and grammar is None:  # on plain's conversation: the same prompts, turn by turn
            res.llama_cpp = self.binaries.run(plain.rendered, self.max_tokens)
        self.results.append(res)
        return res

    def _top2_gap(self, prompt: list[int], answer: list[int], grammar: Grammar | None = None) -> float:
        """The gap between the two best next tokens after ``prompt + answer``: among those the grammar allows
        there, when the answer is constrained (an unconstrained gap says nothing of a tie between allowed ones)."""
        logits = self.llm.next_token_logits(prompt + answer)
        if grammar is not None:
            state = grammar.state(self.llm.model)
            for tok in answer:
                state.accept(tok)
            logits = state.constrain(logits)
            state.close()
        top = np.sort(logits)[-2:]
        return float(top[1] - top[0])

    def summary(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for name in dict.fromkeys(r.set for r in self.results):
            rs = [r for r in self.results if r.set == name]
            plain, eagle = (sum((getattr(r, mode) for r in rs), GenerationStats()) for mode in ("plain", "eagle"))
            greedy = self.sampling.greedy
            near = [r for r in rs if not r.identical and r.divergence_gap is not None
                    and r.divergence_gap < self.tie_tolerance]
            out[name] = {
                "n_prompts": len(rs),
                "n_turns": sum(r.turns for r in rs),
                "n_constrained": sum(r.constrained for r in rs),
                "speedup": round(statistics.median(r.speedup for r in rs), 4),
                "tokens_per_s_plain": round(statistics.median(r.plain.tokens_per_s for r in rs), 3),
                "tokens_per_s_eagle": round(statistics.median(r.eagle.tokens_per_s for r in rs), 3),
                "speedup_e2e": _speedup_e2e(rs),
                "tokens_per_s_e2e_plain": round(statistics.median(r.plain.tokens_per_s_e2e for r in rs), 3),
                "tokens_per_s_e2e_eagle": round(statistics.median(r.eagle.tokens_per_s_e2e for r in rs), 3),
                "tau": round(eagle.tau, 4),
                "acceptance_per_depth": [round(d / (eagle.target_passes or 1), 4) for d in eagle.accepted_per_depth],
                "mean_tree_size": round(statistics.mean(round(r.eagle.mean_tree_size, 2) for r in rs), 2),
                "plain_steps": eagle.plain_steps,
                "nodes_by_source": eagle.nodes_by_source,
                "accepted_by_source": eagle.accepted_by_source,
                "time_split_eagle": {k: round(getattr(eagle, k), 3) for k in ("draft_s", "verify_s", "other_s")},
                "host_eagle": eagle.host_totals(),
                "host_plain": plain.host_totals(),
                "identical_outputs": sum(r.identical for r in rs) if greedy else None,
                "near_tie_divergences": len(near) if greedy else None,
                "mismatches": (len(rs) - sum(r.identical for r in rs) - len(near)) if greedy else None,
            }
            if any(r.llama_cpp for r in rs):
                out[name]["llama_cpp"] = binaries_summary([r for r in rs if r.llama_cpp])
            held = [r for r in rs if r.split == "heldout"]
            if held and len(held) < len(rs):  # held-out records reported apart: tuning never saw them
                out[name]["heldout"] = _split_summary(held)
        return out

    def report(self, settings: dict) -> dict:
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "machine": {**machine_info(), **self.load_summary()}, "settings": settings, "sets": self.summary(),
                "prompts": [{"set": r.set, "index": r.index, "speedup": round(r.speedup, 4),
                             "identical": r.identical, "split": r.split, "divergence_at": r.divergence_at,
                             "divergence_gap": r.divergence_gap, "turns": r.turns,
                             "divergence_turn": r.divergence_turn, "constrained": r.constrained,
                             "plain": r.plain.as_dict(), "eagle": r.eagle.as_dict(),
                             "llama_cpp": r.llama_cpp, "machine_load": r.machine_load}
                            for r in self.results]}

    def load_summary(self) -> dict:
        """How busy the machine was over the run: the medians of the records' load averages and of their steal
        shares (each mode's; None where the platform has no such readings)."""
        loads = [r.machine_load["load_1min"] for r in self.results
                 if r.machine_load and r.machine_load["load_1min"] is not None]
        steals = [r.machine_load[k] for r in self.results if r.machine_load
                  for k in ("steal_plain", "steal_eagle") if r.machine_load[k] is not None]
        return {"load_1min_median": round(statistics.median(loads), 2) if loads else None,
                "steal_median": round(statistics.median(steals), 4) if steals else None}


def _speedup_e2e(rs: list[PromptResult]) -> float:
    """The median end-to-end speed-up (tokens over the whole time, prompt evaluation included)."""
    return round(statistics.median(r.eagle.tokens_per_s_e2e / max(r.plain.tokens_per_s_e2e, 1e-9) for r in rs), 4)


def _split_summary(rs: list[PromptResult]) -> dict:
    """A subset of a set's records (the held-out ones): medians of speed-ups (decode-only and end to end), tau,
    and eagle2-local against the best n-gram mode of the whole set when llama.cpp's tools ran."""
    eagle = sum((r.eagle for r in rs), GenerationStats())
    out = {"n_prompts": len(rs), "speedup": round(statistics.median(r.speedup for r in rs), 4),
           "speedup_e2e": _speedup_e2e(rs), "tau": round(eagle.tau, 4),
           "identical_outputs": sum(r.identical for r in rs)}
    if all(r.llama_cpp and "ngram" in r.llama_cpp for r in rs):
        out["llama_cpp"] = binaries_summary(rs)
    return out


@dataclass
class ChatRun:
    """One record run in one mode: per turn, the rendered prompt, its tokens and the answer; the turns' stats
    added up, so a chat's tokens/s and τ cover every turn."""

    rendered: list[str] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    answers: list[list[int]] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)


def _median(runs: list[ChatRun]) -> GenerationStats:
    """The stats of the run with the median decode time (repeats only change timings)."""
    ordered = sorted((r.stats for r in runs), key=lambda st: st.decode_s)
    return ordered[len(ordered) // 2]
