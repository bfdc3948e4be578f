"""Build the copy-heavy prompt sets (code_edit.jsonl, qa_passage.jsonl) from the EAGLE prompt sets in eagle/.

Lookup drafts pay when the answer repeats its input, so these sets ask for exactly that: edits that return a
whole function, and answers that quote a passage. Everything is derived deterministically from humaneval.jsonl
(function prompt + reference solution) and sum.jsonl (news articles), so rerunning this script rewrites the
same files byte for byte.

Usage: python benchmarks/prompts/build_prompts.py [--source DIR] [--out DIR] [--n 20]
"""

from __future__ import annotations

import argparse
import ast
import doctest
import io
import json
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE / "eagle"
HUMANEVAL_LEAD = "Complete the code I provided."
RETURN_WHOLE = "Return the whole function in a ```python code block."

# Negating a comparison always changes behaviour where it is reached, unlike an off-by-one that may never bite.
NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
FRIENDLY_NAMES = {"i": "index", "j": "inner", "k": "third", "x": "item", "e": "element", "s": "text",
                  "l": "values", "n": "count", "c": "char", "ans": "answer", "res": "result", "lst": "items",
                  "check": "last_word", "s_list": "chars", "char": "letter"}
TYPING_TO_BUILTIN = {"List": "list", "Dict": "dict", "Tuple": "tuple", "Set": "set"}


class BuildError(Exception):
    """Source data that cannot give the requested sets."""


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise BuildError(f"missing source file {path}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


# ---- code_edit ---------------------------------------------------------------------------------------------

def full_function(rec: dict) -> str | None:
    """Signature + docstring + reference body as one clean module, or None if it is not one parsable function."""
    head = rec["turns"][0]
    if not head.startswith(HUMANEVAL_LEAD):
        return None
    head = head[len(HUMANEVAL_LEAD):].strip("\n")
    body = rec["reference"][0]
    code = "\n".join(line.rstrip() for line in (head + "\n" + body).splitlines()).strip("\n") + "\n"
    code = re.sub(r"\n{3,}", "\n\n", code)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    funcs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if len(funcs) != 1 or len(funcs[0].body) < 2:
        return None
    return code


def the_function(code: str) -> ast.FunctionDef:
    return next(node for node in ast.parse(code).body if isinstance(node, ast.FunctionDef))


def body_start_line(fn: ast.FunctionDef) -> int:
    """First line (1-based) after the docstring: edits and injected bugs stay out of the docstring."""
    first = fn.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return (first.end_lineno + 1) if has_doc else first.lineno


def replace_tokens(code: str, pick) -> tuple[str, int]:
    """Rewrite tokens for which pick(tok) returns a string; returns (code, count). Keeps layout byte for byte."""
    lines = code.splitlines(keepends=True)
    edits = []
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        new = pick(tok)
        if new is not None:
            edits.append((tok.start, tok.end, new))
    for (srow, scol), (_erow, ecol), new in reversed(edits):
        line = lines[srow - 1]
        lines[srow - 1] = line[:scol] + new + line[ecol:]
    return "".join(lines), len(edits)


def passes_doctests(code: str) -> bool | None:
    """Run the docstring's >>> examples; None when there are none to run."""
    namespace: dict = {}
    try:
        exec(compile(code, "<humaneval>", "exec"), namespace)  # reference solutions from the EAGLE humaneval set
    except Exception:
        return None
    fn = namespace.get(the_function(code).name)
    tests = doctest.DocTestFinder(recurse=False).find(fn, globs=namespace)
    if not tests or not tests[0].examples:
        return None
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test, out=lambda _s: None)
    return runner.failures == 0


def edit_type_hints(code: str) -> dict | None:
    return {"kind": "type_hints", "text": "Rewrite this function with type hints on every variable: the "
            "arguments, the return value and every local variable where it is first assigned. Keep the "
            "docstring and the logic unchanged. " + RETURN_WHOLE, "code": code}


def edit_comments(code: str) -> dict | None:
    return {"kind": "comments", "text": "Add a comment above every line of this function's body explaining "
            "what that line does. Do not change any code. " + RETURN_WHOLE, "code": code}


