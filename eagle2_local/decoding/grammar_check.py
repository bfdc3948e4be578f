"""A GBNF validator in pure Python: what llama.cpp must never be handed, refused in one line before it sees it.

llama.cpp's grammar code trusts its input. Four forms take down the process that compiles them (issue 45):

* deep nesting: its parser recurses once per parenthesis, so ``((((…"a"…))))`` 60,000 deep overflows the C
  stack (a segfault);
* left recursion hidden behind a rule that can match nothing: its check only counts a rule as "may be empty"
  when one of its own alternatives is literally empty, so ``root ::= x root "b" | "c"`` with ``x ::= "a"?`` (x
  empty only through the rule ``?`` creates) passes, and setting up the parse then pushes stacks forever: no
  answer, memory growing by gigabytes a minute;
* a repetition ``{m,n}`` with n below m: its count of optional copies underflows to 2^64 and it makes rules until
  memory runs out; and one that copies a long item thousands of times (``"…100 KB…"{2000}``) asks for gigabytes;
* a grammar whose parse positions multiply (``a ::= b | b "x"`` over forty rules: 2^40 stacks) or whose left
  corners llama.cpp's check walks again on every path (the same shape): time and memory exponential in its size.

And one form is not a crash but a dead end: a grammar in which the model can write something after which nothing
is allowed, not even the end (``root ::= [^\\x00-\\U0010FFFF]``); the generation then fails half-way.

:func:`check_gbnf` parses the text exactly as llama.cpp's parser does (:mod:`.grammar_parse`: same syntax, same
rewriting of groups and repetitions into rules, same symbol numbering as llama-cpp-python 0.3's vendored
``llama-grammar.cpp``), so it never refuses a grammar llama.cpp would parse, set up in bounded time and memory,
and complete; the parse enforces the nesting and size limits, then this module checks the length, the costs and
the rules' structure (undefined rules, true nullability by fixpoint, left recursion through nullable prefixes,
parse-path counts, dead ends). It imports nothing but the standard library: the server runs it on any thread,
the CLI before a model loads. A form it does not know is still caught by the isolated compile
(:mod:`eagle2_local.decoding.grammar_screen`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .grammar_parse import GrammarError, Parser, Terminal, rule_weight

MAX_GRAMMAR_BYTES = 256 * 1024
"""The UTF-8 size of a grammar text. Grammars people write are a few KB and the JSON-schema grammars the project
makes tens of KB; 256 KB leaves room for big enums while staying far below the server's 16 MB body limit."""
MAX_PARSE_PATHS = 16_384
"""Parse stacks one position of a rule can open at once (llama.cpp checks each stack against every candidate
token). A flat list of thousands of alternatives stays below it; the exponential shapes exceed it by far."""
MAX_CHECK_CALLS = 2_000_000
"""Calls of llama.cpp's left-recursion check (which walks shared left corners again on every path)."""
MAX_LEFT_DEPTH = 10_000
"""Depth of that check's C recursion along a chain of left corners (a frame is about 100 bytes)."""


@dataclass(frozen=True)
class GbnfSummary:
    """What :func:`check_gbnf` learned of a grammar it accepts."""

    n_rules: int  # after llama.cpp's rewriting of groups and repetitions
    n_elements: int
    max_parse_paths: int
    probe_text: str  # the text with named tokens (<think>) as <[0]>: compiles without a vocabulary, same shape


# ---------------------------------------------------------------- structure checks
class _Rules:
    """The rewritten rules and the fixpoints the checks need."""

    def __init__(self, p: Parser) -> None:
        self.rules = p.rules
        self.names = {i: n for n, i in p.symbol_ids.items()}
        self.origin = p.origin
        self.nullable = _all_symbols_fixpoint(self.rules, lambda t: False)
        self.productive = _all_symbols_fixpoint(self.rules, lambda t: t.matchable)
        self.corners = {i: [c for alt in alts for c in self.left_corners(alt, self.nullable.__getitem__)]
                        for i, alts in self.rules.items()}
        self.can_start = self._can_start()

    def _can_start(self) -> dict[int, bool]:
        """Whether a rule can begin by consuming a character: a matchable terminal among its left corners, or a
        left-corner rule that can (a reverse reachability, linear in the grammar)."""
        users: dict[int, list[int]] = {i: [] for i in self.rules}
        todo = []
        for i, alts in self.rules.items():
            for c in self.corners[i]:
                users[c].append(i)
            if any(self._first_terminal_matches(alt) for alt in alts):
                todo.append(i)
        known = dict.fromkeys(self.rules, False)
        while todo:
            i = todo.pop()
            if not known[i]:
                known[i] = True
                todo.extend(u for u in users[i] if not known[u])
        return known

    def _first_terminal_matches(self, alt: list) -> bool:
        for x in alt:
            if isinstance(x, Terminal):
                return x.matchable
            if not self.nullable[x]:
                return False
        return False

    def starts(self, sym) -> bool:
        return sym.matchable if isinstance(sym, Terminal) else self.can_start[sym]

    def label(self, rule_id: int) -> str:
        """The name a user wrote: a group's or repetition's rule is named after the rule it appears in."""
        return self.origin.get(rule_id) or self.names.get(rule_id, str(rule_id))

    def left_corners(self, alt: list, empty: Callable[[int], bool]) -> Iterable[int]:
        """The rules an alternative can start with: its first symbol, and the next while each ``empty``."""
        for x in alt:
            if isinstance(x, Terminal):
                return
            yield x
            if not empty(x):
                return


