"""What a person types, pastes or pipes into ``chat`` becomes whole messages.

In a terminal, input goes through readline: line editing, and a history kept in the cache folder
(``chat-history.jsonl``; up-arrow recalls a whole multi-line message). Bracketed paste is switched on (CPython turns
it off in readline), so a pasted block arrives as one edit, newlines and all, and Enter sends it as one message, as
in bash. Where the terminal or the readline has no bracketed paste, ollama's and llama-cli's ways still work: a
message between ``\"\"\"`` lines, or lines ended with ``\\`` continued on the next.

Piped in, all of stdin is one message (``cat file.py | eagle2-local chat`` asks about the whole file, as ollama
does). A line holding only ``/send`` ends a message and starts the next; a line holding only a chat command
(``/reset``, ``/stats``, ``/exit``) ends the message before it too, and runs in its turn.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import IO, Iterator

import click

from ..formats.atomic_write import atomic_path
from ..formats.cache_root import cache_root

log = logging.getLogger(__name__)

FENCE = '"""'
SEND = "/send"
COMMANDS = ("/exit", "/quit", "/reset", "/stats", "/stats json")
HISTORY_FILE = "chat-history.jsonl"
HISTORY_LENGTH = 1000
PROMPT, MORE = "> ", "... "


class MessageBuffer:
    """Joins what the terminal hands over (a line, or a pasted block) into messages: ``\"\"\"`` blocks and ``\\``
    continuations span several; anything else is a message by itself."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.fenced = False

    @property
    def open(self) -> bool:
        """Whether a message has begun and waits for more lines."""
        return bool(self.lines) or self.fenced

    def feed(self, text: str) -> str | None:
        """The finished message, or None while one is still open."""
        if not self.open:
            return self._first(text)
        if self.fenced:
            body = text.rstrip()
            if body.endswith(FENCE):
                return self._finish(body[:-len(FENCE)])
            self.lines.append(text)
            return None
        if text.endswith("\\"):
            self.lines.append(text[:-1])
            return None
        return self._finish(text)

    def _first(self, text: str) -> str | None:
        stripped = text.lstrip()
        if stripped.startswith(FENCE):
            rest = stripped[len(FENCE):].rstrip()
            if len(rest) >= len(FENCE) and rest.endswith(FENCE):  # """a whole block""" in one piece
                return clean(rest[:-len(FENCE)])
            self.fenced = True
            self.lines = [rest] if rest else []
            return None
        if text.endswith("\\"):
            self.lines = [text[:-1]]
            return None
        return clean(text)

    def _finish(self, last: str) -> str:
        text = "\n".join([*self.lines, last])
        self.lines, self.fenced = [], False
        return clean(text)


def clean(text: str) -> str:
    """A message without the blank lines around it and trailing spaces (indentation inside is kept)."""
    return text.strip("\n").rstrip()


def piped_messages(stream: IO[str]) -> Iterator[str]:
    """Messages from a pipe: everything up to a ``/send`` line, a command line or the end is one message; commands
    are yielded as they are."""
    lines: list[str] = []
    for raw in stream:
        line = raw.rstrip("\n")
        word = line.strip()
        if word == SEND or word in COMMANDS:
            if clean("\n".join(lines)):
                yield clean("\n".join(lines))
            lines = []
            if word != SEND:
                yield word
            continue
        lines.append(line)
    if clean("\n".join(lines)):
        yield clean("\n".join(lines))


def terminal_messages() -> Iterator[str]:
    """Messages typed or pasted at the terminal, through readline when there is one; Ctrl-C drops the message
    being typed, Ctrl-D ends the chat. The history is saved when the chat ends."""
    history = _open_history()
    try:
        while True:
            buffer = MessageBuffer()
            try:
                message = None
                while message is None:
                    message = buffer.feed(input(MORE if buffer.open else PROMPT))
            except EOFError:
                return
            except KeyboardInterrupt:
                click.echo()
                continue
            if not message:
                continue
            if history is not None:
                history.add_history(message)
            yield message
    finally:
        if history is not None:
            _save_history(history)


def history_path() -> Path:
    return cache_root() / HISTORY_FILE


def _open_history():
    """GNU readline set up for the chat (bracketed paste on, whole messages in the history), or None where the
    platform has none; the saved history is loaded."""
    try:
        import readline
    except ImportError:
        return None
    if "libedit" not in (readline.__doc__ or ""):
        readline.parse_and_bind("set enable-bracketed-paste on")
    readline.set_auto_history(False)  # a multi-line message goes in once, whole (terminal_messages adds it)
    try:
        for line in history_path().read_text(encoding="utf-8").splitlines()[-HISTORY_LENGTH:]:
            readline.add_history(json.loads(line))
    except (OSError, ValueError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("chat history not read (%s): %s", history_path(), exc)
    return readline


def _save_history(readline) -> None:
    """The last HISTORY_LENGTH messages, one JSON string a line (a message may hold newlines, which readline's own
    history file would split into several entries)."""
    n = readline.get_current_history_length()
    entries = [readline.get_history_item(i) for i in range(max(1, n - HISTORY_LENGTH + 1), n + 1)]
    path = history_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text("".join(json.dumps(e) + "\n" for e in entries if e), encoding="utf-8")
        os.chmod(path, 0o600)  # what a person typed is theirs alone
    except OSError as exc:
        log.warning("chat history not saved (%s): %s", path, exc)
