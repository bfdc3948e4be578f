"""The grammar of an answer that must call tools (``tool_choice`` "required" or a named function): each call's
JSON (``name`` a constant, the arguments the function's ``parameters``) from the same JSON-schema converter as
``response_format``, inside the call format's tags.

Each function's parameters are placed under the larger schema's ``$defs`` (the call object refers to them), so
their local references (``#/$defs/Item``, ``#``, what pydantic writes) would point at the wrong root there:
:func:`rebased` rewrites each to the place the parameters now hold.
"""

from __future__ import annotations

import json
import re
from typing import Protocol

from ..decoding.grammar import Grammar, GrammarError
from ..errors import ParameterError


class CallTags(Protocol):
    """What the grammar needs of a call format (:class:`~eagle2_local.chat.tool_calls.CallFormat`, which reads
    calls and so builds on this module): the arguments' key and the tags around each call."""

    args_key: str
    open: str
    close: str
    parallel: bool


CALL_RULE, CALLS_RULE = "tool-call", "tool-calls"  # GBNF rules added around the converter's ``root``


class ToolError(ParameterError):
    """Tools or a tool choice that cannot be used; ``param`` names the request field at fault."""

    def __init__(self, message: str, param: str = "tools") -> None:
        super().__init__(message, param)


def rebased(schema, prefix: str):
    """A copy of ``schema`` whose local ``$ref`` (``#`` and ``#/...``) point below ``prefix`` (a JSON pointer
    fragment such as ``#/properties/arguments``), where the schema is placed. The schema's depth is bounded
    by :func:`~eagle2_local.decoding.grammar_bounds.check_schema` before this runs."""
    if isinstance(schema, list):
        return [rebased(x, prefix) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: rebased(v, prefix) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = prefix + ref[1:]
    return out


def call_grammar(fmt: CallTags, tools: list[dict], parallel: bool) -> Grammar:
    """The answer as calls of ``tools`` (one, or several when ``parallel`` and the format allows): their JSON
    from the schema converter, inside the format's tags."""
    shapes, defs = [], {}
    for t in tools:
        name = t["function"]["name"]
        place = f"{name}-{fmt.args_key}"  # names are [A-Za-z0-9_-]: a JSON pointer segment as written
        defs[place] = rebased(t["function"]["parameters"], f"#/$defs/{place}")
        shapes.append({"type": "object", "properties": {"name": {"const": name},
                                                        fmt.args_key: {"$ref": f"#/$defs/{place}"}},
                       "required": ["name", fmt.args_key], "additionalProperties": False})
    schema = {**shapes[0]} if len(shapes) == 1 else {"anyOf": shapes}
    try:
        body = Grammar.from_json_schema({**schema, "$defs": defs}, "tools")
    except GrammarError as exc:
        raise ToolError(f"a function's parameters: {exc}") from None
    if not fmt.open:
        return body
    taken = set(re.findall(r"^([\w-]+) ::=", body.gbnf, re.MULTILINE))
    if {CALL_RULE, CALLS_RULE} & taken:  # the converter names rules after properties; never these so far
        raise ToolError(f"a function's parameters make a grammar rule named {CALL_RULE!r}; rename that property")
    opening, closing = json.dumps(fmt.open + "\n"), json.dumps("\n" + fmt.close)  # GBNF literals as JSON writes them
    rules = [f"{CALL_RULE} ::= {opening} {body.root} {closing}",
             f"{CALLS_RULE} ::= {CALL_RULE}" + (f' ("\\n" {CALL_RULE})*' if parallel and fmt.parallel else "")]
    return Grammar(body.gbnf + "\n" + "\n".join(rules), root=CALLS_RULE)