def _all_symbols_fixpoint(rules: dict[int, list[list]], terminal: Callable[[Terminal], bool]) -> dict[int, bool]:
    """The least fixpoint of "a rule holds if every symbol of one of its alternatives does" (a terminal as
    ``terminal`` says): nullable, productive. Each alternative counts the rule symbols it still waits for, so the
    whole takes time linear in the grammar, however long its chains of rules."""
    waiting: list[int] = []  # per alternative: rule occurrences not yet known to hold
    owner: list[int] = []
    users: dict[int, list[int]] = {i: [] for i in rules}  # rule -> the alternatives it occurs in (once per time)
    todo = []
    for i, alts in rules.items():
        for alt in alts:
            if not all(terminal(x) for x in alt if isinstance(x, Terminal)):
                continue  # never holds
            k = len(owner)
            owner.append(i)
            refs = [x for x in alt if isinstance(x, int)]
            waiting.append(len(refs))
            for x in refs:
                users[x].append(k)
            if not refs:
                todo.append(i)
    known = dict.fromkeys(rules, False)
    while todo:
        i = todo.pop()
        if known[i]:
            continue
        known[i] = True
        for k in users[i]:
            waiting[k] -= 1
            if waiting[k] == 0 and not known[owner[k]]:
                todo.append(owner[k])
    return known


def _check_defined(p: Parser, root: str) -> None:
    """Every symbol names a defined rule, and the root is one of them (llama.cpp refuses both cleanly too; the
    analyses below need every reference to resolve)."""
    for name, i in p.symbol_ids.items():
        if i not in p.rules:
            raise GrammarError(f"invalid grammar: rule '{name}' is used but never defined")
    if root not in p.symbol_ids:
        raise GrammarError(f"invalid grammar: there is no rule '{root}' to start from")


def _check_left_recursion(r: _Rules) -> None:
    """A rule that can reach itself before consuming anything (through nullable prefixes) sends llama.cpp's
    stack expansion into an endless loop when its own check misses it; llama.cpp refuses every such grammar it
    sees, so refusing all of them here changes nothing else. Iterative DFS: no Python recursion limit."""
    colour = {i: 0 for i in r.rules}  # 0 new, 1 on the path, 2 done
    for start in r.rules:
        if colour[start]:
            continue
        path = [start]
        stack = [iter(r.corners[start])]
        colour[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                stack.pop()
            elif colour[nxt] == 1:
                cycle = path[path.index(nxt):]
                names = list(dict.fromkeys(r.label(i) for i in cycle))
                via = f" (through {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
                raise GrammarError(f"the grammar is left-recursive: rule '{names[0]}' can reach itself before "
                                   f"matching anything{via}, where all that comes first can match nothing; "
                                   "llama.cpp cannot use that (make something non-empty come first)")
            elif colour[nxt] == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append(iter(r.corners[nxt]))


def _postorder(rules: dict[int, list[list]], children: Callable[[int], list[int]]) -> list[int]:
    """The rules, each after all its ``children`` (an acyclic relation: left recursion was refused first)."""
    order, seen = [], set()
    for start in rules:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(children(start)))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                order.append(node)
                stack.pop()
            elif nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(children(nxt))))
    return order


