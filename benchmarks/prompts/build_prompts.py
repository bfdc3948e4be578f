"""Build the copy-heavy prompt sets (code_edit, code_edit_short, edit_chat, qa_passage, extract, extract_schema),
the long-context ones (long_rag, long_sum, long_chat) and mixed/mixed_kinds (answers of one kind after another's)
from eagle/.

Lookup drafts pay when the answer repeats its input, so these sets ask for exactly that: edits that return a
whole function (short ones too, where a draft must pay from its first rounds), multi-turn chats about a pasted
file, answers that quote or extract from a passage, and extraction into a JSON record whose schema constrains
the answer (each record's ``schema``). The long-context sets put 1.5k-3k tokens of news articles, numbered as
documents, around a retrieval question or a summary request, or paste them into chats that grow past 2k tokens.
Everything is derived deterministically from humaneval.jsonl (function prompt + reference solution) and
sum.jsonl (news articles), so rerunning this script rewrites the same files byte for byte. Every record
carries a ``split``: "heldout" for every 4th record of each category, "tune" for the rest, so that settings tuned
on a set can be checked on prompts tuning never saw.

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


# Sizes of the newer sets. code_edit_short: four kinds, 6 each (only 8 short functions take a bug the docstring
# examples catch, and other kinds use some first); extract: four kinds, 8 each; edit_chat: 8 three-turn and 8
# four-turn chats.
N_SHORT = 24
N_CHATS = 16
N_EXTRACT = 32
N_SCHEMA = 24


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
    try:
        tests = doctest.DocTestFinder(recurse=False).find(fn, globs=namespace)
    except ValueError:  # examples doctest cannot parse (e.g. a "\n" inside one) test nothing
        return None
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


HELDOUT_EVERY = 4  # every 4th record of each category is held out


def with_splits(records: list[dict]) -> list[dict]:
    """Mark every ``HELDOUT_EVERY``-th record of each category "heldout", the rest "tune".

    Counted per category, not over the file: kinds take turns, so a file-wide "every 4th" would hold out one
    kind only when a set has four kinds. Returns the records (changed in place)."""
    seen: Counter[str] = Counter()
    for rec in records:
        seen[rec["category"]] += 1
        rec["split"] = "heldout" if seen[rec["category"]] % HELDOUT_EVERY == 0 else "tune"
    return records


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
    return with_splits(out)


def build_code_edit(humaneval: list[dict], n: int) -> list[dict]:
    funcs = [(rec["question_id"], code) for rec in humaneval if (code := full_function(rec))]

    def render(edit: dict, _code: str) -> tuple[str, str | None]:
        ref = edit.get("reference")
        return f"{edit['text']}\n\n```python\n{edit['code']}```", (f"```python\n{ref}```" if ref else None)

    return take_in_turn(funcs, EDITS, n, "code_edit", render)


# ---- code_edit_short ---------------------------------------------------------------------------------------

# The whole answer (the edited function in a ```python block) must stay under 120 tokens. The builder needs no
# model, so it bounds characters: on every humaneval function SmolLM2's tokenizer (the default model) spends at
# most 0.49 tokens per character of such a block, so 240 characters stay under ~118 tokens (other tokenizers,
# e.g. Qwen2.5's, were not measured here). tests/bench/test_prompt_sets.py checks the real count with SmolLM2.
SHORT_ANSWER_CHARS = 240
MAX_SPEC_CHARS = 300


def doc_lead(fn: ast.FunctionDef) -> str | None:
    """The docstring's first paragraph on one line (examples dropped), or None when missing or over
    ``MAX_SPEC_CHARS``: what the function is for, said in the request so the answer need not repeat it."""
    doc = ast.get_docstring(fn) or ""
    lead = re.split(r"\n\s*\n|>>>|\bExamples?\b|\bFor example\b|\bExample:", doc)[0]
    lead = " ".join(lead.split())
    return lead if lead and len(lead) <= MAX_SPEC_CHARS else None


def shorten(code: str) -> str:
    """``code`` without its docstring (imports and the body byte for byte): humaneval docstrings are mostly
    test cases, and re-emitting them would make every answer long."""
    fn = the_function(code)
    first = fn.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return code
    lines = code.splitlines(keepends=True)
    rest = lines[first.end_lineno:]
    while rest and not rest[0].strip():  # the blank line that followed the docstring
        rest = rest[1:]
    return "".join(lines[:first.lineno - 1] + rest)


def fits_short(edit: dict | None) -> dict | None:
    """Keep an edit only if its expected answer, fenced, is within ``SHORT_ANSWER_CHARS``."""
    if edit is None or len(f"```python\n{edit['reference']}```") > SHORT_ANSWER_CHARS:
        return None
    return edit


def rename_everywhere(code: str, old: str, new: str) -> str:
    """Every NAME token ``old`` renamed (strings and comments untouched): the exact answer to a rename request."""
    return replace_tokens(code, lambda t: new if t.type == tokenize.NAME and t.string == old else None)[0]


def short_rename(full: str) -> dict | None:
    return fits_short(edit_rename(shorten(full)))


def short_rename_arg(full: str) -> dict | None:
    """Rename the first argument whose new name is free."""
    code = shorten(full)
    fn = the_function(code)
    used = {tok.string for tok in tokenize.generate_tokens(io.StringIO(code).readline)}
    for arg in fn.args.args:
        old = arg.arg
        new = FRIENDLY_NAMES.get(old, f"{old}_value")
        if new in used:
            continue
        return fits_short({"kind": "rename_arg", "text": f"Rename the argument `{old}` to `{new}` everywhere in "
                           f"this function and change nothing else. {RETURN_WHOLE}", "code": code,
                           "reference": rename_everywhere(code, old, new)})
    return None


def short_rename_function(full: str) -> dict | None:
    """snake_case name to camelCase (recursive calls too); only names with an underscore."""
    code = shorten(full)
    fn = the_function(code)
    parts = fn.name.split("_")
    new = parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])
    if "_" not in fn.name.strip("_") or new == fn.name:
        return None
    return fits_short({"kind": "rename_function", "text": f"Rename the function `{fn.name}` to `{new}` and change "
                       f"nothing else. {RETURN_WHOLE}", "code": code, "reference": rename_everywhere(code, fn.name, new)})


def short_fix_bug(full: str) -> dict | None:
    """The bug is injected and checked on the full function (its docstring examples must catch it); the request
    states the docstring's first paragraph, and both versions lose the docstring."""
    edit = edit_fix_bug(full)
    spec = doc_lead(the_function(full))
    if edit is None or spec is None:
        return None
    return fits_short({"kind": "fix_bug", "text": f"This function should do the following: {spec} One comparison "
                       f"in it is wrong. Fix it and change nothing else. {RETURN_WHOLE}",
                       "code": shorten(edit["code"]), "reference": shorten(edit["reference"])})


