"""A JSON schema judged before anything is expanded from it (issue 74): the JSON-schema converter writes
``minItems`` / ``maxItems`` / ``minLength`` / ``maxLength`` and a pattern's ``{m,n}`` out literally, one copy per
count, so a 238-byte schema asking for ten million items would allocate gigabytes before the grammar's own size
limit could refuse it. :func:`check_schema` walks the schema once, iteratively (no recursion a deep schema could
exhaust), and refuses with a :class:`GrammarError` naming the place and the field: a count above
:data:`MAX_COUNT`, an enum above :data:`MAX_ENUM_VALUES`, a schema deeper than :data:`MAX_DEPTH` or larger than
:data:`MAX_NODES`, or an estimated grammar above :data:`MAX_ESTIMATED_BYTES`. The estimate follows how the
converter writes each construct (a repetition copies a rule's name per count; constants are written out), so it
is linear in the schema and never expands anything.
"""

from __future__ import annotations

import json
import re

from .grammar_check import MAX_GRAMMAR_BYTES
from .grammar_parse import MAX_REPETITION, GrammarError

MAX_COUNT = MAX_REPETITION
"""The largest ``minItems`` / ``maxItems`` / ``minLength`` / ``maxLength`` / ``minProperties`` /
``maxProperties`` and pattern quantifier: llama.cpp's own bound on a GBNF repetition (2000); the converter nests
one group per optional copy, and the grammar check refuses nesting past 2048 anyway."""
MAX_ENUM_VALUES = 16_384
"""Values of one ``enum`` (written as a prefix tree, so a long flat list stays cheap to follow)."""
MAX_DEPTH = 128  # objects and arrays nested in the schema
MAX_NODES = 100_000  # objects, arrays and values in the schema
MAX_ESTIMATED_BYTES = 2 * MAX_GRAMMAR_BYTES
"""The grammar's size estimated from the schema; the exact limit (:data:`MAX_GRAMMAR_BYTES`) is applied to the
converter's output, this one keeps the conversion from ever writing much more than that."""
COUNT_FIELDS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains",
                "maxContains")
_PER_COPY = 24  # bytes the converter writes per repeated copy besides the item's rule name (separator, groups)
_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def check_schema(schema: object, where: str = "schema") -> None:
    """Refuse ``schema`` (a :class:`GrammarError` naming ``where`` and the field) when a count, an enum, its
    depth, its size or the grammar it would make is beyond the bounds above."""
    estimate = 0
    seen = 0
    todo: list[tuple[object, str, int]] = [(schema, where, 0)]
    while todo:
        node, path, depth = todo.pop()
        seen += 1
        if seen > MAX_NODES:
            raise GrammarError(f"{where}: more than {MAX_NODES} values in the schema")
        if depth > MAX_DEPTH:
            raise GrammarError(f"{path}: the schema nests more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            estimate += _node_cost(node, path)
            todo.extend((v, f"{path}.{k}", depth + 1) for k, v in node.items() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            todo.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node) if isinstance(v, (dict, list)))
        if estimate > MAX_ESTIMATED_BYTES:
            raise GrammarError(f"{path}: the grammar this schema makes would be over {MAX_ESTIMATED_BYTES >> 10} KB "
                               "(its counts and constants, written out); make it smaller")


def _node_cost(node: dict, path: str) -> int:
    """What the converter writes for one schema object, estimated (bytes); refuses an out-of-bounds count."""
    copies = 0
    for name in COUNT_FIELDS:
        value = node.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GrammarError(f"{path}.{name} must be a non-negative integer, got {value!r}")
        if value > MAX_COUNT:
            raise GrammarError(f"{path}.{name} is {value}; the largest count this server expands is {MAX_COUNT}")
        copies = max(copies, value)
    cost = copies * (len(path) + _PER_COPY)
    enum = node.get("enum")
    if enum is not None:
        if not isinstance(enum, list) or not enum:
            raise GrammarError(f"{path}.enum must be a non-empty list")
        if len(enum) > MAX_ENUM_VALUES:
            raise GrammarError(f"{path}.enum has {len(enum)} values; the limit is {MAX_ENUM_VALUES}")
        cost += sum(_json_size(v, path) for v in enum)
    if "const" in node:
        cost += _json_size(node["const"], path)
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        cost += _pattern_cost(pattern, path)
    return cost + sum(len(k) + 16 for k in node) * 2


def _json_size(value: object, path: str) -> int:
    """The length of a constant's JSON text (a value that has none is refused)."""
    try:
        return len(json.dumps(value)) * 2
    except (TypeError, ValueError, RecursionError):
        raise GrammarError(f"{path}: a constant that is not JSON") from None


def _pattern_cost(pattern: str, path: str) -> int:
    """A pattern's text plus a copy of a rule name per quantified count."""
    cost = len(pattern) * 4
    for m in _QUANTIFIER.finditer(pattern):
        low, high = m.group(1), m.group(2)
        counts = [int(x) if len(x) < 10 else MAX_COUNT + 1 for x in (low, high) if x]  # no 4,300-digit ints
        if any(c > MAX_COUNT for c in counts):
            raise GrammarError(f"{path}.pattern: the quantifier {m.group(0)} is over {MAX_COUNT}")
        cost += max(counts, default=0) * (len(path) + _PER_COPY)
    return cost