def _check_costs(r: _Rules) -> int:
    """Bound what llama.cpp's setup costs: the parse stacks one position opens (llama.cpp expands left corners,
    popping completed rules, into one stack per path) and the calls and depth of its left-recursion check (which
    re-walks shared corners on every path, and counts a rule empty only by a literally empty alternative).
    Returns the most parse paths any rule opens."""
    direct_empty = {i: any(not alt for alt in alts) for i, alts in r.rules.items()}
    paths: dict[int, int] = {}
    for i in _postorder(r.rules, r.corners.__getitem__):
        total = 0
        for alt in r.rules[i]:
            for x in alt:
                if isinstance(x, Terminal):
                    total += 1
                    break
                total += paths[x]
                if not r.nullable[x]:
                    break
        paths[i] = min(total, MAX_PARSE_PATHS + 1)
        if paths[i] > MAX_PARSE_PATHS:
            raise GrammarError(f"rule '{r.label(i)}' opens more than {MAX_PARSE_PATHS} parse paths at once "
                               "(alternatives that share their first rules multiply); simplify it")
    check_edges = {i: [c for alt in alts for c in r.left_corners(alt, direct_empty.__getitem__)]
                   for i, alts in r.rules.items()}
    calls: dict[int, int] = {}
    depth: dict[int, int] = {}
    for i in _postorder(r.rules, check_edges.__getitem__):
        calls[i] = min(1 + sum(calls[c] for c in check_edges[i]), MAX_CHECK_CALLS + 1)
        depth[i] = 1 + max((depth[c] for c in check_edges[i]), default=0)
        if calls[i] > MAX_CHECK_CALLS or depth[i] > MAX_LEFT_DEPTH:
            raise GrammarError(f"rule '{r.label(i)}' starts with a chain of rules too long or too shared for "
                               "llama.cpp's left-recursion check; simplify it")
    return max(paths.values(), default=0)


def _reachable(r: _Rules, root_id: int) -> list[int]:
    seen, todo = {root_id}, [root_id]
    while todo:
        for alt in r.rules[todo.pop()]:
            for x in alt:
                if isinstance(x, int) and x not in seen:
                    seen.add(x)
                    todo.append(x)
    return sorted(seen)


def _check_dead_ends(r: _Rules, root_id: int, root: str) -> None:
    """Refuse a grammar the model could follow into a state where no token, not even the end, is allowed: the
    root matches nothing, or an alternative lets some text through and then needs something that matches
    nothing (an empty class such as ``[^\\x00-\\U0010FFFF]``, a character above U+10FFFF, a rule without an
    end)."""
    if not r.productive[root_id]:
        raise GrammarError(f"the grammar can never be completed: rule '{root}' matches no text at all "
                           f"({_culprit(r, root_id)})")
    for i in _reachable(r, root_id):
        for alt in r.rules[i]:
            entered = False
            for x in alt:
                productive = x.matchable if isinstance(x, Terminal) else r.productive[x]
                if entered and not productive:
                    what = (f"{x.source} matches no character" if isinstance(x, Terminal)
                            else f"rule '{r.label(x)}' matches no text: {_culprit(r, x)}")
                    raise GrammarError(f"the grammar has a dead end in rule '{r.label(i)}': after some text, "
                                       f"{what}; nothing could follow")
                entered = entered or r.starts(x)


def _culprit(r: _Rules, rule_id: int) -> str:
    """Why a rule matches nothing, in a few words: the first unmatchable terminal it leads to."""
    seen, todo = set(), [rule_id]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        for alt in r.rules[i]:
            for x in alt:
                if isinstance(x, Terminal) and not x.matchable:
                    return f"{x.source} matches no character"
                if isinstance(x, int) and not r.productive[x]:
                    todo.append(x)
    return "its rules only ever recurse, never end"


def check_gbnf(text: str, root: str = "root") -> GbnfSummary:
    """Parse ``text`` as llama.cpp would and refuse, with a :class:`GrammarError` naming the rule, what would
    hang, crash or dead-end it; on success, what was learned (a :class:`GbnfSummary`)."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise GrammarError(f"the grammar is not valid Unicode: {exc.reason} at character {exc.start}") from None
    if size > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the grammar is {size} bytes; the limit is {MAX_GRAMMAR_BYTES}")
    p = Parser(text)
    p.parse()
    if not p.rules:
        raise GrammarError("invalid grammar: it defines no rule")
    _check_defined(p, root)
    rules = _Rules(p)
    _check_left_recursion(rules)
    paths = _check_costs(rules)
    _check_dead_ends(rules, p.symbol_ids[root], root)
    pieces, last = [], 0
    for start, end in p.token_spans:  # in order of the text: one join, not a copy of the text per token
        pieces += [text[last:start], "<[0]>"]
        last = end
    probe = "".join(pieces) + text[last:]
    return GbnfSummary(n_rules=len(p.rules), n_elements=sum(rule_weight(a) for a in p.rules.values()),
                       max_parse_paths=paths, probe_text=probe)