SHORT_EDITS = [short_fix_bug, short_rename, short_rename_arg, short_rename_function]  # the scarcest first


def build_code_edit_short(humaneval: list[dict], n: int) -> list[dict]:
    """Short edits in turn, each on the next function it fits; every record has its exact expected answer."""
    funcs = [(rec["question_id"], code) for rec in humaneval if (code := full_function(rec))]

    def render(edit: dict, _code: str) -> tuple[str, str]:
        return f"{edit['text']}\n\n```python\n{edit['code']}```", f"```python\n{edit['reference']}```"

    return take_in_turn(funcs, SHORT_EDITS, n, "code_edit_short", render)


# ---- edit_chat ---------------------------------------------------------------------------------------------

CHAT_FUNCTIONS = 3
CHAT_EDITS = [edit_type_hints, edit_rename, edit_comments, edit_validation]
WHOLE_FILE = "Now return the whole file with all the changes so far, in one ```python code block."


def split_imports(code: str) -> tuple[list[str], str]:
    """A function module's top-level import lines, and the rest (the function), so files can hoist imports."""
    tree = ast.parse(code)
    lines = code.splitlines(keepends=True)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    drop = {i for n in imports for i in range(n.lineno - 1, n.end_lineno)}
    rest = "".join(line for i, line in enumerate(lines) if i not in drop).strip("\n") + "\n"
    return ["".join(lines[n.lineno - 1:n.end_lineno]).rstrip("\n") for n in imports], rest


