"""EAGLE's six prompt sets as the tests read them (the benchmark's own files, so both run the same turns)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle2_local.bench.prompt_sets import interleaved, load_prompt_sets
from eagle2_local.errors import Eagle2Error

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts" / "eagle"


def load_prompts(n: int) -> list[str]:
    """The first turns of EAGLE's six prompt sets, interleaved, ``n`` in total (more than they hold: a failure)."""
    try:
        return interleaved(load_prompt_sets([str(PROMPTS_DIR)], None), n)
    except Eagle2Error as exc:
        pytest.fail(str(exc))
