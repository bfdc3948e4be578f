"""Prompt sets: JSONL records of user turns (and the schema or grammar their answers keep to), split into the
records a rule may be tuned on and those held back to check it."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..decoding.grammar import Grammar, GrammarError
from ..errors import Eagle2Error

SPLITS = ("tune", "heldout")


@dataclass
class PromptSet:
    """A prompt set's records: ``prompts`` holds each record's first user turn (what single-turn callers use),
    ``chats`` every turn of each record (empty: one turn each, the ``prompts``), ``grammars`` the constraint of
    each record's answers (empty or None: free text)."""

    name: str
    prompts: list[str]
    chats: list[list[str]] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)  # each record's split (empty: all "tune")
    grammars: list[Grammar | None] = field(default_factory=list)

    def split(self, index: int) -> str:
        return self.splits[index] if self.splits else "tune"

    def turns(self, index: int) -> list[str]:
        """The user turns of record ``index``, in order."""
        return self.chats[index] if self.chats else [self.prompts[index]]

    def grammar(self, index: int) -> Grammar | None:
        """What constrains every answer of record ``index`` (None: nothing)."""
        return self.grammars[index] if self.grammars else None


def record_grammar(rec: dict) -> Grammar | None:
    """A record's ``schema`` (a JSON schema) or ``grammar`` (GBNF text): the constraint of its answers, in
    plain and speculative runs alike."""
    schema, gbnf = rec.get("schema"), rec.get("grammar")
    if schema is not None and gbnf is not None:
        raise GrammarError("give 'schema' or 'grammar', not both")
    if schema is not None:
        if not isinstance(schema, dict):
            raise GrammarError("'schema' must be a JSON schema object")
        return Grammar.from_json_schema(schema)
    if gbnf is not None:
        if not isinstance(gbnf, str) or not gbnf.strip():
            raise GrammarError("'grammar' must be non-empty GBNF text")
        return Grammar(gbnf)
    return None


def load_prompt_sets(specs: list[str], n: int | None, split: str = "all") -> list[PromptSet]:
    """Each spec is a JSONL file or a folder of them; records carry ``turns`` (a list of user messages) or
    ``prompt``, and optionally ``schema`` or ``grammar`` (:func:`record_grammar`).

    ``split`` ("tune", "heldout" or "all") keeps the records whose ``split`` field says so, before the first
    ``n`` are taken; a record without one counts as "tune": held-out records must be marked as such, so that an
    unmarked set can never pass for one tuning has not seen. A set left empty by the split is dropped."""
    if split not in ("all", *SPLITS):
        raise Eagle2Error(f"split must be all, tune or heldout, got {split!r}")
    sets: list[PromptSet] = []
    for spec in specs:
        path = Path(spec).expanduser()
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise Eagle2Error(f"no prompt set at {spec} (give a .jsonl file or a folder of them)")
        for f in files:
            chats: list[list[str]] = []
            splits: list[str] = []
            grammars: list[Grammar | None] = []
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise Eagle2Error(f"{f}:{i + 1}: not JSON ({exc.msg})") from None
                if not isinstance(rec, dict):
                    raise Eagle2Error(f"{f}:{i + 1}: a record must be a JSON object, got {line.strip()[:40]}")
                turns = rec.get("turns")
                if not (isinstance(turns, list) and turns):
                    if not isinstance(rec.get("prompt"), str):
                        raise Eagle2Error(f"{f}:{i + 1}: record has neither 'turns' nor 'prompt'")
                    turns = [rec["prompt"]]
                if not all(isinstance(t, str) for t in turns):
                    raise Eagle2Error(f"{f}:{i + 1}: 'turns' must be a list of strings")
                rec_split = rec.get("split", "tune")
                if rec_split not in SPLITS:
                    raise Eagle2Error(f"{f}:{i + 1}: split must be tune or heldout, got {rec_split!r}")
                try:
                    grammar = record_grammar(rec)
                except GrammarError as exc:
                    raise Eagle2Error(f"{f}:{i + 1}: {exc}") from None
                if split in ("all", rec_split):
                    chats.append(turns)
                    splits.append(rec_split)
                    grammars.append(grammar)
            chats, splits, grammars = (chats[:n], splits[:n], grammars[:n]) if n else (chats, splits, grammars)
            if chats or split == "all":
                sets.append(PromptSet(f.stem, [c[0] for c in chats], chats, splits,
                                      grammars if any(g is not None for g in grammars) else []))
    if not sets:
        raise Eagle2Error(f"no {split} records in {', '.join(specs)}")
    return sets


def interleaved(sets: list[PromptSet], n: int) -> list[str]:
    """``n`` prompts taken across ``sets`` in turn (every set's first, then every set's second, ...), so that a
    handful already spans every kind of task; an error when the sets hold fewer than ``n``."""
    out = [p for row in itertools.zip_longest(*(s.prompts for s in sets)) for p in row if p is not None][:n]
    if len(out) < n:
        raise Eagle2Error(f"asked for {n} prompts but the sets ({', '.join(s.name for s in sets)}) hold {len(out)}")
    return out