def make_file(codes: list[str]) -> str:
    """Functions joined into one module: their imports first (deduplicated, in order), two blank lines apart."""
    imports: list[str] = []
    bodies = []
    for code in codes:
        imps, body = split_imports(code)
        imports += [i for i in imps if i not in imports]
        bodies.append(body)
    head = "\n".join(imports) + "\n\n\n" if imports else ""
    return head + "\n\n".join(bodies)


def chat_edit(i: int, k: int, code: str) -> dict:
    """Turn ``k`` of chat ``i`` edits ``code`` with the next edit kind (in turn) that applies to it."""
    for step in range(len(CHAT_EDITS)):
        edit = CHAT_EDITS[(i + k + step) % len(CHAT_EDITS)](code)
        if edit is not None:
            return edit
    raise BuildError("no chat edit applies")  # edit_type_hints always applies


def build_edit_chat(humaneval: list[dict], n: int) -> list[dict]:
    """Chat ``i`` pastes a file of the next ``CHAT_FUNCTIONS`` functions (file order) and asks for one edit of
    each in turn; every even-numbered chat ends with a fourth turn asking for the whole file back."""
    funcs = [(rec["question_id"], code) for rec in humaneval if (code := full_function(rec))]
    if len(funcs) < n * CHAT_FUNCTIONS:
        raise BuildError(f"edit_chat needs {n * CHAT_FUNCTIONS} functions, the source has {len(funcs)}")
    out = []
    for i in range(n):
        group = funcs[i * CHAT_FUNCTIONS:(i + 1) * CHAT_FUNCTIONS]
        turns = []
        for k, (_qid, code) in enumerate(group):
            name = the_function(code).name
            edit = chat_edit(i, k, code)
            ask = (edit["text"].replace(RETURN_WHOLE, "").strip()
                   .replace("this function's body", f"the body of `{name}`").replace("this function", f"`{name}`")
                   + f" Return the whole updated function `{name}` in a ```python code block.")
            turns.append(f"Here is my file:\n\n```python\n{make_file([c for _q, c in group])}```\n\n{ask}"
                         if k == 0 else ask)
        if i % 2 == 0:
            turns.append(WHOLE_FILE)
        out.append({"question_id": i, "category": f"edit_chat/{len(turns)}_turns", "turns": turns,
                    "source_question_ids": [qid for qid, _c in group]})
    return with_splits(out)


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


# ---- extract -----------------------------------------------------------------------------------------------

# Double-quoted, or single-quoted as the Daily Mail's articles quote (apostrophes inside words allowed).
QUOTED = re.compile(r"[\"\u201c]([^\"\u201c\u201d]{12,}?)[\"\u201d]|(?<!\w)'((?:[^']|(?<=\w)'(?=\w)){12,}?)'(?!\w)")
NAME_RUN = re.compile(r"\b[A-Z][a-z]+(?:-[A-Z][a-z]+)*(?: [A-Z][a-z]+(?:-[A-Z][a-z]+)*)*\b")
CALENDAR = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "January", "February",
            "March", "April", "June", "July", "August", "September", "October", "November", "December"}


def names_in_order(passage: list[str]) -> list[str]:
    """Runs of capitalised words (leading stopwords, weekdays and months dropped, and a lone sentence-initial
    word), in order of first appearance: a guide for reading answers, since a regular expression cannot tell a
    name from a capitalised common word."""
    seen: list[str] = []
    for s in passage:
        for m in NAME_RUN.finditer(s):
            words = m.group(0).split(" ")
            while words and (words[0] in STOP or words[0] in CALENDAR or (m.start() == 0 and len(words) == 1)):
                words = words[1:]
            name = " ".join(words)
            if len(name) > 2 and name not in seen:
                seen.append(name)
    return seen


def ex_sentence(passage: list[str]) -> dict | None:
    """The first capitalised word (not a stopword) that occurs in exactly one sentence, so the answer is one."""
    for s in passage:
        for word in re.findall(r"[A-Za-z][A-Za-z'-]+", s)[1:]:
            if word[0].isupper() and word not in STOP and len(word) > 3:
                hits = [t for t in passage if re.search(rf"\b{re.escape(word)}\b", t)]
                if len(hits) == 1:
                    return {"kind": "sentence", "text": f"Quote the sentence of the passage below that mentions "
                            f"{word}, exactly as written.", "reference": hits[0]}
    return None


