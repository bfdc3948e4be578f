"""The grammar guards (issue 45): the validator refuses, in one line naming the rule, every form that hangs,
bloats or crashes llama.cpp, and never a grammar llama.cpp takes (llama.cpp itself is the judge, compiling in a
limited child); the isolated compile catches those forms on its own; the CLI and the Python API refuse them with
one clear error.

The dangerous grammars are only ever compiled by llama.cpp in a child process with a time and memory limit: the
API test runs in a limited subprocess too, so that a missing guard fails the test instead of eating the machine.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time

import pytest

from eagle2_local.decoding import grammar_screen
from eagle2_local.decoding.grammar_check import MAX_GRAMMAR_BYTES, MAX_PARSE_PATHS, check_gbnf
from eagle2_local.decoding.grammar_screen import compile_isolated, screen_gbnf
from eagle2_local.decoding.grammar_parse import MAX_ELEMENTS, MAX_NESTING, GrammarError
from tests.support.helpers import assert_one_line_error, run_cli

HANGS = 'root ::= x root "b" | "c"\nx ::= "a"?'  # left recursion behind a rule empty only through its '?'
NESTED = "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000  # 120 KB: overflows llama.cpp's parser's stack
DEAD = "root ::= [^\\x00-\\U0010FFFF]"  # a class that excludes every character
WRAPS = 'root ::= "a"{5,3}'  # llama.cpp's count of optional copies wraps around to 2^64

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "likes_tea": {"type": "boolean"},
                                           "pets": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
          "required": ["name", "age", "likes_tea", "pets"], "additionalProperties": False}
SCHEMAS = [PERSON, {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 10},
           {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]+$"}, {"type": "string", "format": "date-time"},
           {"enum": ["a", "b", 3, None]}, {"type": "object", "additionalProperties": {"type": "integer"}},
           {"oneOf": [{"type": "string"}, {"$ref": "#/$defs/t"}], "$defs": {"t": {"type": "integer"}}},
           {"type": "string", "minLength": 1, "maxLength": 500}, {}]

# Real GBNF as people write it: comments, escapes, classes, repetitions, tokens, CRLF, groups over lines.
WRITTEN = {
    "comments and escapes": '# a greeting\nroot ::= "Hi" [!.]? " " name "\\n" # the end\n'
                            'name ::= [A-Z] [a-z\\-\']{1,15} ("\\u00e9" | "\\x41" | "\\U0001F600")?\n',
    "crlf and continued groups": 'root ::= (\r\n  "a" |\r\n  "b"\r\n)+ "."\r\nws ::= [ \\t\\n]*\r\n',
    "repetitions": 'root ::= digit{3} "-" digit{2,4} "-" [0-9a-f]{0,} "." x* y+ z?\ndigit ::= [0-9]\n'
                   'x ::= "x"\ny ::= "y"\nz ::= "z"',
    "tokens": 'root ::= <[1]> "text" !<[2]>* <[3]>',
    "right recursion and empty alternatives": 'root ::= item ("," ws item)* ws\nitem ::= "[" (item | ) "]" | "n"\n'
                                              'ws ::= | " " ws',
    "class edges": 'root ::= [a-] [\\]\\[] [^"\\\\] [-a] [] "" .',
    "names with digits and dashes": "root ::= 1st-rule\n1st-rule ::= \"a\" a-2\na-2 ::= \"b\"",
    "a rule defined twice (the last wins)": 'root ::= a\na ::= "x"\na ::= "y"',
    "nested optional repetition (maxLength)": "root ::= " + '"a" (' * 300 + '"a"' + ")?" * 300,
}


# ------------------------------------------------------------------ what the validator lets through
def test_project_grammars_pass():
    """Every grammar the project makes passes: llama-cpp-python's own (JSON and its examples), the JSON-schema
    converter's for a range of schemas, json_object, and the tool-call grammars of both formats."""
    import llama_cpp.llama_grammar as shipped

    from eagle2_local.chat.tool_calls import HERMES, LLAMA3, call_grammar, check_tools
    from eagle2_local.decoding.grammar import Grammar

    texts = {name: value for name, value in vars(shipped).items() if name.endswith("_GBNF")}
    assert {"JSON_GBNF", "ARITHMETIC_GBNF", "C_GBNF", "CHESS_GBNF"} <= set(texts)
    texts.update({f"schema {i}": Grammar.from_json_schema(s).gbnf for i, s in enumerate(SCHEMAS)})
    texts["json_object"] = Grammar.json_object().gbnf
    tools = check_tools([{"type": "function", "function": {"name": "get_weather", "parameters": PERSON}},
                         {"type": "function", "function": {"name": "now"}}])
    for fmt in (HERMES, LLAMA3):
        texts[f"tools {fmt.name}"] = call_grammar(fmt, tools, parallel=fmt.parallel).gbnf
    for name, text in texts.items():
        summary = check_gbnf(text)
        assert summary.n_rules > 0 and 0 < summary.max_parse_paths <= MAX_PARSE_PATHS, name