def local_names(fn: ast.FunctionDef) -> list[str]:
    """Names assigned inside the body (loop variables, assignments, comprehension targets), in order of appearance."""
    seen: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in seen:
            seen.append(node.id)
    return sorted(seen, key=lambda name: min(n.lineno for n in ast.walk(fn)
                                             if isinstance(n, ast.Name) and n.id == name))


def edit_rename(code: str) -> dict | None:
    fn = the_function(code)
    used = {tok.string for tok in tokenize.generate_tokens(io.StringIO(code).readline)}
    args = {a.arg for a in fn.args.args}
    doc = ast.get_docstring(fn) or ""
    for old in local_names(fn):
        new = FRIENDLY_NAMES.get(old, f"{old}_value")
        # Arguments and words of the docstring would make "rename everywhere" ambiguous.
        if new in used or old == fn.name or old in args or re.search(rf"\b{old}\b", doc):
            continue
        renamed, count = replace_tokens(code, lambda t: new if t.type == tokenize.NAME and t.string == old else None)
        if count >= 2:
            return {"kind": "rename", "text": f"Rename the variable `{old}` to `{new}` everywhere in this "
                    f"function and change nothing else. {RETURN_WHOLE}", "code": code, "reference": renamed}
    return None


def edit_fix_bug(code: str) -> dict | None:
    """Negate the first comparison after the docstring; kept only if the docstring's examples catch it."""
    if passes_doctests(code) is not True:
        return None
    start = body_start_line(the_function(code))
    done = []

    def pick(tok: tokenize.TokenInfo) -> str | None:
        if not done and tok.type == tokenize.OP and tok.string in NEGATED and tok.start[0] >= start:
            done.append(tok.string)
            return NEGATED[tok.string]
        return None

    buggy, count = replace_tokens(code, pick)
    if count != 1 or passes_doctests(buggy) is not False:
        return None
    return {"kind": "fix_bug", "text": "Fix this function so it behaves as its docstring describes: one "
            "comparison in it is wrong. Change only what is needed. " + RETURN_WHOLE, "code": buggy,
            "reference": code}


def edit_validation(code: str) -> dict | None:
    args = the_function(code).args.args
    if not args:
        return None
    checks = []
    for a in args:
        if a.annotation is not None:
            kind = ast.unparse(a.annotation).split("[")[0]
            checks.append(f"`{a.arg}` is not a `{TYPING_TO_BUILTIN.get(kind, kind)}`")
        else:
            checks.append(f"`{a.arg}` is None")
    return {"kind": "validation", "text": "Add input validation at the start of this function that raises "
            f"ValueError with a clear message if {' or if '.join(checks)}. Keep the rest of the function "
            "unchanged. " + RETURN_WHOLE, "code": code}


EDITS = [edit_type_hints, edit_rename, edit_comments, edit_fix_bug, edit_validation]


def take_in_turn(sources: list[tuple[int, object]], makers: list, n: int, set_name: str, render) -> list[dict]:
    """Makers take turns; each uses the next unused source (file order) it applies to. render(item) -> turn, reference."""
    used: set[int] = set()
    out = []
    for i in range(n):
        make = makers[i % len(makers)]
        for qid, source in sources:
            if qid in used or (item := make(source)) is None:
                continue
            used.add(qid)
            turn, reference = render(item, source)
            rec = {"question_id": i, "category": f"{set_name}/{item['kind']}", "turns": [turn],
                   "source_question_id": qid}
            if reference is not None:
                rec["reference"] = [reference]
            out.append(rec)
            break
        else:
            raise BuildError(f"ran out of source records for {set_name} kind {make.__name__}")
    return out


def build_code_edit(humaneval: list[dict], n: int) -> list[dict]:
    funcs = [(rec["question_id"], code) for rec in humaneval if (code := full_function(rec))]

    def render(edit: dict, _code: str) -> tuple[str, str | None]:
        ref = edit.get("reference")
        return f"{edit['text']}\n\n```python\n{edit['code']}```", (f"```python\n{ref}```" if ref else None)

    return take_in_turn(funcs, EDITS, n, "code_edit", render)


# ---- qa_passage --------------------------------------------------------------------------------------------