def ex_numbers(passage: list[str]) -> dict | None:
    rows = [f"{m.group(0).rstrip('.,')}: {s}" for s in passage for m in NUMBER.finditer(s)]
    if len(rows) < 3:
        return None
    return {"kind": "numbers", "text": "List every number written in digits in the passage below, in the order "
            "they appear, each followed by a colon and the sentence it comes from, copied exactly.",
            "reference": "\n".join(rows)}


def ex_quotes(passage: list[str]) -> dict | None:
    quotes = [m.group(1) or m.group(2) for s in passage for m in QUOTED.finditer(s)]
    if len(quotes) < 2:
        return None
    return {"kind": "quotes", "text": "Copy every remark in quotation marks from the passage below, in order, one "
            "per line, word for word.", "reference": "\n".join(quotes)}


def ex_names(passage: list[str]) -> dict | None:
    names = names_in_order(passage)
    if len(names) < 3:
        return None
    return {"kind": "names", "text": "Copy the names of the people, places and organisations in the passage "
            "below in the order they first appear, one per line, spelled exactly as in the passage.",
            "reference": "\n".join(names)}


EXTRACTIONS = [ex_sentence, ex_numbers, ex_quotes, ex_names]


def build_extract(articles: list[dict], n: int) -> list[dict]:
    """Shorter passages than qa_passage (120-250 words): extraction answers are mostly copied, so the passage,
    not the answer, is what makes a prompt long."""
    passages = []
    for rec in articles:
        text = rec["turns"][0]
        text = text[len("Summarize:"):].strip() if text.startswith("Summarize:") else text.strip()
        if (cut := cut_passage(text, low=120, high=250)) is not None:
            passages.append((rec["question_id"], cut))
    return take_in_turn(passages, EXTRACTIONS, n, "extract",
                        lambda q, passage: (f"{q['text']}\n\nPassage:\n{' '.join(passage)}", q.get("reference")))


# ---- extract_schema ----------------------------------------------------------------------------------------

STRINGS = {"type": "array", "items": {"type": "string"}}
# Two record shapes take turns; every field is required and nothing else is allowed, so a valid answer is
# exactly the record asked for (5-6 fields, some copied from the passage, some written).
SCHEMAS = {
    "article": ("headline (a short title you write), people (the people named in the passage, spelled as "
                "written), places (the place names, as written), numbers (every number written in digits, in "
                "order), key_quote (the passage's most important sentence, copied exactly) and tone (positive, "
                "neutral or negative)",
                {"type": "object", "properties": {
                    "headline": {"type": "string"}, "people": STRINGS, "places": STRINGS,
                    "numbers": {"type": "array", "items": {"type": "number"}}, "key_quote": {"type": "string"},
                    "tone": {"type": "string", "enum": ["positive", "neutral", "negative"]}},
                 "required": ["headline", "people", "places", "numbers", "key_quote", "tone"],
                 "additionalProperties": False}),
    "event": ("event (what happened, in a few words), who (the people or organisations involved, as written), "
              "where (the place, as written), when (the time given in the passage, as written, or an empty "
              "string), first_sentence (the passage's first sentence, copied exactly), and confirmed (true if the "
              "passage states it as fact, false if it reports claims or plans)",
              {"type": "object", "properties": {
                  "event": {"type": "string"}, "who": STRINGS, "where": {"type": "string"},
                  "when": {"type": "string"}, "first_sentence": {"type": "string"},
                  "confirmed": {"type": "boolean"}},
               "required": ["event", "who", "where", "when", "first_sentence", "confirmed"],
               "additionalProperties": False}),
}


