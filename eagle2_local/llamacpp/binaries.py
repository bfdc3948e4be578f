"""Run llama.cpp's own command-line tools on the same prompts, for the benchmark record.

Users who do not run eagle2-local would run ``llama-completion`` (plain decoding) or
``llama-speculative-simple``: llama.cpp's draft-model speculation (a chain of up to N draft tokens) or its
n-gram drafting from the text itself (:data:`NGRAM_MODES`). We time them from a folder of built binaries and
parse the speeds they report themselves: decoding alone, and with the prompt's evaluation (end to end).
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import Eagle2Error

log = logging.getLogger(__name__)

# the generation line, not "prompt eval time" (a batched prefill)
_EVAL = re.compile(r"(?:^|[:\s])(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs", re.M)
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")

# llama.cpp's n-gram drafting modes (no draft model), each at the settings its docs/speculative.md shows
NGRAM_MODES: dict[str, list[str]] = {
    "ngram-simple": ["--spec-type", "ngram-simple", "--spec-draft-n-max", "64"],
    "ngram-map-k": ["--spec-type", "ngram-map-k", "--spec-draft-n-max", "64"],
    "ngram-map-k4v": ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "8",
                      "--spec-ngram-map-k4v-size-m", "8", "--spec-ngram-map-k4v-min-hits", "2",
                      "--spec-draft-n-max", "64"],
    "ngram-mod": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-min", "48",
                  "--spec-ngram-mod-n-max", "64"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
}
_ACCEPT = re.compile(r"n_drafted\s*=\s*(\d+).*?n_accept\s*=\s*(\d+)", re.S)


@dataclass
class ToolRun:
    """One tool run: tokens decoded in ``seconds`` (decoding alone), the prompt's evaluation before it, and for
    speculation the drafted and accepted token counts."""

    tokens: int
    seconds: float
    drafted: int | None = None
    accepted: int | None = None
    prompt_seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def find_tool(bin_dir: str | Path, name: str) -> Path:
    for cand in (Path(bin_dir) / name, Path(bin_dir) / "bin" / name):
        if cand.is_file():
            return cand
    raise Eagle2Error(f"{name} not found in {bin_dir} (build it: cmake --build build --target {name})")


def _run(cmd: list[str], timeout: float) -> str:
    log.debug("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Eagle2Error(f"{Path(cmd[0]).name} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise Eagle2Error(f"{Path(cmd[0]).name} failed ({proc.returncode}): {' | '.join(tail)}")
    return proc.stdout + proc.stderr


def run_completion(bin_dir, model: Path, prompt: str, n: int, threads: int, n_ctx: int,
                   timeout: float = 600) -> ToolRun:
    """Plain greedy decoding with ``llama-completion``; speed from its own eval-time lines."""
    out = _run([str(find_tool(bin_dir, "llama-completion")), "-m", str(model), "-p", prompt, "-n", str(n),
                "--temp", "0", "-t", str(threads), "-c", str(n_ctx), "-no-cnv", "--no-warmup"], timeout)
    m = _EVAL.search(out)
    if not m:
        raise Eagle2Error("could not find llama-completion's eval time in its output")
    p = _PROMPT_EVAL.search(out)
    return ToolRun(tokens=int(m.group(2)), seconds=float(m.group(1)) / 1e3,
                   prompt_seconds=float(p.group(1)) / 1e3 if p else 0.0)


def run_speculative(bin_dir, model: Path, draft: Path | None, prompt: str, n: int, threads: int, n_ctx: int,
                    n_draft: int = 4, timeout: float = 600, spec: list[str] | None = None) -> ToolRun:
    """``llama-speculative-simple``: draft-model speculation (``draft-simple``, ``n_draft`` tokens) with
    ``draft``, or the drafting ``spec`` names (an :data:`NGRAM_MODES` entry; no draft model)."""
    args = (["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_draft)]
            if spec is None else list(spec))
    out = _run([str(find_tool(bin_dir, "llama-speculative-simple")), "-m", str(model), *args,
                "-p", prompt, "-n", str(n), "--temp", "0", "-t", str(threads), "-c", str(n_ctx)], timeout)
    m = _DECODED.search(out)
    if not m:
        raise Eagle2Error("could not find llama-speculative-simple's decode speed in its output")
    acc = _ACCEPT.search(out)
    enc = _ENCODED.search(out)
    return ToolRun(tokens=int(m.group(1)), seconds=float(m.group(2)),
                   drafted=int(acc.group(1)) if acc else None, accepted=int(acc.group(2)) if acc else None,
                   prompt_seconds=float(enc.group(2)) if enc else 0.0)
