"""The copy-heavy prompt sets in benchmarks/prompts load as bench prompt sets and ask for what they promise."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from eagle2_local.bench.prompt_sets import load_prompt_sets
from tests.support.prompts import PROMPTS_DIR

SETS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts"
FENCE = re.compile(r"```python\n(.*?)```", re.S)


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (SETS_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def build_constant(name: str):
    """A module-level constant of build_prompts.py, read from its source (the script is run, not imported)."""
    tree = ast.parse((SETS_DIR / "build_prompts.py").read_text(encoding="utf-8"))
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
    return ast.literal_eval(value)


SIZES = {"code_edit": 20, "code_edit_short": 24, "edit_chat": 16, "extract": 32, "extract_schema": 24,
         "qa_passage": 20, "long_rag": 12, "long_sum": 12, "long_chat": 8}
LONG = ("long_rag", "long_sum", "long_chat")


def test_sets_load_with_bench_loader():
    sets = {s.name: s.prompts for s in load_prompt_sets([str(SETS_DIR)], None)}
    assert {name: len(p) for name, p in sets.items()} == SIZES
    assert [len(s.prompts) for s in load_prompt_sets([str(SETS_DIR)], 2)] == [2] * len(SIZES)
    chats = next(s for s in load_prompt_sets([str(SETS_DIR)], None) if s.name == "edit_chat")
    assert [len(chats.turns(i)) for i in range(len(chats.prompts))] == [4, 3] * 8
    long_chats = next(s for s in load_prompt_sets([str(SETS_DIR)], None) if s.name == "long_chat")
    assert [len(long_chats.turns(i)) for i in range(len(long_chats.prompts))] == [4, 3] * 4
    held = {s.name: len(s.prompts) for s in load_prompt_sets([str(SETS_DIR)], None, "heldout")}
    tune = {s.name: len(s.prompts) for s in load_prompt_sets([str(SETS_DIR)], None, "tune")}
    assert held == {"code_edit": 5, "code_edit_short": 4, "edit_chat": 4, "extract": 8, "extract_schema": 6,
                    "qa_passage": 4, "long_rag": 3, "long_sum": 3, "long_chat": 2}
    assert {name: held[name] + tune[name] for name in SIZES} == SIZES


def test_every_set_holds_back_every_fourth_record_of_each_category():
    for name in SIZES:
        recs = records(name)
        for category in {r["category"] for r in recs}:
            splits = [r["split"] for r in recs if r["category"] == category]
            assert splits == ["heldout" if i % 4 == 3 else "tune" for i in range(len(splits))], (name, category)
        assert any(r["split"] == "heldout" for r in recs)


def test_code_edit_short_answers_are_short_exact_edits(smollm2_path):
    """The promise: the whole answer (the edited function, fenced) is under 120 tokens. The builder bounds it at
    240 characters; here the default model's tokenizer counts it."""
    from eagle2_local.llamacpp.llama import LlamaModel

    model = LlamaModel(smollm2_path)
    recs = records("code_edit_short")
    assert {r["category"].split("/")[1] for r in recs} == {"fix_bug", "rename", "rename_arg", "rename_function"}
    for rec in recs:
        (given,) = FENCE.findall(rec["turns"][0])
        answer = rec["reference"][0]
        (expected,) = FENCE.findall(answer)
        assert len(answer) <= 240 and len(model.tokenize(answer, add_special=False, parse_special=False)) < 120
        assert expected != given and len(expected.splitlines()) == len(given.splitlines())
        fn = next(n for n in ast.parse(expected).body if isinstance(n, ast.FunctionDef))
        assert ast.get_docstring(fn) is None  # docstrings are dropped so answers stay short


def test_edit_chats_paste_a_file_then_ask_for_edits():
    recs = records("edit_chat")
    assert len(recs) >= 8 and {len(r["turns"]) for r in recs} == {3, 4}
    for rec in recs:
        first, *rest = rec["turns"]
        (file,) = FENCE.findall(first)
        names = [n.name for n in ast.parse(file).body if isinstance(n, ast.FunctionDef)]
        assert len(names) == 3 and first.startswith("Here is my file:")
        for turn, name in zip(rec["turns"], names):  # turn k edits function k
            assert f"Return the whole updated function `{name}`" in turn
        assert all("```python\n" not in t for t in rest)  # later turns refer to the pasted file
        assert rec["category"] == f"edit_chat/{len(rec['turns'])}_turns"