def build_extract_schema(articles: list[dict], n: int) -> list[dict]:
    """Passages of 120-250 words (articles extract has not used, so the two sets share no passage) turned into
    one JSON record each; the record's ``schema`` is the JSON schema its answer must follow."""
    passages = []
    for rec in articles[::-1]:  # from the end of the file: extract takes passages from its start
        text = rec["turns"][0]
        text = text[len("Summarize:"):].strip() if text.startswith("Summarize:") else text.strip()
        if (cut := cut_passage(text, low=120, high=250)) is not None:
            passages.append((rec["question_id"], cut))
    if len(passages) < n:
        raise BuildError(f"extract_schema needs {n} passages of 120-250 words, the articles give {len(passages)}")
    out = []
    for i, (qid, passage) in enumerate(passages[:n]):
        kind = list(SCHEMAS)[i % len(SCHEMAS)]
        fields, schema = SCHEMAS[kind]
        turn = (f"Read the passage below and answer with one JSON object with these fields: {fields}.\n\n"
                f"Passage:\n{' '.join(passage)}")
        out.append({"question_id": i, "category": f"extract_schema/{kind}", "turns": [turn],
                    "source_question_id": qid, "schema": schema})
    return with_splits(out)


# ---- long_rag, long_sum, long_chat -------------------------------------------------------------------------

# Long-context sets: sum.jsonl articles, several to a prompt. The builder needs no model, so it bounds words:
# SmolLM2's tokenizer (the default model's) spends 1.18-1.64 tokens per word on these articles, 1.33 on average
# (other tokenizers were not measured). Documents of 1,250-2,050 words plus a ~60-word request then average
# 1.7k-2.8k tokens (3.5k at worst), and chats of 1,750-2,100 words of user turns 2.3k-2.8k tokens before their
# answers; tests/bench/test_prompt_sets.py counts the real tokens with SmolLM2 (1.5k-3k, chats 2k-3k).
N_LONG_RAG = 12  # three kinds, 4 each (so each kind has one held-out record)
N_LONG_SUM = 12
N_LONG_CHAT = 8  # four 4-turn and four 3-turn chats
LONG_DOC_WORDS = [(1250, 1650), (1650, 2050)]  # packs alternate: ~1.7k-2.2k and ~2.2k-2.8k tokens
LONG_CHAT_WORDS = (1750, 2100)
LONG_CHAT_FIRST = 800  # the first turn pastes an article of at least this many words
RAG_MIN_DOCS = 3
RAG_CHUNK_WORDS = (150, 600)  # a long_rag document: an article cut at a sentence end to at most 600 words


def article_text(rec: dict) -> str:
    """An article of sum.jsonl, the leading "Summarize:" stripped and whitespace made single spaces (so the
    script's sentences are substrings of it)."""
    text = rec["turns"][0]
    text = text[len("Summarize:"):] if text.startswith("Summarize:") else text
    return " ".join(text.split())


def n_words(text: str) -> int:
    return len(text.split())


def documents(texts: list[str]) -> str:
    return "\n\n".join(f"Document {k}:\n{text}" for k, text in enumerate(texts, 1))


def pack_articles(articles: list[tuple[int, str]], windows: list[tuple[int, int]], min_docs: int,
                  max_docs: int) -> list[list[tuple[int, str]]]:
    """Articles into packs of ``min_docs``-``max_docs`` whose words total ``low``-``high`` (the next of
    ``windows`` in turn for each pack, so a set spans shorter and longer prompts), each article used once: a pack
    starts with the first unused article (file order) and takes the next unused ones that fit (the last one only
    if it brings the pack to ``low``) until it is long enough; an article no pack can start with is skipped."""
    left = list(articles)
    packs = []
    while left:
        low, high = windows[len(packs) % len(windows)]
        pack = [left.pop(0)]
        words = n_words(pack[0][1])
        for art in list(left):
            if words >= low and len(pack) >= min_docs:
                break
            w = n_words(art[1])
            if words + w <= high and (len(pack) + 1 < max_docs or words + w >= low):
                pack.append(art)
                left.remove(art)
                words += w
        if words >= low and len(pack) >= min_docs:
            packs.append(pack)
        else:  # give the others back, in their order; the first article starts no pack
            left = sorted(left + pack[1:], key=articles.index)
    return packs


def proper_words(text: str) -> list[str]:
    """Capitalised words that are not sentence-initial, stopwords, weekdays or months (4+ letters), in order."""
    out: list[str] = []
    for s in sentences(text):
        for word in re.findall(r"[A-Za-z][A-Za-z'-]+", s)[1:]:
            if word[0].isupper() and word not in STOP and word not in CALENDAR and len(word) > 3 and word not in out:
                out.append(word)
    return out