@pytest.mark.parametrize("name", list(WRITTEN))
def test_written_grammars_pass_and_llama_cpp_takes_them(name):
    """Hand-written GBNF passes the validator, and llama.cpp (in a child) takes each one too: the examples are
    real grammars, not the validator's own dialect."""
    summary = check_gbnf(WRITTEN[name])
    assert compile_isolated(summary.probe_text) is True


def test_named_tokens_are_probed_as_token_ids():
    """<think> needs a vocabulary, which the child has not: it compiles <[0]> in its place, same shape."""
    summary = check_gbnf('root ::= <think> "x" !<|end|> "y"')
    assert summary.probe_text == 'root ::= <[0]> "x" !<[0]> "y"'
    assert compile_isolated(summary.probe_text) is True


# ------------------------------------------------------------------ what it refuses
REFUSED = [  # (what, grammar, words the one-line message must contain)
    ("left recursion behind an empty rule (the hang)", HANGS, ["left-recursive", "'root'"]),
    ("left recursion through two rules", 'root ::= a\na ::= b? root "x" | "y"\nb ::= "b"',
     ["left-recursive", "'root'", "'a'"]),
    ("60,000 nested parentheses (the crash)", NESTED, [f"more than {MAX_NESTING} deep", "line 1"]),
    ("over the size limit", 'root ::= "' + "a" * MAX_GRAMMAR_BYTES + '"', [str(MAX_GRAMMAR_BYTES)]),
    ("an undefined rule", 'root ::= "a" missing', ["'missing'", "never defined"]),
    ("no root", 'start ::= "a"', ["no rule 'root'"]),
    ("a class that matches nothing (dead end)", DEAD, ["'root'", "matches no text", "[^\\x00-\\U0010FFFF]"]),
    ("a dead end after some text", 'root ::= "ok" | "a" tail\ntail ::= [\\x00]', ["dead end", "'root'", "'tail'"]),
    ("a rule that never ends", 'root ::= "a" loop\nloop ::= "b" loop', ["'root'", "never end"]),
    ("a repetition whose maximum is below its minimum", WRAPS, ["maximum is below its minimum", "line 1"]),
    ("parse paths that multiply", "\n".join(f'a{i} ::= a{i + 1} | a{i + 1} "x"' for i in range(30))
     + '\na30 ::= "y"\nroot ::= a0', [str(MAX_PARSE_PATHS), "parse paths"]),
    ("a long item repeated into millions of elements", 'root ::= "' + "a" * 1000 + '"{2000}', [str(MAX_ELEMENTS)]),
    ("a NUL character", 'root ::= "a"\x00 junk', ["NUL"]),
    ("a syntax error", "root ::= (", ["invalid grammar", "expecting ')'"]),
    ("an unknown escape", 'root ::= "\\q"', ["invalid grammar", "unknown escape"]),
    ("an empty text", "  # nothing\n", ["no rule"]),
    ("a lone surrogate", 'root ::= "\ud800"', ["not valid Unicode"]),
]


@pytest.mark.parametrize("what,text,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_in_one_line_naming_the_rule(what, text, words):
    t0 = time.perf_counter()
    with pytest.raises(GrammarError) as info:
        check_gbnf(text)
    message = str(info.value)
    assert time.perf_counter() - t0 < 1.0, what
    assert "\n" not in message and all(w in message for w in words), message


# a grammar whose setup grows without end runs out of the child's time on one CPU and out of its memory first on a
# faster one (an Intel VM with AMX: bad_alloc within the 1.5 s); either verdict is the guard working
ENDLESS = "within|needs more than"


@pytest.mark.parametrize("text,why", [(HANGS, ENDLESS), (NESTED, "crashed"), (WRAPS, ENDLESS)],
                         ids=["hangs", "nested", "wraps"])
def test_the_isolated_compile_catches_what_the_validator_would_have_missed(text, why):
    """The second guard alone: llama.cpp compiles each dangerous grammar in a child that times out, runs out
    of its memory or crashes, and the verdict is a GrammarError here, this process untouched."""
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match=why):
        compile_isolated(text, timeout_s=1.5)
    assert time.perf_counter() - t0 < 10


