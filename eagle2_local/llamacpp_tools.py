"""Run llama.cpp's own command-line tools on the same prompts, for the benchmark record.

Users who do not run eagle2-local would run ``llama-completion`` (plain decoding) or
``llama-speculative-simple`` (llama.cpp's draft-model speculation, a chain of up to N draft tokens). We time
both from a folder of built binaries and parse the speed they report themselves.
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import Eagle2Error

log = logging.getLogger(__name__)

# the generation line, not "prompt eval time" (a batched prefill)
_EVAL = re.compile(r"(?:^|[:\s])(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs", re.M)
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"n_drafted\s*=\s*(\d+).*?n_accept\s*=\s*(\d+)", re.S)


@dataclass
class ToolRun:
    tokens: int
    seconds: float
    drafted: int | None = None
    accepted: int | None = None

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
    """Plain greedy decoding with ``llama-completion``; speed from its own eval-time line."""
    out = _run([str(find_tool(bin_dir, "llama-completion")), "-m", str(model), "-p", prompt, "-n", str(n),
                "--temp", "0", "-t", str(threads), "-c", str(n_ctx), "-no-cnv", "--no-warmup"], timeout)
    m = _EVAL.search(out)
    if not m:
        raise Eagle2Error("could not find llama-completion's eval time in its output")
    return ToolRun(tokens=int(m.group(2)), seconds=float(m.group(1)) / 1e3)


def run_speculative(bin_dir, model: Path, draft: Path, prompt: str, n: int, threads: int, n_ctx: int,
                    n_draft: int = 4, timeout: float = 600) -> ToolRun:
    """llama.cpp's draft-model speculation (``draft-simple``) with the same draft model."""
    out = _run([str(find_tool(bin_dir, "llama-speculative-simple")), "-m", str(model), "-md", str(draft),
                "-p", prompt, "-n", str(n), "--temp", "0", "-t", str(threads), "-c", str(n_ctx),
                "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_draft)], timeout)
    m = _DECODED.search(out)
    if not m:
        raise Eagle2Error("could not find llama-speculative-simple's decode speed in its output")
    acc = _ACCEPT.search(out)
    return ToolRun(tokens=int(m.group(1)), seconds=float(m.group(2)),
                   drafted=int(acc.group(1)) if acc else None, accepted=int(acc.group(2)) if acc else None)
