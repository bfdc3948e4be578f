"""Side-by-side benchmark: plain decoding and eagle2-local on the same target context, alternating per prompt.

Both modes run on one :class:`~eagle2_local.api.Eagle2` (same llama.cpp build, model, context settings and
threads; plain decoding is its ``speculative=False`` path), reset before every run, so neither profits from the
other's KV cache. Speed is tokens per second of decoding (the
prompt's prefill is the same for both and excluded); the speedup of a set is the median of per-prompt ratios.
At temperature 0 the outputs are compared token for token; a divergence is reported as a near-tie when the
target's top-2 logits at that position differ by less than ``tie_tolerance`` (multi-threaded CPU runs are not
batch-invariant, see NOTES.md), and as a mismatch otherwise.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import platform
import statistics
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .chat import prompt_tokens, render_for_model
from .errors import Eagle2Error
from .generator import GenerationStats, add_counts, host_summary
from .llama import LlamaModel, system_info
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .api import Eagle2

log = logging.getLogger(__name__)


@dataclass
class PromptSet:
    name: str
    prompts: list[str]


def load_prompt_sets(specs: list[str], n: int | None) -> list[PromptSet]:
    """Each spec is a JSONL file or a folder of them; records carry ``turns`` (first turn used) or ``prompt``."""
    sets: list[PromptSet] = []
    for spec in specs:
        path = Path(spec).expanduser()
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise Eagle2Error(f"no prompt set at {spec} (give a .jsonl file or a folder of them)")
        for f in files:
            prompts = []
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise Eagle2Error(f"{f}:{i + 1}: not JSON ({exc.msg})") from None
                if not isinstance(rec, dict):
                    raise Eagle2Error(f"{f}:{i + 1}: a record must be a JSON object, got {line.strip()[:40]}")
                turns = rec.get("turns")
                text = turns[0] if isinstance(turns, list) and turns else rec.get("prompt")
                if not isinstance(text, str):
                    raise Eagle2Error(f"{f}:{i + 1}: record has neither 'turns' nor 'prompt'")
                prompts.append(text)
            sets.append(PromptSet(f.stem, prompts[:n] if n else prompts))
    return sets


def interleaved(sets: list[PromptSet], n: int) -> list[str]:
    """``n`` prompts taken across ``sets`` in turn (every set's first, then every set's second, ...), so that a
    handful already spans every kind of task; an error when the sets hold fewer than ``n``."""
    out = [p for row in itertools.zip_longest(*(s.prompts for s in sets)) for p in row if p is not None][:n]
    if len(out) < n:
        raise Eagle2Error(f"asked for {n} prompts but the sets ({', '.join(s.name for s in sets)}) hold {len(out)}")
    return out


def machine_info() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    import llama_cpp
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__, "llama_cpp_system_info": system_info().strip()}


@dataclass
class PromptResult:
    set: str
    index: int
    plain: dict
    eagle: dict
    identical: bool
    divergence_at: int | None = None
    divergence_gap: float | None = None
    llama_cpp: dict | None = None

    @property
    def speedup(self) -> float:
        return self.eagle["tokens_per_s"] / self.plain["tokens_per_s"] if self.plain["tokens_per_s"] else 0.0


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
    tools: "LlamaCppTools | None" = None
    results: list[PromptResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.repeat < 1:  # the median of no runs does not exist
            raise Eagle2Error(f"repeat must be 1 or more, got {self.repeat}")

    @property
    def model(self) -> LlamaModel:
        return self.llm.model

    def prompt(self, text: str) -> tuple[str, list[int]]:
        """What the model is given, as text and tokens: the chat template applied to one user turn when the
        model has one, else the raw text (tokenized like every prompt: ``chat.prompt_tokens``)."""
        if self.chat and self.model.info.chat_template:
            text = render_for_model(self.model, [{"role": "user", "content": text}])
        return text, prompt_tokens(self.model, text)

    def _one(self, mode: str, prompt: list[int]) -> tuple[list[int], GenerationStats]:
        self.llm.reset()
        tokens: list[int] = []
        for ch in self.llm.stream(prompt, self.max_tokens, self.sampling, seed=self.seed,
                                  speculative=mode == "eagle"):
            tokens += ch.tokens
        return tokens, self.llm.last_stats

    def run_prompt(self, set_name: str, index: int, text: str) -> PromptResult:
        rendered, prompt = self.prompt(text)
        runs: dict[str, list[tuple[list[int], GenerationStats]]] = {"plain": [], "eagle": []}
        order = ("plain", "eagle") if index % 2 == 0 else ("eagle", "plain")  # alternate who goes first
        for _ in range(self.repeat):
            for mode in order:
                runs[mode].append(self._one(mode, prompt))
        plain_tokens = runs["plain"][0][0]
        eagle_tokens = runs["eagle"][0][0]
        res = PromptResult(set_name, index, _median_stats(runs["plain"]), _median_stats(runs["eagle"]),
                           identical=plain_tokens == eagle_tokens)
        if not res.identical and self.sampling.greedy:
            at = next((i for i, (a, b) in enumerate(zip(plain_tokens, eagle_tokens)) if a != b),
                      min(len(plain_tokens), len(eagle_tokens)))
            res.divergence_at = at
            res.divergence_gap = self._top2_gap(prompt + plain_tokens[:at])
        if self.tools is not None:
            res.llama_cpp = self.tools.run(rendered, self.max_tokens)
        self.results.append(res)
        return res

    def _top2_gap(self, tokens: list[int]) -> float:
        top = np.sort(self.llm.next_token_logits(tokens))[-2:]
        return float(top[1] - top[0])

    def summary(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for name in dict.fromkeys(r.set for r in self.results):
            rs = [r for r in self.results if r.set == name]
            passes = sum(r.eagle["target_passes"] for r in rs)
            depth = _sum_lists([r.eagle["accepted_per_depth"] for r in rs])
            n_rounds = passes or 1
            greedy = self.sampling.greedy
            near = [r for r in rs if not r.identical and r.divergence_gap is not None
                    and r.divergence_gap < self.tie_tolerance]
            out[name] = {
                "n_prompts": len(rs),
                "speedup": round(statistics.median(r.speedup for r in rs), 4),
                "tokens_per_s_plain": round(statistics.median(r.plain["tokens_per_s"] for r in rs), 3),
                "tokens_per_s_eagle": round(statistics.median(r.eagle["tokens_per_s"] for r in rs), 3),
                "tau": round(sum(r.eagle["pass_tokens"] for r in rs) / n_rounds, 4),
                "acceptance_per_depth": [round(d / n_rounds, 4) for d in depth],
                "mean_tree_size": round(statistics.mean(r.eagle["mean_tree_size"] for r in rs), 2),
                "plain_steps": sum(r.eagle.get("plain_steps", 0) for r in rs),
                "nodes_by_source": reduce(add_counts, (r.eagle.get("nodes_by_source", {}) for r in rs), {}),
                "accepted_by_source": reduce(add_counts, (r.eagle.get("accepted_by_source", {}) for r in rs), {}),
                "time_split_eagle": {k: round(sum(r.eagle[k] for r in rs), 3) for k in ("draft_s", "verify_s", "other_s")},
                "host_eagle": _host(r.eagle for r in rs),
                "host_plain": _host(r.plain for r in rs),
                "identical_outputs": sum(r.identical for r in rs) if greedy else None,
                "near_tie_divergences": len(near) if greedy else None,
                "mismatches": (len(rs) - sum(r.identical for r in rs) - len(near)) if greedy else None,
            }
            tools = [r.llama_cpp for r in rs if r.llama_cpp]
            if tools:
                out[name]["llama_cpp"] = {
                    "tokens_per_s_completion": round(statistics.median(t["completion_tokens_per_s"] for t in tools), 3),
                    "tokens_per_s_draft_simple": round(statistics.median(t["draft_simple_tokens_per_s"] for t in tools), 3),
                    "draft_simple_accept_rate": round(sum(t["accepted"] for t in tools) / max(1, sum(t["drafted"] for t in tools)), 4),
                    "speedup_draft_simple": round(statistics.median(
                        t["draft_simple_tokens_per_s"] / t["completion_tokens_per_s"] for t in tools), 4),
                    "speedup_eagle_vs_completion": round(statistics.median(
                        r.eagle["tokens_per_s"] / r.llama_cpp["completion_tokens_per_s"] for r in rs if r.llama_cpp), 4),
                }
        return out

    def report(self, settings: dict) -> dict:
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "machine": machine_info(), "settings": settings, "sets": self.summary(),
                "prompts": [{"set": r.set, "index": r.index, "speedup": round(r.speedup, 4),
                             "identical": r.identical, "divergence_at": r.divergence_at,
                             "divergence_gap": r.divergence_gap, "plain": r.plain, "eagle": r.eagle,
                             "llama_cpp": r.llama_cpp}
                            for r in self.results]}


PROJECTION_STEPS_MS = (5.0, 10.0, 20.0, 40.0)  # target step times of GPU / Apple-silicon class devices


def projected_speedup(tau: float, host_ms: float, step_ms: float, plain_host_ms: float = 0.0) -> float:
    """What the measured host time would leave of a speed-up on a device where verifying a round's tree costs
    one target step of ``step_ms`` and drafting costs nothing (a GPU running a 7-8B target: both nearly so).
    An upper bound, and a projection, not a measurement: a round yields ``tau`` tokens in ``step_ms + host_ms``,
    a plain step one token in ``step_ms + plain_host_ms``."""
    return tau * (step_ms + plain_host_ms) / (step_ms + host_ms)


def _host(stats) -> dict:
    """A set's host time: the rounds, their time inside llama.cpp, and :func:`host_summary`'s figures."""
    stats = list(stats)
    return {"rounds": sum(s.get("rounds", 0) for s in stats),
            "llama_s": round(sum(s.get("llama_s", 0.0) for s in stats), 4), **host_summary(stats)}


def _median_stats(runs: list[tuple[list[int], GenerationStats]]) -> dict:
    """The stats dict of the run with the median decode time (repeats only change timings)."""
    ordered = sorted(runs, key=lambda r: r[1].decode_s)
    return ordered[len(ordered) // 2][1].as_dict()


def _sum_lists(lists: list[list[int]]) -> list[int]:
    n = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(n)]


@dataclass
class LlamaCppTools:
    """llama.cpp's own binaries timed on the same rendered prompts (what users would run instead)."""

    bin_dir: Path
    model: Path
    draft: Path
    threads: int
    n_ctx: int
    n_draft: int = 4

    def run(self, rendered: str, max_tokens: int) -> dict:
        from .llamacpp_tools import run_completion, run_speculative
        plain = run_completion(self.bin_dir, self.model, rendered, max_tokens, self.threads, self.n_ctx)
        spec = run_speculative(self.bin_dir, self.model, self.draft, rendered, max_tokens, self.threads, self.n_ctx,
                               self.n_draft)
        return {"completion_tokens_per_s": round(plain.tokens_per_s, 3),
                "draft_simple_tokens_per_s": round(spec.tokens_per_s, 3),
                "drafted": spec.drafted or 0, "accepted": spec.accepted or 0}
