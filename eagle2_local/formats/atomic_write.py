"""Writing a file so that a reader finds the old one or the whole new one, never a part of it (a crash, a full
disk or Ctrl-C mid-write): the new file is written beside the old, then renamed over it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A path beside ``path`` (``NAME.part``) to write; renamed onto ``path`` when the block ends, removed when it
    raises.

        with atomic_path(out) as tmp:
            tmp.write_text(text)
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