SENTENCE_END = re.compile(r"(?<=[.!?])[\"'\u201d\u2019]?\s+(?=[\"'\u201c\u2018(]?[A-Z0-9])")
QUOTE = re.compile(r"[\"\u201c\u201d]|'[^']{12,}'")
NUMBER = re.compile(r"\b\d[\d,.]*\b")
STOP = {"The", "A", "An", "But", "And", "In", "On", "At", "He", "She", "It", "They", "We", "I", "His", "Her",
        "This", "That", "There", "Their", "As", "If", "When", "While", "After", "Before", "For", "Of", "To",
        "Mr", "Mrs", "Ms", "Dr", "Scroll", "CLICK", "Daily", "Mail", "MailOnline", "Online"}


def sentences(text: str) -> list[str]:
    """Split at sentence ends; good enough for news prose, and the passage is cut only at these points."""
    parts = []
    pos = 0
    for m in SENTENCE_END.finditer(text):
        end = m.start() + len(m.group(0).rstrip())
        parts.append(text[pos:end].strip())
        pos = m.end()
    parts.append(text[pos:].strip())
    return [p for p in parts if p]


def cut_passage(article: str, low: int = 250, high: int = 400) -> list[str] | None:
    taken: list[str] = []
    words = 0
    for s in sentences(article):
        w = len(s.split())
        if words + w > high:
            break
        taken.append(s)
        words += w
    return taken if words >= low else None


def top_name(passage: list[str]) -> str | None:
    """The capitalised word (not sentence-initial, not a stopword) found in the most sentences, at least two."""
    counts: Counter[str] = Counter()
    for s in passage:
        words = re.findall(r"[A-Za-z][A-Za-z'-]+", s)
        counts.update({w for w in words[1:] if w[0].isupper() and w not in STOP and len(w) > 2})
    if not counts:
        return None
    name, hits = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return name if hits >= 2 else None


def qa_quotes(passage: list[str]) -> dict | None:
    if sum(bool(QUOTE.search(s)) for s in passage) < 2:
        return None
    return {"kind": "quotes", "text": "Using only the passage below, list every person named in it and what "
            "they said, quoting their words exactly."}


def qa_mentions(passage: list[str]) -> dict | None:
    name = top_name(passage)
    if name is None:
        return None
    hits = [s for s in passage if re.search(rf"\b{re.escape(name)}\b", s)]
    return {"kind": "mentions", "text": f"Which sentences of the passage below mention {name}? Quote them "
            "exactly, one per line.", "reference": "\n".join(hits)}


def qa_numbers(passage: list[str]) -> dict | None:
    hits = [s for s in passage if NUMBER.search(s)]
    if len(hits) < 2:
        return None
    return {"kind": "numbers", "text": "Using only the passage below, list every number written in digits, "
            "each followed by the sentence it comes from, quoted exactly.", "reference": "\n".join(hits)}


def qa_facts(passage: list[str]) -> dict | None:
    return {"kind": "facts", "text": "Using only the passage below, list the facts it states about who did "
            "what, when and where, one per line, quoting the passage's own words for each."}


QUESTIONS = [qa_quotes, qa_mentions, qa_numbers, qa_facts]


def build_qa_passage(articles: list[dict], n: int) -> list[dict]:
    passages = []
    for rec in articles:
        text = rec["turns"][0]
        text = text[len("Summarize:"):].strip() if text.startswith("Summarize:") else text.strip()
        if (cut := cut_passage(text)) is not None:
            passages.append((rec["question_id"], cut))
    return take_in_turn(passages, QUESTIONS, n, "qa_passage",
                        lambda q, passage: (f"{q['text']}\n\nPassage:\n{' '.join(passage)}", q.get("reference")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                    help="folder with humaneval.jsonl and sum.jsonl (default: eagle/ in this folder)")
    ap.add_argument("--out", type=Path, default=HERE, help="where to write the sets (default: this folder)")
    ap.add_argument("--n", type=int, default=20, help="prompts per set")
    args = ap.parse_args(argv)
    try:
        if args.n < 1:
            raise BuildError("--n must be at least 1")
        code = build_code_edit(read_jsonl(args.source / "humaneval.jsonl"), args.n)
        qa = build_qa_passage(read_jsonl(args.source / "sum.jsonl"), args.n)
        args.out.mkdir(parents=True, exist_ok=True)
        write_jsonl(args.out / "code_edit.jsonl", code)
        write_jsonl(args.out / "qa_passage.jsonl", qa)
    except (BuildError, OSError, json.JSONDecodeError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(code)} code_edit and {len(qa)} qa_passage prompts to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