def test_extract_references_are_copied_from_the_passage():
    recs = records("extract")
    assert {r["category"].split("/")[1] for r in recs} == {"sentence", "numbers", "quotes", "names"}
    for rec in recs:
        _question, passage = rec["turns"][0].split("\n\nPassage:\n")
        assert 120 <= len(passage.split()) <= 250
        for line in rec["reference"][0].splitlines():
            part = line.split(": ", 1)[1] if rec["category"] == "extract/numbers" else line
            assert part in passage, (rec["question_id"], line)


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


def test_mixed_kinds_alternates_copies_with_paraphrases_and_holds_out_its_second_cycle():
    """Answers of one kind after another's, in one file (a bench or replay keeps one model across a file): the
    tune cycle's records come from the built sets' tune records and EAGLE's first, the held-out cycle's from
    held-out records and EAGLE records past the tune cycle's; the folder's own sets leave it out."""
    mixed = records("mixed/mixed_kinds")
    first_heldout = build_constant("MIXED_EAGLE_HELDOUT")
    assert len(mixed) == 24 and [r["split"] for r in mixed] == ["tune"] * 12 + ["heldout"] * 12
    assert [r["source"] for r in mixed[:12]] == [r["source"] for r in mixed[12:]]
    assert {mixed[i]["source"] for i in (0, 1)} == {"code_edit_short", "sum"}
    for rec in mixed:
        if rec["source"] in SIZES:
            (source,) = [s for s in records(rec["source"]) if s["question_id"] == rec["source_question_id"]]
            assert source["split"] == rec["split"]
        else:
            eagle = records(f"eagle/{rec['source']}")
            (at,) = [i for i, s in enumerate(eagle) if s["question_id"] == rec["source_question_id"]]
            assert (at >= first_heldout) == (rec["split"] == "heldout")
            source = eagle[at]
        assert source["turns"][0] == rec["turns"][0]
    assert "mixed_kinds" not in {s.name for s in load_prompt_sets([str(SETS_DIR)], None)}
    assert [len(s.prompts) for s in load_prompt_sets([str(SETS_DIR / "mixed")], None, "heldout")] == [12]