def mentions(word: str, text: str) -> list[str]:
    return [s for s in sentences(text) if re.search(rf"\b{re.escape(word)}\b", s)]


def unique_name(texts: list[str], k: int, most: int = 99) -> str | None:
    """A capitalised word of document ``k`` that no other document contains: the one in the most sentences (at
    most ``most``; ties alphabetical), so "the document that mentions NAME" picks document ``k`` alone."""
    others = " ".join(t for j, t in enumerate(texts) if j != k)
    found = [(len(hits), w) for w in proper_words(texts[k])
             if not re.search(rf"\b{re.escape(w)}\b", others) and 0 < len(hits := mentions(w, texts[k])) <= most]
    return min(found, key=lambda hw: (-hw[0], hw[1]))[1] if found else None


def quoted(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for s in sentences(text) for m in QUOTED.finditer(s)]


def number_rows(text: str) -> list[str]:
    return [f"{m.group(0).rstrip('.,')}: {s}" for s in sentences(text) for m in NUMBER.finditer(s)]


def rag_quotes(texts: list[str], k: int) -> dict | None:
    found = quoted(texts[k])
    if not 2 <= len(found) <= 12 or (name := unique_name(texts, k)) is None:
        return None
    return {"kind": "quotes", "text": f"Which document mentions {name}? Say its number, then copy every remark in "
            "quotation marks from that document, in order, one per line, word for word.",
            "reference": "\n".join([f"Document {k + 1}", *found])}


def rag_numbers(texts: list[str], k: int) -> dict | None:
    rows = number_rows(texts[k])
    if not 3 <= len(rows) <= 12 or (name := unique_name(texts, k)) is None:
        return None
    return {"kind": "numbers", "text": f"In the document that mentions {name}, list every number written in digits, "
            "in the order they appear, each followed by a colon and the sentence it comes from, copied exactly.",
            "reference": "\n".join(rows)}


def rag_two_docs(texts: list[str], k: int) -> dict | None:
    """Sentences about two names, each found in one document only (document ``k`` and the next one)."""
    j = (k + 1) % len(texts)
    first, second = unique_name(texts, k, most=4), unique_name(texts, j, most=4)
    if first is None or second is None:
        return None
    rows = [f"Document {k + 1}: {s}" for s in mentions(first, texts[k])]
    rows += [f"Document {j + 1}: {s}" for s in mentions(second, texts[j])]
    return {"kind": "two_docs", "text": f"Quote every sentence that mentions {first} and every sentence that "
            f"mentions {second}, exactly as written, one per line, each after the number of the document it comes "
            "from (e.g. \"Document 2: ...\").", "reference": "\n".join(rows)}


RAG_QUESTIONS = [rag_quotes, rag_numbers, rag_two_docs]


def pack_maker(ask, rotate: bool = False):
    """``ask`` as a maker for :func:`take_in_turn` over ``(pack index, texts)`` sources. ``rotate``: ``ask(texts, k)``
    asks about document ``k``, tried from ``pack index mod docs`` on, so the answer is not always in one place."""
    def make(source: tuple[int, list[str]]) -> dict | None:
        p, texts = source
        if not rotate:
            return ask(texts)
        return next((q for step in range(len(texts)) if (q := ask(texts, (p + step) % len(texts)))), None)
    make.__name__ = ask.__name__
    return make


def take_packs(packs: list[list[tuple[int, str]]], makers: list, n: int, set_name: str, render) -> list[dict]:
    """:func:`take_in_turn` over packs of articles: each record names its articles in ``source_question_ids``."""
    out = take_in_turn([(p, (p, [t for _q, t in pack])) for p, pack in enumerate(packs)], makers, n, set_name,
                       lambda q, source: render(q, source[1]))
    return [{("source_question_ids" if k == "source_question_id" else k):
             ([qid for qid, _t in packs[v]] if k == "source_question_id" else v) for k, v in rec.items()}
            for rec in out]


