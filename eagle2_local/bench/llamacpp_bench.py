"""llama.cpp's own binaries timed on the benchmark's prompts (what users would run instead of eagle2-local), and
their figures over a prompt set beside eagle2-local's (``bench --llama-cpp-bin``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..llamacpp.binaries import ToolRun
    from .results import PromptResult


@dataclass
class LlamaCppBinaries:
    """llama.cpp's own binaries timed on the same rendered prompts (what users would run instead): plain
    ``llama-completion``, draft-simple with ``draft`` (None: not run) and each of ``ngram`` (names in
    binaries.NGRAM_MODES), one after another in an order that alternates per prompt, as bench's own modes
    do."""

    bin_dir: Path
    model: Path
    draft: Path | None
    threads: int
    n_ctx: int
    n_draft: int = 4
    ngram: tuple[str, ...] = ()
    calls: int = 0

    def run(self, rendered: str | list[str], max_tokens: int) -> dict:
        """Time every tool on a prompt, or on each turn's prompt of a chat (tokens and seconds summed over the
        turns): decode-only and end-to-end (prompt included) tokens/s, drafted and accepted counts."""
        from ..llamacpp.binaries import NGRAM_MODES, run_completion, run_speculative
        prompts = [rendered] if isinstance(rendered, str) else rendered
        tools = {"completion": lambda p: run_completion(self.bin_dir, self.model, p, max_tokens, self.threads,
                                                        self.n_ctx)}
        if self.draft is not None:
            tools["draft_simple"] = lambda p: run_speculative(self.bin_dir, self.model, self.draft, p, max_tokens,
                                                              self.threads, self.n_ctx, self.n_draft)
        for mode in self.ngram:
            tools[mode] = (lambda spec: lambda p: run_speculative(
                self.bin_dir, self.model, None, p, max_tokens, self.threads, self.n_ctx, spec=spec))(NGRAM_MODES[mode])
        order = list(tools) if self.calls % 2 == 0 else list(reversed(tools))
        self.calls += 1
        runs = {name: [tools[name](p) for p in prompts] for name in order}
        out = {"completion_tokens_per_s": round(_rate(runs["completion"]), 3),
               "completion_e2e_tokens_per_s": round(_rate(runs["completion"], e2e=True), 3)}
        if "draft_simple" in runs:
            spec = runs["draft_simple"]
            out.update({"draft_simple_tokens_per_s": round(_rate(spec), 3),
                        "drafted": sum(r.drafted or 0 for r in spec), "accepted": sum(r.accepted or 0 for r in spec)})
        if self.ngram:
            out["ngram"] = {mode: {"tokens_per_s": round(_rate(runs[mode]), 3),
                                   "e2e_tokens_per_s": round(_rate(runs[mode], e2e=True), 3),
                                   "tokens": sum(r.tokens for r in runs[mode]),
                                   "drafted": sum(r.drafted or 0 for r in runs[mode]),
                                   "accepted": sum(r.accepted or 0 for r in runs[mode])} for mode in self.ngram}
        return out


def _rate(runs: list["ToolRun"], e2e: bool = False) -> float:
    """Tokens per second over several llama.cpp tool runs (ToolRun): decoding alone, or with the prompts'
    evaluation (``e2e``)."""
    seconds = sum(r.seconds + (r.prompt_seconds if e2e else 0.0) for r in runs)
    return sum(r.tokens for r in runs) / seconds if seconds > 0 else 0.0


def binaries_summary(rs: list["PromptResult"]) -> dict:
    """llama.cpp's tools over a set: medians of their tokens/s and of per-prompt speedups over llama-completion
    (decode-only and end-to-end), acceptance rates, and eagle2-local against the best n-gram mode."""
    tools = [r.llama_cpp for r in rs]
    med = lambda key: round(statistics.median(t[key] for t in tools), 3)  # noqa: E731
    out = {"tokens_per_s_completion": med("completion_tokens_per_s"),
           "tokens_per_s_e2e_completion": med("completion_e2e_tokens_per_s"),
           "speedup_eagle_vs_completion": _median_ratio((r.eagle.tokens_per_s, r.llama_cpp["completion_tokens_per_s"])
                                                        for r in rs)}
    if "draft_simple_tokens_per_s" in tools[0]:
        out.update({"tokens_per_s_draft_simple": med("draft_simple_tokens_per_s"),
                    "draft_simple_accept_rate": round(sum(t["accepted"] for t in tools)
                                                      / max(1, sum(t["drafted"] for t in tools)), 4),
                    "speedup_draft_simple": _median_ratio((t["draft_simple_tokens_per_s"], t["completion_tokens_per_s"])
                                                          for t in tools)})
    modes = list(tools[0].get("ngram", {}))
    if modes:
        ngram = {}
        for mode in modes:
            runs = [t["ngram"][mode] for t in tools]
            ngram[mode] = {
                "tokens_per_s": round(statistics.median(m["tokens_per_s"] for m in runs), 3),
                "speedup": _median_ratio((m["tokens_per_s"], t["completion_tokens_per_s"])
                                         for m, t in zip(runs, tools)),
                "speedup_e2e": _median_ratio((m["e2e_tokens_per_s"], t["completion_e2e_tokens_per_s"])
                                             for m, t in zip(runs, tools)),
                "accept_rate": round(sum(m["accepted"] for m in runs) / max(1, sum(m["drafted"] for m in runs)), 4)}
        best = max(modes, key=lambda m: ngram[m]["speedup"])
        out["ngram"] = ngram
        out["best_ngram"] = best
        out["speedup_eagle_vs_best_ngram"] = _median_ratio(
            (r.eagle.tokens_per_s, r.llama_cpp["ngram"][best]["tokens_per_s"]) for r in rs)
    return out


def _median_ratio(pairs) -> float:
    """Median of a / b over (a, b) pairs with b > 0 (0.0 without any)."""
    ratios = [a / b for a, b in pairs if b > 0]
    return round(statistics.median(ratios), 4) if ratios else 0.0