def test_build_script_regenerates_the_committed_files(tmp_path):
    proc = subprocess.run([sys.executable, str(SETS_DIR / "build_prompts.py"), "--source", str(PROMPTS_DIR),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{name}.jsonl" for name in SIZES] + ["mixed"])
    for name in [*SIZES, "mixed/mixed_kinds"]:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (SETS_DIR / f"{name}.jsonl").read_bytes()
    bad = subprocess.run([sys.executable, str(SETS_DIR / "build_prompts.py"), "--source", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_extract_schema_records_constrain_their_answers(smollm2_path):
    """Every record's schema compiles for llama.cpp's grammar engine, the loader attaches it, and it admits the
    record asked for and refuses one with a field missing; the passages are not those of ``extract``."""
    from eagle2_local.decoding.grammar import Grammar
    from eagle2_local.llamacpp.llama import LlamaModel

    recs = records("extract_schema")
    (loaded,) = [s for s in load_prompt_sets([str(SETS_DIR / "extract_schema.jsonl")], None)]
    assert all(loaded.grammar(i) == Grammar.from_json_schema(r["schema"]) for i, r in enumerate(recs))
    assert not {r["source_question_id"] for r in recs} & {r["source_question_id"] for r in records("extract")}
    model = LlamaModel(smollm2_path)
    samples = {"article": {"headline": "A pig", "people": ["Zhu Diandian"], "places": [], "numbers": [5, 1.5],
                           "key_quote": "She walks it.", "tone": "neutral"},
               "event": {"event": "a walk", "who": ["Zhu"], "where": "China", "when": "", "first_sentence": "A.",
                         "confirmed": True}}
    for rec in recs[:2]:
        kind = rec["category"].split("/")[1]
        assert set(rec["schema"]["required"]) == set(samples[kind]) and 5 <= len(samples[kind]) <= 8
        words = rec["turns"][0].split("Passage:\n", 1)[1].split()
        assert 120 <= len(words) <= 250
        for record, valid in ((samples[kind], True), ({k: v for k, v in list(samples[kind].items())[:-1]}, False)):
            state = Grammar.from_json_schema(rec["schema"]).state(model)
            tokens = model.tokenize(json.dumps(record), add_special=False, parse_special=False)
            ok = True
            for tok in tokens:
                if not state.allows(tok):
                    ok = False
                    break
                state.accept(tok)
            state.close()
            assert ok == valid, (kind, record)


DOCUMENT = re.compile(r"Document (\d+):\n(.*?)(?=\n\nDocument \d+:\n|\n\nQuestion: |\Z)", re.S)


def test_long_sets_fill_their_context(smollm2_path):
    """The promise of issue 44's long-context sets, counted with the default model's tokenizer: every long_rag and
    long_sum prompt holds 1.5k-3k tokens, every long_chat's user turns 2k-3k (so the chat grows past 2k tokens
    and, with 128-token answers, still fits bench's 4096-token context)."""
    from eagle2_local.llamacpp.llama import LlamaModel

    model = LlamaModel(smollm2_path)
    for name in LONG:
        for rec in records(name):
            n = sum(len(model.tokenize(t, add_special=False, parse_special=False)) for t in rec["turns"])
            low = 2000 if name == "long_chat" else 1500
            assert low <= n <= 3000, (name, rec["question_id"], n)


def test_long_documents_are_the_articles_and_answers_are_in_them():
    articles = {rec["question_id"]: " ".join(rec["turns"][0].split()).removeprefix("Summarize: ")
                for rec in map(json.loads, (PROMPTS_DIR / "sum.jsonl").read_text(encoding="utf-8").splitlines())}
    kinds = {"long_rag": {"quotes", "numbers", "two_docs"}, "long_sum": {"summaries", "quoted", "bullets"}}
    for name, expected in kinds.items():
        recs = records(name)
        assert {r["category"].split("/")[1] for r in recs} == expected
        ids = [q for r in recs for q in r["source_question_ids"]]
        assert len(ids) == len(set(ids))  # no article twice in a set
        for rec in recs:
            (turn,) = rec["turns"]
            docs = DOCUMENT.findall(turn)
            assert [int(k) for k, _d in docs] == list(range(1, len(rec["source_question_ids"]) + 1))
            assert (3 <= len(docs) <= 5) if name == "long_rag" else len(docs) == 2
            for (_k, doc), qid in zip(docs, rec["source_question_ids"]):
                # long_rag cuts an article at a sentence end (a retrieved chunk); long_sum pastes it whole
                assert articles[qid].startswith(doc) if name == "long_rag" else articles[qid] == doc
            if name == "long_rag":
                assert turn.startswith("Answer the question using only") and "\n\nQuestion: " in turn
            for line in (rec.get("reference") or [""])[0].splitlines():
                if rec["category"] == "long_rag/quotes" and re.fullmatch(r"Document \d+", line):
                    continue
                part = line.split(": ", 1)[1] if re.match(r"Document \d+: |[\d,.]+: ", line) else line
                assert any(part in doc for _k, doc in docs), (name, rec["question_id"], line)


def test_long_chats_paste_two_articles():
    recs = records("long_chat")
    ids = [q for r in recs for q in r["source_question_ids"]]
    assert len(ids) == len(set(ids))
    for rec in recs:
        turns = rec["turns"]
        assert turns[0].startswith("Here is a news article:\n\n") and turns[2].startswith("Here is a second article")
        assert len(turns[0].split()) >= 800 and len(turns[1].split()) < 40 and len(turns[2].split()) > 200
        assert rec["category"] == f"long_chat/{len(turns)}_turns"
