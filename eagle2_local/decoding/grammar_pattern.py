"""A JSON schema's ``pattern`` rewritten for llama-cpp-python's pattern converter so that the grammar it makes
writes JSON: the converter copies a pattern's characters into the GBNF as if they were the JSON text, but a
pattern describes the string's decoded content. A ``"``, a ``\\`` or a control character the pattern allows must
appear escaped in the JSON text, and ``.`` or a class must never let a raw one through.

:func:`json_pattern` therefore rewrites, before the converter sees it: literal characters into the regex that
makes the converter write their JSON text; ``.`` and classes into GBNF classes without the characters JSON must
escape; ``\\d``, ``\\w`` into classes and ``\\s`` into a space (a narrower choice: what the grammar allows still
matches the pattern). What it cannot express is refused by the converter or llama.cpp (a 400), never turned into
a grammar that writes text that is not JSON. Standard library only (it runs in :mod:`._grammar_child`).
"""

from __future__ import annotations

import json

_META = set("|()[]{}*+?")  # what the converter reads as syntax; written ``\\x`` it is the character x
_SHORTHANDS = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)], "s": [(0x20, 0x20)]}
_CONTROL = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v"}
_UNSAFE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]  # what JSON never holds raw in a string
ANY_SAFE = "[^\\x00-\\x1F\\x22\\x5C]"  # ``.``: any character JSON writes as itself


def json_pattern(pattern: str) -> str:
    """``pattern`` (``^...$``) as the converter must see it (see the module's text). Raises ValueError on an
    escape it does not know."""
    if not (pattern.startswith("^") and pattern.endswith("$")) or len(pattern) < 2:
        raise ValueError('a pattern must start with "^" and end with "$"')
    body, out, i = pattern[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c == "[":
            end, ranges, negated = _read_class(body, i + 1)
            out.append(_safe_class(ranges, negated))
            i = end
        elif c == ".":
            out.append(ANY_SAFE)
            i += 1
        elif c == "\\":
            if i + 1 >= len(body):
                raise ValueError("a pattern ends with a lone backslash")
            char, width = _escape(body, i + 1)
            if isinstance(char, list):
                out.append(_safe_class(char, False))
            else:
                out.append(_literal(char))
            i += 1 + width
        elif c in _META or c in "^$":
            out.append(c)
            i += 1
        else:
            out.append(_literal(c))
            i += 1
    return "^" + "".join(out) + "$"


def _escape(text: str, at: int) -> tuple[str | list[tuple[int, int]], int]:
    """The escape after a backslash at ``at``: a character or a shorthand's ranges, and its length."""
    e = text[at]
    if e in _SHORTHANDS:
        return _SHORTHANDS[e], 1
    if e in _CONTROL:
        return _CONTROL[e], 1
    if e in "xu":
        n = 2 if e == "x" else 4
        digits = text[at + 1:at + 1 + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise ValueError(f"a pattern's \\{e} needs {n} hex digits")
        return chr(int(digits, 16)), 1 + n
    if e.isalnum():
        raise ValueError(f"a pattern's escape \\{e} is not supported")
    return e, 1


def _literal(c: str) -> str:
    """One character of the string, as the regex that makes the converter write its JSON text."""
    if c in _META:
        return "\\" + c
    if c == ".":
        return "[.]"
    text = json.dumps(c, ensure_ascii=False)[1:-1]
    if len(text) == 1:
        return text
    # an escape (\" \\ \n \u0001): a backslash doubled for GBNF, a quote kept escaped; grouped, so that a
    # quantifier after it repeats the whole escape (the converter joins escaped characters into one literal)
    return "(" + "".join("\\\\" if x == "\\" else '\\"' if x == '"' else x for x in text) + ")"


def _read_class(text: str, at: int) -> tuple[int, list[tuple[int, int]], bool]:
    """A class starting after ``[`` at ``at``: where it ends (after ``]``), its ranges, and whether negated."""
    negated = text.startswith("^", at)
    i = at + negated
    ranges: list[tuple[int, int]] = []
    first = True
    while True:
        if i >= len(text):
            raise ValueError("a pattern's character class is not closed")
        c = text[i]
        if c == "]" and not first:
            return i + 1, ranges, negated
        first = False
        lo, i = _class_char(text, i)
        if isinstance(lo, list):
            ranges += lo
            continue
        if text.startswith("-", i) and i + 1 < len(text) and text[i + 1] != "]":
            hi, i = _class_char(text, i + 1)
            if isinstance(hi, list) or ord(hi) < ord(lo):
                raise ValueError("a pattern's character class has a bad range")
            ranges.append((ord(lo), ord(hi)))
        else:
            ranges.append((ord(lo), ord(lo)))


def _class_char(text: str, i: int) -> tuple[str | list[tuple[int, int]], int]:
    if text[i] != "\\":
        return text[i], i + 1
    if i + 1 >= len(text):
        raise ValueError("a pattern ends with a lone backslash")
    char, width = _escape(text, i + 1)
    return char, i + 1 + width


def _subtract(ranges: list[tuple[int, int]], cut: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for clo, chi in cut:
            pieces = [p for a, b in pieces for p in ((a, min(b, clo - 1)), (max(a, chi + 1), b)) if p[0] <= p[1]]
        out += pieces
    return out


def _safe_class(ranges: list[tuple[int, int]], negated: bool) -> str:
    """A GBNF class: the ranges without what JSON escapes (a positive class), or also refusing it (negated)."""
    if negated:
        ranges = ranges + _UNSAFE
    else:
        ranges = _subtract(ranges, _UNSAFE)
        if not ranges:
            raise ValueError("a pattern's character class holds only characters JSON writes escaped")
    items = "".join(_class_item(lo) if lo == hi else f"{_class_item(lo)}-{_class_item(hi)}" for lo, hi in ranges)
    return f"[{'^' if negated else ''}{items}]"


def _class_item(code: int) -> str:
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"