def build_long_rag(articles: list[dict], n: int) -> list[dict]:
    """Question kinds take turns, each on the next pack of 3-5 documents (file order) it fits; a document is an
    article cut at a sentence end to at most 600 words, as a retriever returns chunks. The document asked about
    rotates (pack ``p`` tries document ``p mod docs`` first), so the answer is not always in the same place; the
    documents come first and the question last, as a retrieval prompt puts them."""
    chunks = [(rec["question_id"], " ".join(cut)) for rec in articles
              if (cut := cut_passage(article_text(rec), low=RAG_CHUNK_WORDS[0], high=RAG_CHUNK_WORDS[1]))]
    packs = pack_articles(chunks, LONG_DOC_WORDS, min_docs=RAG_MIN_DOCS, max_docs=5)
    return take_packs(packs, [pack_maker(ask, rotate=True) for ask in RAG_QUESTIONS], n, "long_rag",
                      lambda q, texts: (f"Answer the question using only the documents below.\n\n{documents(texts)}"
                                        f"\n\nQuestion: {q['text']}", q["reference"]))


def sum_summaries(texts: list[str]) -> dict | None:
    return {"kind": "summaries", "text": "Summarize each of the documents below in two sentences. Start each "
            "summary with the document's number, as in \"Document 1: ...\"."}


def sum_quoted(texts: list[str]) -> dict | None:
    found = [[q for q in quoted(t)] for t in texts]
    if sum(map(len, found)) < 3:
        return None
    return {"kind": "quoted", "text": "List every person quoted in the documents below, document by document: the "
            "person's name, then what they said, copied word for word from the quotation marks.",
            "reference": "\n".join(f"Document {k}: {q}" for k, qs in enumerate(found, 1) for q in qs)}


def sum_bullets(texts: list[str]) -> dict | None:
    return {"kind": "bullets", "text": "Summarize the documents below as one list of at most eight bullet points, "
            "the most important first; end each point with the document it comes from, as in \"(Document 2)\"."}


SUM_TASKS = [sum_summaries, sum_quoted, sum_bullets]


def build_long_sum(articles: list[dict], n: int) -> list[dict]:
    """Two articles of 400+ words to a prompt (packs taken from the end of the file, where long_rag's are not),
    the request first, then the documents."""
    longer = [(rec["question_id"], text) for rec in articles[::-1] if n_words(text := article_text(rec)) >= 400]
    packs = pack_articles(longer, LONG_DOC_WORDS, min_docs=2, max_docs=2)
    return take_packs(packs, [pack_maker(ask) for ask in SUM_TASKS], n, "long_sum",
                      lambda q, texts: (f"{q['text']}\n\n{documents(texts)}", q.get("reference")))


def build_long_chat(articles: list[dict], n: int) -> list[dict]:
    """Chat ``i`` pastes the next article of ``LONG_CHAT_FIRST``+ words (file order) and asks for a summary, then
    for the sentences about its most-mentioned name; turn 3 pastes a second article (the next unused one, file
    order, that brings the user turns to ``LONG_CHAT_WORDS``) and asks for its numbers; every even-numbered chat
    ends with a fourth turn about both articles."""
    texts = [(rec["question_id"], article_text(rec)) for rec in articles]
    firsts = [(qid, t) for qid, t in texts if n_words(t) >= LONG_CHAT_FIRST
              and top_name(sentences(t)) is not None]
    if len(firsts) < n:
        raise BuildError(f"long_chat needs {n} articles of {LONG_CHAT_FIRST}+ words, the source has {len(firsts)}")
    used = {qid for qid, _t in firsts[:n]}
    low, high = LONG_CHAT_WORDS
    out = []
    for i, (qid_a, a) in enumerate(firsts[:n]):
        name = top_name(sentences(a))
        t1 = f"Here is a news article:\n\n{a}\n\nSummarize it in three sentences."
        t2 = f"Quote every sentence of the article that mentions {name}, exactly as written, one per line."
        ask = ("List every number written in digits in this second article, in order, each followed by a colon and "
               "the sentence it comes from, copied exactly.")
        for qid_b, b in texts:
            t3 = f"Here is a second article:\n\n{b}\n\n{ask}"
            if qid_b in used or len(number_rows(b)) < 2 or not low <= n_words(" ".join([t1, t2, t3])) <= high:
                continue
            used.add(qid_b)
            break
        else:
            raise BuildError(f"long_chat ran out of second articles for chat {i}")
        turns = [t1, t2, t3]
        if i % 2 == 0:
            turns.append("Now write one sentence on what each of the two articles is about, then copy the first "
                         "sentence of each article exactly.")
        out.append({"question_id": i, "category": f"long_chat/{len(turns)}_turns", "turns": turns,
                    "source_question_ids": [qid_a, qid_b]})
    return with_splits(out)


