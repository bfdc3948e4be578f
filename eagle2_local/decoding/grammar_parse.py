"""llama.cpp's GBNF parser, in Python: the same syntax, the same rewriting of groups and repetitions into rules and
the same symbol numbering as llama-cpp-python 0.3's vendored ``llama-grammar.cpp``, so that the checks of
:mod:`~eagle2_local.decoding.grammar_check` see exactly the rules llama.cpp would build, and never refuse a grammar
it would take. The parse itself refuses what llama.cpp's parser would choke on: nesting past :data:`MAX_NESTING`
(its recursion overflows the C stack) and more than :data:`MAX_ELEMENTS` elements once repetitions are expanded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import Eagle2Error

MAX_NESTING = 2048
"""Parentheses open at once. llama.cpp's parser recurses per level, about 450 bytes of C stack each: 60,000 levels
overflow a thread's 8 MB (measured: fine at 15,000, a segfault at 20,000). 2048 levels take under 1 MB; the JSON-schema
converter nests one level per optional repetition (``maxLength`` minus ``minLength``), and llama.cpp refuses
repetitions above 2000 anyway."""
MAX_ELEMENTS = 1_000_000
"""llama.cpp's grammar elements (8 bytes each) after repetitions are expanded: 8 MB per copy, and it keeps about
three copies. A 256 KB grammar without repetitions has fewer than 256 K."""
MAX_REPETITION = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD: the parser refuses more, or treats it as unbounded
MAX_CODEPOINT = 0x10FFFF

_HEX = {"x": 2, "u": 4, "U": 8}
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_WORD = re.compile(r"[A-Za-z0-9-]+")
_DIGITS = re.compile(r"[0-9]+")
_PLAIN_LITERAL = re.compile(r'[^"\\\x00]+')  # a run of a literal that needs no escape handling


class GrammarError(Eagle2Error):
    """A grammar or JSON schema that cannot be used (syntax, unsupported feature, a form refused as unsafe)."""


@dataclass(frozen=True)
class Terminal:
    """A symbol that consumes input: a character, a character class, any character, or a token."""

    matchable: bool  # can some token text ever match it (an empty class, or \\x00, cannot)
    weight: int = 1  # llama.cpp grammar elements it takes
    source: str = ""  # its text, kept for the message when it cannot match


class _Group:
    """A rule body or parenthesized group being parsed: its alternatives so far and the current one."""

    def __init__(self, rule_id: int, symbols_before: int) -> None:
        self.rule_id = rule_id
        self.symbols_before = symbols_before  # llama.cpp counts the rules a group creates (n_prev_rules)
        self.alternatives: list[list] = []
        self.restart()

    def restart(self) -> None:
        self.seq: list = []  # symbols: a rule id (int) or a Terminal
        self.last = 0  # where the last item starts (a repetition applies to it)
        self.n_prev = 1  # llama.cpp's count of rules the last item stands for (it bounds nested repetitions)


class Parser:
    """llama.cpp's recursive-descent parser, mirrored: the same symbol ids, the same synthesized rules."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.n = len(text)
        self.symbol_ids: dict[str, int] = {}
        self.rules: dict[int, list[list]] = {}
        self.origin: dict[int, str] = {}  # each rule's user-facing name (a group's: the rule it was written in)
        self.built = 0  # elements ever added (a little above the final count): checked before each copy
        self.token_spans: list[tuple[int, int]] = []  # named tokens (<...>), which need a vocabulary
        self._chars: dict[int, Terminal] = {}

    # --------------------------------------------------------- helpers
    def ch(self, pos: int) -> str:
        return self.s[pos] if pos < self.n else ""

    def where(self, pos: int) -> str:
        line = self.s.count("\n", 0, pos) + 1
        return f"line {line}, column {pos - (self.s.rfind(chr(10), 0, pos) + 1) + 1}"

    def fail(self, what: str, pos: int) -> GrammarError:
        snippet = self.s[pos:pos + 40].split("\n")[0]
        return GrammarError(f"invalid grammar: {what} at {self.where(pos)}" +
                            (f": {snippet}" if snippet else " (the end)"))

    def space(self, pos: int, newline_ok: bool) -> int:
        while True:
            c = self.ch(pos)
            if c in (" ", "\t") or (newline_ok and c in ("\r", "\n")):
                pos += 1
            elif c == "#":
                while pos < self.n and self.s[pos] not in "\r\n":
                    pos += 1
            else:
                return pos

    def name(self, pos: int) -> int:
        m = _WORD.match(self.s, pos)
        if m is None:
            raise self.fail("expecting name", pos)
        return m.end()

    def integer(self, pos: int) -> tuple[int, int]:
        m = _DIGITS.match(self.s, pos)
        if m is None:
            raise self.fail("expecting integer", pos)
        return int(m.group()), m.end()

    def char(self, pos: int) -> tuple[int, int]:
        """One character of a literal or class, escapes decoded (\\xHH \\uHHHH \\UHHHHHHHH \\t \\r \\n \\\\ ...)."""
        c = self.ch(pos)
        if c == "\\":
            e = self.ch(pos + 1)
            if e in _HEX:
                size = _HEX[e]
                digits = self.s[pos + 2:pos + 2 + size]
                if len(digits) != size or any(d not in "0123456789abcdefABCDEF" for d in digits):
                    raise self.fail(f"expecting {size} hex chars", pos + 2)
                return int(digits, 16), pos + 2 + size
            if e in _ESCAPES:
                return ord(_ESCAPES[e]), pos + 2
            raise self.fail("unknown escape", pos)
        if not c:
            raise self.fail("unexpected end of input", pos)
        return ord(c), pos + 1

    def symbol_id(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_id(self, base: str) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base}_{next_id}"] = next_id  # assignment, as llama.cpp (not setdefault)
        self.origin[next_id] = base
        return next_id

    def add_rule(self, rule_id: int, alternatives: list[list]) -> None:
        self.rules[rule_id] = alternatives  # a second definition replaces the first, as in llama.cpp
        self.grow(len(alternatives))  # its ALT / END elements

    def add(self, seq: list, sym) -> None:
        self.grow(_sym_weight(sym))
        seq.append(sym)

    def grow(self, n: int) -> None:
        self.built += n
        if self.built > MAX_ELEMENTS:
            raise GrammarError(f"the grammar expands to more than {MAX_ELEMENTS} llama.cpp elements (repetitions "
                               "of long items); make it smaller")

    def literal_char(self, cp: int, source: str) -> Terminal:
        if 1 <= cp <= MAX_CODEPOINT:
            known = self._chars.get(cp)
            return known if known is not None else self._chars.setdefault(cp, Terminal(True))
        return Terminal(False, 1, source)

    # --------------------------------------------------------- grammar structure
    def parse(self) -> None:
        if "\x00" in self.s:
            raise self.fail("a NUL character (llama.cpp would stop reading there)", self.s.index("\x00"))
        pos = self.space(0, True)
        while pos < self.n:
            pos = self.rule(pos)

    def rule(self, pos: int) -> int:
        end = self.name(pos)
        name = self.s[pos:end]
        rule_id = self.symbol_id(name)
        self.origin.setdefault(rule_id, name)
        pos = self.space(end, False)
        if not self.s.startswith("::=", pos):
            raise self.fail("expecting ::=", pos)
        pos = self.alternates(self.space(pos + 3, True), name, rule_id)
        if self.s.startswith("\r\n", pos):
            pos += 2
        elif self.ch(pos) in ("\r", "\n"):
            pos += 1
        elif pos < self.n:
            raise self.fail("expecting newline or end", pos)
        return self.space(pos, True)

    def alternates(self, pos: int, rule_name: str, rule_id: int) -> int:
        """A rule's alternatives, groups included. llama.cpp recurses once per parenthesis; this keeps the open
        groups on a list instead, so a deep one costs no Python recursion (and is refused past the limit)."""
        groups = [_Group(rule_id, len(self.symbol_ids))]
        while True:
            group = groups[-1]
            pos = self.sequence(pos, rule_name, group, nested=len(groups) > 1)
            c = self.ch(pos)
            if c == "(":
                if len(groups) > MAX_NESTING:
                    raise GrammarError(f"the grammar nests parentheses more than {MAX_NESTING} deep (at "
                                       f"{self.where(pos)}; a JSON schema's maxLength or maxItems far above "
                                       "its minimum nests that deep)")
                before = len(self.symbol_ids)
                groups.append(_Group(self.generate_id(rule_name), before))
                pos = self.space(pos + 1, True)
                continue
            if c == "|":
                group.alternatives.append(group.seq)
                group.restart()
                pos = self.space(pos + 1, True)
                continue
            group.alternatives.append(group.seq)
            self.add_rule(group.rule_id, group.alternatives)
            if len(groups) == 1:
                return pos
            if c != ")":
                raise self.fail("expecting ')'", pos)
            groups.pop()
            outer = groups[-1]
            outer.last, outer.n_prev = len(outer.seq), max(1, len(self.symbol_ids) - group.symbols_before)
            self.add(outer.seq, group.rule_id)
            pos = self.space(pos + 1, len(groups) > 1)

    def sequence(self, pos: int, rule_name: str, group: "_Group", nested: bool) -> int:
        """Items of ``group``'s current alternative up to what ends it, or up to a '(' (which the caller opens)."""
        seq = group.seq
        while pos < self.n:
            c = self.s[pos]
            if c == '"':
                group.last, group.n_prev = len(seq), 1
                pos = self.literal(pos + 1, seq)
                pos = self.space(pos + 1, nested)
            elif c == "[":
                group.last, group.n_prev = len(seq), 1
                pos = self.char_class(pos, seq)
                pos = self.space(pos, nested)
            elif c in "<!":
                group.last, group.n_prev = len(seq), 1
                pos = self.token(pos, seq)
                pos = self.space(pos, nested)
            elif _WORD.match(c):
                end = self.name(pos)
                group.last, group.n_prev = len(seq), 1
                self.add(seq, self.symbol_id(self.s[pos:end]))
                pos = self.space(end, nested)
            elif c == ".":
                group.last, group.n_prev = len(seq), 1
                self.add(seq, Terminal(True))
                pos = self.space(pos + 1, nested)
            elif c in "*+?":
                pos = self.space(pos + 1, nested)
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                group.n_prev = self.repeat(seq, group.last, low, high, rule_name, group.n_prev, pos)
            elif c == "{":
                low, high, pos = self.braces(pos, nested)
                group.n_prev = self.repeat(seq, group.last, low, high, rule_name, group.n_prev, pos)
            else:
                break
        return pos

    def literal(self, pos: int, seq: list) -> int:
        """The characters of a "..." literal, one terminal each; returns the position of the closing quote."""
        while True:
            m = _PLAIN_LITERAL.match(self.s, pos)
            if m is not None:
                self.grow(len(m.group()))
                seq.extend(self.literal_char(ord(c), c) for c in m.group())
                pos = m.end()
            c = self.ch(pos)
            if c == '"':
                return pos
            if not c:
                raise self.fail("unexpected end of input", pos)
            start = pos
            cp, pos = self.char(pos)
            self.add(seq, self.literal_char(cp, self.s[start:pos]))

    def char_class(self, pos: int, seq: list) -> int:
        start = pos
        pos += 1
        negated = self.ch(pos) == "^"
        if negated:
            pos += 1
        ranges: list[tuple[int, int]] = []
        weight = 0
        while self.ch(pos) != "]":
            if pos >= self.n:
                raise self.fail("unexpected end of input", pos)
            low, pos = self.char(pos)
            high = low
            weight += 1
            if self.ch(pos) == "-" and self.ch(pos + 1) != "]":
                if pos + 1 >= self.n:
                    raise self.fail("unexpected end of input", pos + 1)
                high, pos = self.char(pos + 1)
                weight += 1
            ranges.append((low, high))
        pos += 1
        if ranges:  # "[]" and "[^]" add nothing at all in llama.cpp (not even an item a repetition could apply to)
            self.add(seq, Terminal(_class_matches(ranges, negated), weight, self.s[start:pos]))
        return pos

    def token(self, pos: int, seq: list) -> int:
        """``<[id]>``, ``<name>`` (a token of the vocabulary) or either negated with ``!``."""
        start = pos
        if self.ch(pos) == "!":
            pos += 1
        if self.ch(pos) != "<":
            raise self.fail("expecting '<'", pos)
        pos += 1
        if self.ch(pos) == "[":
            value, pos = self.integer(pos + 1)
            if value > 0xFFFFFFFF:
                raise self.fail("parsed token id is too big", pos)
            if self.ch(pos) != "]":
                raise self.fail("expecting ']'", pos)
            if self.ch(pos + 1) != ">":
                raise self.fail("expecting '>'", pos + 1)
            pos += 2
        else:
            end = self.s.find(">", pos)
            if end < 0:
                raise self.fail("expecting '>'", self.n)
            pos = end + 1
            self.token_spans.append((start + (self.s[start] == "!"), pos))
        self.add(seq, Terminal(True))
        return pos

    def braces(self, pos: int, nested: bool) -> tuple[int, int | None, int]:
        """``{m}``, ``{m,}``, ``{m,n}``: (m, n or None for no maximum, the position after)."""
        brace = pos
        pos = self.space(pos + 1, nested)
        if not _DIGITS.match(self.s, pos):
            raise self.fail("expecting an int", pos)
        low, pos = self.integer(pos)
        pos = self.space(pos, nested)
        high: int | None = None
        if self.ch(pos) == "}":
            high = low
        elif self.ch(pos) == ",":
            pos = self.space(pos + 1, nested)
            if _DIGITS.match(self.s, pos):
                high, pos = self.integer(pos)
                pos = self.space(pos, nested)
            if self.ch(pos) != "}":
                raise self.fail("expecting '}'", pos)
        else:
            raise self.fail("expecting ','", pos)
        pos = self.space(pos + 1, nested)
        if low > MAX_REPETITION or low >= 1 << 64 or (high is not None and high >= 1 << 64):
            raise self.fail(f"a repetition of more than {MAX_REPETITION}", brace)
        if high is not None and high > MAX_REPETITION:
            high = None  # llama.cpp treats a maximum above its threshold as no maximum
        if high is not None and high < low:  # llama.cpp's count of optional copies would wrap around to 2^64
            raise self.fail("a repetition whose maximum is below its minimum (llama.cpp would loop on it)", brace)
        return low, high, pos

    def repeat(self, seq: list, last: int, low: int, high: int | None, rule_name: str, n_prev: int,
               pos: int) -> int:
        """llama.cpp's rewriting of ``S{m,n}``: m copies of S, then n-m nested optional rules (one recursive rule
        without a maximum). Sizes are checked before anything is copied."""
        if last == len(seq):
            raise self.fail("expecting preceding item to */+/?/{", pos)
        prev = seq[last:]
        total = high if high is not None and high > 0 else (low if low > 0 else 1)
        if n_prev * total > MAX_REPETITION:
            raise self.fail("a repetition whose rules times their repetitions exceed llama.cpp's limit "
                            f"({MAX_REPETITION})", pos)
        n_opt = 1 if high is None else high - low
        size = sum(_sym_weight(x) for x in prev)
        self.grow(size * max(low - 1, 0) + n_opt * (size + 2))  # before copying anything
        if low == 0:
            del seq[last:]
        else:
            seq.extend(prev * (low - 1))
        last_rec = 0
        for i in range(n_opt):
            rec_id = self.generate_id(rule_name)
            first = list(prev)
            if i > 0 or high is None:
                first.append(rec_id if high is None else last_rec)
            self.add_rule(rec_id, [first, []])
            last_rec = rec_id
        if n_opt > 0:
            seq.append(last_rec)
        return n_prev * total


def _sym_weight(sym) -> int:
    return sym.weight if isinstance(sym, Terminal) else 1


def rule_weight(alternatives: list[list]) -> int:
    return sum(sum(_sym_weight(x) for x in alt) + 1 for alt in alternatives)  # + ALT / END


def _class_matches(ranges: list[tuple[int, int]], negated: bool) -> bool:
    """Whether a class matches some character a token can contain (1..U+10FFFF: a NUL ends llama.cpp's text)."""
    clipped = sorted((max(lo, 1), min(hi, MAX_CODEPOINT)) for lo, hi in ranges)
    clipped = [(lo, hi) for lo, hi in clipped if lo <= hi]
    if not negated:
        return bool(clipped)
    reach = 0  # every character up to here is excluded
    for lo, hi in clipped:
        if lo > reach + 1:
            return True
        reach = max(reach, hi)
    return reach < MAX_CODEPOINT
