"""`eagle2-local chat` driven like a person would: through a pseudo-terminal, and through a pipe."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pexpect
import pytest


def read_stats(child: pexpect.spawn) -> dict:
    """Type /stats json and parse the JSON it prints."""
    child.sendline("/stats json")
    child.expect(r"\{.*?\}\r?\n(\x1b\[\?2004h)?> ")  # readline announces bracketed paste before the prompt
    return json.loads(child.after.rsplit("}", 1)[0] + "}")


def spawn_chat(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "cli", "chat", *args], encoding="utf-8", timeout=120,
                          dimensions=(40, 200))
    child.expect("/exit")  # the banner
    child.expect("> ")
    return child


@pytest.mark.smollm2
def test_chat_two_turns_ctrl_c_and_ctrl_d(smollm2_path, smollm2_head):
    child = spawn_chat("--model", str(smollm2_path), "--head", str(smollm2_head), "--temperature", "0",
                       "-n", "600", "--total-tokens", "12", "--depth", "4", "--tree-top-k", "3", "-t", "1")
    child.sendline("What is the capital of France? Answer in one word.")
    child.expect("tok/s")  # the stats line after the answer
    first = child.before
    assert "Paris" in first
    child.expect(r", tau \d+\.\d+")  # speculative statistics on the same line
    child.expect("> ")
    child.sendline("/stats")  # a short table a person reads
    child.expect(r"tau +\d+\.\d+ tokens per target pass")
    child.expect(r"accepted +\w+")
    child.expect("> ")
    # a long answer, interrupted
    child.sendline("Write a very long story about a dragon who learns to cook. Make it at least 500 words.")
    child.expect("500 words.")  # the terminal's echo of the typed line
    child.expect(r"\w+ \w+ \w+ \w+")  # some of the answer streamed
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.expect("> ")
    # the session goes on; the next turn prefills only the new message (plus the template's glue)
    question = "Thanks! What city did I ask about first?"
    child.sendline(question)
    child.expect("tok/s")
    child.expect("> ")
    stats = read_stats(child)
    new_tokens = stats["prompt_tokens"] - stats["prompt_tokens_reused"]
    assert stats["prompt_tokens_reused"] > 40
    assert new_tokens <= 12 + 15, stats  # the question is ~12 tokens; <|im_end|>, role headers ~10
    # /reset forgets everything: the next prompt is prefilled from scratch
    child.sendline("/reset")
    child.expect("conversation reset")
    child.expect("> ")
    child.sendline("Hello!")
    child.expect("tok/s")
    child.expect("> ")
    assert read_stats(child)["prompt_tokens_reused"] == 0
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_piped_stdin_and_commands(synth_q8):
    proc = subprocess.run([sys.executable, "-m", "cli", "chat", "--model", str(synth_q8), "--temperature", "0",
                           "-n", "8"], input="the cat sat\n/reset\nhello there\n/exit\nnever read\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "conversation reset" in proc.stdout
    assert proc.stdout.count("tok/s") == 2  # two answers, then /exit stopped reading
    assert "Traceback" not in proc.stderr


def test_chat_message_longer_than_the_context_is_one_error(synth_q8):
    """A message that cannot fit even alone: one error naming --n-ctx, the next message still answered; with
    --no-context-shift the error offers /reset, as before context shifts."""
    long_line = "the cat sat on the mat " * 60
    for extra, needle in (((), "--n-ctx"), (("--no-context-shift",), "/reset")):
        proc = subprocess.run([sys.executable, "-m", "cli", "chat", "--model", str(synth_q8), "--n-ctx", "256",
                               "--temperature", "0", "-n", "4", *extra], input=f"{long_line}\n/send\nhi\n",
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert needle in proc.stderr and "context" in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stdout.count("tok/s") == 1  # the short message after the error was still answered


def test_chat_drops_oldest_turns_when_the_context_fills(synth_q8):
    """Turns that together outgrow --n-ctx: the chat drops the oldest, says so on one line and answers every
    message; with --no-context-shift the same conversation ends in a context error."""
    lines = [f"message {i}: " + "the cat sat on the mat " * 12 for i in range(6)]
    args = [sys.executable, "-m", "cli", "chat", "--model", str(synth_q8), "--n-ctx", "256", "--temperature", "0",
            "-n", "24"]
    piped = "\n/send\n".join(lines) + "\n"
    proc = subprocess.run(args, input=piped, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("tok/s") == 6 and "error" not in proc.stderr, (proc.stdout, proc.stderr)
    assert "oldest messages were dropped" in proc.stdout
    strict = subprocess.run([*args, "--no-context-shift"], input=piped, capture_output=True,
                            text=True, timeout=120)
    assert "context" in strict.stderr and strict.stdout.count("tok/s") < 6


@pytest.mark.smollm2
def test_chat_first_turn_is_generates_answer_whatever_came_before(smollm2_path):
    """The default model and head on a fixed tree (no calibration), 1 thread: a long message (past 64 tokens) gets
    `generate --chat`'s answer as chat's first turn, and again after another conversation and /reset (nothing of
    the earlier text leaks in)."""
    message = "Read this and answer: " + " ".join(f"Box {i} holds {i * 3} red and {i % 4} blue marbles."
                                                  for i in range(6)) + " Which box holds the most marbles?"
    args = ["--threads", "1", "--temperature", "0", "-n", "16", "--total-tokens", "8", "--depth", "3"]
    gen = subprocess.run([sys.executable, "-m", "cli", "generate", "--chat", "--json", *args, "-p", message],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr
    expected = json.loads(gen.stdout)["text"]
    proc = subprocess.run([sys.executable, "-m", "cli", "chat", *args],
                          input=f"{message}\n/send\nWhat about the blue ones?\n/reset\n{message}\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # answers are what stands between the stats lines (an answer may hold newlines of its own)
    answers = [block.strip() for block in re.split(r"^.*tok/s.*$", proc.stdout, flags=re.M)]
    answers = [a.removeprefix("conversation reset").strip() for a in answers if a]
    assert answers[0] == expected.strip() and answers[-1] == expected.strip(), (answers, expected)