# ---- mixed_kinds --------------------------------------------------------------------------------------------

# Answers of one kind after another's, for the lookup's learned rates that carry from one answer into the next:
# copies (code_edit_short, extract, qa_passage quotes) between paraphrases (EAGLE's sum) and new code (humaneval)
MIXED_CYCLE = ("code_edit_short", "sum", "extract", "humaneval", "qa_passage", "sum", "code_edit_short", "extract",
               "sum", "qa_passage", "humaneval", "extract")
MIXED_EAGLE_HELDOUT = 40  # the held-out cycle's EAGLE records start here (the tune cycle's at 0)


def build_mixed_kinds(sets: dict[str, list[dict]], humaneval: list[dict], articles: list[dict]) -> list[dict]:
    """Two cycles of :data:`MIXED_CYCLE`: the first of tune records (the built sets' first tune records,
    EAGLE's first), the second of held-out ones (the built sets' held-out records, EAGLE records no other set
    or bench has used). Each record keeps its source's user turn; ``source`` names the set it came from."""
    eagle = {"sum": articles, "humaneval": humaneval}
    out: list[dict] = []
    for split in ("tune", "heldout"):
        pools = {name: [r for r in sets[name] if r["split"] == split] for name in MIXED_CYCLE if name not in eagle}
        first = 0 if split == "tune" else MIXED_EAGLE_HELDOUT
        pools.update({name: records[first:] for name, records in eagle.items()})
        taken: Counter[str] = Counter()
        for name in MIXED_CYCLE:
            if taken[name] >= len(pools[name]):
                raise BuildError(f"mixed_kinds: too few {split} records of {name}")
            rec = pools[name][taken[name]]
            taken[name] += 1
            out.append({"question_id": len(out), "category": f"mixed_kinds/{name}", "turns": rec["turns"][:1],
                        "source": name, "source_question_id": rec["question_id"], "split": split})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                    help="folder with humaneval.jsonl and sum.jsonl (default: eagle/ in this folder)")
    ap.add_argument("--out", type=Path, default=HERE, help="where to write the sets (default: this folder)")
    ap.add_argument("--n", type=int, default=20, help="prompts in code_edit and qa_passage")
    args = ap.parse_args(argv)
    try:
        if args.n < 1:
            raise BuildError("--n must be at least 1")
        humaneval = read_jsonl(args.source / "humaneval.jsonl")
        articles = read_jsonl(args.source / "sum.jsonl")
        sets = {"code_edit": build_code_edit(humaneval, args.n),
                "code_edit_short": build_code_edit_short(humaneval, N_SHORT),
                "edit_chat": build_edit_chat(humaneval, N_CHATS),
                "qa_passage": build_qa_passage(articles, args.n),
                "extract": build_extract(articles, N_EXTRACT),
                "extract_schema": build_extract_schema(articles, N_SCHEMA),
                "long_rag": build_long_rag(articles, N_LONG_RAG),
                "long_sum": build_long_sum(articles, N_LONG_SUM),
                "long_chat": build_long_chat(articles, N_LONG_CHAT)}
        mixed = build_mixed_kinds(sets, humaneval, articles)
        (args.out / "mixed").mkdir(parents=True, exist_ok=True)
        for name, records in sets.items():
            write_jsonl(args.out / f"{name}.jsonl", records)
        write_jsonl(args.out / "mixed" / "mixed_kinds.jsonl", mixed)
    except (BuildError, OSError, json.JSONDecodeError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(f'{len(r)} {name}' for name, r in sets.items())} prompts and {len(mixed)} mixed/mixed_kinds"
          f" to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
