"""The copy-heavy prompt sets in benchmarks/prompts load as bench prompt sets and ask for what they promise."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import PROMPTS_DIR
from eagle2_local.bench import load_prompt_sets

SETS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts"
FENCE = re.compile(r"```python\n(.*?)```", re.S)


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (SETS_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def test_sets_load_with_bench_loader():
    sets = {s.name: s.prompts for s in load_prompt_sets([str(SETS_DIR)], None)}
    assert set(sets) == {"code_edit", "qa_passage"}
    assert len(sets["code_edit"]) == 20 and len(sets["qa_passage"]) == 20
    assert [len(s.prompts) for s in load_prompt_sets([str(SETS_DIR)], 2)] == [2, 2]


def test_code_edit_prompts_hold_a_whole_function():
    kinds = set()
    for rec in records("code_edit"):
        text = rec["turns"][0]
        assert "Return the whole function in a ```python code block." in text
        blocks = FENCE.findall(text)
        assert len(blocks) == 1 and "def " in blocks[0]
        fns = [n for n in ast.parse(blocks[0]).body if isinstance(n, ast.FunctionDef)]
        assert len(fns) == 1
        kind = rec["category"].split("/")[1]
        kinds.add(kind)
        if kind in ("rename", "fix_bug"):  # the expected answer differs from the input, but only a little
            (expected,) = FENCE.findall(rec["reference"][0])
            assert expected != blocks[0]
            assert ast.parse(expected) and len(expected.splitlines()) == len(blocks[0].splitlines())
        if kind == "rename":
            old, new = re.findall(r"`(\w+)`", text)[:2]
            assert re.search(rf"\b{old}\b", blocks[0]) and not re.search(rf"\b{old}\b", expected)
            assert re.search(rf"\b{new}\b", expected)
    assert kinds == {"type_hints", "rename", "comments", "fix_bug", "validation"}


def test_qa_passages_are_quoted_from_the_articles():
    articles = {json.loads(line)["question_id"]: json.loads(line)["turns"][0]
                for line in (PROMPTS_DIR / "sum.jsonl").read_text(encoding="utf-8").splitlines()}
    for rec in records("qa_passage"):
        question, passage = rec["turns"][0].split("\n\nPassage:\n")
        assert 250 <= len(passage.split()) <= 400 and passage.rstrip()[-1] in ".!?'\"\u201d\u2019"
        source = " ".join(articles[rec["source_question_id"]].split())
        assert " ".join(passage.split()) in source
        for sentence in (rec.get("reference") or [""])[0].splitlines():
            assert sentence in passage


def test_build_script_regenerates_the_committed_files(tmp_path):
    proc = subprocess.run([sys.executable, str(SETS_DIR / "build_prompts.py"), "--source", str(PROMPTS_DIR),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in ("code_edit", "qa_passage"):
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (SETS_DIR / f"{name}.jsonl").read_bytes()
    bad = subprocess.run([sys.executable, str(SETS_DIR / "build_prompts.py"), "--source", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