def test_a_child_that_fails_while_compiling_refuses_and_one_that_never_started_does_not():
    """Once the child says it is compiling (its memory limit set), any failure is the grammar's: on one build
    of llama.cpp running out of the child's memory is a bad_alloc, on another glibc's thread-local-data abort
    (exit 127), which used to pass for a child that could not start and left the validator alone. A child that
    fails before that word (here: no library to load) still leaves the validator in charge."""
    child = [sys.executable, "-I", "-S", str(grammar_screen._CHILD), "/nonexistent/libllama.so", "root", "1048576"]
    never_started = subprocess.run(child, input=b'root ::= "a"', capture_output=True, timeout=30)
    assert never_started.returncode not in (0, 3) and not never_started.stdout
    assert grammar_screen._read_outcome(never_started, 1 << 20) is False
    glibc = b"cannot allocate memory for thread-local data: ABORT\n"
    tls = subprocess.CompletedProcess(child, 127, b"compiling\n", glibc)
    with pytest.raises(GrammarError, match="needs more than 1 MB"):
        grammar_screen._read_outcome(tls, 1 << 20)
    with pytest.raises(GrammarError, match="failed setting the grammar up \\(exit 1\\)"):
        grammar_screen._read_outcome(subprocess.CompletedProcess(child, 1, b"compiling\n", b""), 1 << 20)


def test_verdicts_are_cached_and_refusals_too(monkeypatch):
    runs = []
    real_run = subprocess.run

    def counting(*args, **kwargs):
        runs.append(args)
        return real_run(*args, **kwargs)
    monkeypatch.setattr(grammar_screen.subprocess, "run", counting)
    fresh = f'root ::= "cached {random.random()}"'
    for _ in range(3):
        screen_gbnf(fresh)
    assert len(runs) == 1  # one child, then the verdict from the cache
    bad = f'root ::= "{random.random()}" undefined-{random.randrange(10 ** 9)}'
    for _ in range(2):
        with pytest.raises(GrammarError, match="never defined"):
            screen_gbnf(bad)
    assert len(runs) == 1  # refused by the validator: no child at all


def test_busy_checker_refuses_without_caching_a_verdict(monkeypatch):
    """With every child slot taken, a new grammar is refused as busy (a 503 in the server), not judged: once a
    slot frees, the same grammar passes."""
    import threading

    slots = threading.BoundedSemaphore(1)
    slots.acquire()
    monkeypatch.setattr(grammar_screen, "_slots", slots)
    monkeypatch.setattr(grammar_screen, "PROBE_WAIT_S", 0.1)
    fresh = f'root ::= "busy {random.random()}"'
    with pytest.raises(grammar_screen.GrammarCheckBusy, match="retry"):
        screen_gbnf(fresh)
    slots.release()
    screen_gbnf(fresh)


def test_differential_against_llama_cpp():
    """Seeded random grammars (groups, repetitions, escapes, classes, tokens, comments, mutations): whenever
    llama.cpp (in a child) refuses, hangs or crashes, the validator refuses too; whenever llama.cpp takes one, the
    validator takes it too, unless it names a structural reason (left recursion, a dead end)."""
    rng = random.Random(45)
    texts = [_random_grammar(rng) for _ in range(120)]
    taken = 0
    for text in texts:
        try:
            compile_isolated(text, timeout_s=2.0)
            llama_takes = True
        except GrammarError:
            llama_takes = False
        try:
            check_gbnf(text)
            ours = None
        except GrammarError as exc:
            ours = str(exc)
        if not llama_takes:
            assert ours is not None, text
        elif ours is not None:
            assert not ours.startswith("invalid grammar"), (text, ours)
            assert "left-recursive" in ours or "dead end" in ours or "matches no text" in ours, (text, ours)
        taken += llama_takes
    assert taken >= 10  # the sample does exercise accepted grammars


_ATOMS = ['"a"', '"bc"', '""', '"\\n"', '"\\x41"', '"\\u00e9"', '"é"', "[a-z]", "[^a]", "[]", "[a-]", "[\\]x]",
          "[^\\x00-\\U0010FFFF]", ".", "a", "b", "root", "<[3]>", "!<[4]>", '"\\t\\"q"']
_OPS = ["", "", "", "*", "+", "?", "{2}", "{1,3}", "{0,}", "{ 2 , 4 }", "{0}", "{0,2}"]


def _random_expr(rng: random.Random, depth: int) -> str:
    space = [" ", "  ", "\t"] + ([" # c\n ", "\n "] if depth else [])
    alternatives = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        items = []
        for _ in range(rng.randint(1, 3)):  # an empty last alternative would run on into the next line's rule
            if depth < 3 and rng.random() < 0.25:
                item = "(" + rng.choice(["", " ", "\n"]) + _random_expr(rng, depth + 1) + ")"
            else:
                item = rng.choice(_ATOMS)
            items.append(item + (rng.choice(_OPS) if item not in ('""', "[]") else ""))  # nothing to repeat
        alternatives.append(rng.choice(space).join(items))
    return (rng.choice(space) + "|" + rng.choice(space)).join(alternatives)


