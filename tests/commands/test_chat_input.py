"""A chat a person can paste into, driven through a pseudo-terminal as a terminal would: a bracketed paste of
several lines is one message, \"\"\" blocks and trailing backslashes join lines, up-arrow recalls the last message
(the history kept in the cache folder), and piped stdin is one message."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pexpect
import pytest

from eagle2_local.commands.chat_input import MessageBuffer, piped_messages

SNIPPET = ["def total(xs):", "    s = 0", "    for x in xs: s += x", "    return s"]
ARGS = ["--temperature", "0", "-n", "4", "--threads", "1"]


@pytest.fixture
def chat(synth_q8, tmp_path):
    env = {**os.environ, "EAGLE2_LOCAL_CACHE": str(tmp_path), "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "cli", "chat", "--model", str(synth_q8), *ARGS], env=env,
                          encoding="utf-8", timeout=60, dimensions=(40, 200))
    child.expect("/exit")  # the banner
    child.expect("> ")
    yield child
    child.close(force=True)


def answers_until_stats(child: pexpect.spawn) -> tuple[int, dict]:
    """How many answers (stats lines) came before ``/stats json``, and its figures."""
    child.expect(r"tok/s[^\n]*\n")
    child.expect("> ")
    child.sendline("/stats json")
    child.expect(r"\{.*?\}\r?\n(\x1b\[\?2004h)?> ")  # readline announces bracketed paste before the prompt
    more = child.before.count("tok/s")
    return 1 + more, json.loads(child.after.rsplit("}", 1)[0] + "}")


def test_a_bracketed_paste_is_one_message_and_up_arrow_recalls_it(chat, tmp_path):
    chat.send("\x1b[200~" + "\r".join(SNIPPET) + "\r\x1b[201~")  # a terminal sends pasted newlines as CR
    chat.send("\r")  # Enter sends what was pasted
    n, stats = answers_until_stats(chat)
    assert n == 1
    one_line = stats["prompt_tokens"]
    chat.send("\x1b[A\x1b[A\r")  # up twice: past /stats json to the pasted message
    chat.expect(r"return s\s*\r?\n")  # the whole message came back onto the line
    n, stats = answers_until_stats(chat)
    assert n == 1 and stats["prompt_tokens"] - stats["prompt_tokens_reused"] >= one_line // 2
    chat.sendeof()
    chat.expect(pexpect.EOF)
    history = [json.loads(line) for line in (tmp_path / "chat-history.jsonl").read_text().splitlines()]
    assert "\n".join(SNIPPET) in history and "/stats json" in history


def test_fenced_blocks_and_backslashes_join_lines(chat):
    chat.sendline('"""')
    chat.expect(r"\.\.\. ")  # the continuation prompt
    for line in SNIPPET[:-1]:
        chat.sendline(line)
    chat.sendline(SNIPPET[-1] + '"""')
    fenced, stats = answers_until_stats(chat)
    fenced_tokens = stats["prompt_tokens"]
    chat.sendline("/reset")
    chat.expect("conversation reset")
    chat.expect("> ")
    for line in SNIPPET[:-1]:
        chat.sendline(line + "\\")
    chat.sendline(SNIPPET[-1])
    continued, stats = answers_until_stats(chat)
    assert fenced == continued == 1
    assert stats["prompt_tokens"] == fenced_tokens  # the same message either way


def test_piped_stdin_is_one_message(synth_q8):
    proc = subprocess.run([sys.executable, "-m", "cli", "chat", "--model", str(synth_q8), *ARGS],
                          input="\n".join(SNIPPET) + "\n\n/stats json\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("tok/s") == 1
    stats = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert stats["prompt_tokens"] > 4 * 4  # all four lines in one prompt


@pytest.mark.parametrize("pieces, expected", [
    (["hello"], ["hello"]),
    (['"""', "a", "  b", 'c"""'], ["a\n  b\nc"]),
    (['"""one line"""'], ["one line"]),
    (['"""first', 'last"""'], ["first\nlast"]),
    (["a\\", "b\\", "c"], ["a\nb\nc"]),
    (["x = 1\ny = 2\n"], ["x = 1\ny = 2"]),  # a pasted block arrives whole
    (['"""', "", "kept blank above", '"""', "next"], ["kept blank above", "next"]),
])
def test_message_buffer(pieces, expected):
    buffer, out = MessageBuffer(), []
    for piece in pieces:
        message = buffer.feed(piece)
        if message is not None:
            out.append(message)
    assert out == expected and not buffer.open


def test_piped_messages_split_on_send_and_commands():
    text = "a\nb\n\n/send\nc\n/reset\nd\n/exit\ne\n"
    assert list(piped_messages(iter(text.splitlines(keepends=True)))) == ["a\nb", "c", "/reset", "d", "/exit", "e"]
