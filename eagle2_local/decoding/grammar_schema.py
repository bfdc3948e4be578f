"""JSON schema to GBNF: llama-cpp-python's converter with the literals it writes made right.

Its converter writes a constant (``const``, ``enum``, a property name) as the GBNF literal of its JSON text but
escapes only ``\\r``, ``\\n`` and ``"`` in it: the backslashes of the JSON text's own escapes (``\\t``, ``\\\\``,
``\\u00e9``) then read as GBNF escapes, so the grammar demands a raw tab or a lone backslash, text that is not
JSON. :class:`SafeConverter` writes every literal with all of GBNF's escapes, and reads the literal characters of
a ``pattern`` as the string's decoded content (so a ``"`` or ``\\`` there is written in its JSON-escaped form).
An ``enum`` becomes a tree of shared prefixes instead of a flat list: llama.cpp keeps one parse stack per
alternative alive, so a flat list of 10,000 values costs seconds per token, the tree only its branching.

This module imports nothing but the standard library and llama-cpp-python's ``llama_grammar`` (itself standard
library only): :mod:`._grammar_child` loads both by path in its bare interpreter, where the conversion runs under
a memory limit.
"""

from __future__ import annotations

import json

try:
    from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, BuiltinRule, SchemaConverter

    from .grammar_pattern import json_pattern
except ImportError:  # the bare child interpreter: llama_grammar.py's folder and this one's are on sys.path
    from grammar_pattern import json_pattern  # type: ignore[no-redef]
    from llama_grammar import (PRIMITIVE_RULES, RESERVED_NAMES, BuiltinRule,  # type: ignore[no-redef]
                               SchemaConverter)

JSON_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" '
                        r'[0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])')
"""A character of a JSON string: the converter's own lets raw control characters (a raw newline) through, which
``json.loads`` refuses; this is llama.cpp's current rule."""
_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal that matches exactly it: backslash, quote, tab, CR, LF and every other
    control character escaped (llama.cpp reads ``\\xHH``)."""
    out = []
    for c in text:
        esc = _GBNF_ESCAPES.get(c)
        if esc is None and (ord(c) < 0x20 or ord(c) == 0x7F):
            esc = f"\\x{ord(c):02X}"
        out.append(esc or c)
    return '"' + "".join(out) + '"'


def json_text(value) -> str:
    """A constant's JSON text as a model writes it: characters as themselves (UTF-8), JSON's escapes where JSON
    needs them; ASCII escapes only for a text with a lone surrogate, which has no UTF-8 form."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


def _trie_rule(texts: list[str]) -> str:
    """A GBNF expression matching exactly ``texts`` (distinct, non-empty), their common prefixes shared."""
    trie: dict = {}
    for t in texts:
        node = trie
        for c in t:
            node = node.setdefault(c, {})
        node[""] = {}  # the end of a value
    return _emit(trie)


def _emit(node: dict) -> str:
    """The expression of one trie node's subtree (iterative over straight chains, recursive at branches: the
    depth is the number of branch points on a path, bounded by the schema's value lengths)."""
    alternatives, ends = [], False
    for c, child in node.items():
        if c == "":
            ends = True
            continue
        chain = c
        while len(child) == 1 and "" not in child:  # a straight run: one literal
            (c2, child), = child.items()
            chain += c2
        rest = "" if child == {"": {}} else " " + _emit(child)
        alternatives.append(gbnf_literal(chain) + rest)
    if not alternatives:
        return '""'
    body = " | ".join(alternatives)
    if ends:
        return f"({body})?"
    return body if len(alternatives) == 1 and not node.get("") else f"({body})"


class SafeConverter(SchemaConverter):
    """llama-cpp-python's ``SchemaConverter`` with correct literals, a string character that excludes raw
    control characters, patterns rewritten to write JSON
    (:mod:`.grammar_pattern`), and enums as prefix trees."""

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def _format_literal(self, literal: str) -> str:
        return gbnf_literal(literal)

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        return super()._add_primitive(name, JSON_CHAR if rule is PRIMITIVE_RULES["char"] else rule)

    def _generate_constant_rule(self, value) -> str:
        return gbnf_literal(json_text(value))

    def visit(self, schema, name):
        if isinstance(schema, dict) and "enum" in schema and "$ref" not in schema and not (
                "oneOf" in schema or "anyOf" in schema or isinstance(schema.get("type"), list) or "const" in schema):
            values = list(dict.fromkeys(json_text(v) for v in schema["enum"]))
            if not values:
                raise ValueError("an enum needs at least one value")
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            return self._add_rule(rule_name, _trie_rule(values))
        if isinstance(schema, dict) and "pattern" in schema and isinstance(schema["pattern"], str):
            schema = {**schema, "pattern": json_pattern(schema["pattern"])}
        return super().visit(schema, name)


def schema_to_gbnf(text: str) -> str:
    """The GBNF of the JSON schema ``text``. Raises what the converter raises (several bare kinds) when it
    cannot."""
    schema = json.loads(text)
    converter = SafeConverter()
    schema = converter.resolve_refs(schema, "stdin")
    converter.visit(schema, "")
    return converter.format_grammar()