def _random_grammar(rng: random.Random) -> str:
    names = ["root", "a", "b"]
    rng.shuffle(names)
    text = "\n".join(f"{n} ::= {_random_expr(rng, 0)}" for n in names)
    if rng.random() < 0.15:
        i = rng.randrange(len(text) + 1)
        text = text[:i] + rng.choice(["(", ")", '"', "\n", "|", "#", "\\", ":", "{", "-"]) + text[i + rng.randint(0, 2):]
    return text


# ------------------------------------------------------------------ the CLI and the Python API
@pytest.mark.parametrize("text,needle", [(HANGS, "left-recursive"), (NESTED, "deep"), (DEAD, "matches no text"),
                                         (WRAPS, "maximum is below")], ids=["hangs", "nested", "dead", "wraps"])
def test_cli_grammar_file_one_line_error(tmp_path, text, needle):
    """`generate --grammar-file`: one error line, a non-zero exit, no traceback, before any model loads."""
    path = tmp_path / "bad.gbnf"
    path.write_text(text)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cli", "generate", "-p", "hi", "--model", str(tmp_path / "none.gguf"),
                           "--grammar-file", str(path)], capture_output=True, text=True, timeout=60)
    assert_one_line_error(proc, needle)
    assert time.perf_counter() - t0 < 30


def test_cli_grammar_file_not_utf8_or_too_large(tmp_path):
    binary = tmp_path / "binary.gbnf"
    binary.write_bytes(b'root ::= "\xff\xfe"')
    assert_one_line_error(run_cli("generate", "-p", "hi", "--grammar-file", str(binary)), "not UTF-8")
    big = tmp_path / "big.gbnf"
    big.write_text('root ::= "' + "a" * (MAX_GRAMMAR_BYTES + 10) + '"')
    assert_one_line_error(run_cli("generate", "-p", "hi", "--grammar-file", str(big)), str(MAX_GRAMMAR_BYTES))


@pytest.mark.smollm2
def test_python_api_raises_one_clear_grammar_error(smollm2_path):
    """Eagle2.create_completion and Grammar.state refuse each form with a GrammarError: run in a subprocess
    limited to 4 GB and 120 s, so that without the guards the test fails rather than hanging this one."""
    script = textwrap.dedent(f"""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from eagle2_local import Eagle2
        from eagle2_local.decoding.grammar import Grammar, GrammarError
        texts = json.loads(sys.stdin.read())
        with Eagle2({str(smollm2_path)!r}, plain=True, n_ctx=256, n_threads=1) as llm:
            out = []
            for text in texts:
                try:
                    llm.create_completion("Hi", max_tokens=4, grammar=text)
                    out.append("generated")
                except GrammarError as exc:
                    try:
                        Grammar(text).state(llm.model)
                        out.append("state passed")
                    except GrammarError as again:
                        out.append(str(exc) if str(exc) == str(again) else "differs")
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps([HANGS, NESTED, DEAD, WRAPS]),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    messages = json.loads(proc.stdout.strip().splitlines()[-1])
    for message, needle in zip(messages, ["left-recursive", "deep", "matches no text", "maximum is below"]):
        assert needle in message and "\n" not in message, messages


@pytest.mark.smollm2
def test_a_grammar_whose_parses_multiply_is_stopped_within_seconds(smollm2_path):
    """An ambiguous recursion passes every static check, but llama.cpp's parse stacks multiply with each token
    (the 13th "x" alone took 37 s): the step limit ends it with a GrammarError after a second or two. In a
    subprocess limited to 60 s, so that without the limit the test fails instead of running for hours."""
    script = textwrap.dedent(f"""
        import time
        from eagle2_local.decoding.grammar import Grammar, GrammarError
        from eagle2_local.llamacpp.llama import LlamaModel
        model = LlamaModel({str(smollm2_path)!r}, n_gpu_layers=0)
        state = Grammar('root ::= "x" root "y" | "x" root "z" | ""').state(model)
        x = model.tokenize(b"x", add_special=False, parse_special=False)[0]
        t0 = time.perf_counter()
        try:
            for _ in range(40):
                assert state.allows(x)
                state.accept(x)
            print("accepted 40")
        except GrammarError as exc:
            print(f"{{time.perf_counter() - t0:.1f}} {{exc}}")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds, message = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert "parses multiply" in message and float(seconds) < 15, proc.stdout
